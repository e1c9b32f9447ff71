// replag dashboard: fetches the JSON API and draws the matrix and charts as SVG (no libraries).
"use strict";

const REFRESH_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";
const RANGES = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
const RANGE_STEP = { "15m": "10s", "1h": "30s", "6h": "2m", "24h": "6m", "7d": "42m" };
const RANGE_MS = { "15m": 9e5, "1h": 36e5, "6h": 216e5, "24h": 864e5, "7d": 6048e5 };
const REPAIRS_PER_PAGE = 10;
const state = { range: "1h", cluster: "", focus: null, repairsPage: 0, health: null, lastSeries: [], cells: new Map(), replication: new Map() };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// --- units -------------------------------------------------------------------

// A lag with its unit: "0.84 ms", "80.9 ms", "2.24 s". Never a bare number.
function fmtMs(v) {
  if (v === null || v === undefined) return "–";
  if (v < 10) return `${v.toFixed(2)} ms`;
  if (v < 1000) return `${v.toFixed(1)} ms`;
  if (v < 10000) return `${(v / 1000).toFixed(2)} s`;
  return `${(v / 1000).toFixed(1)} s`;
}

// The number and its unit apart, for the matrix's big figure.
function splitMs(v) {
  const text = fmtMs(v);
  const at = text.lastIndexOf(" ");
  return at < 0 ? [text, ""] : [text.slice(0, at), text.slice(at + 1)];
}

function fmtPct(ratio) {
  if (!ratio) return "0%";
  if (ratio >= 0.9995) return "100%";
  const pct = 100 * ratio;
  return `${pct < 0.1 ? pct.toFixed(3) : pct < 10 ? pct.toFixed(1) : pct.toFixed(0)}%`;
}

function fmtClock(ns, withDate = false) {
  const d = new Date(ns / 1e6);
  const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hour12: false });
  return withDate ? `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${hm}` : hm;
}

function ago(ns) {
  if (!ns) return "never";
  const s = Math.max(0, (Date.now() - ns / 1e6) / 1000);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

// --- status and problems -----------------------------------------------------

// Every live instance on the store and the units it owns (leases), this one marked.
function drawInstances(health) {
  const rows = (health.instances || []).map((i) => el("tr", { "data-instance": i.instance },
    el("td", {}, i.instance, i.this ? el("span", { class: "muted" }, " (this one)") : ""),
    el("td", {}, i.owns.length ? i.owns.join(", ") : el("span", { class: "muted" }, "nothing yet"))));
  document.getElementById("instances").replaceChildren(rows.length
    ? el("table", { class: "instances" }, el("thead", {}, el("tr", {}, el("th", {}, "instance"), el("th", {}, "owns"))), el("tbody", {}, ...rows))
    : el("p", { class: "empty" }, "No instance holds a lease (schedules not running)."));
}

function drawStatus(health) {
  state.health = health;
  drawInstances(health);
  const node = document.getElementById("status");
  const probes = Object.values(health.probes);
  const last = Math.max(0, ...probes.map((p) => p.last_success_ns || 0));
  const problems = health.problems || [];
  const label = { ok: "healthy", degraded: "degraded", failing: "failing" }[health.status] || health.status;
  node.className = `status status-${probes.length || problems.length ? health.status : "unknown"}`;
  node.dataset.status = health.status;
  node.textContent = !probes.length && !problems.length ? "no probe runs recorded yet"
    : `${label}${problems.length ? ` · ${problems.length} problem${problems.length > 1 ? "s" : ""}` : ""} · last probe ${ago(last)}`;
  node.title = problems.map((p) => p.message).join("\n");
  const banner = document.getElementById("problems");
  banner.hidden = !problems.length;
  banner.className = `problems problems-${health.status}`;
  banner.replaceChildren(...problems.slice(0, 6).map((p) => el("div", { class: `problem problem-${p.severity}`, "data-kind": p.kind },
    el("span", { class: `badge badge-${p.severity}` }, p.kind.replace("_", " ")), " ", p.message)),
    ...(problems.length > 6 ? [el("div", { class: "muted" }, `and ${problems.length - 6} more`)] : []));
}

// A size with its unit: "0 B", "1.4 KiB", "12.0 MiB".
function fmtBytes(v) {
  if (v === null || v === undefined) return "–";
  const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [unit, size] of units) if (Math.abs(v) >= size) return `${(v / size).toFixed(1)} ${unit}`;
  return `${Math.round(v)} B`;
}

// --- matrix ------------------------------------------------------------------

