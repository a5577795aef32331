// edgekit fleet dashboard: time series charts drawn with uPlot (vendored in /static, see uPlot.LICENSE.txt), with
// short distinct legends, rollout markers and a zoom that survives the 10 s refresh. Loaded before app.js.
"use strict";

const COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457", "#9e9d24", "#455a64"];
const LEGEND_MAX_CHARS = 32;
const charts = {};  // figure id -> uPlot instance (the browser tests read the plotted data from here)
window.edgekitCharts = charts;

// -- legends ----------------------------------------------------------------------------------------

// Short legend labels that stay distinct: a prefix shared by every long name is cut to "…", and what is still
// too long loses its middle (never its end, where versions and precisions differ). Full names go in tooltips.
function legendLabels(names) {
  if (names.every((n) => n.length <= LEGEND_MAX_CHARS)) return names.slice();
  let prefix = names.length > 1 ? names.reduce((p, n) => { let i = 0; while (i < p.length && p[i] === n[i]) i++; return p.slice(0, i); }) : "";
  const cut = Math.max(prefix.lastIndexOf("-"), prefix.lastIndexOf("_"), prefix.lastIndexOf("."), prefix.lastIndexOf("/")) + 1;
  prefix = prefix.slice(0, cut);
  const labels = names.map((n) => {
    let label = prefix.length > 3 && n.length > prefix.length ? "…" + n.slice(prefix.length) : n;
    if (label.length > LEGEND_MAX_CHARS) {
      const tail = Math.ceil(LEGEND_MAX_CHARS * 0.6);
      label = label.slice(0, LEGEND_MAX_CHARS - tail - 1) + "…" + label.slice(label.length - tail);
    }
    return label;
  });
  return new Set(labels).size === labels.length ? labels : names.slice();
}

// -- charts -----------------------------------------------------------------------------------------

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const pad = (n) => String(n).padStart(2, "0");

// x tick labels, one line each: 16:05:30 under a minute apart, 16:05 under a day (the date at midnight), else Nov 25
function timeLabels(u, splits, axisIndex, space, increment) {
  return splits.map((s) => {
    const d = new Date(s * 1000), date = `${MONTHS[d.getMonth()]} ${d.getDate()}`;
    if (increment >= 86400) return date;
    if (d.getHours() === 0 && d.getMinutes() === 0 && d.getSeconds() === 0) return date;
    return `${pad(d.getHours())}:${pad(d.getMinutes())}` + (increment < 60 ? `:${pad(d.getSeconds())}` : "");
  });
}

// lines: [{name, t: [ms], v: [number|null], color}] with different t allowed; returns uPlot's aligned data.
function align(lines) {
  const ts = [...new Set(lines.flatMap((l) => l.t))].sort((a, b) => a - b);
  const index = new Map(ts.map((t, i) => [t, i]));
  const data = [ts.map((t) => t / 1000)];
  for (const line of lines) {
    const column = new Array(ts.length).fill(null);
    line.t.forEach((t, i) => { column[index.get(t)] = line.v[i] === undefined ? null : line.v[i]; });
    data.push(column);
  }
  return data;
}

// A dashed vertical line and a label for each of `live.markers` inside the plot (drawn on uPlot's canvas after the
// series).
function drawMarkers(live) {
  return (u) => {
    const markers = live.markers;
    const ctx = u.ctx, ratio = uPlot.pxRatio, left = u.bbox.left, right = u.bbox.left + u.bbox.width;
    ctx.save();
    ctx.strokeStyle = ctx.fillStyle = "#6a1b9a";
    ctx.lineWidth = ratio;
    ctx.setLineDash([4 * ratio, 3 * ratio]);
    ctx.font = `${11 * ratio}px system-ui, sans-serif`;
    for (const m of markers) {
      const x = u.valToPos(m.t, "x", true);
      if (x < left || x > right) continue;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      const width = ctx.measureText(m.label).width;
      ctx.textAlign = x + 4 * ratio + width > right ? "right" : "left";
      ctx.fillText(m.label, ctx.textAlign === "right" ? x - 4 * ratio : x + 4 * ratio, u.bbox.top + 11 * ratio);
    }
    ctx.restore();
  };
}

