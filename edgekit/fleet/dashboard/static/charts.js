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

// Rollout markers: a thin dashed line per rollout on the plot, and its label in a lane above the plot (uPlot's top
// padding), as HTML in the chart's overlay so each label has a tooltip. Rollouts closer together than a label's
// width share one label ("3 rollouts"), whose tooltip lists them: five deploys in 15 minutes stay readable.
const MARKER_LANE_PX = 18;
const MARKER_LABEL_PX = 104;

// Where a label starting at x (CSS px in the plot) sits: to the right of its line, or ending at it near the right edge.
function labelExtent(x, width) {
  return width - x < MARKER_LABEL_PX ? [x - MARKER_LABEL_PX, x] : [x, x + MARKER_LABEL_PX];
}

// Rollouts in the plot grouped so that no two labels overlap: a rollout whose label would touch the previous group's
// joins that group.
function markerClusters(u, markers) {
  const width = u.bbox.width / uPlot.pxRatio;
  const placed = markers.map((m) => ({ ...m, x: u.valToPos(m.t, "x") })).filter((m) => m.x >= 0 && m.x <= width)
    .sort((a, b) => a.x - b.x);
  const clusters = [];
  for (const m of placed) {
    const last = clusters[clusters.length - 1];
    const [start] = labelExtent(m.x, width);
    if (last && start < labelExtent(last.x, width)[1]) last.members.push(m);
    else clusters.push({ x: m.x, members: [m] });
  }
  return clusters;
}

function drawMarkers(live) {
  return (u) => {
    const ctx = u.ctx, ratio = uPlot.pxRatio;
    const clusters = markerClusters(u, live.markers);
    ctx.save();
    ctx.strokeStyle = getComputedStyle(u.root).getPropertyValue("--marker").trim() || "#6a1b9a";
    ctx.lineWidth = ratio;
    ctx.setLineDash([4 * ratio, 3 * ratio]);
    for (const cluster of clusters) {
      for (const m of cluster.members) {
        const x = Math.round(u.bbox.left + m.x * ratio);
        ctx.beginPath();
        ctx.moveTo(x, u.bbox.top);
        ctx.lineTo(x, u.bbox.top + u.bbox.height);
        ctx.stroke();
      }
    }
    ctx.restore();
    let lane = u.over.querySelector(".marker-lane");
    if (!lane) {
      lane = el("div", { class: "marker-lane" });
      u.over.appendChild(lane);
    }
    const width = u.bbox.width / ratio;
    lane.replaceChildren(...clusters.map((cluster) => {
      const single = cluster.members.length === 1;
      const text = single ? cluster.members[0].short : `${cluster.members.length} rollouts`;
      const label = el("span", { class: "marker-label", "data-rollouts": String(cluster.members.length),
        title: cluster.members.map((m) => m.label).join("\n") }, "▾ " + text);
      if (width - cluster.x < MARKER_LABEL_PX) {  // near the right edge: the label ends at its line
        label.style.right = `${width - cluster.x}px`;
        label.classList.add("end");
        label.textContent = text + " ▾";
      } else {
        label.style.left = `${cluster.x - 4}px`;
      }
      label.style.maxWidth = `${MARKER_LABEL_PX - 4}px`;
      return label;
    }));
  };
}

// The newest bucket is still filling while `until` is inside it: its mean (power per device, say) covers part of a
// bucket and dips or spikes. Its points are left out of every line that has others; returns that bucket's start (s)
// or null.
function dropFillingBucket(data, bucketS, until) {
  if (!bucketS || !until || data[0].length < 2) return null;
  const last = data[0].length - 1;
  if (data[0][last] + bucketS <= until + 0.5) return null;
  for (let i = 1; i < data.length; i++) {
    const others = data[i].slice(0, last).some((v) => v !== null && v !== undefined);
    if (others) data[i][last] = null;
  }
  return data[0][last];
}

