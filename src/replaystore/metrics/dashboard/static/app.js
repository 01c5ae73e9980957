// replaystore dashboard: polls /api/points and /api/info, draws canvas charts. No dependencies.
"use strict";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563", "#65a30d", "#9333ea"];
const WINDOW_S = 300; // seconds shown on the time axis (at most)
const LINE_CHARTS = [
  { id: "inserts", title: "Inserts /s", fields: [["inserts_per_s", ""]], perShard: true },
  { id: "samples", title: "Samples /s (items)", fields: [["samples_per_s", ""]], perShard: true },
  { id: "ratio", title: "Sample-to-insert ratio vs target", fields: [["ratio", "per refresh"], ["ratio_total", "since start"], ["ratio_target", "target", true]] },
  { id: "blocked", title: "Rate limiter: seconds blocked per second", fields: [["sample_blocked", "sample side"], ["insert_blocked", "insert side"]], perShard: true },
  { id: "fill", title: "Fill (size / capacity)", fields: [["fill", ""]], perShard: true, min: 0, max: 1 },
  { id: "evictions", title: "Evictions and refusals /s, by reason", fields: [["evictions_per_s", "evicted"], ["retired_per_s", "retired"], ["dropped_stale_per_s", "stale"], ["skipped_updates_per_s", "updates of gone keys"]] },
  { id: "staleness", title: "Staleness (mean version lag of live items)", fields: [["staleness_mean", ""]] },
];
const LOCK_CHARTS = [
  { id: "lock", title: "Shared lock: held fraction, mean waiters", fields: [["held_fraction", "held"], ["waiting_mean", "waiters"]] },
  { id: "lockrate", title: "Shared lock: acquisitions /s", fields: [["acquisitions_per_s", ""]] },
];

const ONLINE_CHARTS = [
  { id: "budget", title: "Staleness budget (tickets)", fields: [["tickets", "running"], ["budget_accepted", "accepted"], ["budget_capacity", "can still grant"], ["budget_limit", "limit", true]] },
  { id: "groups", title: "Groups", fields: [["groups", "ready"], ["pending_groups", "pending"], ["groups_admitted_per_s", "admitted /s"], ["groups_sampled_per_s", "sampled /s"]] },
  { id: "refusals", title: "Refusals /s, by reason", dicts: [["dropped_per_s", "dropped"], ["rejected_per_s", "rejected"], ["budget_lost_per_s", "tickets"]] },
];
const NODE_FIELDS = [["leased_fragments", "leased"], ["loader_queue", "loaders' queue"]];

const state = { points: [], lastSeq: 0, period: 1, info: null, renders: 0, status: "connecting", error: null, fails: 0 };
window.replaystoreDashboard = state;

function si(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(a >= 1e5 ? 0 : 1) + "k";
  if (a >= 100 || Number.isInteger(v)) return String(Math.round(v));
  if (a >= 1) return v.toFixed(2);
  if (a === 0) return "0";
  return v.toPrecision(2);
}
function bytes(v) {
  if (v === null || v === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return v.toFixed(i ? 1 : 0) + " " + u[i];
}
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) { if (k === "class") e.className = v; else e.setAttribute(k, v); }
  for (const k of kids) e.append(k);
  return e;
}

