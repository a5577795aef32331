// edgekit fleet dashboard: fetches /api/ JSON and draws tables and SVG line charts. No libraries.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1b5e20", "#b71c1c", "#1565c0", "#e65100", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"];
const REFRESH_MS = 10000;
const state = { overview: null, selected: null, sortKey: "device", sortUp: true, filter: "" };

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  return Number(value).toFixed(digits);
}

function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 172800) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(url + ": HTTP " + response.status);
  return response.json();
}

// -- charts ---------------------------------------------------------------------------------------

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) { hi = lo + 1; }
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  const top = Math.ceil(hi / step - 1e-9) * step;  // the last tick is at or above the highest value
  for (let v = Math.ceil(lo / step) * step; v <= top + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

// lines: [{name, t: [ms], v: [number|null]}]; draws an SVG into `figure`, gaps where v is null.
function lineChart(figure, title, unit, lines) {
  const W = 480, H = 220, L = 52, R = 10, T = 22, B = 40;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  root.appendChild(svg("text", { x: L, y: 14, class: "title" }, title + (unit ? ` (${unit})` : "")));
  const points = lines.flatMap((line) => line.t.map((t, i) => [t, line.v[i]])).filter((p) => p[1] !== null && p[1] !== undefined);
  figure.replaceChildren(root);
  figure.dataset.points = String(points.length);
  if (!points.length) {
    root.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "no data"));
    return;
  }
  let t0 = Math.min(...points.map((p) => p[0])), t1 = Math.max(...points.map((p) => p[0]));
  if (t1 === t0) { t0 -= 60000; t1 += 60000; }
  const vMax = Math.max(...points.map((p) => p[1]));
  const yTicks = niceTicks(0, vMax * 1.05 || 1, 4);
  const v1 = yTicks[yTicks.length - 1];
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / v1) * (H - B - T);
  for (const tick of yTicks) {
    root.appendChild(svg("line", { x1: L, x2: W - R, y1: y(tick), y2: y(tick), class: "grid" }));
    root.appendChild(svg("text", { x: L - 4, y: y(tick) + 3, "text-anchor": "end" }, String(tick)));
  }
  const span = t1 - t0;
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (span * i) / 4;
    const d = new Date(t);
    const label = span > 2 * 86400000 ? `${d.getMonth() + 1}/${d.getDate()}` : `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}`;
    root.appendChild(svg("text", { x: x(t), y: H - B + 14, "text-anchor": "middle" }, label));
  }
  root.appendChild(svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }));
  root.appendChild(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }));
  lines.forEach((line, index) => {
    const color = line.color || COLORS[index % COLORS.length];
    let d = "", pen = false;
    line.t.forEach((t, i) => {
      const v = line.v[i];
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    if (d) root.appendChild(svg("path", { d, class: "line", stroke: color, "data-series": line.name }));
    const lx = L + 8 + index * 110;
    root.appendChild(svg("rect", { x: lx, y: H - 14, width: 10, height: 3, fill: color }));
    root.appendChild(svg("text", { x: lx + 14, y: H - 10 }, line.name.length > 16 ? line.name.slice(0, 15) + "…" : line.name));
  });
}

// -- tables ---------------------------------------------------------------------------------------

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

function cell(value, cls) {
  return el("td", cls ? { class: cls } : {}, value);
}

function renderCards(overview) {
  const c = overview.counts;
  const rejected = Object.values(overview.rejected || {}).reduce((a, b) => a + b, 0);
  const cards = [["devices", c.devices], ["online", c.online], ["offline", c.offline], ["bundles", overview.bundles.length], ["rejected messages", rejected]];
  document.getElementById("cards").replaceChildren(...cards.map(([label, value]) => {
    const card = el("div", { class: "card" });
    card.appendChild(el("b", {}, value));
    card.appendChild(document.createTextNode(label));
    return card;
  }));
}

function renderDevices() {
  const overview = state.overview;
  if (!overview) return;
  const f = state.filter.toLowerCase();
  const rows = overview.devices.filter((d) => !f || [d.device, d.bundle_id, d.target, d.state].some((v) => v && v.toLowerCase().includes(f)));
  const key = state.sortKey, dir = state.sortUp ? 1 : -1;
  rows.sort((a, b) => (a[key] === b[key] ? 0 : a[key] === null ? 1 : b[key] === null ? -1 : a[key] < b[key] ? -dir : dir));
  fill("devices", rows.map((d) => {
    const tr = el("tr", { "data-device": d.device, "data-fleet": d.fleet });
    if (state.selected && state.selected.device === d.device && state.selected.fleet === d.fleet) tr.classList.add("selected");
    tr.append(cell(d.device), cell(d.state, d.state === "online" ? "online" : "offline"), cell(d.bundle_id || "–"), cell(d.target || "–"),
      cell(fmt(d.p50_ms, 2), "num"), cell(fmt(d.p99_ms, 2), "num"), cell(d.power_mw === null ? "–" : fmt(d.power_mw / 1000, 2), "num"),
      cell(fmt(d.energy_per_inference_mj, 1), "num"), cell(fmt(d.temperature_c, 1), "num"), cell(ago(d.last_seen)), cell(d.missing_seqs, "num"));
    tr.addEventListener("click", () => selectDevice(d.fleet, d.device));
    return tr;
  }));
}

function renderOverview(overview) {
  state.overview = overview;
  document.getElementById("store").textContent = overview.store;
  document.getElementById("updated").textContent = "updated " + new Date(overview.generated_at).toLocaleTimeString();
  renderCards(overview);
  renderDevices();
  fill("bundles", overview.bundles.map((b) => {
    const tr = el("tr");
    tr.append(cell(b.bundle_id || "(none)"), cell(b.devices, "num"), cell(b.online, "num"), cell(b.targets.join(", ")));
    return tr;
  }));
  fill("rejected", Object.entries(overview.rejected || {}).map(([reason, count]) => {
    const tr = el("tr");
    tr.append(cell(reason), cell(count, "num"));
    return tr;
  }));
  fill("rollouts", overview.rollouts.map((r) => {
    const tr = el("tr");
    const h = r.health || {};
    const health = h.error_rate === undefined ? "–" : `errors ${h.error_rate === null ? "–" : (100 * h.error_rate).toFixed(1) + "%"}, p99 ${fmt(h.p99_before_ms, 2)} → ${fmt(h.p99_after_ms, 2)} ms`;
    tr.append(cell(new Date(r.started_at).toLocaleString()), cell(r.bundle_id), cell(r.state), cell(r.canary.join(", ")), cell(r.devices.length, "num"), cell(health), cell(r.reason || ""));
    return tr;
  }));
  fill("events", overview.events.map((e) => {
    const tr = el("tr");
    tr.append(cell(new Date(e.at).toLocaleTimeString()), cell(e.device), cell(e.kind), cell(e.level, "level-" + e.level), cell(e.message));
    return tr;
  }));
}

// -- data flow ------------------------------------------------------------------------------------

async function selectDevice(fleet, device) {
  state.selected = { fleet, device };
  document.getElementById("selected").textContent = `${device} (${fleet})`;
  renderDevices();
  const data = await getJSON(`/api/series?fleet=${encodeURIComponent(fleet)}&device=${encodeURIComponent(device)}&hours=24`);
  const s = data.series;
  lineChart(document.getElementById("chart-latency"), `${device}: latency`, "ms", [
    { name: "p50", t: s.t, v: s.p50_ms, color: COLORS[0] }, { name: "p99", t: s.t, v: s.p99_ms, color: COLORS[1] }]);
  lineChart(document.getElementById("chart-power"), `${device}: power`, "W", [
    { name: "power", t: s.t, v: s.power_mean_mw.map((v) => (v === null ? null : v / 1000)), color: COLORS[2] },
    { name: "temp °C / 10", t: s.t, v: s.temperature_max_c.map((v) => (v === null ? null : v / 10)), color: COLORS[3] }]);
}

async function loadBundleSeries() {
  const data = await getJSON("/api/bundle-series?hours=24");
  const lines = Object.entries(data.bundles).map(([bundle, s], i) => ({ name: bundle, t: s.t, v: s.p99_ms, color: COLORS[i % COLORS.length] }));
  lineChart(document.getElementById("chart-bundles"), "fleet p99 by bundle", "ms", lines);
}

async function refresh(first) {
  try {
    const overview = await getJSON("/api/overview");
    renderOverview(overview);
    const jobs = [loadBundleSeries()];
    if (!state.selected && overview.devices.length) {
      const d = overview.devices[0];
      jobs.push(selectDevice(d.fleet, d.device));
    } else if (state.selected && !first) {
      jobs.push(selectDevice(state.selected.fleet, state.selected.device));
    }
    await Promise.all(jobs);
    if (first) {
      document.body.dataset.ready = "1";
      window.edgekitReadyMs = performance.now();
    }
  } catch (err) {
    document.getElementById("updated").textContent = "error: " + err.message;
    document.body.dataset.error = err.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("#devices th").forEach((th) => th.addEventListener("click", () => {
    const key = th.dataset.key;
    state.sortUp = state.sortKey === key ? !state.sortUp : true;
    state.sortKey = key;
    renderDevices();
  }));
  document.getElementById("filter").addEventListener("input", (event) => { state.filter = event.target.value; renderDevices(); });
  refresh(true);
  setInterval(() => refresh(false), REFRESH_MS);
});
