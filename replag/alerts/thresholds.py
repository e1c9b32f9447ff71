"""Colour bands of one replica (or region pair), from the alert rules that cover it.

The matrix colours a replica by its p99 lag against the `lag_p99` rules whose
source/target/replica filters match it, and by its loss ratio against the
matching `probe_loss` rules: a rule of severity critical sets the critical
band, any other the warning band; the lowest threshold wins. Without rules the
settings (`max_p99`, `max_loss`) and then defaults apply. A replica that was
sent probes and saw none has no p99 at all: it is critical. A region pair is
coloured by its merged figures against the rules covering the whole pair, and
never better than its worst replica.

A replica's backlog headroom is coloured the same way by the
`replication_headroom` rules that cover its source and region, the other way
up: under a rule's threshold is where the rule fires, and the highest
threshold wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from replag.alerts.config import AlertRule
from replag.config import Config

Colour = Literal["ok", "warning", "critical", "none"]
DEFAULT_LAG_WARNING_MS = 100.0
DEFAULT_LOSS_WARNING = 0.01  # the probe_loss rule's default threshold
DEFAULT_LOSS_CRITICAL = 0.5  # half the probes lost: the link is broken, not noisy
# Without a replication_headroom rule: amber under half the backlog left, red under a
# quarter (the rule's default threshold: a resync is near).
DEFAULT_HEADROOM_WARNING = 0.5
DEFAULT_HEADROOM_CRITICAL = 0.25


@dataclass(frozen=True, slots=True)
class Bands:
    """Values at or above `warning` are amber, at or above `critical` red."""

    warning: float
    critical: float

    def colour(self, value: float) -> Colour:
        if value >= self.critical:
            return "critical"
        return "warning" if value >= self.warning else "ok"

    def to_dict(self) -> dict[str, float]:
        return {"warning": self.warning, "critical": self.critical}


@dataclass(frozen=True, slots=True)
class FloorBands:
    """Values under `warning` are amber, under `critical` red (a floor, as headroom)."""

    warning: float
    critical: float

    def colour(self, value: float | None) -> Colour:
        if value is None:
            return "none"
        if value < self.critical:
            return "critical"
        return "warning" if value < self.warning else "ok"

    def to_dict(self) -> dict[str, float]:
        return {"warning": self.warning, "critical": self.critical}


def _thresholds(
    config: Config, kind: str, source: str | None, target: str | None, replica: str | None = None
) -> tuple[list[float], list[float]]:
    """(warning, critical) thresholds of the rules covering the pair (or its replica); with
    no pair, the rules that cover every pair (for a legend)."""

    def covers(rule: AlertRule) -> bool:
        if source is None or target is None:
            return rule.source is None and rule.target is None and rule.replica is None
        return rule.covers(source, target, replica)

    rules = [r for r in config.alerts.rules if r.kind == kind and covers(r)]
    return (
        [r.threshold for r in rules if r.severity != "critical"],
        [r.threshold for r in rules if r.severity == "critical"],
    )


def lag_bands_ms(
    config: Config, source: str | None = None, target: str | None = None, replica: str | None = None
) -> Bands:
    """p99 bands in ms for a pair or replica (without one: the rules that cover every pair)."""
    warning, critical = _thresholds(config, "lag_p99", source, target, replica)
    if config.settings.max_p99 is not None:
        warning.append(config.settings.max_p99 * 1000)
    warn = min(warning or critical or [DEFAULT_LAG_WARNING_MS])
    return Bands(warning=warn, critical=max(warn, min(critical or [warn * 5])))


def loss_bands(
    config: Config, source: str | None = None, target: str | None = None, replica: str | None = None
) -> Bands:
    """Loss-ratio bands for a pair or replica: a ratio above a probe_loss rule's threshold is
    coloured (the rule fires above it); `max_loss` counts when above 0."""
    warning, critical = _thresholds(config, "probe_loss", source, target, replica)
    if config.settings.max_loss:
        warning.append(config.settings.max_loss)
    warn = min(warning or critical or [DEFAULT_LOSS_WARNING])
    crit = max(warn, min(critical or [max(warn, DEFAULT_LOSS_CRITICAL)]))
    return Bands(warning=_above(warn), critical=_above(crit))


def headroom_bands(
    config: Config, source: str | None = None, region: str | None = None
) -> FloorBands:
    """Backlog-headroom bands (fractions of the backlog) for the replicas in `region` of
    `source`'s primary; a warning rule alone puts the red band at half its threshold."""
    warning, critical = _thresholds(config, "replication_headroom", source, region)
    if not warning and not critical:
        return FloorBands(warning=DEFAULT_HEADROOM_WARNING, critical=DEFAULT_HEADROOM_CRITICAL)
    warn = max(warning or critical)
    return FloorBands(warning=warn, critical=min(warn, max(critical or [warn / 2])))


def _above(ratio: float) -> float:
    return min(1.0, ratio + 1e-9)


COLOUR_ORDER: tuple[Colour, ...] = ("none", "ok", "warning", "critical")


def worst(colours: list[Colour]) -> Colour:
    return max(colours, key=COLOUR_ORDER.index) if colours else "none"


def pair_colour(
    config: Config,
    source: str,
    target: str,
    *,
    p99_ms: float | None,
    sent: int,
    lost: int,
    replica: str | None = None,
) -> dict[str, Any]:
    """The pair's (or replica's) colour and the bands that gave it: the worse of lag and
    loss."""
    lag = lag_bands_ms(config, source, target, replica)
    loss = loss_bands(config, source, target, replica)
    ratio = lost / sent if sent else 0.0
    colours: list[Colour] = []
    if p99_ms is not None:
        colours.append(lag.colour(p99_ms))
    elif sent:
        colours.append("critical")  # probes sent, none seen: no lag figure at all
    if sent:
        colours.append(loss.colour(ratio))
    return {"colour": worst(colours), "lag_ms": lag.to_dict(), "loss": loss.to_dict()}