// -- cards ---------------------------------------------------------------------------------------
const cards = new Map();
function card(id, title) {
  let c = cards.get(id);
  if (!c) {
    const canvas = el("canvas", { "data-chart": id, "data-renders": "0" });
    const latest = el("span", { class: "latest" });
    const legend = el("div", { class: "legend" });
    const root = el("div", { class: "card", id: "card-" + id }, el("h3", {}, el("span", {}, title), latest), canvas, legend);
    document.getElementById("charts").append(root);
    c = { root, canvas, latest, legend };
    cards.set(id, c);
  }
  return c;
}
function setupCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  g.font = "10px system-ui, sans-serif";
  return { g, w, h };
}
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function drawLines(c, series, opts) {
  const { g, w, h } = setupCanvas(c.canvas);
  const L = 42, R = 8, T = 6, B = 16;
  let tMax = -Infinity, tMin = Infinity, yMax = opts.max !== undefined ? opts.max : 0;
  for (const s of series) for (const [t, v] of s.data) {
    tMax = Math.max(tMax, t); tMin = Math.min(tMin, t);
    if (v !== null && opts.max === undefined) yMax = Math.max(yMax, v);
  }
  if (!Number.isFinite(tMax)) { tMax = Date.now() / 1000; tMin = tMax - 60; }
  tMin = Math.max(tMin, tMax - WINDOW_S); if (tMax - tMin < 30) tMin = tMax - 30;
  yMax = opts.max !== undefined ? opts.max : niceMax(yMax * 1.05);
  const X = (t) => L + ((t - tMin) / (tMax - tMin)) * (w - L - R);
  const Y = (v) => T + (1 - v / yMax) * (h - T - B);
  g.strokeStyle = "#e5e7eb"; g.fillStyle = "#6b7280"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4, y = Math.round(Y(v)) + 0.5;
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.textAlign = "right"; g.textBaseline = "middle"; g.fillText(si(v), L - 4, y);
  }
  g.textAlign = "center"; g.textBaseline = "top";
  const span = tMax - tMin, step = span > 240 ? 60 : span > 100 ? 30 : 10;
  for (let s = 0; s <= span; s += step) g.fillText(s ? "-" + s + "s" : "now", X(tMax - s), h - B + 3);
  series.forEach((s) => {
    g.strokeStyle = s.color; g.lineWidth = 1.6; g.setLineDash(s.dashed ? [5, 4] : []);
    g.beginPath(); let pen = false;
    for (const [t, v] of s.data) {
      if (t < tMin) continue;
      if (v === null || v === undefined) { pen = false; continue; }
      const x = X(t), y = Y(Math.min(v, yMax));
      if (pen) g.lineTo(x, y); else g.moveTo(x, y);
      pen = true;
    }
    g.stroke(); g.setLineDash([]);
  });
  c.legend.replaceChildren(...series.map((s) => {
    const last = lastValue(s.data);
    return el("span", { "data-series": s.key, "data-latest": last === null ? "" : String(last) },
      el("i", { style: `background:${s.color}` }), (s.label ? s.label + " " : ""), el("b", {}, si(last)));
  }));
  c.latest.textContent = series.length ? si(lastValue(series[0].data)) : "";
  c.canvas.dataset.renders = String(Number(c.canvas.dataset.renders) + 1);
  c.canvas.dataset.npoints = String(series.reduce((n, s) => n + s.data.filter((d) => d[1] !== null).length, 0));
}
function lastValue(data) {
  for (let i = data.length - 1; i >= 0; i--) if (data[i][1] !== null && data[i][1] !== undefined) return data[i][1];
  return null;
}

function drawBars(c, bins, color, fmtLabel) {
  const { g, w, h } = setupCanvas(c.canvas);
  const L = 42, R = 8, T = 6, B = 16;
  const yMax = niceMax(Math.max(1, ...bins.map((b) => b[1])));
  const n = Math.max(bins.length, 1), bw = (w - L - R) / n;
  g.strokeStyle = "#e5e7eb"; g.fillStyle = "#6b7280";
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4, y = Math.round(T + (1 - v / yMax) * (h - T - B)) + 0.5;
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.textAlign = "right"; g.textBaseline = "middle"; g.fillText(si(v), L - 4, y);
  }
  g.textAlign = "center"; g.textBaseline = "top";
  const every = Math.ceil(n / Math.max(1, Math.floor((w - L - R) / 34)));
  bins.forEach(([label, count], i) => {
    const bh = (count / yMax) * (h - T - B);
    g.fillStyle = color; g.fillRect(L + i * bw + 1, T + (h - T - B) - bh, Math.max(1, bw - 2), bh);
    g.fillStyle = "#6b7280";
    if (i % every === 0) g.fillText(fmtLabel(label), L + i * bw + bw / 2, h - B + 3);
  });
  const total = bins.reduce((s, b) => s + b[1], 0);
  c.latest.textContent = si(total) + " items";
  c.canvas.dataset.renders = String(Number(c.canvas.dataset.renders) + 1);
  c.canvas.dataset.total = String(total);
}
function binOrder(label) {
  if (label.startsWith(">=")) return Infinity;
  if (label.startsWith("<2^")) return Math.pow(2, Number(label.slice(3))) / 2;
  if (label.startsWith("2^")) return Math.pow(2, Number(label.slice(2)));
  return Number(label);
}
function sortedBins(hist) {
  return Object.entries(hist || {}).sort((a, b) => binOrder(a[0]) - binOrder(b[0]));
}

