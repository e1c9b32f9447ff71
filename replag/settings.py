"""Every tunable of replag, declared once as data.

Each `Setting` has a name, a kind, a default and a help line. The TOML
`[settings]` table, `REPLAG_*` environment variables, `--help` texts and the
README's settings table all read this one list; precedence is
default < file < environment < command-line flag.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replag.durations import parse_duration_s


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected an integer, got {value!r}")
    number = int(value)
    if number < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
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


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _optional_str(value: Any) -> str | None:
    if value in (None, ""):
        return None
    return _str(value)


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


@dataclass(frozen=True, kw_only=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    secret: bool = False

    @property
    def env_var(self) -> str:
        return "REPLAG_" + self.name.upper()


_DEFAULT_STORE = str(Path("~/.local/state/replag/replag.sqlite"))

SETTINGS: tuple[Setting, ...] = (
    Setting(
        name="prefix",
        parse=_prefix,
        default="replag:probe:",
        help="Key prefix of probe keys; replag never writes other keys when probing.",
    ),
    Setting(
        name="ttl",
        parse=_positive_duration,
        default="60s",
        help="TTL set on every probe key (keys are also deleted after each run).",
    ),
    Setting(
        name="timeout",
        parse=_positive_duration,
        default="5s",
        help="How long a probe waits for a key on a replica before counting it lost.",
    ),
    Setting(
        name="connect_timeout",
        parse=_positive_duration,
        default="2s",
        help="Connect and command timeout for every Redis endpoint.",
    ),
    Setting(name="count", parse=_int, default=200, help="Probe keys written per probe run."),
    Setting(
        name="rate",
        parse=_float,
        default=200.0,
        help="Probe writes per second (0 = as fast as acknowledgements allow).",
    ),
    Setting(
        name="mode",
        parse=_choice("auto", "push", "poll"),
        default="auto",
        help="Observation: push (keyspace notifications), poll (MGET), auto (push if allowed).",
    ),
    Setting(
        name="poll_interval",
        parse=_positive_duration,
        default="1ms",
        help="Interval between MGET rounds per replica in poll mode.",
    ),
    Setting(
        name="store",
        parse=_str,
        default=_DEFAULT_STORE,
        help="Path of the SQLite results store (lag windows, repair runs, alert state).",
    ),
    Setting(
        name="max_p99",
        parse=_optional_duration,
        default=None,
        help="Breach when a pair's p99 lag exceeds this (e.g. 200ms); unset = no check.",
    ),
    Setting(
        name="max_loss",
        parse=_optional_float,
        default=0.0,
        help="Breach when a pair's lost/sent ratio exceeds this (default 0: any lost probe).",
    ),
    Setting(
        name="dynomite_consistency",
        parse=lambda v: (
            None
            if v in (None, "")
            else _choice("DC_ONE", "DC_QUORUM", "DC_SAFE_QUORUM")(str(v).upper())
        ),
        default=None,
        help="Per-connection consistency for probe writes through a Dynomite client port.",
    ),
    Setting(
        name="probe_interval",
        parse=_positive_duration,
        default="10s",
        help="Service: time between probe rounds of every source region.",
    ),
    Setting(
        name="window",
        parse=_positive_duration,
        default="60s",
        help="Service: windows older than `compact_after` are merged (exactly) into one per "
        "replica per this length; also the finest step of lag series.",
    ),
    Setting(
        name="compact_after",
        parse=_duration,
        default="1h",
        help="Service: age after which per-run lag windows are merged into `window`-long ones.",
    ),
    Setting(
        name="retention",
        parse=_duration,
        default="30d",
        help="Service: lag windows, probe runs, Dynomite samples and alert history older "
        "than this are pruned from the store (hourly).",
    ),
    Setting(
        name="check_interval",
        parse=_positive_duration,
        default="15m",
        help="Service: time between repair checks of every replica group.",
    ),
    Setting(
        name="auto_repair",
        parse=_bool,
        default=False,
        help="Service: run `repair run` after a check finds divergence.",
    ),
    Setting(
        name="api_token",
        parse=_optional_str,
        default=None,
        secret=True,
        help="Bearer token required by API calls that change data.",
    ),
    Setting(
        name="scan_count",
        parse=_int,
        default=1000,
        help="SCAN COUNT hint used when scanning replicas.",
    ),
    Setting(
        name="repair_rate",
        parse=_float,
        default=0.0,
        help="Repair writes per second per replica (0 = unthrottled).",
    ),
    Setting(
        name="max_inflight",
        parse=_int,
        default=64,
        help="Maximum repair commands in flight per replica.",
    ),
    Setting(
        name="ttl_tolerance",
        parse=_duration,
        default="2s",
        help="Expiry times closer than this count as equal when comparing replicas.",
    ),
    Setting(
        name="repair_settle",
        parse=_duration,
        default="50ms",
        help="Repair reads each divergent key twice this far apart; a key that changed "
        "in between is being written and is rechecked later, not repaired.",
    ),
    Setting(
        name="scan_parallel",
        parse=_int,
        default=1,
        help="Replicas of a group scanned at the same time (0 = all); scanning is "
        "CPU-bound on this side, so more only helps with more cores.",
    ),
    # Dynomite's port conventions (Netflix's defaults): /cluster_describe names peers by
    # their peer port only, so discovery maps each node to its other ports with these.
    Setting(
        name="dynomite_peer_port",
        parse=_int,
        default=8101,
        help="Dynomite peer (dnode) port that /cluster_describe lists for every node.",
    ),
    Setting(
        name="dynomite_client_port",
        parse=_int,
        default=8102,
        help="Dynomite client port probes write through (same host as the peer port).",
    ),
    Setting(
        name="dynomite_stats_port",
        parse=_int,
        default=22222,
        help="Dynomite stats (admin HTTP) port serving /info and /cluster_describe.",
    ),
    Setting(
        name="dynomite_redis_port",
        parse=_int,
        default=22122,
        help="Port of the backend Redis next to every Dynomite node.",
    ),
    Setting(
        name="dynomite_stats_urls",
        parse=_url_list,
        default=(),
        help="Dynomite stats URLs whose /info is collected (written by topology discover).",
    ),
)

SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


class Settings:
    """Resolved values of every `Setting`, read as attributes (`settings.ttl`)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def replace(self, **overrides: Any) -> Settings:
        """A copy with `overrides` parsed through each setting's own parser (None = keep)."""
        from replag.errors import UsageError

        values = dict(self._values)
        for name, raw in overrides.items():
            if raw is not None:
                try:
                    values[name] = SETTINGS_BY_NAME[name].parse(raw)
                except ValueError as exc:
                    raise UsageError(f"--{name.replace('_', '-')}: {exc}") from None
        return Settings(values)

    def public(self) -> dict[str, Any]:
        """Values safe to show: secrets are masked."""
        return {
            s.name: ("***" if s.secret and self._values[s.name] else self._values[s.name])
            for s in SETTINGS
        }

    def __repr__(self) -> str:
        return f"Settings({self.public()!r})"


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
    for setting in SETTINGS:
        raw, origin = setting.default, "default"
        if setting.name in table:
            raw, origin = table[setting.name], f"{where}: settings.{setting.name}"
        if setting.env_var in environ:
            raw, origin = environ[setting.env_var], f"environment {setting.env_var}"
        try:
            values[setting.name] = setting.parse(raw)
        except ValueError as exc:
            raise ConfigError(str(exc), where=origin) from None
    return Settings(values)


def default_settings() -> Settings:
    return resolve_settings({}, where="defaults", environ={})
