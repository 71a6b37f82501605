// kvfabric console: polls this node's JSON API and draws the cluster.
// /api/v1/cluster every refresh_ms, /api/v1/history every sampling interval,
// /api/v1/top-prefixes and /api/v1/capacity less often. No framework: the
// DOM is rebuilt from each answer. window.kvConsole exposes the last answers
// and the plots (the browser test reads them).
"use strict";

const COLORS = ["#3b6fd8", "#d8573b", "#2a9d5b", "#9b59b6", "#e0a100", "#16a0b5", "#7f8c8d", "#c0392b"];
const state = { clusterUpdates: 0, cluster: null, history: null, prefixes: null, capacity: null, plots: {}, plotKeys: {}, tenant: "" };
window.kvConsole = state;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function bytes(n) {
  if (n == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

// Axis labels by unit: bytes in binary units, small rates with their digits.
function axisValue(unit, v) {
  if (v == null) return "";
  if (unit === "bytes") return bytes(v);
  if (unit === "ratio") return v.toFixed(2);
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (a === 0) return "0";
  return a < 0.01 ? v.toExponential(1) : String(+v.toPrecision(3));
}

function ratio(x) { return x == null ? "–" : x.toFixed(3); }

function setStatus(text, error) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = "status" + (error ? " error" : "");
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) { const e = new Error(path + ": HTTP " + r.status); e.status = r.status; throw e; }
  return r.json();
}

function tierCell(tiers) {
  const td = el("td");
  for (const t of tiers || []) {
    const pct = t.capacity_bytes ? Math.min(100, 100 * t.used_bytes / t.capacity_bytes) : 0;
    const bar = el("span", { class: "bar" }, el("i", { style: "width:" + pct.toFixed(1) + "%" }));
    td.append(el("span", { class: "tier", "data-tier": t.tier },
      t.tier + " ", bar, bytes(t.used_bytes) + " / " + bytes(t.capacity_bytes) + ", " + t.blocks + " blocks"));
  }
  return td;
}

function renderCluster(c) {
  state.cluster = c;
  state.clusterUpdates++;
  document.getElementById("served-by").textContent = "served by " + c.node_id;
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of c.nodes) {
    const hr = el("td", { class: "num hit-ratio", "data-value": n.hit_ratio == null ? "" : String(n.hit_ratio) }, ratio(n.hit_ratio));
    body.append(el("tr", { "data-node": n.node_id, "data-state": n.state },
      el("td", {}, n.node_id + (n.node_id === c.node_id ? " (this node)" : "")),
      el("td", {}, el("span", { class: "state state-" + n.state }, n.state)),
      el("td", {}, el("code", {}, n.grpc_addr)),
      hr,
      tierCell(n.tiers)));
  }
}

// One uPlot per series, one line per node, x aligned with uPlot.join.
function renderHistory(h) {
  state.history = h;
  const box = document.getElementById("plots");
  const interval = h.nodes.length ? h.nodes[0].interval_ms : 0;
  document.getElementById("history-note").textContent =
    interval ? "(each node's own ring, one sample every " + interval / 1000 + " s)" : "";
  const width = Math.max(360, Math.floor(box.clientWidth / Math.max(1, Math.floor(box.clientWidth / 440))) - 16);
  for (const s of h.series) {
    let cell = document.getElementById("plot-" + s.name);
    if (!cell) {
      cell = el("div", { class: "plot", id: "plot-" + s.name, "data-series": s.name });
      box.append(cell);
    }
    const nodes = h.nodes.filter(n => (n.values[s.name] || []).some(v => v != null));
    const points = nodes.reduce((a, n) => a + n.values[s.name].filter(v => v != null).length, 0);
    cell.setAttribute("data-points", String(points));
    const key = nodes.map(n => n.node_id).join(",");
    if (!nodes.length) {
      if (state.plots[s.name]) { state.plots[s.name].destroy(); delete state.plots[s.name]; }
      cell.replaceChildren(el("h3", {}, s.title + " (" + s.unit + ")"), el("div", { class: "empty" }, "no data on any node yet"));
      continue;
    }
    const data = uPlot.join(nodes.map(n => [n.t, n.values[s.name]]));
    const plot = state.plots[s.name];
    if (plot && state.plotKeys[s.name] === key) { plot.setData(data); continue; }
    if (plot) plot.destroy();
    cell.replaceChildren();
    state.plotKeys[s.name] = key;
    state.plots[s.name] = new uPlot({
      title: s.title + " (" + s.unit + ")", width, height: 180,
      scales: { x: { time: true }, y: s.unit === "ratio" ? { range: [0, 1] } : {} },
      axes: [{}, { size: 64, values: (u, splits) => splits.map(v => axisValue(s.unit, v)) }],
      series: [{}].concat(nodes.map((n, i) => ({ label: n.node_id, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true }))),
    }, data, cell);
  }
}