function drawMatrix(data) {
  state.cells = new Map(data.cells.map((c) => [`${c.source}→${c.target}`, c]));
  state.replication = new Map((data.replication || []).map((r) => [`${r.source}→${r.target}`, r]));
  const bands = data.thresholds_ms, loss = data.loss_thresholds;
  document.getElementById("legend").replaceChildren(
    el("span", {}, el("span", { class: "swatch sw-ok" }), `p99 < ${fmtMs(bands.warning)}, ≤ ${fmtPct(loss.warning)} lost`),
    el("span", {}, el("span", { class: "swatch sw-warning" }), amberLegend(bands, loss)),
    el("span", {}, el("span", { class: "swatch sw-critical" }), `p99 ≥ ${fmtMs(bands.critical)}, > ${fmtPct(loss.critical)} lost, or unreachable`),
    el("span", { class: "muted", title: "Each pair is coloured by the worse of its p99 and its loss against the alert rules whose source/target cover it (hover a tile for its bands); these are the bands of the rules that cover every pair." }, "· rules per pair (hover a tile)"),
  );
  const host = document.getElementById("matrix");
  if (!data.cells.length) {
    host.replaceChildren(el("p", { class: "empty" }, "No lag windows in this range yet."));
    return;
  }
  const now = new Map(((state.health || {}).pairs || []).map((p) => [`${p.source}→${p.target}`, p]));
  const sources = data.regions.filter((r) => data.cells.some((c) => c.source === r));
  const targets = data.regions.filter((r) => data.cells.some((c) => c.target === r));
  const head = el("tr", {}, el("th", { class: "row" }, "source ╲ target"), ...targets.map((t) => el("th", {}, t)));
  const rows = sources.map((s) => el("tr", {}, el("th", { class: "row" }, s), ...targets.map((t) => {
    const c = state.cells.get(`${s}→${t}`);
    if (!c) return el("td", { class: "cell sev-none" }, "–");
    const pairNow = now.get(`${s}→${t}`);
    const [figure, unit] = c.p99_ms === null ? ["no data", ""] : splitMs(c.p99_ms);
    // A pair that saw none of its probes lost them all, whatever the windows' lost count.
    const ratio = c.sent && c.seen === 0 ? 1 : c.loss_ratio;
    const loss = c.sent ? `${fmtPct(ratio)} lost` : "no probes";
    const down = unreachableIn(s, t);
    const flag = down.length ? el("div", { class: "flag", title: down.map((u) => `${u.replica}: ${u.error}`).join("\n") },
      `unreachable: ${whyUnreachable(down[0].error)}`)
      : pairFlag(pairNow, (c.replicas || []).length);
    // The tile's colour is the pair's state now (red while it does not replicate, whatever
    // the window's figures); replicating again after an outage in the range, it says since
    // when, and takes the live colour: the window's figures (the outage's) stay beside.
    const notReplicating = pairNow && pairNow.state === "not_replicating";
    const recovered = !down.length && !notReplicating && pairNow && pairNow.recovered_ns &&
      Date.now() - pairNow.recovered_ns / 1e6 < RANGE_MS[state.range] ? pairNow.recovered_ns : null;
    const colour = down.length || notReplicating ? "critical"
      : recovered && c.colour !== "ok" ? (pairNow.state === "lossy" ? "warning" : "ok") : c.colour;
    const healed = recovered ? [el("div", { class: "recovered", title: `replicating again since ${new Date(recovered / 1e6).toISOString()}; the figures above are the last ${state.range}'s, the outage included` },
      `recovered ${ago(recovered)} · ${state.range}: ${c.colour === "ok" ? "within limits" : `was ${c.colour}`}`)] : [];
    return el("td", {
      class: `cell sev-${colour}${flag ? " now-bad" : ""}`, "data-source": s, "data-target": t, "data-p99": c.p99_ms ?? "",
      "data-loss": c.loss_ratio,
      title: `${s} → ${t} over ${state.range}\np50 ${fmtMs(c.p50_ms)} · p99 ${fmtMs(c.p99_ms)} · max ${fmtMs(c.max_ms)}\n` +
        `${c.seen}/${c.sent} probes seen (${c.lost} lost)\nbands: p99 ${fmtMs(c.lag_ms.warning)} / ${fmtMs(c.lag_ms.critical)}, ` +
        `loss > ${fmtPct(c.loss.warning)} / ${fmtPct(c.loss.critical)}`,
      onclick: () => focusPair(s, t),
    },
      el("div", { class: "p99" }, figure, el("span", { class: "unit" }, unit)),
      el("div", { class: "sub" }, `p50 ${fmtMs(c.p50_ms)} · ${loss}`), ...replicaRows(c, pairNow, down), ...replicationLine(s, t), ...(flag ? [flag] : []), ...healed);
  })));
  host.replaceChildren(el("table", { class: "matrix", id: "matrix-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

// Amber is what lies between the warning and the critical limits; where the rules put both
// at the same value there is no amber band for that figure, and the legend says so.
function amberLegend(bands, loss) {
  const parts = [];
  if (bands.warning < bands.critical) parts.push(`p99 ${fmtMs(bands.warning)} – ${fmtMs(bands.critical)}`);
  if (loss.warning < loss.critical) parts.push(`${fmtPct(loss.warning)} – ${fmtPct(loss.critical)} lost`);
  return parts.length ? parts.join(" or ") : "none (the rules' warning and critical limits are equal)";
}

// Replicas the source's latest probe could not reach in `target`, and why in a few words.
function unreachableIn(source, target) {
  const probe = ((state.health || {}).probes || {})[source];
  return ((probe && probe.unreachable) || []).filter((u) => u.region === target);
}

function whyUnreachable(error) {
  const text = String(error || "");
  if (/authentication failed|WRONGPASS|NOAUTH|invalid password|invalid username/i.test(text)) return "auth failed";
  if (/permission refused|NOPERM/i.test(text)) return "permission refused";
  if (/not a Redis server/i.test(text)) return "not Redis";
  if (/certificate|TLS|SSL/i.test(text)) return "TLS failed";
  if (/timed out/i.test(text)) return "timed out";
  return "no answer";
}

// The pair's state now; with several replicas, which of them is not replicating.
function pairFlag(pairNow, replicaCount) {
  if (!pairNow || pairNow.state === "ok") return null;
  const bad = (pairNow.replicas || []).filter((r) => r.state === pairNow.state).map((r) => r.replica);
  const which = replicaCount > 1 && bad.length && bad.length < replicaCount ? `: ${bad.join(", ")}` : "";
  return pairNow.state === "not_replicating" ? el("div", { class: "flag" }, `not replicating${which}`)
    : el("div", { class: "flag flag-soft" }, `losing probes now${which}`);
}

// A region of several replicas (Dynomite racks, a primary's replicas): one row each, in its
// own colour, so one silent replica is not averaged away by its healthy siblings.
function replicaRows(c, pairNow, down) {
  if (!c.replicas || c.replicas.length < 2) return [];
  const states = new Map(((pairNow || {}).replicas || []).map((r) => [r.replica, r.state]));
  // A replica unreachable or not replicating now is red, whatever its window's figures
  // (the tile around it is red for it): the row never says green for a stopped server.
  const gone = new Set((down || []).map((u) => u.replica));
  return [el("div", { class: "replicas" }, ...c.replicas.map((r) => {
    const bad = gone.has(r.replica) || states.get(r.replica) === "not_replicating";
    const lost = gone.has(r.replica) ? "unreachable" : states.get(r.replica) === "not_replicating" ? "not replicating"
      : r.sent ? `${fmtPct(r.seen === 0 ? 1 : r.loss_ratio)} lost` : "no probes";
    return el("div", {
      class: `replica-row sev-${bad ? "critical" : r.colour}${bad ? " now-bad" : ""}`,
      "data-replica": r.replica, "data-p99": r.p99_ms ?? "", "data-loss": r.loss_ratio, "data-now": bad ? "bad" : "ok",
      title: `${c.source} → ${c.target}, replica ${r.replica} over ${state.range}\np50 ${fmtMs(r.p50_ms)} · p99 ${fmtMs(r.p99_ms)}\n${r.seen}/${r.sent} probes seen (${r.lost} lost)`,
      onclick: (ev) => { ev.stopPropagation(); focusPair(c.source, c.target, r.replica); },
    }, el("span", { class: "name" }, r.replica), el("span", {}, r.p99_ms === null ? "no lag" : fmtMs(r.p99_ms)),
    el("span", {}, lost));
  }))];
}

// Beside the lag: the target's worst replica in bytes behind and backlog headroom (latest).
function replicationLine(source, target) {
  const r = state.replication.get(`${source}→${target}`);
  if (!r) return [];
  const headroom = r.headroom_fraction === null ? "–" : fmtPct(r.headroom_fraction);
  const low = r.headroom_colour === "critical";  // under the bands of the headroom rules
  return [el("div", {
    class: `repl${r.links_down ? " repl-down" : ""}${low ? " repl-low" : ""}`, "data-bytes-behind": r.bytes_behind ?? "",
    title: `${target}'s replicas of ${source}'s primary (latest sample): most behind ${fmtBytes(r.bytes_behind)}, ` +
      `least backlog headroom ${headroom}, ${r.links_down}/${r.replicas} link(s) down`,
  }, el("div", {}, `${fmtBytes(r.bytes_behind)} behind`),
  el("div", {}, `headroom ${headroom}${!r.links_down ? "" : r.links_down === r.replicas ? " · link down" : ` · ${r.links_down}/${r.replicas} links down`}`))];
}

function chartKey(source, target, replica) {
  return replica ? `${source}→${target}/${replica}` : `${source}→${target}`;
}

function focusPair(source, target, replica = null) {
  state.focus = chartKey(source, target, replica);
  for (const card of document.querySelectorAll(".chart-card")) {
    const on = card.dataset.pair === state.focus;
    card.classList.toggle("focus", on);
    if (on) card.scrollIntoView({ behavior: "smooth", block: "center" });
  }
}

// --- charts ------------------------------------------------------------------

// A step of 1, 2 or 5 × 10^k giving about `count` intervals up to `max`.
function niceStep(max, count) {
  const raw = max / count;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5, 10]) if (raw <= m * p) return m * p;
  return 10 * p;
}

function yAxis(maxMs) {
  const top = maxMs > 0 ? maxMs : 1;
  const step = niceStep(top, 4);
  const ticks = [];
  for (let v = 0; v <= top + step * 1e-9; v += step) ticks.push(v);
  if (ticks[ticks.length - 1] < top) ticks.push(ticks[ticks.length - 1] + step);
  const inSeconds = ticks[ticks.length - 1] >= 1000;
  const decimals = (x) => (Number.isInteger(Math.round(x * 1000) / 1000) ? 0 : x < 1 ? 2 : 1);
  const label = (v) => (inSeconds ? `${(v / 1000).toFixed(decimals(step / 1000))} s` : `${v.toFixed(decimals(step))} ms`);
  return { max: ticks[ticks.length - 1], ticks, label };
}

// "UTC", "UTC+1", "UTC-03:30": the offset of the browser's time zone, which the axes use.
function tzLabel(at = new Date()) {
  const minutes = -at.getTimezoneOffset();
  if (!minutes) return "UTC";
  const sign = minutes > 0 ? "+" : "-", abs = Math.abs(minutes);
  return `UTC${sign}${Math.floor(abs / 60)}${abs % 60 ? `:${String(abs % 60).padStart(2, "0")}` : ""}`;
}

function tzName() {
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  return zone ? `${zone} (${tzLabel()})` : tzLabel();
}

const TICK_STEPS_S = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800];

function timeTicks(sinceNs, untilNs, width) {
  const span = (untilNs - sinceNs) / 1e9;
  const wanted = Math.max(3, Math.min(8, Math.floor(width / 110)));
  const step = TICK_STEPS_S.find((s) => span / s <= wanted) || TICK_STEPS_S[TICK_STEPS_S.length - 1];
  // Aligned to local time, so a day tick falls on midnight and an hour tick on the hour.
  const offset = new Date(sinceNs / 1e6).getTimezoneOffset() * 60;
  const first = Math.ceil((sinceNs / 1e9 - offset) / step) * step + offset;
  const ticks = [];
  for (let t = first; t <= untilNs / 1e9; t += step) ticks.push(t * 1e9);
  const label = (ns) => {
    const d = new Date(ns / 1e6);
    const midnight = d.getHours() === 0 && d.getMinutes() === 0;
    if (step >= 86400) return d.toLocaleDateString([], { month: "short", day: "numeric" });
    if (midnight || (span > 86400 && ns === ticks[0])) return fmtClock(ns, true);
    return fmtClock(ns);
  };
  return { ticks, label };
}

function drawChart(series, bands, width) {
  const W = Math.max(300, Math.round(width)), H = 236, L = 62, R = 12, T = 10, B = 66;
  const plotBottom = H - B, stripTop = plotBottom + 12, stripH = 10;
  const sinceNs = series.since_ns, untilNs = series.until_ns;
  const root = svg("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-points": series.points.length });
  const step = series.step_s * 1e9;
  const pts = series.points.filter((p) => p.p99_ms !== null);
  const dataMax = Math.max(0, ...pts.map((p) => p.p99_ms));
  // Show the pair's warning limit when it is near the data, so a breach is visible as such.
  const limitShown = bands && bands.warning <= Math.max(dataMax * 2, 1);
  const axis = yAxis(Math.max(dataMax * 1.05, limitShown ? bands.warning * 1.05 : 0));
  const x = (ns) => L + ((ns - sinceNs) / Math.max(1, untilNs - sinceNs)) * (W - L - R);
  const y = (ms) => T + (1 - Math.min(ms, axis.max) / axis.max) * (plotBottom - T);
  for (const v of axis.ticks) {
    root.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    root.append(svg("text", { class: "axis", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, axis.label(v)));
  }
  const time = timeTicks(sinceNs, untilNs, W - L - R);
  for (const t of time.ticks) {
    root.append(svg("line", { class: "tick", x1: x(t), x2: x(t), y1: plotBottom, y2: stripTop + stripH + 2 }));
    root.append(svg("text", { class: "axis", x: x(t), y: H - 20, "text-anchor": "middle" }, time.label(t)));
  }
  root.append(svg("text", { class: "axis strip-label", x: L - 6, y: stripTop + stripH - 1, "text-anchor": "end" }, "loss"));
  // The times below are the browser's local time: say which.
  root.append(svg("text", { class: "axis tz", x: W - R, y: H - 4, "text-anchor": "end" }, `time (${tzLabel()})`));
  root.append(svg("rect", { class: "strip", x: L, y: stripTop, width: W - L - R, height: stripH }));
  const mid = (p) => x(p.t_ns + step / 2);
  const bucketW = Math.max(1.5, x(sinceNs + step) - x(sinceNs));
  // Buckets where probes went out and none came back: the replica did not replicate.
  for (const p of series.points) {
    if (p.sent && p.seen === 0) {
      root.append(svg("rect", { class: "blackout", x: x(p.t_ns), y: T, width: bucketW, height: plotBottom - T }));
    }
    if (p.lost) {
      const h = Math.max(1.5, stripH * (p.lost / p.sent));
      root.append(svg("rect", { class: "lossbar", x: x(p.t_ns), y: stripTop + stripH - h, width: bucketW, height: h }));
    }
  }
  const dark = series.points.filter((p) => p.sent && p.seen === 0);
  if (dark.length) {
    // Labelled inside the plot: from the first dark bucket on, or ending at the last one.
    const start = x(dark[0].t_ns), end = x(dark[dark.length - 1].t_ns) + bucketW;
    const left = start < L + (W - L - R) / 2;
    root.append(svg("text", { class: "blackout-label", x: left ? start + 4 : end - 4, y: T + 14, "text-anchor": left ? "start" : "end" },
      "no probe seen: 100% lost"));
  }
  if (limitShown) {
    root.append(svg("line", { class: "limit", x1: L, x2: W - R, y1: y(bands.warning), y2: y(bands.warning) }));
    root.append(svg("text", { class: "axis limit-label", x: L + 4, y: y(bands.warning) - 3, "text-anchor": "start" }, `limit ${fmtMs(bands.warning)}`));
  }
  if (pts.length) {
    // A gap breaks the line rather than bridging it: a bucket where every probe was lost, or
    // a stretch with no window at all (longer than the step, and than the probes' cadence).
    const all = series.points;
    const spacing = all.slice(1).map((p, i) => p.t_ns - all[i].t_ns).sort((a, b) => a - b);
    const cadence = spacing.length ? spacing[Math.floor(spacing.length / 2)] : step;
    const limitGap = Math.max(step * 1.5, cadence * 2.5);
    const breaks = new Set();
    all.forEach((p, i) => {
      if (i === 0 || p.p99_ms === null) return;
      const before = all[i - 1];
      if (before.p99_ms === null || p.t_ns - before.t_ns > limitGap) breaks.add(p.t_ns);
    });
    const starts = (p, i) => i === 0 || breaks.has(p.t_ns);
    const path = (key) => pts.map((p, i) => `${starts(p, i) ? "M" : "L"}${mid(p).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
    root.append(svg("path", { class: "line-p50", d: path("p50_ms") }));
    root.append(svg("path", { class: "line-p99", d: path("p99_ms") }));
    pts.forEach((p, i) => {
      const alone = starts(p, i) && (i === pts.length - 1 || starts(pts[i + 1], i + 1));
      if (alone) {
        root.append(svg("circle", { cx: mid(p), cy: y(p.p99_ms), r: 2.5, class: "dot-p99" }));
        root.append(svg("circle", { cx: mid(p), cy: y(p.p50_ms), r: 2.5, class: "dot-p50" }));
      }
    });
  }
  if (series.points.length) {
    const hover = svg("line", { class: "hover", y1: T, y2: plotBottom, visibility: "hidden" });
    root.append(hover);
    root.addEventListener("mousemove", (ev) => {
      const box = root.getBoundingClientRect();
      const px = ((ev.clientX - box.left) / box.width) * W;
      let best = series.points[0];
      for (const p of series.points) if (Math.abs(mid(p) - px) < Math.abs(mid(best) - px)) best = p;
      hover.setAttribute("x1", mid(best)); hover.setAttribute("x2", mid(best));
      hover.setAttribute("visibility", "visible");
      const lag = best.p99_ms === null ? "no probe seen" : `p50 ${fmtMs(best.p50_ms)} · p99 ${fmtMs(best.p99_ms)} · max ${fmtMs(best.max_ms)}`;
      showTip(ev, `${fmtClock(best.t_ns, true)}<br>${lag}<br>lost ${best.lost}/${best.sent} (${fmtPct(best.sent ? best.lost / best.sent : 0)})`);
    });
    root.addEventListener("mouseleave", () => { hover.setAttribute("visibility", "hidden"); hideTip(); });
  }
  return root;
}

const tip = el("div", { class: "tip" });
document.body.append(tip);
function showTip(ev, html) { tip.innerHTML = html; tip.style.display = "block"; tip.style.left = `${ev.clientX + 12}px`; tip.style.top = `${ev.clientY + 12}px`; }
function hideTip() { tip.style.display = "none"; }

function chartTitle(series) {
  const last = series.points.length ? series.points[series.points.length - 1] : null;
  const pair = ((state.health || {}).pairs || []).find((p) => p.source === series.source && p.target === series.target);
  const pairNow = series.replica ? ((pair || {}).replicas || []).find((r) => r.replica === series.replica) : pair;
  let now;
  // A replica's chart says what its own replica is: a sibling's outage is not its own.
  const down = unreachableIn(series.source, series.target).filter((u) => !series.replica || u.replica === series.replica);
  if (down.length) {
    now = el("span", { class: "now bad", title: down.map((u) => `${u.replica}: ${u.error}`).join("\n") },
      `unreachable: ${whyUnreachable(down[0].error)}`);
  } else if (pairNow && pairNow.state === "not_replicating") {
    now = el("span", { class: "now bad", title: "none of the latest run's probes arrived" },
      `not replicating · last seen ${pairNow.last_seen_ns ? fmtClock(pairNow.last_seen_ns) : "never"}`);
  } else if (last && last.p99_ms !== null) {
    now = el("span", { class: "now" }, `latest p99 ${fmtMs(last.p99_ms)} · p50 ${fmtMs(last.p50_ms)}`);
  } else {
    now = el("span", { class: "now" }, last ? "latest: no probe seen" : "no data in this range");
  }
  const name = `${series.source} → ${series.target}${series.replica ? ` · ${series.replica}` : ""}`;
  return el("div", { class: "chart-title" }, el("strong", {}, name), now);
}

function renderCharts() {
  const host = document.getElementById("charts");
  if (!state.lastSeries.length) { host.replaceChildren(el("p", { class: "empty" }, "No series yet.")); return; }
  const cards = state.lastSeries.map((series) => {
    const key = chartKey(series.source, series.target, series.replica);
    return el("div", { class: `chart-card${series.replica ? " chart-replica" : ""}${state.focus === key ? " focus" : ""}`, "data-pair": key }, chartTitle(series));
  });
  host.replaceChildren(...cards);
  cards.forEach((card, i) => {
    const series = state.lastSeries[i];
    const cell = state.cells.get(`${series.source}→${series.target}`);
    const own = cell && series.replica ? (cell.replicas || []).find((r) => r.replica === series.replica) : cell;
    card.append(drawChart(series, own ? own.lag_ms : null, card.clientWidth - 24));
  });
}

// One chart per pair and, where the pair has several replicas, one per replica after it.
async function drawCharts(cells) {
  const step = RANGE_STEP[state.range];
  const wanted = cells.flatMap((c) => [[c.source, c.target, null],
    ...((c.replicas || []).length > 1 ? c.replicas.map((r) => [c.source, c.target, r.replica]) : [])]);
  state.lastSeries = await Promise.all(wanted.map(([s, t, r]) => getJSON(
    `/api/v1/lag/series?source=${encodeURIComponent(s)}&target=${encodeURIComponent(t)}${r ? `&replica=${encodeURIComponent(r)}` : ""}&since=${state.range}&step=${step}`)));
  renderCharts();
}

let resizeTimer = null;
window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(renderCharts, 150); });

// --- alerts and repairs ------------------------------------------------------

function drawAlerts(data) {
  const host = document.getElementById("alerts");
  const failing = data.sinks.filter((s) => s.last_status === "failed");
  document.getElementById("sinks-summary").textContent = data.sinks.length
    ? `${data.sinks.length} sink(s)${failing.length ? ` · ${failing.length} failing: ${failing.map((s) => s.name).join(", ")}` : " · delivering"}`
    : "no sinks configured";
  if (!data.active.length) { host.replaceChildren(el("p", { class: "empty" }, "No active alerts.")); return; }
  host.replaceChildren(el("table", { class: "list", id: "alerts-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "severity"), el("th", {}, "state"), el("th", {}, "alert"), el("th", {}, "since"))),
    el("tbody", {}, ...data.active.map((a) => {
      const noData = a.status === "nodata" || a.nodata_since_ns;
      return el("tr", { "data-rule": a.rule, "data-status": a.status },
        el("td", {}, el("span", { class: `badge badge-${a.labels.severity || "warning"}` }, a.labels.severity || "warning")),
        el("td", {}, el("span", { class: `badge badge-${a.status}` }, a.status === "nodata" ? "no data" : a.status),
          ...(a.status !== "nodata" && a.nodata_since_ns ? [el("div", {}, el("span", { class: "badge badge-nodata" }, "no data"))] : [])),
        el("td", {}, el("strong", {}, a.rule), el("div", { class: "muted" }, a.summary)),
        el("td", {}, ago(a.fired_ns || a.active_since_ns), ...(noData ? [el("div", { class: "muted" }, `no data since ${fmtClock(a.nodata_since_ns, true)}`)] : [])));
    }))));
}

function drawRepairs(data) {
  const host = document.getElementById("repairs");
  const pages = Math.max(1, Math.ceil(data.total / REPAIRS_PER_PAGE));
  const running = state.repairsPage === 0 ? data.jobs.filter((j) => j.state === "running") : [];
  const rows = [...running, ...data.runs];
  if (!rows.length) {
    host.replaceChildren(el("p", { class: "empty" }, "No repair runs yet."));
    return;
  }
  const table = el("table", { class: "list", id: "repairs-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "run"), el("th", {}, "group"), el("th", {}, "kind"), el("th", {}, "divergent"), el("th", {}, "state"), el("th", {}, "started"))),
    el("tbody", {}, ...rows.map((r) => {
      const report = r.report || {};
      const runState = r.state || r.status || "running";
      const divergent = r.divergent ?? report.divergent ?? "–";
      const started = r.started_ns || (r.started ? r.started * 1e9 : 0);
      const group = r.group || report.group || (r.params || {}).group;
      return el("tr", {},
        el("td", {}, el("code", {}, r.run_id || r.job_id || "–")),
        el("td", {}, group || "all"), el("td", {}, r.action || r.kind || r.mode || "–"),
        el("td", {}, divergent === 0 ? el("span", { class: "badge badge-clean" }, "0") : divergent === "–" ? "–" : el("span", { class: "badge badge-divergent" }, String(divergent))),
        el("td", {}, el("span", { class: `badge badge-${runState}` }, runState)),
        el("td", {}, ago(started)));
    })));
  const newer = el("button", { onclick: () => turnRepairs(-1) }, "‹ newer");
  const older = el("button", { onclick: () => turnRepairs(1) }, "older ›");
  newer.disabled = state.repairsPage === 0;
  older.disabled = state.repairsPage >= pages - 1;
  const pager = el("div", { class: "pager", id: "repairs-pager" }, newer,
    el("span", { class: "muted" }, `page ${state.repairsPage + 1} of ${pages} · ${data.total} runs`), older);
  host.replaceChildren(table, pager);
}

async function turnRepairs(delta) {
  state.repairsPage = Math.max(0, state.repairsPage + delta);
  drawRepairs(await getJSON(repairsUrl()));
}

function repairsUrl() {
  return `/api/v1/repairs?limit=${REPAIRS_PER_PAGE}&offset=${state.repairsPage * REPAIRS_PER_PAGE}`;
}

// --- Dynomite ----------------------------------------------------------------

function fmtUs(v) {
  if (v === null || v === undefined) return "–";
  return v < 1000 ? `${v} µs` : fmtMs(v / 1000);
}

function latencyBar(v, max) {
  const root = svg("svg", { class: "bar", viewBox: "0 0 120 10", preserveAspectRatio: "none" });
  root.append(svg("rect", { class: "track", x: 0, y: 0, width: 120, height: 10, rx: 3 }));
  if (v) root.append(svg("rect", { class: "fill", x: 0, y: 0, width: Math.max(2, (120 * v) / max), height: 10, rx: 3 }));
  return root;
}

function drawDynomite(data) {
  const card = document.getElementById("dynomite-card");
  card.hidden = !data.nodes.length && !data.errors.length;
  if (card.hidden) return;
  const answering = data.configured - data.errors.length;
  document.getElementById("dynomite-summary").textContent = data.collected_ns
    ? `${answering}/${data.configured} node(s) answering · collected ${ago(data.collected_ns)}`
    : `${data.configured} node(s) · figures from the store`;
  const dropping = new Map(data.dropped_writes.map((f) => [f.node, f]));
  const failing = new Map(data.errors.map((e) => [e.node, e.error]));
  const maxZone = Math.max(1, ...data.nodes.map((n) => n.cross_zone_latency_p99_us || 0));
  const sum = (a, b) => (a ?? 0) + (b ?? 0);
  const stateBadge = (finding, error) => el("span", { class: `badge badge-${error ? "failed" : finding ? "critical" : "ok"}` },
    error ? "unreachable" : finding ? "dropping" : "ok");
  const rows = data.nodes.map((n) => {
    const finding = dropping.get(n.node), error = failing.get(n.node);
    const dropped = sum(n.peer_dropped_requests, n.remote_peer_dropped_requests);
    const timedOut = sum(n.peer_timedout_requests, n.remote_peer_timedout_requests);
    return el("tr", { "data-node": n.node, "data-dropped": dropped },
      el("td", {}, el("strong", {}, `${n.dc} / ${n.rack}`), el("div", { class: "node" }, n.node),
        ...(finding ? [el("div", { class: "message" }, `${finding.link_failures ? `${finding.link_failures} peer link failures, ` : ""}+${finding.dropped} dropped in the last ${data.window_s < 120 ? `${data.window_s} s` : `${Math.round(data.window_s / 60)} min`}${(finding.peers_down || []).length ? ` (peer down: ${finding.peers_down.join(", ")})` : ""}: ${finding.message}`)] : []),
        ...(error ? [el("div", { class: "message" }, error)] : [])),
      el("td", { class: `num${dropped ? " bad" : ""}`, title: `local DC ${n.peer_dropped_requests ?? "–"} · remote DCs ${n.remote_peer_dropped_requests ?? "–"}` }, String(dropped)),
      el("td", { class: "num", title: `local DC ${n.peer_timedout_requests ?? "–"} · remote DCs ${n.remote_peer_timedout_requests ?? "–"}` }, String(timedOut)),
      el("td", { class: "num" }, fmtUs(n.cross_zone_latency_p99_us), latencyBar(n.cross_zone_latency_p99_us, maxZone)),
      el("td", { class: "num" }, fmtUs(n.cross_region_rtt_p99_us)),
      el("td", { class: "num" }, `${n.peer_out_queue ?? "–"} / ${n.remote_peer_out_queue ?? "–"}`),
      el("td", {}, stateBadge(finding, error), el("div", { class: "node" }, `sampled ${ago(n.sampled_ns)}`)));
  });
  const sampled = new Set(data.nodes.map((n) => n.node));
  const errors = data.errors.filter((e) => !sampled.has(e.node)).map((e) => el("tr", { "data-node": e.node },
    el("td", {}, el("div", { class: "node" }, e.node), el("div", { class: "message" }, e.error)),
    ...[1, 2, 3, 4, 5].map(() => el("td", { class: "num" }, "–")), el("td", {}, stateBadge(null, e.error))));
  document.getElementById("dynomite").replaceChildren(el("table", { class: "list dynomite", id: "dynomite-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "DC / rack · node"), el("th", { class: "num" }, "peer dropped"),
      el("th", { class: "num" }, "peer timed out"), el("th", { class: "num" }, "cross-zone p99"),
      el("th", { class: "num" }, "cross-region RTT p99"), el("th", { class: "num" }, "out queue local / remote"),
      el("th", {}, "state"))),
    el("tbody", {}, ...rows, ...errors)));
}

// --- replication ----------------------------------------------------------------

// Bytes behind over the range (max per step), 0 at the bottom, drawn against the backlog's
// size: a few bytes behind stay a flat line, and a dashed line marks where a reconnect
// would mean a full resync once the peak goes past it.
function sparkline(points, backlog, width = 180, height = 28) {
  const root = svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}`, "data-points": points.length });
  const values = points.map((p) => p.bytes_behind_max ?? 0);
  const max = Math.max(1, backlog || 0, ...values);
  if (backlog && max > backlog) {
    const level = (height - 2 - (backlog / max) * (height - 4)).toFixed(1);
    root.append(svg("line", { class: "spark-limit", x1: 0, x2: width, y1: level, y2: level }));
  }
  if (points.length) {
    const t0 = points[0].t_ns, t1 = points[points.length - 1].t_ns || t0 + 1;
    const x = (t) => (t1 === t0 ? width : ((t - t0) / (t1 - t0)) * (width - 2) + 1);
    const y = (v) => height - 2 - (v / max) * (height - 4);
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(p.t_ns).toFixed(1)},${y(values[i]).toFixed(1)}`).join("");
    root.append(svg("path", { class: "spark-line", d }));
    points.forEach((p, i) => {
      if (p.link_up_ratio < 1) root.append(svg("rect", { class: "spark-down", x: x(p.t_ns) - 1, y: 0, width: 2, height }));
    });
  }
  const writable = points.filter((p) => p.read_only === false).length;
  root.append(svg("title", {}, `most behind per step over the range: peak ${fmtBytes(Math.max(0, ...values))}` +
    (backlog ? `; scale: the ${fmtBytes(backlog)} backlog or the peak, whichever is larger` : "") +
    (writable ? `; WRITABLE (replica-read-only no) in ${writable} ${writable === 1 ? "step" : "steps"}` : "")));
  return root;
}

// Coloured by the replication_headroom rules covering the replica (the server's bands;
// without rules amber under half the backlog left, red under a quarter: a resync is near).
const HEADROOM_CLASS = { ok: "fill-ok", warning: "fill-warn", critical: "fill-low" };

function behindOverRange(points, backlog) {
  const peak = Math.max(0, ...points.map((p) => p.bytes_behind_max ?? 0));
  return [sparkline(points, backlog), el("div", { class: "node" }, points.length ? `peak ${fmtBytes(peak)}` : "no samples yet")];
}

function headroomBar(fraction, colour, bands) {
  const root = svg("svg", { class: "bar", width: 120, height: 10 });
  root.append(svg("rect", { class: "track", x: 0, y: 0, width: 120, height: 10, rx: 3 }));
  if (fraction !== null && fraction !== undefined) {
    root.append(svg("rect", { class: `fill ${HEADROOM_CLASS[colour] ?? "fill-ok"}`, x: 0, y: 0, width: Math.max(2, 120 * fraction), height: 10, rx: 3 }));
  }
  if (bands) {
    root.append(svg("title", {}, `amber under ${fmtPct(bands.warning)} of the backlog, red under ${fmtPct(bands.critical)} (the headroom rules covering this replica)`));
  }
  return root;
}

async function drawReplication(data) {
  const card = document.getElementById("replication-card");
  card.hidden = !data.primaries.length;
  if (card.hidden) return;
  const step = RANGE_STEP[state.range];
  const series = new Map(await Promise.all(data.primaries.flatMap((p) => p.replicas.map(async (r) => [
    `${p.source}/${r.replica}`,
    (await getJSON(`/api/v1/replication/series?source=${encodeURIComponent(p.source)}&replica=${encodeURIComponent(r.replica)}&since=${state.range}&step=${step}`)).points,
  ]))));
  const events = data.failovers.length ? ` · ${data.failovers.length} failover(s) followed today` : "";
  document.getElementById("replication-summary").textContent = `sampled every ${data.interval_s} s${events}`;
  const blocks = data.primaries.map((p) => {
    const rpo = new Map(p.failover.candidates.map((c) => [c.replica, c]));
    const head = p.error
      ? el("div", { class: "message" }, `${p.source} (${p.primary}): ${p.error}`)
      : el("div", { class: "primary-line" }, el("strong", {}, `${p.source}`), ` primary ${p.primary} · writes ${p.write_rate_bps === null ? "–" : `${fmtBytes(p.write_rate_bps)}/s`}` +
        ` · backlog ${fmtBytes(p.backlog.size)} · full resyncs since its start ${p.resyncs.full ?? "–"} · read skew ${fmtMs(p.read_skew_ms)} · `,
        el("span", { class: `badge badge-${p.failover.safe ? "ok" : "critical"}`, title: p.failover.verdict },
          p.failover.safest ? `safest failover: ${p.failover.safest} (loses ${fmtBytes(p.failover.rpo_bytes)})` : "no replica can be promoted"));
    const rows = p.replicas.map((r) => {
      const c = rpo.get(r.replica) || {};
      const link = r.status === "ok" ? "up" : r.status;
      return el("tr", { "data-replica": r.replica, "data-status": r.status, "data-bytes-behind": r.bytes_behind ?? "" },
        el("td", {}, el("strong", {}, r.replica), el("div", { class: "node" }, r.region),
          ...(r.read_only === false ? [el("span", { class: "badge badge-critical", title: "replica-read-only no: clients may write to it" }, "writable")] : []),
          ...(c.last_check ? [el("div", { class: `node${c.last_check.divergent_keys ? " bad" : ""}`, "data-last-check": c.last_check.run_id },
            `${c.last_check.kind} ${ago(Date.now() * 1e6 - c.last_check.age_s * 1e9)}: ${c.last_check.divergent_keys} divergent`)] : [])),
        el("td", {}, el("span", { class: `badge badge-${r.status === "ok" ? "ok" : "critical"}` }, link),
          ...(r.link_down_s !== null ? [el("div", { class: "node" }, `down ${r.link_down_s} s`)] : []),
          ...(r.error ? [el("div", { class: "message" }, r.error)] : [])),
        el("td", { class: `num${r.bytes_behind ? " bad" : ""}` }, fmtBytes(r.bytes_behind),
          el("div", { class: "node" }, `± ${fmtBytes(r.bytes_uncertainty)}`)),
        el("td", { class: "num" }, r.backlog_headroom !== null && r.backlog_headroom < 0 ? "full resync due" :
          r.headroom_fraction === null ? "–" : fmtPct(r.headroom_fraction), headroomBar(r.headroom_fraction, r.headroom_colour, r.headroom_bands)),
        el("td", { class: "num" }, c.rpo_bytes === null || c.rpo_bytes === undefined ? "–" : fmtBytes(c.rpo_bytes),
          el("div", { class: "node" }, c.rpo_s === null || c.rpo_s === undefined ? "" : fmtMs(c.rpo_s * 1000)),
          ...(c.eligible === false ? [el("div", { class: "message passed-over" }, `passed over: ${c.reason}`)] : [])),
        el("td", {}, ...behindOverRange(series.get(`${p.source}/${r.replica}`) || [], (p.backlog || {}).size)));
    });
    return el("div", { class: "repl-primary" }, head, el("table", { class: "list replication", id: `replication-${p.source}` },
      el("thead", {}, el("tr", {}, el("th", {}, "replica"), el("th", {}, "link"), el("th", { class: "num" }, "behind"),
        el("th", { class: "num" }, "backlog headroom"), el("th", { class: "num" }, "RPO if promoted"),
        el("th", {}, `behind over ${state.range}`))),
      el("tbody", {}, ...rows)));
  });
  document.getElementById("replication").replaceChildren(...blocks);
}

// --- refresh loop --------------------------------------------------------------

async function refresh() {
  try {
    const only = state.cluster ? `cluster=${encodeURIComponent(state.cluster)}` : "";
    const [matrix, health, alerts, repairs, dynomite, replication] = await Promise.all([
      getJSON(`/api/v1/lag/matrix?since=${state.range}${only ? `&${only}` : ""}`),
      getJSON(`/api/v1/health${only ? `?${only}` : ""}`),
      getJSON(`/api/v1/alerts${only ? `?${only}` : ""}`), getJSON(repairsUrl()), getJSON("/api/v1/dynomite"),
      getJSON(`/api/v1/replication${only ? `?${only}` : ""}`),
    ]);
    drawClusters(matrix.clusters || []);
    drawStatus(health);
    drawMatrix(matrix);
    drawAlerts(alerts);
    drawRepairs(repairs);
    drawDynomite(dynomite);
    await drawReplication(replication);
    document.getElementById("range-note").textContent = `over the last ${state.range}`;
    await drawCharts(matrix.cells);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
    document.body.dataset.loaded = "true";
  } catch (err) {
    const node = document.getElementById("status");
    node.className = "status status-failing";
    node.textContent = `API error: ${err.message}`;
  }
}

// A picker when the configuration names several clusters (one service, an estate).
function drawClusters(clusters) {
  const picker = document.getElementById("cluster");
  picker.hidden = clusters.length < 2;
  const names = ["", ...clusters];
  if (picker.options.length !== names.length || names.some((n, i) => picker.options[i].value !== n)) {
    picker.replaceChildren(...names.map((n) => el("option", { value: n }, n || "all clusters")));
  }
  picker.value = state.cluster;
}

function shareView() {
  const query = new URLSearchParams({ range: state.range });
  if (state.cluster) query.set("cluster", state.cluster);
  history.replaceState(null, "", `?${query}`);
}

document.getElementById("cluster").addEventListener("change", (event) => {
  state.cluster = event.target.value;
  shareView();
  refresh();
});

function selectRange(range) {
  state.range = range;
  for (const b of document.querySelectorAll("#range button")) b.classList.toggle("active", b.dataset.range === range);
}

for (const button of document.querySelectorAll("#range button")) {
  button.addEventListener("click", () => {
    selectRange(button.dataset.range);
    // Shareable: the range (and the cluster) live in the URL (?range=6h&cluster=eu).
    shareView();
    refresh();
  });
}
// Without ?range=, a service up for less than 15 minutes (a new install) starts on 15m, so
// its few minutes of data are not squeezed into the corner of an hour.
async function start() {
  const wanted = new URLSearchParams(location.search).get("range");
  state.cluster = new URLSearchParams(location.search).get("cluster") || "";
  if (wanted && RANGES[wanted]) selectRange(wanted);
  else {
    try {
      const health = await getJSON("/api/v1/health");
      if (health.uptime_s < RANGES["15m"]) selectRange("15m");
    } catch (err) { /* refresh() reports the API error */ }
  }
  document.getElementById("refresh-s").textContent = String(REFRESH_MS / 1000);
  document.getElementById("tz").textContent = tzName();
  await refresh();
  setInterval(refresh, REFRESH_MS);
}
start();
