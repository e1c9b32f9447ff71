// replag dashboard: fetches the JSON API and draws the matrix and charts as SVG (no libraries).
"use strict";

const REFRESH_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";
const RANGE_STEP = { "15m": "10s", "1h": "30s", "6h": "2m", "24h": "6m", "7d": "42m" };
const state = { range: "1h", focus: null, thresholds: { warning: 100, critical: 500 } };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

function fmtMs(v) {
  if (v === null || v === undefined) return "–";
  if (v < 10) return v.toFixed(2);
  if (v < 1000) return v.toFixed(1);
  return (v / 1000).toFixed(2) + " s";
}

function unit(v) { return v !== null && v !== undefined && v < 1000 ? "ms" : ""; }

function fmtTime(ns, withDate, withSeconds = false) {
  const d = new Date(ns / 1e6);
  const parts = { hour: "2-digit", minute: "2-digit", hour12: false };
  if (withSeconds) parts.second = "2-digit";
  const hm = d.toLocaleTimeString([], parts);
  return withDate ? `${d.toLocaleDateString([], { month: "short", day: "numeric" })} ${hm}` : hm;
}

function ago(ns) {
  if (!ns) return "never";
  const s = Math.max(0, (Date.now() - ns / 1e6) / 1000);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function severity(p99) {
  if (p99 === null || p99 === undefined) return "none";
  if (p99 >= state.thresholds.critical) return "critical";
  if (p99 >= state.thresholds.warning) return "warning";
  return "ok";
}

// --- matrix ----------------------------------------------------------------

function drawMatrix(data) {
  state.thresholds = data.thresholds_ms;
  const legend = document.getElementById("legend");
  legend.replaceChildren(
    el("span", {}, el("span", { class: "swatch", style: "background:var(--ok)" }), `< ${fmtMs(data.thresholds_ms.warning)} ms`),
    el("span", {}, el("span", { class: "swatch", style: "background:var(--warn)" }), `≥ ${fmtMs(data.thresholds_ms.warning)} ms`),
    el("span", {}, el("span", { class: "swatch", style: "background:var(--crit)" }), `≥ ${fmtMs(data.thresholds_ms.critical)} ms`),
  );
  const host = document.getElementById("matrix");
  if (!data.cells.length) {
    host.replaceChildren(el("p", { class: "empty" }, "No lag windows in this range yet."));
    return;
  }
  const cells = new Map(data.cells.map((c) => [`${c.source}→${c.target}`, c]));
  const sources = data.regions.filter((r) => data.cells.some((c) => c.source === r));
  const targets = data.regions.filter((r) => data.cells.some((c) => c.target === r));
  const head = el("tr", {}, el("th", { class: "row" }, "source ╲ target"), ...targets.map((t) => el("th", {}, t)));
  const rows = sources.map((s) => el("tr", {}, el("th", { class: "row" }, s), ...targets.map((t) => {
    const c = cells.get(`${s}→${t}`);
    if (!c) return el("td", { class: s === t ? "cell self" : "cell sev-none" }, s === t ? "" : "–");
    const sev = severity(c.p99_ms);
    const loss = c.sent ? `${(100 * c.loss_ratio).toFixed(c.loss_ratio ? 2 : 0)}% lost` : "no probes";
    return el("td", {
      class: `cell sev-${sev}`, "data-source": s, "data-target": t, "data-p99": c.p99_ms ?? "",
      title: `${s} → ${t}\np50 ${fmtMs(c.p50_ms)} ms · p99 ${fmtMs(c.p99_ms)} ms · max ${fmtMs(c.max_ms)} ms\n${c.seen}/${c.sent} seen`,
      onclick: () => focusPair(s, t),
    },
      el("div", { class: "p99" }, fmtMs(c.p99_ms), el("span", { class: "unit" }, unit(c.p99_ms))),
      el("div", { class: "sub" }, `p50 ${fmtMs(c.p50_ms)} · ${loss}`));
  })));
  host.replaceChildren(el("table", { class: "matrix", id: "matrix-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

function focusPair(source, target) {
  state.focus = `${source}→${target}`;
  for (const card of document.querySelectorAll(".chart-card")) {
    const on = card.dataset.pair === state.focus;
    card.classList.toggle("focus", on);
    if (on) card.scrollIntoView({ behavior: "smooth", block: "center" });
  }
}

// --- charts ----------------------------------------------------------------

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function drawChart(series, sinceNs, untilNs) {
  const W = 560, H = 170, L = 46, R = 10, T = 10, B = 22;
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
    "data-points": series.points.length });
  const pts = series.points.filter((p) => p.p99_ms !== null);
  const yMax = niceMax(Math.max(...pts.map((p) => p.p99_ms), 0) * 1.1);
  const step = series.step_s * 1e9;
  const x = (ns) => L + ((ns - sinceNs) / Math.max(1, untilNs - sinceNs)) * (W - L - R);
  const y = (ms) => T + (1 - Math.min(ms, yMax) / yMax) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    root.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    const label = svg("text", { class: "axis", x: L - 6, y: y(v) + 3, "text-anchor": "end" });
    label.textContent = fmtMs(v);
    root.append(label);
  }
  const withDate = untilNs - sinceNs > 86400e9;
  const withSeconds = untilNs - sinceNs < 600e9;  // ticks a minute or less apart
  for (let i = 0; i <= 4; i++) {
    const t = sinceNs + ((untilNs - sinceNs) * i) / 4;
    const label = svg("text", { class: "axis", x: x(t), y: H - 6, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" });
    label.textContent = fmtTime(t, withDate, withSeconds);
    root.append(label);
  }
  if (pts.length) {
    const mid = (p) => x(p.t_ns + step / 2);
    const line = (key) => pts.map((p, i) => `${i ? "L" : "M"}${mid(p).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
    root.append(svg("path", { class: "area-p99", d: `${line("p99_ms")}L${mid(pts[pts.length - 1]).toFixed(1)},${y(0)}L${mid(pts[0]).toFixed(1)},${y(0)}Z` }));
    root.append(svg("path", { class: "line-p50", d: line("p50_ms") }));
    root.append(svg("path", { class: "line-p99", d: line("p99_ms") }));
    if (pts.length === 1) {
      root.append(svg("circle", { cx: mid(pts[0]), cy: y(pts[0].p99_ms), r: 3, fill: "var(--p99)" }));
      root.append(svg("circle", { cx: mid(pts[0]), cy: y(pts[0].p50_ms), r: 3, fill: "var(--p50)" }));
    }
    const hover = svg("line", { class: "hover", y1: T, y2: H - B, visibility: "hidden" });
    root.append(hover);
    root.addEventListener("mousemove", (ev) => {
      const box = root.getBoundingClientRect();
      const px = ((ev.clientX - box.left) / box.width) * W;
      let best = pts[0];
      for (const p of pts) if (Math.abs(mid(p) - px) < Math.abs(mid(best) - px)) best = p;
      hover.setAttribute("x1", mid(best)); hover.setAttribute("x2", mid(best));
      hover.setAttribute("visibility", "visible");
      showTip(ev, `${fmtTime(best.t_ns, withDate)}<br>p50 ${fmtMs(best.p50_ms)} ms · p99 ${fmtMs(best.p99_ms)} ms<br>` +
        `max ${fmtMs(best.max_ms)} ms · lost ${best.lost}/${best.sent}`);
    });
    root.addEventListener("mouseleave", () => { hover.setAttribute("visibility", "hidden"); hideTip(); });
  }
  return root;
}

const tip = el("div", { class: "tip" });
document.body.append(tip);
function showTip(ev, html) { tip.innerHTML = html; tip.style.display = "block"; tip.style.left = `${ev.clientX + 12}px`; tip.style.top = `${ev.clientY + 12}px`; }
function hideTip() { tip.style.display = "none"; }

// A pair measured for less than the chosen range is drawn from its first window,
// not squeezed against the right edge of an empty axis.
function chartStart(series) {
  if (!series.points.length) return series.since_ns;
  return Math.max(series.since_ns, series.points[0].t_ns - series.step_s * 1e9);
}

async function drawCharts(pairs) {
  const host = document.getElementById("charts");
  if (!pairs.length) { host.replaceChildren(el("p", { class: "empty" }, "No series yet.")); return; }
  const step = RANGE_STEP[state.range];
  const all = await Promise.all(pairs.map(([s, t]) => getJSON(
    `/api/v1/lag/series?source=${encodeURIComponent(s)}&target=${encodeURIComponent(t)}&since=${state.range}&step=${step}`)));
  host.replaceChildren(...all.map((series) => {
    const last = series.points.length ? series.points[series.points.length - 1] : null;
    const pair = `${series.source}→${series.target}`;
    return el("div", { class: `chart-card${state.focus === pair ? " focus" : ""}`, "data-pair": pair },
      el("div", { class: "chart-title" }, el("strong", {}, `${series.source} → ${series.target}`),
        el("span", { class: "now" }, last ? `latest p99 ${fmtMs(last.p99_ms)} ms · p50 ${fmtMs(last.p50_ms)} ms` : "no data")),
      drawChart(series, chartStart(series), series.until_ns));
  }));
}

// --- alerts and repairs ------------------------------------------------------

function drawAlerts(data) {
  const host = document.getElementById("alerts");
  const failing = data.sinks.filter((s) => s.last_status === "failed");
  document.getElementById("sinks-summary").textContent = data.sinks.length
    ? `${data.sinks.length} sink(s)${failing.length ? ` · ${failing.length} failing: ${failing.map((s) => s.name).join(", ")}` : " · delivering"}`
    : "no sinks configured";
  if (!data.active.length) { host.replaceChildren(el("p", { class: "empty" }, "No active alerts.")); return; }
  host.replaceChildren(el("table", { class: "list" },
    el("thead", {}, el("tr", {}, el("th", {}, "severity"), el("th", {}, "state"), el("th", {}, "alert"), el("th", {}, "since"))),
    el("tbody", {}, ...data.active.map((a) => el("tr", {},
      el("td", {}, el("span", { class: `badge badge-${a.labels.severity || "warning"}` }, a.labels.severity || "warning")),
      el("td", {}, el("span", { class: `badge badge-${a.status}` }, a.status)),
      el("td", {}, el("strong", {}, a.rule), el("div", { class: "muted" }, a.summary)),
      el("td", {}, ago(a.fired_ns || a.active_since_ns)))))));
}

function drawRepairs(data) {
  const host = document.getElementById("repairs");
  const rows = [...data.jobs.filter((j) => j.state === "running"), ...data.runs].slice(0, 12);
  if (!rows.length) {
    host.replaceChildren(el("p", { class: "empty" }, "No repair runs yet."));
    return;
  }
  host.replaceChildren(el("table", { class: "list" },
    el("thead", {}, el("tr", {}, el("th", {}, "run"), el("th", {}, "group"), el("th", {}, "kind"), el("th", {}, "divergent"), el("th", {}, "state"), el("th", {}, "started"))),
    el("tbody", {}, ...rows.map((r) => {
      const report = r.report || {};
      const state = r.state || r.status || "running";
      const divergent = r.divergent ?? report.divergent ?? "–";
      const started = r.started_ns || (r.started ? r.started * 1e9 : 0);
      r.group = r.group || report.group || (r.params || {}).group;
      return el("tr", {},
        el("td", {}, el("code", {}, r.run_id || r.job_id || "–")),
        el("td", {}, r.group || "all"), el("td", {}, r.action || r.kind || r.mode || "–"),
        el("td", {}, divergent === 0 ? el("span", { class: "badge badge-clean" }, "0") : divergent === "–" ? "–" : el("span", { class: "badge badge-divergent" }, String(divergent))),
        el("td", {}, el("span", { class: `badge badge-${state}` }, state)),
        el("td", {}, ago(started)));
    }))));
}

// --- Dynomite ----------------------------------------------------------------

function fmtUs(v) {
  if (v === null || v === undefined) return "–";
  return v < 1000 ? `${v} µs` : `${fmtMs(v / 1000)} ms`;
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
  const maxZone = niceMax(Math.max(0, ...data.nodes.map((n) => n.cross_zone_latency_p99_us || 0)));
  const sum = (a, b) => (a ?? 0) + (b ?? 0);
  const stateBadge = (finding, error) => el("span", { class: `badge badge-${error ? "failed" : finding ? "critical" : "ok"}` },
    error ? "unreachable" : finding ? "dropping" : "ok");
  const rows = data.nodes.map((n) => {
    const finding = dropping.get(n.node), error = failing.get(n.node);
    const dropped = sum(n.peer_dropped_requests, n.remote_peer_dropped_requests);
    const timedOut = sum(n.peer_timedout_requests, n.remote_peer_timedout_requests);
    return el("tr", { "data-node": n.node, "data-dropped": dropped },
      el("td", {}, el("strong", {}, `${n.dc} / ${n.rack}`), el("div", { class: "node" }, n.node),
        ...(finding ? [el("div", { class: "message" }, `${finding.link_failures ? `${finding.link_failures} peer link failures, ` : ""}+${finding.dropped} dropped in the last ${data.window_s < 120 ? `${data.window_s} s` : `${Math.round(data.window_s / 60)} min`}: ${finding.message}`)] : []),
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

function drawStatus(health) {
  const node = document.getElementById("status");
  const probes = Object.values(health.probes);
  const failing = probes.filter((p) => p.error || p.unreachable.length);
  const last = Math.max(0, ...probes.map((p) => p.last_success_ns || 0));
  node.className = `status ${failing.length ? "status-bad" : probes.length ? "status-ok" : "status-unknown"}`;
  node.textContent = !probes.length ? "no probe runs recorded yet" : failing.length
    ? `${failing.length} source(s) with errors · last probe ${ago(last)}`
    : `healthy · last probe ${ago(last)}`;
}

// --- refresh loop --------------------------------------------------------------

async function refresh() {
  try {
    const [matrix, health, alerts, repairs, dynomite] = await Promise.all([
      getJSON(`/api/v1/lag/matrix?since=${state.range}`), getJSON("/api/v1/health"),
      getJSON("/api/v1/alerts"), getJSON("/api/v1/repairs?limit=12"), getJSON("/api/v1/dynomite"),
    ]);
    drawMatrix(matrix);
    drawStatus(health);
    drawAlerts(alerts);
    drawRepairs(repairs);
    drawDynomite(dynomite);
    await drawCharts(matrix.cells.map((c) => [c.source, c.target]));
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
    document.body.dataset.loaded = "true";
  } catch (err) {
    const node = document.getElementById("status");
    node.className = "status status-bad";
    node.textContent = `API error: ${err.message}`;
  }
}

function selectRange(range) {
  state.range = range;
  for (const b of document.querySelectorAll("#range button")) b.classList.toggle("active", b.dataset.range === range);
}

for (const button of document.querySelectorAll("#range button")) {
  button.addEventListener("click", () => {
    selectRange(button.dataset.range);
    // Shareable: the range lives in the URL (?range=6h).
    history.replaceState(null, "", `?range=${encodeURIComponent(state.range)}`);
    refresh();
  });
}
const wanted = new URLSearchParams(location.search).get("range");
if (wanted && RANGE_STEP[wanted]) selectRange(wanted);
document.getElementById("refresh-s").textContent = String(REFRESH_MS / 1000);
refresh();
setInterval(refresh, REFRESH_MS);