function renderPrefixes(p) {
  state.prefixes = p;
  const sel = document.getElementById("tenant");
  const have = new Set([...sel.options].map(o => o.value));
  for (const ns of p.namespaces) if (!have.has(ns)) sel.append(el("option", { value: ns }, ns));
  const body = document.querySelector("#prefixes tbody");
  body.replaceChildren();
  for (const x of p.prefixes) {
    body.append(el("tr", {},
      el("td", {}, x.namespace), el("td", { class: "num" }, x.hits), el("td", { class: "num" }, x.depth_blocks),
      el("td", { class: "num" }, x.depth_tokens || "–"), el("td", {}, x.holders.join(", ")),
      el("td", { class: "num" }, bytes(x.size_bytes)), el("td", {}, el("code", {}, x.tip_key.slice(0, 16) + "…"))));
  }
  if (!p.prefixes.length) body.append(el("tr", {}, el("td", { colspan: "7" }, "no lookups have found a prefix yet")));
}

// The planner's curves: token hit ratio against tier capacity, scale 1.0 marked.
function renderCapacity(c) {
  state.capacity = c;
  const box = document.getElementById("capacity");
  const note = document.getElementById("capacity-note");
  box.replaceChildren();
  if (!c) { note.textContent = "planner not available"; return; }
  if (!c.tiers.length) { note.textContent = "planner off (planner_sample_rate = 0)"; return; }
  // Below min_samples sampled lookups a curve is noise: say so instead of plotting it.
  if (c.sampled_lookups < c.min_samples) {
    note.textContent = "too few samples: " + c.sampled_lookups + " of " + c.min_samples +
      " needed (sampled lookups at planner_sample_rate " + c.sample_rate + "); the curve appears once there are enough.";
    return;
  }
  note.textContent = "Estimated token hit ratio at other tier sizes (SHARDS miss-ratio curves); ● marks the current capacity.";
  for (const t of c.tiers) {
    const pts = [...t.points].sort((a, b) => a.capacity_bytes - b.capacity_bytes);
    const xs = pts.map(p => p.capacity_bytes / 2 ** 30);
    const cur = pts.map(p => (Math.abs(p.scale - 1) < 1e-9 ? p.token_hit_ratio : null));
    const cell = el("div", { class: "plot", "data-tier": t.tier, "data-points": String(pts.length) });
    box.append(cell);
    new uPlot({
      title: t.tier + " (" + t.policy + "), capacity " + bytes(t.capacity_bytes), width: 420, height: 200,
      scales: { x: { time: false }, y: { range: [0, 1] } },
      axes: [{ label: "GiB" }, { label: "token hit ratio" }],
      series: [{ label: "GiB" }, { label: "estimate", stroke: COLORS[0], width: 2 },
        { label: "current", stroke: COLORS[1], width: 0, points: { show: true, size: 10, fill: COLORS[1] } }],
    }, [xs, pts.map(p => p.token_hit_ratio), cur], cell);
  }
}

async function pollCluster() {
  try {
    renderCluster(await getJson("/api/v1/cluster"));
    setStatus("updated " + new Date().toLocaleTimeString(), false);
  } catch (e) {
    setStatus("cannot reach this node: " + e.message, true);
  }
  setTimeout(pollCluster, (state.cluster && state.cluster.refresh_ms) || 2000);
}

async function pollHistory() {
  try { renderHistory(await getJson("/api/v1/history")); } catch (e) { setStatus("history: " + e.message, true); }
  const every = state.cluster ? Math.min(5000, Math.max(1000, state.cluster.interval_ms)) : 2000;
  setTimeout(pollHistory, every);
}

async function pollPrefixes() {
  const q = state.tenant ? "&namespace=" + encodeURIComponent(state.tenant) : "";
  try { renderPrefixes(await getJson("/api/v1/top-prefixes?n=20" + q)); } catch (e) { setStatus("prefixes: " + e.message, true); }
  setTimeout(pollPrefixes, 5000);
}

async function pollCapacity() {
  try { renderCapacity(await getJson("/api/v1/capacity")); } catch (e) {
    if (e.status === 404) renderCapacity(null); else document.getElementById("capacity-note").textContent = "planner: " + e.message;
  }
  // While the planner is still gathering samples, look again at the page's refresh rate.
  const c = state.capacity;
  const gathering = c && c.tiers.length && c.sampled_lookups < c.min_samples;
  setTimeout(pollCapacity, gathering ? (state.cluster && state.cluster.refresh_ms) || 2000 : 30000);
}

document.getElementById("tenant").addEventListener("change", ev => { state.tenant = ev.target.value; });
pollCluster();
pollHistory();
pollPrefixes();
pollCapacity();
