"""The one exception hierarchy of replag.

Every error carries where it happened (a file and key, an endpoint, an API
route) so the edge (CLI, API) can print one clear line::

    ReplagError                 exit 2 unless a subclass says otherwise
    ├── ConfigError             bad file, key or value (names file and key)
    ├── UsageError              bad command-line or API argument
    │   ├── NotFound            it names a region, group, replica or run that does not exist
    │   └── JobConflict         a check/repair of that group already runs
    ├── EndpointError           a Redis/Dynomite endpoint failed us
    │   ├── UnreachableError    connect refused / timed out / closed
    │   ├── AuthError           wrong user or password
    │   ├── MisconfiguredError  it answered, but not as configured
    │   │   ├── NotRedisError       not in RESP (wrong port?)
    │   │   ├── TlsError            certificate refused (expired, wrong name, unknown CA)
    │   │   └── PermissionRefused   NOPERM: the ACL user lacks a command, key or channel
    │   ├── KeyRefused          a server refused a command on one key (that key's error)
    │   ├── OutsideReach        a server named a host outside the topology and allow_networks
    │   ├── ReplyShapeError     a reply is not of the shape its command has
    │   └── AgentError          a region agent failed, refused, or has no current tree
    │       └── AgentTlsError       (also a TlsError) its certificate or ours was refused
    ├── LabError                the local lab could not start or stop
    ├── DiscoveryError          a topology source answered nonsense
    ├── RepairError             a repair run cannot go on (resumable)
    ├── StoreError              the results store failed (names the store, never a password)
    │   ├── StoreUnwritable     full disk, read-only file, no space on the database server
    │   │   └── StoreUnreachable    PostgreSQL away (stopped, restarting, cut off)
    │   ├── StoreDuplicate      a row with that key is stored already (a held write replayed)
    │   └── StoreDamaged        damaged pages, or not a store at all
    └── LeaseLost               a lease was taken over: work under it must stop
"""

from __future__ import annotations

# Exit codes of every command (docs: "Exit codes"; `--format nagios` maps them to Nagios's).
EXIT_OK = 0
EXIT_BREACH = 1  # a threshold breached, divergence found, no safe failover candidate
EXIT_ERROR = 2  # usage, configuration, or connection error on what the command needs
EXIT_UNREACHABLE = 3  # some replica (or agent) could not be measured; the rest was


class ReplagError(Exception):
    """Base of every error replag raises on purpose."""

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class ConfigError(ReplagError):
    """A configuration file, key or value is wrong."""


class UsageError(ReplagError):
    """A command-line option or API parameter is wrong."""


class NotFound(UsageError):
    """An argument names a region, replica group, replica or run that does not exist."""


class EndpointError(ReplagError):
    """An endpoint (Redis server, Dynomite port) failed; `where` is its redacted address."""


class UnreachableError(EndpointError):
    """Connection refused, timed out, or closed by the peer."""


class AuthError(EndpointError):
    """The endpoint refused our credentials."""


class MisconfiguredError(EndpointError):
    """The endpoint is there but not as configured: a configuration mistake, not an
    outage to measure, so a probe run stops on it (exit 2) instead of counting losses."""


class NotRedisError(MisconfiguredError):
    """The endpoint answered bytes that are not RESP: an HTTP listener, a TLS port, the
    wrong service."""


class TlsError(MisconfiguredError):
    """The TLS handshake failed: the server's certificate expired, names another host or
    is signed by a CA we do not trust, or the server refused our client certificate."""


class PermissionRefused(MisconfiguredError):
    """NOPERM: the ACL user authenticated but may not run this command, touch this key
    or subscribe to this channel (`replag acl` prints what each mode needs)."""


class KeyRefused(EndpointError):
    """A server refused a command on one key (READONLY, NOPERM, OOM, EXECABORT, a module's
    type, MOVED): that key's error, named with the replica; the run goes on."""


class OutsideReach(EndpointError):
    """A server named a host (a master, a node, a replica) that the topology does not name
    and that is outside allow_networks: it was not contacted, and got no credentials."""


class ReplyShapeError(EndpointError):
    """A reply is not of the shape its command must have (a TIME that is no pair of
    integers, an INFO that is no text): the server is named with what was expected and got."""


class AgentError(EndpointError):
    """A region agent (`replag agent`) failed us; `where` is its URL or the replica."""


class AgentTlsError(AgentError, TlsError):
    """The TLS handshake with a region agent failed (its certificate, or ours): a
    configuration mistake, like a Redis endpoint's TlsError."""


class LabError(ReplagError):
    """The local lab could not be started, inspected or stopped."""


class DiscoveryError(ReplagError):
    """A topology source (Dynomite admin port, INFO, CLUSTER) answered nonsense."""


class RepairError(ReplagError):
    """A repair run cannot go on; it stays resumable from the store."""


class JobConflict(UsageError):
    """A check or repair of the same group (or of every group) is already running."""


class StoreError(ReplagError):
    """The results store (SQLite file or PostgreSQL) failed; `where` is its redacted location."""


class StoreUnwritable(StoreError):
    """The store cannot take writes now (full disk, read-only): it may recover by itself."""


class StoreUnreachable(StoreUnwritable):
    """The store cannot be reached now (PostgreSQL stopped, restarting, or cut off): reads
    fail too, at once, until it answers again."""


class StoreDuplicate(StoreError):
    """A write would store a row whose key is there already (a held write replayed after
    its first try went through): nothing to do."""


class StoreDamaged(StoreError):
    """The store's pages are damaged (or the file is not a store): refused until repaired."""


class LeaseLost(ReplagError):
    """A lease is no longer held by this instance (expired, or taken over with a new epoch)."""