// Draw a time series chart into `figure`, or give new data to the chart already there when its lines are the same
// (the 10 s refresh): then a zoomed chart (drag across it; double-click to zoom out) keeps its zoom.
// spec: {title, unit, digits, zero, lines, since, until, empty, markers}
function timeChart(figure, spec) {
  const lines = spec.lines.filter((l) => l.v.some((v) => v !== null && v !== undefined));
  const points = lines.reduce((n, l) => n + l.v.filter((v) => v !== null && v !== undefined).length, 0);
  const old = charts[figure.id];
  figure.dataset.points = String(points);
  const caption = el("figcaption", { title: spec.title });
  caption.append(el("span", { class: "chart-title" }, spec.title + (spec.unit ? ` (${spec.unit})` : "")), exportButtons(figure));
  if (!points) {
    if (old) { old.destroy(); delete charts[figure.id]; }
    figure.replaceChildren(caption, el("div", { class: "chart-empty" }, spec.empty));
    return;
  }
  const data = align(lines);
  const live = { since: Date.parse(spec.since) / 1000, until: Date.parse(spec.until) / 1000, markers: spec.markers || [], zoomed: false };
  const filling = dropFillingBucket(data, spec.bucket_s, live.until);
  if (filling === null) delete figure.dataset.filling;
  else figure.dataset.filling = String(filling);
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
  live.names = lines.map((l) => l.name);
  live.unit = spec.unit;
  const labels = legendLabels(lines.map((l) => l.name));
  const unit = spec.unit ? " " + spec.unit : "";
  const theme = chartTheme();
  const fullRange = (lo, hi) => (live.until > live.since ? [Math.min(lo, live.since), Math.max(hi, live.until)] : [lo - 60, hi + 60]);
  const opts = {
    width: Math.max(280, plot.clientWidth), height: 210, padding: [MARKER_LANE_PX, null, null, null],
    scales: {
      x: { time: true, range: (u, lo, hi) => fullRange(lo, hi) },
      y: { range: (u, lo, hi) => (spec.zero ? [0, hi > 0 ? hi * 1.12 : 1] : [lo - Math.max(1, (hi - lo) * 0.15), hi + Math.max(1, (hi - lo) * 0.15)]) },
    },
    axes: [
      { stroke: theme.axis, grid: { stroke: theme.grid }, ticks: { stroke: theme.tick }, space: 64, values: timeLabels },
      { stroke: theme.axis, grid: { stroke: theme.grid }, ticks: { stroke: theme.tick }, label: spec.unit, labelSize: 18, size: 52,
        values: (u, splits) => splits.map((v) => (Math.abs(v) >= 1000 ? (v / 1000).toFixed(1) + "k" : String(+v.toPrecision(4)))) },
    ],
    series: [{ value: (u, v) => (v === null ? DASH : formatDateTime(v * 1000)), label: "time" }].concat(lines.map((line, i) => ({
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

// -- export -----------------------------------------------------------------------------------------

// The view a chart shows as CSV: local time (as the page writes it), then one column per line with its full name
// and unit; the zoomed range only when zoomed.
function chartCsv(id) {
  const u = charts[id];
  if (!u) return null;
  const quote = (v) => (/[",\n]/.test(v) ? `"${v.replace(/"/g, '""')}"` : v);
  // a line's name is a device-reported bundle id: one a spreadsheet would run as a formula starts with an apostrophe
  const text = (v) => (/^[=+\-@\t\r]/.test(v) ? "'" + v : v);
  const unit = u.edgekit.unit ? ` (${u.edgekit.unit})` : "";
  const header = ["time"].concat(u.edgekit.names.map((n) => text(n) + unit));
  const lo = u.scales.x.min, hi = u.scales.x.max, rows = [header.map(quote).join(",")];
  u.data[0].forEach((t, i) => {
    if (t < lo || t > hi) return;
    rows.push([formatDateTime(t * 1000)].concat(u.data.slice(1).map((column) => (column[i] === null || column[i] === undefined ? "" : String(column[i])))).map(quote).join(","));
  });
  return rows.join("\n") + "\n";
}

// The plot as a PNG (data URL), as drawn, on the page's background.
function chartPng(id) {
  const u = charts[id];
  if (!u) return null;
  const canvas = document.createElement("canvas");
  canvas.width = u.ctx.canvas.width;
  canvas.height = u.ctx.canvas.height;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = getComputedStyle(u.root.closest(".chart") || document.body).backgroundColor || "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.drawImage(u.ctx.canvas, 0, 0);
  return canvas.toDataURL("image/png");
}

function download(name, href) {
  const link = el("a", { href, download: name });
  document.body.appendChild(link);
  link.click();
  link.remove();
}

function exportButtons(figure) {
  const span = el("span", { class: "chart-export" });
  const stamp = () => formatDateTime(new Date()).replace(/[: ]/g, "-");
  const csv = el("button", { type: "button", title: "download the lines shown as CSV", "data-export": "csv" }, "CSV");
  csv.addEventListener("click", () => {
    const text = chartCsv(figure.id);
    if (text) download(`${figure.id}-${stamp()}.csv`, URL.createObjectURL(new Blob([text], { type: "text/csv" })));
  });
  const png = el("button", { type: "button", title: "download the plot as PNG", "data-export": "png" }, "PNG");
  png.addEventListener("click", () => {
    const url = chartPng(figure.id);
    if (url) download(`${figure.id}-${stamp()}.png`, url);
  });
  span.append(csv, png);
  return span;
}

// axis and grid colours from the page's CSS variables (light or dark, prefers-color-scheme)
function chartTheme() {
  const css = getComputedStyle(document.documentElement);
  const read = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
  return { axis: read("--chart-axis", "#555"), grid: read("--chart-grid", "#eee"), tick: read("--chart-tick", "#ddd") };
}

function resizeCharts() {
  for (const [id, chart] of Object.entries(charts)) {
    const plot = document.querySelector(`#${id} .plot`);
    if (plot && Math.abs(plot.clientWidth - chart.width) > 4) chart.setSize({ width: Math.max(280, plot.clientWidth), height: 210 });
  }
}
