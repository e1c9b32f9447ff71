"""Pictures of the docs drawn from code as SVG: the agents-and-coordinator and HA diagrams
(deterministic: `docs_gen` writes them into docs/img/ and its test fails when stale), and
the lag plot of a `GET /api/v1/lag/series` answer (drawn by the suite from a real lab,
tests/test_docs_pictures.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
INK, MUTED, ACCENT, WAN = "#1f2933", "#616e7c", "#2563eb", "#c2410c"


@dataclass(frozen=True)
class Box:
    key: str
    x: int
    y: int
    w: int
    h: int
    title: str
    lines: tuple[str, ...] = ()
    fill: str = "#f5f7fa"

    @property
    def centre(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h / 2

    def edge_towards(self, px: float, py: float) -> tuple[float, float]:
        """Where the line from the centre to (px, py) leaves the box."""
        cx, cy = self.centre
        dx, dy = px - cx, py - cy
        if dx == dy == 0:
            return cx, cy
        scale = min(
            (self.w / 2) / abs(dx) if dx else math.inf, (self.h / 2) / abs(dy) if dy else math.inf
        )
        return cx + dx * scale, cy + dy * scale


@dataclass(frozen=True)
class Arrow:
    start: str
    end: str
    label: str = ""
    colour: str = INK
    both: bool = False
    dashed: bool = False


@dataclass(frozen=True)
class Area:
    """A labelled region behind boxes (a region, a data centre)."""

    x: int
    y: int
    w: int
    h: int
    title: str


def diagram(
    width: int, height: int, title: str, areas: Sequence[Area], boxes: Sequence[Box],
    arrows: Sequence[Arrow],
) -> str:  # fmt: skip
    by_key = {b.key: b for b in boxes}
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' "
        f"width='{width}' height='{height}' {FONT} font-size='13'>",
        f"<title>{escape(title)}</title>",
        "<defs>"
        + "".join(
            f"<marker id='head-{c[1:]}' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' "
            f"markerHeight='7' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' "
            f"fill='{c}'/></marker>"
            for c in (INK, ACCENT, WAN, MUTED)
        )
        + "</defs>",
        f"<rect width='{width}' height='{height}' fill='white'/>",
    ]
    for a in areas:
        out.append(
            f"<rect x='{a.x}' y='{a.y}' width='{a.w}' height='{a.h}' rx='10' fill='#eef2ff' "
            f"stroke='#c7d2fe'/><text x='{a.x + 12}' y='{a.y + 20}' fill='{MUTED}' "
            f"font-weight='bold'>{escape(a.title)}</text>"
        )
    for arrow in arrows:
        out.append(_arrow(by_key[arrow.start], by_key[arrow.end], arrow))
    for b in boxes:
        out.append(
            f"<rect x='{b.x}' y='{b.y}' width='{b.w}' height='{b.h}' rx='6' fill='{b.fill}' "
            f"stroke='{INK}'/><text x='{b.x + b.w / 2:g}' y='{b.y + 20}' text-anchor='middle' "
            f"font-weight='bold' fill='{INK}'>{escape(b.title)}</text>"
        )
        for i, line in enumerate(b.lines):
            out.append(
                f"<text x='{b.x + b.w / 2:g}' y='{b.y + 38 + 16 * i}' text-anchor='middle' "
                f"font-size='11.5' fill='{MUTED}'>{escape(line)}</text>"
            )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _arrow(a: Box, b: Box, arrow: Arrow) -> str:
    x1, y1 = a.edge_towards(*b.centre)
    x2, y2 = b.edge_towards(*a.centre)
    head = f"url(#head-{arrow.colour[1:]})"
    start = f" marker-start='{head}'" if arrow.both else ""
    dash = " stroke-dasharray='5 4'" if arrow.dashed else ""
    line = (
        f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{arrow.colour}' "
        f"stroke-width='1.6' marker-end='{head}'{start}{dash}/>"
    )
    if not arrow.label:
        return line
    mx, my = (x1 + x2) / 2, (y1 + y2) / 2
    width = 6.6 * len(arrow.label) + 10
    return (
        line + f"<rect x='{mx - width / 2:.1f}' y='{my - 10:.1f}' width='{width:.1f}' height='18' "
        f"rx='3' fill='white' opacity='0.9'/><text x='{mx:.1f}' y='{my + 4:.1f}' "
        f"text-anchor='middle' font-size='11.5' fill='{arrow.colour}'>{escape(arrow.label)}</text>"
    )


def agents_svg() -> str:
    """The coordinator in one region, an agent beside each region's replicas."""
    areas = [Area(20, 20, 420, 400, "region us-east"), Area(520, 20, 420, 400, "region eu-west")]
    boxes = [
        Box("serve", 40, 60, 340, 70, "replag serve (coordinator)",
            ("probes, checks, repairs, API, /metrics", "compares trees, repairs the keys"),
            fill="#dbeafe"),
        Box("store", 40, 200, 140, 60, "results store", ("SQLite or PostgreSQL",)),
        Box("agent-w", 260, 200, 150, 60, "replag agent", ("(us-east)",), fill="#dcfce7"),
        Box("primary", 145, 330, 150, 60, "Redis primary", ("us-east-1",)),
        Box("agent-e", 640, 60, 280, 70, "replag agent (eu-west)",
            ("Tictac trees of its replicas,", "current from keyspace events"), fill="#dcfce7"),
        Box("replica-1", 560, 330, 150, 60, "Redis replica", ("eu-west-1",)),
        Box("replica-2", 760, 330, 150, 60, "Redis replica", ("eu-west-2",)),
    ]  # fmt: skip
    arrows = [
        Arrow("serve", "agent-e", "trees, keys (WAN)", WAN, both=True),
        Arrow("serve", "agent-w", "trees", ACCENT, both=True),
        Arrow("serve", "store", "runs", MUTED),
        Arrow("serve", "primary", "probes", INK),
        Arrow("agent-e", "replica-1", "SCAN, events", ACCENT, both=True),
        Arrow("agent-e", "replica-2", "SCAN, events", ACCENT, both=True),
        Arrow("agent-w", "primary", "events", ACCENT, both=True),
        Arrow("primary", "replica-1", "replication", INK, dashed=True),
    ]
    return diagram(960, 440, "replag: agents and the coordinator", areas, boxes, arrows)