// -- what to draw ----------------------------------------------------------------------------------
function rowsOf(point, tname, perShard) {
  const row = point.ok ? point.tables[tname] : null;
  if (perShard && row && row.shards) return row.shards.map((s, i) => [`${tname}/shard ${i}`, s]);
  return [[tname, row]];
}
function tableNames() {
  const names = new Set();
  for (const p of state.points) if (p.ok) for (const t of Object.keys(p.tables)) names.add(t);
  return [...names];
}
function render() {
  const names = tableNames();
  const shardsOf = (t) => { for (let i = state.points.length - 1; i >= 0; i--) { const p = state.points[i]; if (p.ok && p.tables[t]) return (p.tables[t].shards || []).length; } return 0; };
  for (const chart of LINE_CHARTS) {
    const series = []; let ci = 0;
    for (const t of names) {
      const lanes = chart.perShard && shardsOf(t) ? [...Array(shardsOf(t)).keys()].map((i) => `${t}/shard ${i}`) : [t];
      for (const lane of lanes) for (const [field, label, dashed] of chart.fields) {
        const data = state.points.map((p) => {
          const rows = rowsOf(p, t, chart.perShard);
          const r = (rows.find((x) => x[0] === lane) || [null, null])[1];
          return [p.t, r ? (r[field] ?? null) : null];
        });
        const who = names.length > 1 || lanes.length > 1 ? lane : "";
        series.push({ key: `${lane}:${field}`, label: [who, label].filter(Boolean).join(" "), data, dashed, color: COLORS[ci++ % COLORS.length] });
      }
    }
    drawLines(card(chart.id, chart.title), series, chart);
  }
  const last = [...state.points].reverse().find((p) => p.ok);
  if (last) {
    names.forEach((t, i) => {
      const row = last.tables[t]; if (!row) return;
      const sfx = names.length > 1 ? ` (${t})` : "";
      drawBars(card("prio-" + t, "Priorities by power of two" + sfx), sortedBins(row.priority_histogram), COLORS[(2 * i) % 10], (l) => l);
      drawBars(card("times-" + t, "Times sampled (live items)" + sfx), sortedBins(row.times_sampled_histogram), COLORS[(2 * i + 1) % 10], (l) => l);
    });
    if (last.lock) for (const chart of LOCK_CHARTS) {
      const series = chart.fields.map(([f, label], i) => ({ key: "lock:" + f, label, color: COLORS[i], data: state.points.map((p) => [p.t, p.ok && p.lock ? (p.lock[f] ?? null) : null]) }));
      drawLines(card(chart.id, chart.title), series, chart);
    }
    if (last.nodes && Object.keys(last.nodes).length) {
      const nodes = Object.entries(last.nodes);
      drawBars(card("node-free", "Nodes: free disk"), nodes.map(([k, n]) => [k, n.free_bytes || 0]), COLORS[5], (l) => l);
      const series = []; let ci = 0;
      for (const [label] of nodes) for (const [f, name] of NODE_FIELDS) {
        series.push({ key: `${label}:${f}`, label: `${label} ${name}`, color: COLORS[ci++ % COLORS.length], dashed: f === "loader_queue",
          data: state.points.map((p) => [p.t, p.ok && p.nodes && p.nodes[label] ? (p.nodes[label][f] ?? null) : null]) });
      }
      drawLines(card("node-load", "Nodes: leased fragments, loaders' queue"), series, {});
    }
    if (last.online) renderOnline(Object.keys(last.online));
  }
  renderAlerts(last);
  state.renders++;
}

