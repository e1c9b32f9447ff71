"""Every tunable of replag, declared once: the fields of the frozen `Settings` class.

To add a setting: add a field to `Settings`, `name: type = setting(default, parser, help)`,
then paste `replag settings --markdown` into docs/configuration.md (a test checks it is there).

Each field carries its declaration (default as a file would write it, parser, help,
secret, choices); `SETTINGS` lists them. The TOML `[settings]` table, `REPLAG_*`
environment variables, CLI option help and the docs' table all read that list;
precedence is default < file < environment < command-line flag. Code reads the
typed object (`config.settings.connect_timeout` is a float in seconds).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from replag.durations import parse_duration_s
from replag.errors import ReplagError


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected an integer, got {value!r}")
    number = int(value)
    if number < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return number


def _positive_int(value: Any) -> int:
    number = _int(value)
    if number == 0:
        raise ValueError(f"expected an integer of at least 1, got {value!r}")
    return number


def _optional_url(value: Any) -> str | None:
    if value in (None, ""):
        return None
    text = str(value)
    if not text.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return text.rstrip("/")


def _lag_buckets_per_decade(value: Any) -> int:
    number = _positive_int(value)
    if number > 48:
        raise ValueError(f"expected 1 to 48 buckets a decade, got {value!r}")
    return number


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"expected a finite, non-negative number, got {value!r}")
    return number


def _optional_float(value: Any) -> float | None:
    if value in (None, "", "none", "off"):
        return None
    return _float(value)


def _networks(value: Any) -> tuple[str, ...]:
    import ipaddress

    parts = value if isinstance(value, list | tuple) else str(value).split(",")
    try:
        return tuple(
            str(ipaddress.ip_network(str(p).strip(), strict=False)) for p in parts if str(p).strip()
        )
    except ValueError as exc:
        raise ValueError(f"expected networks like 10.0.0.0/8,192.168.1.0/24: {exc}") from None


def _optional_ratio(value: Any) -> float | None:
    ratio = _optional_float(value)
    if ratio is not None and ratio > 1:
        raise ValueError(f"expected a ratio from 0 to 1 (0.01 = 1%), got {value!r}")
    return ratio


def _duration(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a duration like 5s or 80ms, got {value!r}")
    return parse_duration_s(value)


def _positive_duration(value: Any) -> float:
    seconds = _duration(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration above 0, got {value!r}")
    return seconds


def _optional_duration(value: Any) -> float | None:
    if value in (None, "", "none", "off"):
        return None
    return _duration(value)


_SIZE_UNITS = {"": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def _size(value: Any) -> int:
    """A size in bytes: 1048576, "64MB", "512 mb" (units of 1024)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a size like 64MB or 1048576, got {value!r}")
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgb")
    unit = text[len(number) :]
    if not number.isdigit() or unit not in _SIZE_UNITS or int(number) == 0:
        raise ValueError(f"expected a size above 0 like 64MB or 1048576, got {value!r}")
    return int(number) * _SIZE_UNITS[unit]


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _store_location(value: Any) -> str:
    """A SQLite path or a postgresql:// URL; another scheme is refused here, at load."""
    from replag.store.location import parse_location

    text = _str(value)
    try:
        parse_location(text)
    except ReplagError as exc:
        raise ValueError(exc.message) from None
    return text


def _optional_str(value: Any) -> str | None:
    if value in (None, ""):
        return None
    return _str(value)


def _optional_http_url(value: Any) -> str | None:
    url = _optional_str(value)
    if url is None:
        return None
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


PROBE_MODES = ("auto", "push", "poll")
TLS_VERIFY = ("full", "ca-only", "none")
TLS_VERSIONS = ("1.2", "1.3")
API_READS = ("open", "token")
REPAIR_TTLS = ("compare", "ignore")
DYNOMITE_CONSISTENCIES = ("DC_ONE", "DC_QUORUM", "DC_SAFE_QUORUM")


def _consistency(value: Any) -> str | None:
    if value in (None, ""):
        return None
    return _choice(*DYNOMITE_CONSISTENCIES)(str(value).upper())


def _prefix(value: Any) -> str:
    text = _str(value)
    if len(text) < 3 or any(ch in text for ch in "*?[]"):
        raise ValueError(
            f"the probe prefix must be ≥ 3 characters without glob characters: {text!r}"
        )
    return text