def ha_svg() -> str:
    """Several `serve` instances sharing one PostgreSQL store through leases."""
    areas = [Area(20, 20, 920, 150, "replag serve instances (Deployment, 2 or more)")]
    boxes = [
        Box(
            "a",
            50,
            60,
            260,
            90,
            "serve A",
            ("leases: probe us-east, alerts", "check slots 0, 2"),
            fill="#dbeafe",
        ),
        Box(
            "b",
            350,
            60,
            260,
            90,
            "serve B",
            ("leases: probe eu-west, replication", "check slots 1, 3"),
            fill="#dbeafe",
        ),
        Box(
            "c",
            650,
            60,
            260,
            90,
            "serve C (standby share)",
            ("takes over a lease within", "about 1.33 x lease_time"),
            fill="#dbeafe",
        ),
        Box(
            "pg",
            330,
            250,
            300,
            80,
            "PostgreSQL store",
            ("leases, job claims (SKIP LOCKED),", "windows, runs, alert state"),
        ),
        Box("redis", 40, 250, 220, 80, "Redis regions", ("probed, sampled, checked",)),
        Box("prom", 700, 250, 220, 80, "Prometheus", ("scrapes every instance", "/metrics")),
        Box("am", 700, 380, 220, 60, "Alertmanager / hooks", ("one notification per change",)),
    ]
    arrows = [
        Arrow("a", "pg", "renew every lease_time/3", ACCENT, both=True),
        Arrow("b", "pg", "", ACCENT, both=True),
        Arrow("c", "pg", "", ACCENT, both=True),
        Arrow("a", "redis", "what A holds", INK),
        Arrow("prom", "c", "scrape", MUTED),
        Arrow("prom", "am", "alerts", WAN),
    ]
    return diagram(960, 460, "replag: several instances, one store", areas, boxes, arrows)