function renderOnline(buffers) {
  const at = (p, b) => (p.ok && p.online ? p.online[b] : null);
  for (const b of buffers) {
    const sfx = buffers.length > 1 ? ` (${b})` : "";
    for (const chart of ONLINE_CHARTS) {
      const series = []; let ci = 0;
      if (chart.fields) for (const [f, label, dashed] of chart.fields) {
        series.push({ key: `${b}:${f}`, label, dashed, color: COLORS[ci++ % COLORS.length], data: state.points.map((p) => [p.t, at(p, b) ? (at(p, b)[f] ?? null) : null]) });
      }
      for (const [d, what] of chart.dicts || []) {
        const keys = new Set();
        for (const p of state.points) { const r = at(p, b); for (const [k, v] of Object.entries((r && r[d]) || {})) if (v) keys.add(k); }
        for (const k of keys) series.push({ key: `${b}:${d}:${k}`, label: `${what} ${k}`, color: COLORS[ci++ % COLORS.length],
          data: state.points.map((p) => { const r = at(p, b); return [p.t, r && r[d] ? (r[d][k] ?? null) : null]; }) });
      }
      if (chart.dicts && !series.length) series.push({ key: `${b}:none`, label: "none", color: COLORS[7], data: state.points.map((p) => [p.t, at(p, b) ? 0 : null]) });
      drawLines(card(`online-${chart.id}-${b}`, chart.title + sfx), series, {});
    }
  }
}

function renderAlerts(last) {
  const box = document.getElementById("alerts"); const out = [];
  if (state.status === "unreachable") out.push(["bad", `The dashboard server does not answer (${state.error}); retrying every ${si(state.period)} s.`]);
  const newest = state.points[state.points.length - 1];
  if (newest && !newest.ok) out.push(["bad", `Source unavailable: ${newest.error}. Retrying every ${si(state.period)} s; the charts resume when it is back.`]);
  if (last && newest && newest.ok) {
    for (const [t, row] of Object.entries(last.tables)) {
      const lanes = row.shards ? row.shards.map((s, i) => [`${t}/shard ${i}`, s]) : [[t, row]];
      for (const [name, r] of lanes) {
        if (!r) { out.push(["bad", `${name}: does not answer.`]); continue; }
        if (r.sample_waiting > 0) out.push(["bad", `Learner stalled on ${name}: ${r.sample_waiting} sample call(s) blocked by the rate limiter for ${r.sample_blocked_now_s.toFixed(1)} s (sample-to-insert ratio ${si(r.ratio_total)}, target ${si(r.ratio_target)}).`]);
        if (r.insert_waiting > 0) out.push(["warn", `Writers blocked on ${name}: ${r.insert_waiting} insert call(s) waiting for the learner for ${r.insert_blocked_now_s.toFixed(1)} s.`]);
      }
    }
    for (const [label, n] of Object.entries(last.nodes || {})) {
      const free = n.free_bytes, used = n.disk_bytes || 0;
      if (free !== undefined && free !== null && (free < 64 * 2 ** 20 || free < 0.05 * (free + used))) out.push(["bad", `Node ${label} is nearly full: ${bytes(free)} free.`]);
    }
  }
  box.replaceChildren(...out.map(([cls, text]) => el("div", { class: "alert " + (cls === "warn" ? "warn" : ""), "data-alert": cls }, text)));
  const pill = document.getElementById("status");
  const down = state.status === "unreachable" || (newest && !newest.ok);
  pill.className = "pill " + (down ? "bad" : state.points.length ? "ok" : "wait");
  pill.textContent = state.status === "unreachable" ? "dashboard unreachable" : newest && !newest.ok ? "source unavailable" : state.points.length ? "live" : "connecting";
  if (newest) document.getElementById("updated").textContent = `updated ${new Date(newest.t * 1000).toLocaleTimeString()}, every ${si(state.period)} s`;
}

