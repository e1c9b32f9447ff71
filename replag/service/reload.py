"""Reloading the configuration under a running service: on SIGHUP, or when the file changes.

What a reload keeps: everything measured (the lag windows, in the store and the
index, are keyed by region and replica, not by unit) and the alert state (in the
store, keyed by fingerprint), and the units whose part of the configuration did
not change, which run on undisturbed (a probe round under way is not cut short).
A removed region's or group's unit stops (its lease released, its gauges no
longer exported); an added one starts; a changed one restarts with its new
definition. A new configuration that does not load, or that changes what cannot
change under a running process (`store`), is refused in one line and the one
running goes on. The log says what changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replag.background import cancel_and_wait
from replag.config import Config, load_config
from replag.errors import ConfigError, ReplagError
from replag.probes.targets import observed_replicas

if TYPE_CHECKING:
    from replag.service.wiring import ReplagService

log = logging.getLogger("replag.service")

# Settings a running process cannot take over: a restart applies them.
RESTART_ONLY = ("store",)
WATCH_EVERY_S = 2.0


@dataclass
class ConfigChange:
    """What differs between two configurations, by name."""

    regions: dict[str, list[str]] = field(default_factory=dict)  # added/removed/changed
    groups: dict[str, list[str]] = field(default_factory=dict)
    settings: list[str] = field(default_factory=list)
    alerts: bool = False
    tokens: bool = False

    @property
    def empty(self) -> bool:
        lists = [*self.regions.values(), *self.groups.values(), self.settings]
        return not any(lists) and not self.alerts and not self.tokens

    def summary(self) -> str:
        parts = []
        for what, changes in (("regions", self.regions), ("groups", self.groups)):
            shown = [f"{kind} {', '.join(names)}" for kind, names in changes.items() if names]
            if shown:
                parts.append(f"{what}: {'; '.join(shown)}")
        if self.settings:
            parts.append(f"settings: {', '.join(self.settings)}")
        if self.alerts:
            parts.append("alert rules and sinks")
        if self.tokens:
            parts.append("API tokens")
        return "; ".join(parts) or "nothing"


def _by_name(items: Any) -> dict[str, Any]:
    return {i.name: i for i in items}


def _compare(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[str]]:
    return {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "changed": sorted(n for n in old.keys() & new.keys() if old[n] != new[n]),
    }


def config_change(old: Config, new: Config) -> ConfigChange:
    old_settings, new_settings = dataclasses.asdict(old.settings), dataclasses.asdict(new.settings)
    return ConfigChange(
        regions=_compare(
            {n: r.to_dict() for n, r in _by_name(old.topology.regions).items()},
            {n: r.to_dict() for n, r in _by_name(new.topology.regions).items()},
        ),
        groups=_compare(
            {n: g.to_dict() for n, g in _by_name(old.topology.groups).items()},
            {n: g.to_dict() for n, g in _by_name(new.topology.groups).items()},
        ),
        settings=sorted(k for k in new_settings if old_settings.get(k) != new_settings[k]),
        alerts=old.alerts != new.alerts,
        tokens=old.api_tokens != new.api_tokens,
    )


def refused_change(change: ConfigChange) -> str | None:
    """Why this change cannot be applied to a running process, None if it can."""
    fixed = [name for name in RESTART_ONLY if name in change.settings]
    if fixed:
        return f"settings {', '.join(fixed)} cannot change under a running serve: restart it"
    return None


def probe_unchanged(old: Config, new: Config, source: str) -> bool:
    """Whether `source`'s probe round may run on as it is under `new`."""
    if dataclasses.asdict(old.settings) != dataclasses.asdict(new.settings):
        return False
    try:
        before, after = old.topology.region(source), new.topology.region(source)
    except (KeyError, ReplagError):
        return False
    return before.to_dict() == after.to_dict() and observed_replicas(
        old.topology, before
    ) == observed_replicas(new.topology, after)


class ConfigReloader:
    """Reloads `service`'s configuration file on SIGHUP and when it changes on disk."""

    def __init__(self, service: ReplagService, path: Path) -> None:
        self.service = service
        self.path = path
        self._stamp = self._stat()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._signal = False
        self._pending: set[asyncio.Task[bool]] = set()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def start(self) -> None:
        """On the running loop: watch the file; take SIGHUP where signals can be had."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            # Only the main thread may take signals (tests run servers in threads).
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
            self._signal = True
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        if self._signal:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            await cancel_and_wait(self._task)

    def _on_sighup(self) -> None:
        log.info("SIGHUP: reloading %s", self.path)
        task = asyncio.ensure_future(self.reload())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            stamp = self._stat()
            if stamp is not None and stamp != self._stamp:
                log.info("%s changed: reloading it", self.path)
                await self.reload()

    async def reload(self) -> bool:
        """Load the file and apply it; False (logged in one line) when it is refused."""
        async with self._lock:
            self._stamp = self._stat()
            try:
                new = await asyncio.to_thread(load_config, self.path)
            except ConfigError as exc:
                log.error("configuration reload refused, the previous one runs on: %s", exc)
                return False
            change = config_change(self.service.config, new)
            if change.empty:
                log.info("configuration reloaded from %s: nothing changed", self.path)
                return True
            refusal = refused_change(change)
            if refusal is not None:
                log.error(
                    "configuration reload refused, the previous one runs on: %s: %s",
                    self.path,
                    refusal,
                )
                return False
            await self.service.apply_config(new)
            log.info("configuration reloaded from %s: %s", self.path, change.summary())
            return True