def lag_plot_svg(
    series: Iterable[dict[str, Any]], *, title: str, marks: Sequence[tuple[float, str]] = ()
) -> str:
    """p50/p99 lag and lost probes over time from `/api/v1/lag/series` points (t_ns, p50_ms,
    p99_ms, lost); `marks` are (t_ns, label) lines, e.g. a partition and its heal."""
    points = list(series)
    width, height, left, right, top, bottom = 900, 320, 70, 20, 40, 50
    t0 = float(min(p["t_ns"] for p in points))
    t1 = float(max(p["t_ns"] for p in points))
    span = max(t1 - t0, 1.0)
    values = [float(p[k]) for p in points for k in ("p50_ms", "p99_ms") if p.get(k)]
    top_ms = max(values or [1.0]) * 1.15

    def x(t_ns: float) -> float:
        return left + (t_ns - t0) / span * (width - left - right)

    def y(ms: float) -> float:
        return top + (1 - ms / top_ms) * (height - top - bottom)

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' "
        f"width='{width}' height='{height}' {FONT} font-size='12'>",
        f"<title>{escape(title)}</title><rect width='{width}' height='{height}' fill='white'/>",
        f"<text x='{left}' y='24' font-weight='bold' fill='{INK}'>{escape(title)}</text>",
    ]
    for i in range(5):
        ms = top_ms * i / 4
        out.append(
            f"<line x1='{left}' x2='{width - right}' y1='{y(ms):.1f}' y2='{y(ms):.1f}' "
            f"stroke='#e4e7eb'/><text x='{left - 6}' y='{y(ms) + 4:.1f}' text-anchor='end' "
            f"fill='{MUTED}'>{ms:.3g} ms</text>"
        )
    for p in points:
        if p.get("lost"):
            out.append(
                f"<rect x='{x(p['t_ns']) - 2:.1f}' y='{top}' width='4' "
                f"height='{height - top - bottom}' fill='#fecaca'/>"
            )
    for key, colour in (("p50_ms", ACCENT), ("p99_ms", WAN)):
        path = " ".join(
            f"{'M' if i == 0 else 'L'}{x(p['t_ns']):.1f},{y(p[key]):.1f}"
            for i, p in enumerate(q for q in points if q.get(key) is not None)
        )
        if path:
            out.append(f"<path d='{path}' fill='none' stroke='{colour}' stroke-width='1.8'/>")
    for t_ns, label in marks:
        out.append(
            f"<line x1='{x(t_ns):.1f}' x2='{x(t_ns):.1f}' y1='{top}' y2='{height - bottom}' "
            f"stroke='{INK}' stroke-dasharray='4 3'/><text x='{x(t_ns) + 4:.1f}' "
            f"y='{top + 14}' fill='{INK}'>{escape(label)}</text>"
        )
    seconds = span / 1e9
    for i in range(5):
        t = t0 + span * i / 4
        out.append(
            f"<text x='{x(t):.1f}' y='{height - bottom + 18}' text-anchor='middle' "
            f"fill='{MUTED}'>{seconds * i / 4:.0f} s</text>"
        )
    legend = ((ACCENT, "p50"), (WAN, "p99"), ("#fecaca", "probes lost"))
    for i, (colour, name) in enumerate(legend):
        lx = width - right - 300 + i * 100
        out.append(
            f"<rect x='{lx}' y='14' width='14' height='10' fill='{colour}'/>"
            f"<text x='{lx + 20}' y='24' fill='{INK}'>{name}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def diagrams() -> dict[str, str]:
    """File name under docs/img → its SVG."""
    return {"agents.svg": agents_svg(), "ha.svg": ha_svg()}