def _url_list(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
        raise ValueError(f"expected a list of http:// URLs, got {value!r}")
    urls = tuple(v.strip().rstrip("/") for v in items if v.strip())
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"expected http:// or https:// URLs, got {bad[0]!r}")
    return urls


_T = TypeVar("_T")
_DECLARATION = "replag.setting"


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting's declaration: `default` as a file would write it, parsed by `parse`."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    secret: bool = False
    choices: tuple[str, ...] = ()

    @property
    def env_var(self) -> str:
        return "REPLAG_" + self.name.upper()

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


def setting(
    default: Any,
    parse: Callable[[Any], _T],
    help: str,
    *,
    secret: bool = False,
    choices: tuple[str, ...] = (),
) -> _T:
    """A `Settings` field: its parsed default, and the declaration as field metadata.
    The parser's return type must match the field's annotation (mypy checks it)."""
    declared = {"parse": parse, "default": default, "help": help, "secret": secret}
    return field(default=parse(default), metadata={_DECLARATION: {**declared, "choices": choices}})


_DEFAULT_STORE = str(Path("~/.local/state/replag/replag.sqlite"))


@dataclass(frozen=True, kw_only=True, repr=False)
class Settings:
    """Resolved values of every setting, typed; durations are float seconds."""

    prefix: str = setting(
        "replag:probe:",
        _prefix,
        "Key prefix of probe keys; replag never writes other keys when probing.",
    )
    ttl: float = setting(
        "60s",
        _positive_duration,
        "TTL set on every probe key (keys are also deleted after each run).",
    )
    timeout: float = setting(
        "5s",
        _positive_duration,
        "How long a probe waits for a key on a replica before counting it lost.",
    )
    connect_timeout: float = setting(
        "2s",
        _positive_duration,
        "Connect timeout of every Redis endpoint, and the deadline of each request's whole "
        "reply (not of each read: a server sending a byte a second misses it too).",
    )
    allow_networks: tuple[str, ...] = setting(
        "",
        _networks,
        "Networks (CIDRs, comma-separated) beyond the topology's own endpoints where replag "
        "may follow a server's answer (a Sentinel's master, CLUSTER SHARDS or MOVED nodes, "
        "INFO replication's hosts) with the endpoint's credentials and writes. Any other "
        "host named is not contacted: reported, alerted under serve, and written as a "
        "comment by topology discover. Empty: only the hosts the topology names.",
    )
    max_reply_bytes: int = setting(
        "512MB",
        _size,
        "Most bytes one reply from a Redis endpoint may announce or carry (a bulk string, or "
        "an array's elements together), checked before it is read: a server announcing more "
        "is unreachable for the run, named with what it announced. The default is Redis's "
        "own proto-max-bulk-len, so no value a default server holds is refused. Below a "
        "value's size, the scan and verification read it in smaller batches and GETRANGE "
        "pages, and a repair copies such a string in pages; a repair that needs a DUMP "
        "passing it is that key's error.",
    )
    max_reply_elements: int = setting(
        1_000_000,
        _positive_int,
        "Most elements one reply may announce, all its arrays, sets and maps together "
        "(replag asks for pages of scan_count or repair_page_elements).",
    )
    max_reply_depth: int = setting(
        16, _positive_int, "Most levels of arrays within arrays one reply may nest."
    )
    max_held_bytes: int = setting(
        "512MB",
        _size,
        "Most bytes of replies from one server that replag's connections to it hold at "
        "once in one process (received, not yet read whole), all together: each reply "
        "may pass max_reply_bytes, not every connection's at once. A connection taking "
        "the total past it is closed, naming the server, the command and this setting.",
    )
    max_probe_value_bytes: int = setting(
        "1KB",
        _size,
        "Most bytes of one probe key's value (a timestamp, the region, the run and the "
        "key's number; a region's name must leave room). A replica answering a probe's "
        "poll (an MGET of N probe keys) with more than N such values is refused, naming "
        "the server, MGET and this setting, and its probe fails.",
    )
    max_reply_refusals: int = setting(
        1000,
        _positive_int,
        "Most replies of one server one scan refuses at max_reply_bytes and reads again in "
        "smaller pieces (a batch of big values in halves, a big string in pages); past it "
        "the scan ends, naming the server, the command and this setting (a server that "
        "announces more than its values hold would cost thousands of round trips per "
        "thousand keys).",
    )
    http_header_timeout: float = setting(
        "10s",
        _positive_duration,
        "serve and agent: a connection whose request has not sent all its headers within "
        "this long (of its first byte, or of connecting) is closed.",
    )
    http_keep_alive_timeout: float = setting(
        "5s",
        _positive_duration,
        "serve and agent: an HTTP connection idle between requests this long is closed.",
    )
    http_max_connections: int = setting(
        1000,
        _positive_int,
        "serve and agent: most HTTP connections (and requests in progress) at once; past "
        "it a new one is answered 503.",
    )
    max_string_bytes: int = setting(
        "4GB",
        _size,
        "Most bytes of one string value replag reads in pages (GETRANGE); a server that "
        "keeps answering full pages past it ends the read there, as that key's error.",
    )
    max_info_bytes: int = setting(
        "4MB",
        _size,
        "Most bytes an INFO (or CLUSTER NODES) answer may hold; a larger one is refused "
        "before it is parsed, naming the server.",
    )
    max_info_lines: int = setting(
        100_000, _positive_int, "Most lines an INFO (or CLUSTER NODES) answer may hold."
    )
    max_unrequested_bytes: int = setting(
        "1MB",
        _size,
        "Most bytes a connection may receive while no request waits for them (on a "
        "subscribed connection: not yet handed on); past it the connection is closed and "
        "the server named.",
    )
    max_topology_nodes: int = setting(
        10_000,
        _positive_int,
        "Most nodes one topology answer may name (CLUSTER SHARDS or SLOTS, a Sentinel's "
        "replicas or Sentinels, INFO replication's replica lines); more is refused.",
    )
    count: int = setting(200, _int, "Probe keys written per probe run.")
    rate: float = setting(
        200.0, _float, "Probe writes per second (0 = as fast as acknowledgements allow)."
    )
    mode: str = setting(
        "auto",
        _choice(*PROBE_MODES),
        "Observation: push (keyspace notifications), poll (MGET), auto (push if allowed).",
        choices=PROBE_MODES,
    )
    poll_interval: float = setting(
        "1ms", _positive_duration, "Interval between MGET rounds per replica in poll mode."
    )
    clock_error_bound: float | None = setting(
        None,
        _optional_duration,
        "Most this host's wall clock may be off true time (lag through agents adds it to "
        "error bars); unset = the kernel's maxerror (adjtimex), none if unsynchronised.",
    )
    store: str = setting(
        _DEFAULT_STORE,
        _store_location,
        "Results store (lag windows, repair runs, alert state): a SQLite file path, or "
        "postgresql://user@host:port/db (password: REPLAG_STORE_PASSWORD or "
        "REPLAG_STORE_PASSWORD_FILE; TLS: ?sslmode=verify-full&sslrootcert=…).",
    )
    store_shared: bool = setting(
        False,
        _bool,
        "Let this config share its store with other configs on purpose (`serve` and every "
        "CLI run that writes to the store record their config file in it; without this, "
        "one refuses a store another config used: two fleets' data would show as one; on a "
        "SQLite store, a claim whose config file is gone, moved or deleted, is released "
        "with a warning).",
    )
    store_hold_memory_mb: int = setting(
        256,
        _positive_int,
        "Service: megabytes of writes held in memory while the store cannot take them "
        "(PostgreSQL away, a full disk); past it the oldest spill to a file in "
        "store_spill_dir. Written back, in order, within seconds of the store's return.",
    )
    store_hold_disk_mb: int = setting(
        1024,
        _int,
        "Service: megabytes of held writes spilled to a local file past "
        "store_hold_memory_mb; past this, the oldest held in memory are dropped and counted "
        "(replag_store_dropped_writes_total). 0: no spill file.",
    )
    store_spill_dir: str = setting(
        str(Path("~/.local/state/replag/held")),
        _str,
        "Service: directory of the spill file of held writes (mode 0600, one per process, "
        "removed once written back; what it holds is lost if the process dies).",
    )
    max_p99: float | None = setting(
        None,
        _optional_duration,
        "Breach when a pair's p99 lag exceeds this (e.g. 200ms); unset = no check.",
    )
    max_loss: float | None = setting(
        0.0,
        _optional_ratio,
        "Breach when a pair's lost/sent ratio (0 to 1) exceeds this (default 0: any lost probe).",
    )
    dynomite_consistency: str | None = setting(
        None,
        _consistency,
        "Per-connection consistency for probe writes through a Dynomite client port.",
        choices=DYNOMITE_CONSISTENCIES,
    )
    probe_interval: float = setting(
        "10s", _positive_duration, "Service: time between probe rounds of every source region."
    )
    otlp_endpoint: str | None = setting(
        None,
        _optional_url,
        "Service: OTLP/HTTP endpoint (e.g. http://otel-collector:4318) the metrics and the "
        "traces of checks and repairs are exported to; unset: none. Needs the otel extra "
        "(pip install 'replag[otel]').",
    )
    otlp_interval: float = setting(
        "30s", _positive_duration, "Service: time between OTLP exports of the metrics."
    )
    lag_buckets_per_decade: int = setting(
        5,
        _lag_buckets_per_decade,
        "Service: buckets a decade of replag_lag_seconds (0.1 ms to 10 s; 1 to 48). Each is a "
        "series per replica: 5 makes 30 series, 48 makes 245 (docs/metrics.md#series-budget). "
        "Read at start.",
    )
    lease_time: float = setting(
        "20s",
        _positive_duration,
        "Service: how long an instance owns a scheduled unit (a region's probe round, "
        "replication sampling, Dynomite stats, alert evaluation) without renewing it; "
        "renewed every third of it. A dead instance's units are taken over within about "
        "1.33 times this; several `serve` on one store share the units.",
    )
    replication_interval: float = setting(
        "10s",
        _positive_duration,
        "Service: time between samples of every primary's and replica's INFO replication "
        "(bytes behind, link, resyncs, backlog headroom), besides the one each probe run takes.",
    )
    window: float = setting(
        "60s",
        _positive_duration,
        "Service: windows older than `compact_after` are merged (exactly) into one per "
        "replica per this length; also the finest step of lag series.",
    )
    compact_after: float = setting(
        "1h",
        _duration,
        "Service: age after which per-run lag windows are merged into `window`-long ones.",
    )
    retention: float = setting(
        "30d",
        _duration,
        "Service: lag windows, probe runs, Dynomite samples and alert history older "
        "than this are pruned from the store (hourly).",
    )
    check_interval: float = setting(
        "15m", _positive_duration, "Service: time between repair checks of every replica group."
    )
    auto_repair: bool = setting(
        False, _bool, "Service: run `repair run` after a check finds divergence."
    )
    api_token: str | None = setting(
        None,
        _optional_str,
        "Bearer token required by API calls that change data (a token named api_token with "
        "every scope; named tokens with narrower scopes go in [[api_tokens]]).",
        secret=True,
    )
    api_reads: str = setting(
        "open",
        _choice(*API_READS),
        "Service: open = the API's GET endpoints and /metrics answer anyone who can reach "
        "them; token = they need a bearer token (any scope: every token may read).",
        choices=API_READS,
    )
    api_max_body: int = setting(
        1 << 20,
        _positive_int,
        "Service: the largest request body (bytes) the API reads; a larger one gets 413 "
        "unread, and only after its bearer token was accepted.",
    )
    agent_max_body: int = setting(
        16 << 20,
        _positive_int,
        "`replag agent`: the largest request body (bytes) it reads (a walk's node list, "
        "keys to observe); a larger one gets 413 unread, after its bearer token.",
    )
    agent_max_write_body: int = setting(
        512 << 20,
        _positive_int,
        "`replag agent`: the largest body of a repair's write (a value's DUMP, base64), "
        "from a token with the repair scope; a larger one gets 413 unread.",
    )
    agent_watches_per_token: int = setting(
        16,
        _positive_int,
        "`replag agent`: the most lag watches one token may hold open at once (of 64 in "
        "all); another gets 429 until one is closed or ends.",
    )
    max_json_keys: int = setting(
        1000,
        _positive_int,
        "Service and agent: the most JSON object members a request body may hold (counted "
        "before parsing, as ':' bytes); more gets 413.",
    )
    allow_config_changes: bool = setting(
        False,
        _bool,
        "May replag change a server's configuration? Only ever notify-keyspace-events "
        "(CONFIG GET and SET: `replag acl` then grants both, and CONFIG GET reads "
        "passwords), to observe probes by push (mode auto) and to keep agents' trees: "
        "false = never; auto mode then polls a replica whose notifications are off.",
    )
    allow_scripts: bool = setting(
        False,
        _bool,
        "May replag run its Lua script (SCRIPT LOAD, EVALSHA) to read a batch's TTLs in "
        "a bulk refill? false = one PTTL per key instead; true also makes `replag acl` "
        "grant SCRIPT LOAD and EVALSHA, which lets the user run any Lua (it warns).",
    )
    notify_keyspace_events: str | None = setting(
        None,
        _optional_str,
        "The servers' notify-keyspace-events as you set them, declared: then trusted, never "
        "read (a least-privilege user may not CONFIG GET: it reads passwords too). Unset: "
        "a probe learns whether a replica publishes from the run's own keys (push if their "
        "events come, else poll); an agent reads them where its user may, else needs them "
        "declared (K and g$lshzxet, or KA).",
    )
    username: str | None = setting(
        None,
        _optional_str,
        "ACL user of every Redis endpoint whose URL or table names none.",
    )
    password_env: str | None = setting(
        None,
        _optional_str,
        "Environment variable holding the password of every Redis endpoint that has none of "
        "its own (Sentinels and Dynomite ports excepted).",
    )
    password_file: str | None = setting(
        None,
        _optional_str,
        "File (a mounted secret) holding the password of every Redis endpoint that has none "
        "of its own; one trailing newline is dropped.",
    )
    tls_ca: str | None = setting(
        None,
        _optional_str,
        "rediss:// endpoints: CA certificate file (PEM), or a directory of hashed CA "
        "certificates, to verify servers with (unset: the system's CAs).",
    )
    tls_cert: str | None = setting(
        None,
        _optional_str,
        "rediss:// endpoints: client certificate (PEM) to present, for servers with "
        "tls-auth-clients yes.",
    )
    tls_key: str | None = setting(
        None, _optional_str, "rediss:// endpoints: private key (PEM) of tls_cert."
    )
    tls_server_name: str | None = setting(
        None,
        _optional_str,
        "rediss:// endpoints: name sent in SNI and checked against the certificate "
        "(unset: the URL's host).",
    )
    tls_verify: str = setting(
        "full",
        _choice(*TLS_VERIFY),
        "rediss:// endpoints: full = the CA and the server's name; ca-only = the CA, any "
        "name; none = no verification (an attacker on the path can read everything).",
        choices=TLS_VERIFY,
    )
    tls_min_version: str = setting(
        "1.2",
        _choice(*TLS_VERSIONS),
        "rediss:// endpoints: lowest TLS version accepted.",
        choices=TLS_VERSIONS,
    )
    public_url: str | None = setting(
        None,
        _optional_http_url,
        "Service: the URL users reach the dashboard at (behind a proxy or load balancer), "
        "used for links in alert notifications; unset = http://HOST:PORT that serve binds.",
    )
    scan_count: int = setting(1000, _int, "SCAN COUNT hint used when scanning replicas.")
    repair_rate: float = setting(
        0.0, _float, "Repair writes per second per replica (0 = unthrottled)."
    )
    max_inflight: int = setting(
        64, _positive_int, "Maximum repair commands in flight per replica (at least 1)."
    )
    ttl_tolerance: float = setting(
        "2s",
        _positive_duration,
        "Expiry times closer than this count as equal when comparing replicas (above 0: "
        "replicas' TTLs are read moments apart, so exact equality never holds).",
    )
    repair_ttls: str = setting(
        "compare",
        _choice(*REPAIR_TTLS),
        "compare: a key whose expiry differs between replicas (beyond ttl_tolerance) is "
        "divergent, so scans read every key's TTL where a replica holds expiring keys "
        "(a third more work for the servers). ignore: only presence, type and value are "
        "compared, as RedisFullCheck does, and scans read no TTL; a repaired key still "
        "gets its winner's TTL.",
        choices=REPAIR_TTLS,
    )
    repair_settle: float = setting(
        "50ms",
        _positive_duration,
        "Repair reads each divergent key twice this far apart (one that changed is "
        "being written: rechecked later, not repaired) and re-reads every replica this long "
        "after writing, undoing the write if the winner moved. Keep it above the time a write "
        "takes to reach every replica (the p99 lag `replag probe` measures).",
    )
    repair_page_elements: int = setting(
        2000,
        _positive_int,
        "Collections (hash, set, sorted set, list, stream) with more elements than this are "
        "copied by repair in pages of `scan_count` elements into a temporary key, then swapped "
        "in under the same compare-and-copy guarantee, never with one DUMP/RESTORE: no repair "
        "command then holds a server for more than a few milliseconds. A stream with consumer "
        "groups is the exception: it is copied with one DUMP/RESTORE, which alone keeps its "
        "groups and pending entries exact.",
    )
    repair_command_timeout: float = setting(
        "5s",
        _positive_duration,
        "How long one repair or rebuild command may take (apart from connect_timeout), "
        "plus 1 s per 10 MB it carries; a command that takes longer fails naming its key, "
        "its replica and this setting.",
    )
    repair_outage_window: float = setting(
        "24h",
        _positive_duration,
        "A Dynomite group's default repair (majority) decides a key only while the probes "
        "saw at most one rack miss writes (lost probes) in this window before the run; with "
        "two or more cut off, each divergent key is a conflict for an explicit --policy.",
    )
    scan_parallel: int = setting(
        0,
        _int,
        "Replicas of a group scanned at the same time (0 = all), each in a process of "
        "its own: the client side of a scan is CPU-bound, so all at once uses the cores.",
    )
    scan_rate: float = setting(
        0.0,
        _float,
        "Keys per second read from each replica by a scan (0 = unthrottled): the CLI's "
        "checks and repairs; those `replag serve` runs use service_scan_rate.",
    )
    service_scan_rate: float = setting(
        20000.0,
        _float,
        "Service: keys per second read from each replica by the checks and repairs the "
        "service runs, scheduled or asked for through the API (0 = unthrottled). A scan at "
        "full speed takes a core of each Redis server it reads, away from their other "
        "clients.",
    )
    scan_nice: int = setting(
        10,
        _int,
        "CPU priority increment (nice) of scan processes: on a busy host they yield to "
        "the service's API and probes, and to servers on the same host (0 = as replag).",
    )
    check_memory_mb: int = setting(
        256,
        _positive_int,
        "Memory (MB) a check or repair may use for one group's scans, whatever the "
        "keyspace: each scan process keeps the keys it read in memory up to its share "
        "and spills the rest to a temporary file (see check_spill_mb), and the keys of "
        "the leaves that differ come to the check a batch at a time (at most 2 MB). "
        "Below ~64 MB the processes' own fixed size (~50 MB for 2 replicas) leaves "
        "little to share.",
    )
    check_spill_mb: int = setting(
        16384,
        _int,
        "Disk (MB) a check or repair may use for one group's spilled keys (about 17 bytes "
        "plus the name per key and replica, in $TMPDIR, in files with no name that "
        "vanish when the scan ends or is killed). A keyspace past it is not kept: the "
        "leaves that differ are read again from each replica (0: nothing spilled, and a "
        "keyspace past one chunk is read again that way).",
    )
    scan_checkpoint: float = setting(
        "30s",
        _duration,
        "How often a scan saves where it is (its cursor and tree: 512 KB per replica), "
        "so a killed check or repair resumes from there.",
    )
    # Dynomite's port conventions (Netflix's defaults): /cluster_describe names peers by
    # their peer port only, so discovery maps each node to its other ports with these.
    dynomite_peer_port: int = setting(
        8101, _int, "Dynomite peer (dnode) port that /cluster_describe lists for every node."
    )
    dynomite_client_port: int = setting(
        8102, _int, "Dynomite client port probes write through (same host as the peer port)."
    )
    dynomite_stats_port: int = setting(
        22222, _int, "Dynomite stats (admin HTTP) port serving /info and /cluster_describe."
    )
    dynomite_redis_port: int = setting(
        22122, _int, "Port of the backend Redis next to every Dynomite node."
    )
    dynomite_stats_urls: tuple[str, ...] = setting(
        (),
        _url_list,
        "Dynomite stats URLs whose /info is collected (written by topology discover).",
    )
    # Region agents (`replag agent`): tokens are the service's (api_token, [[api_tokens]]).
    agent_wait: float = setting(
        "60s",
        _positive_duration,
        "How long a check waits for a region agent's tree to become current (after a "
        "start or a rebuild) before reporting its replicas as not compared.",
    )
    agent_state_dir: str = setting(
        str(Path("~/.local/state/replag/agent")),
        _str,
        "Directory where `replag agent` saves its trees (and its audit file of writes), so "
        "a restart against unchanged data does not rescan.",
    )
    agent_token: str | None = setting(
        None,
        _optional_str,
        "Name of the [[api_tokens]] token the coordinator (probe, repair, serve) presents to "
        "region agents (unset: settings.api_token). A repair through agents needs one with "
        "the repair scope.",
    )
    agent_tls_cert: str | None = setting(
        None, _optional_str, "`replag agent`: PEM certificate to serve HTTPS with."
    )
    agent_tls_key: str | None = setting(
        None, _optional_str, "`replag agent`: PEM private key of `agent_tls_cert`."
    )
    agent_tls_client_ca: str | None = setting(
        None,
        _optional_str,
        "`replag agent`: CA file (PEM) or directory of hashed CA certificates; when set, the "
        "agent requires every client to present a certificate signed by it (mutual TLS).",
    )
    agent_tls_ca: str | None = setting(
        None,
        _optional_str,
        "CA file or directory the coordinator verifies https:// agents with (default: the "
        "system's); an agent's table may set its own tls_ca.",
    )
    agent_tls_client_cert: str | None = setting(
        None,
        _optional_str,
        "Client certificate (PEM) the coordinator presents to https:// agents that require "
        "one (agent_tls_client_ca); an agent's table may set its own tls_cert.",
    )
    agent_tls_client_key: str | None = setting(
        None, _optional_str, "Private key (PEM) of `agent_tls_client_cert`."
    )

    def replace(self, **overrides: Any) -> Settings:
        """A copy with `overrides` parsed through each setting's own parser (None = keep)."""
        from replag.errors import UsageError

        values: dict[str, Any] = {}
        for name, raw in overrides.items():
            declared = SETTINGS_BY_NAME[name]
            if raw is not None:
                try:
                    values[name] = declared.parse(raw)
                except ValueError as exc:
                    raise UsageError(f"{declared.option}: {exc}") from None
        return dataclasses.replace(self, **values)

    def public(self) -> dict[str, Any]:
        """Values safe to show: secrets are masked."""
        from replag.store.location import redact

        shown = {s.name: getattr(self, s.name) for s in SETTINGS}
        shown["store"] = redact(shown["store"])
        return {n: "***" if SETTINGS_BY_NAME[n].secret and v else v for n, v in shown.items()}

    def __repr__(self) -> str:
        return f"Settings({self.public()!r})"


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(name=f.name, **f.metadata[_DECLARATION]) for f in fields(Settings)
)
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def resolve_settings(
    table: Mapping[str, Any],
    *,
    where: str,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Resolve defaults < `table` (from a file) < environment; raise ConfigError naming the key."""
    from replag.errors import ConfigError

    environ = os.environ if environ is None else environ
    unknown = sorted(set(table) - set(SETTINGS_BY_NAME))
    if unknown:
        raise ConfigError(
            f"unknown setting {unknown[0]!r} (known: {', '.join(SETTINGS_BY_NAME)})",
            where=f"{where}: [settings]",
        )
    values: dict[str, Any] = {}
    for declared in SETTINGS:
        raw, origin = declared.default, "default"
        if declared.name in table:
            raw, origin = table[declared.name], f"{where}: settings.{declared.name}"
        if declared.env_var in environ:
            raw, origin = environ[declared.env_var], f"environment {declared.env_var}"
        try:
            values[declared.name] = declared.parse(raw)
        except ValueError as exc:
            raise ConfigError(str(exc), where=origin) from None
    return Settings(**values)


def default_settings() -> Settings:
    return resolve_settings({}, where="defaults", environ={})