// -- tables of configuration and counters ----------------------------------------------------------
const COLUMNS = [
  ["table", "table"], ["size", "size"], ["capacity", "capacity"], ["inserts", "inserts"], ["samples", "samples"],
  ["sample_to_insert_ratio", "ratio"], ["target", "target"], ["evictions", "evictions"], ["sample_waiting", "learners blocked"],
  ["insert_waiting", "writers blocked"], ["sampler", "sampler"], ["remover", "remover"], ["rate_limiter", "rate limiter"],
  ["max_times_sampled", "max times sampled"], ["max_staleness", "max staleness"],
];
function cell(field, st, name) {
  const cfg = st.config || {};
  switch (field) {
    case "table": return name;
    case "target": return cfg.target_sample_to_insert_ratio ?? "–";
    case "sampler": case "remover": return cfg[field] ?? "–";
    case "rate_limiter": return cfg.rate_limiter ? Object.entries(cfg.rate_limiter).map(([k, v]) => (k === "type" ? v : `${k}=${v}`)).join(" ") : "–";
    case "max_times_sampled": case "max_staleness": return cfg[field] ?? "–";
    default: return st[field] ?? "–";
  }
}
function renderTables() {
  const snap = state.info && state.info.snapshot; if (!snap) return;
  const head = document.querySelector("#tables thead"), body = document.querySelector("#tables tbody");
  head.replaceChildren(el("tr", {}, ...COLUMNS.map(([, h]) => el("th", {}, h))));
  const rows = [];
  for (const [t, entry] of Object.entries(snap.tables)) {
    const lanes = [[t, entry.stats]];
    (entry.shards || []).forEach((s, i) => lanes.push([`${t}/shard ${i}` + (entry.nodes && entry.nodes[i] ? ` @${entry.nodes[i].slice(0, 8)}` : ""), s]));
    for (const [name, st] of lanes) {
      if (!st) { rows.push(el("tr", {}, el("td", {}, name), el("td", { colspan: COLUMNS.length - 1 }, "does not answer"))); continue; }
      rows.push(el("tr", { "data-table": name }, ...COLUMNS.map(([f]) => {
        const v = cell(f, st, name), num = typeof v === "number";
        return el("td", { class: num ? "num" : "", "data-field": f, "data-value": String(v) }, num ? (Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(3)) : f === "sampler" || f === "remover" ? el("code", {}, String(v)) : String(v));
      })));
    }
  }
  body.replaceChildren(...rows);
  const frag = snap.fragments;
  const ns = document.getElementById("nodes-section");
  if (frag && frag.nodes) {
    ns.hidden = false;
    const fields = ["node_id", "payloads", "live_bytes", "disk_bytes", "free_bytes", "leases", "leased_fragments", "loader_queue"];
    document.querySelector("#nodes thead").replaceChildren(el("tr", {}, el("th", {}, "node"), ...fields.map((f) => el("th", {}, f.replaceAll("_", " ")))));
    document.querySelector("#nodes tbody").replaceChildren(...Object.entries(frag.nodes).map(([label, n]) => el("tr", { "data-node": label }, el("td", {}, label),
      ...fields.map((f) => el("td", { class: f === "node_id" ? "" : "num" }, f.endsWith("bytes") ? bytes(n[f]) : String(n[f] ?? "–").slice(0, 16))))));
  }
  const os = document.getElementById("online-section");
  if (snap.online && Object.keys(snap.online).length) {
    os.hidden = false;
    document.querySelector("#online thead").replaceChildren(el("tr", {}, el("th", {}, "buffer"), el("th", {}, "stats")));
    document.querySelector("#online tbody").replaceChildren(...Object.entries(snap.online).map(([b, st]) => el("tr", {}, el("td", {}, b),
      el("td", {}, Object.entries(st).filter(([, v]) => typeof v !== "object").map(([k, v]) => `${k}=${typeof v === "number" ? si(v) : v}`).join("  ")))));
  }
  const src = document.getElementById("source");
  src.textContent = `${state.info.kind} ${state.info.name}`;
}

// -- polling -----------------------------------------------------------------------------------------
async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}
async function tick() {
  try {
    const res = await getJSON(`/api/points?since=${state.lastSeq}`);
    if (res.seq < state.lastSeq) { state.points = []; state.lastSeq = 0; } // the dashboard server restarted
    state.period = res.period;
    for (const p of res.points) { state.points.push(p); state.lastSeq = p.seq; }
    if (state.points.length > 900) state.points.splice(0, state.points.length - 900);
    state.info = await getJSON("/api/info");
    state.status = "ok"; state.error = null; state.fails = 0;
  } catch (e) {
    state.status = "unreachable"; state.error = String(e.message || e); state.fails++;
  }
  try { render(); renderTables(); } catch (e) { console.error(e); }
  setTimeout(tick, state.period * 1000);
}
window.addEventListener("resize", () => render());
tick();