// Draw a time series chart into `figure`, or give new data to the chart already there when its lines are the same
// (the 10 s refresh): then a zoomed chart (drag across it; double-click to zoom out) keeps its zoom.
// spec: {title, unit, digits, zero, lines, since, until, empty, markers}
function timeChart(figure, spec) {
  const lines = spec.lines.filter((l) => l.v.some((v) => v !== null && v !== undefined));
  const points = lines.reduce((n, l) => n + l.v.filter((v) => v !== null && v !== undefined).length, 0);
  const old = charts[figure.id];
  figure.dataset.points = String(points);
  const caption = el("figcaption", { title: spec.title }, spec.title + (spec.unit ? ` (${spec.unit})` : ""));
  if (!points) {
    if (old) { old.destroy(); delete charts[figure.id]; }
    figure.replaceChildren(caption, el("div", { class: "chart-empty" }, spec.empty));
    return;
  }
  const data = align(lines);
  const live = { since: Date.parse(spec.since) / 1000, until: Date.parse(spec.until) / 1000, markers: spec.markers || [], zoomed: false };
  const first = Math.min(data[0][0], live.since), last = Math.max(data[0][data[0].length - 1], live.until);
  figure.dataset.markers = String(live.markers.filter((m) => m.t >= first && m.t <= last).length);
  const dense = data[0].length > 80;
  const key = JSON.stringify([spec.title, spec.unit, lines.map((l) => l.name), dense]);
  if (old && old.edgekit.key === key) {
    Object.assign(old.edgekit, { since: live.since, until: live.until, markers: live.markers });
    old.setData(data, !old.edgekit.zoomed);
    return;
  }
  if (old) { old.destroy(); delete charts[figure.id]; }
  const plot = el("div", { class: "plot" });
  figure.replaceChildren(caption, plot);
  live.key = key;
  const labels = legendLabels(lines.map((l) => l.name));
  const unit = spec.unit ? " " + spec.unit : "";
  const fullRange = (lo, hi) => (live.until > live.since ? [Math.min(lo, live.since), Math.max(hi, live.until)] : [lo - 60, hi + 60]);
  const opts = {
    width: Math.max(280, plot.clientWidth), height: 210,
    scales: {
      x: { time: true, range: (u, lo, hi) => fullRange(lo, hi) },
      y: { range: (u, lo, hi) => (spec.zero ? [0, hi > 0 ? hi * 1.12 : 1] : [lo - Math.max(1, (hi - lo) * 0.15), hi + Math.max(1, (hi - lo) * 0.15)]) },
    },
    axes: [
      { stroke: "#555", grid: { stroke: "#eee" }, ticks: { stroke: "#ddd" }, space: 64, values: timeLabels },
      { stroke: "#555", grid: { stroke: "#eee" }, ticks: { stroke: "#ddd" }, label: spec.unit, labelSize: 18, size: 52,
        values: (u, splits) => splits.map((v) => (Math.abs(v) >= 1000 ? (v / 1000).toFixed(1) + "k" : String(+v.toPrecision(4)))) },
    ],
    series: [{ value: (u, v) => (v === null ? "–" : new Date(v * 1000).toLocaleString()), label: "time" }].concat(lines.map((line, i) => ({
      label: labels[i], stroke: line.color || COLORS[i % COLORS.length], width: 1.6, spanGaps: false,
      points: { show: !dense, size: 5 }, value: (u, v) => (v === null || v === undefined ? "–" : v.toFixed(spec.digits) + unit),
    }))),
    legend: { live: true },
    hooks: {
      draw: [drawMarkers(live)],
      setScale: [(u, scale) => {
        if (scale !== "x" || !u.data || !u.data[0].length) return;
        const [lo, hi] = fullRange(u.data[0][0], u.data[0][u.data[0].length - 1]);
        live.zoomed = u.scales.x.min > lo + 1e-3 || u.scales.x.max < hi - 1e-3;
      }],
    },
    cursor: { drag: { x: true, y: false } },
  };
  const chart = new uPlot(opts, data, plot);
  chart.edgekit = live;
  charts[figure.id] = chart;
  chart.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
    if (i > 0) { row.title = lines[i - 1].name; row.dataset.series = lines[i - 1].name; }
  });
}

function resizeCharts() {
  for (const [id, chart] of Object.entries(charts)) {
    const plot = document.querySelector(`#${id} .plot`);
    if (plot && Math.abs(plot.clientWidth - chart.width) > 4) chart.setSize({ width: Math.max(280, plot.clientWidth), height: 210 });
  }
}
