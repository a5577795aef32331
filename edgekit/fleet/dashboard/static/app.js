// edgekit fleet dashboard: fetches /api/ JSON, fills the tables and draws time series (charts.js, with uPlot
// vendored in /static, see uPlot.LICENSE.txt). State (fleet, time range, selected device, fleet grouping) lives in the URL hash.
// The device table is paged, sorted and filtered on the server (/api/devices): the page never holds the whole fleet.
"use strict";

const REFRESH_MS = 10000;
const RANGES = { "0.25": "15 min", "1": "1 h", "24": "24 h", "168": "7 d" };
const FILTER_DEBOUNCE_MS = 250;
const STATE_NAMES = ["online", "stale", "offline", "unknown"];
const state = {
  overview: null, page: null, selected: null, fleet: "", hours: "1", by: "bundle_id",
  sort: "worst", order: "asc", q: "", states: [], offset: 0, limit: 100,  // the device table's page, as asked
  missing: null, detail: null,  // a device the URL named that the store does not know; the device page's details
};

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 172800) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

function duration(seconds) {
  if (seconds < 60) return seconds + " s";
  if (seconds < 3600) return seconds / 60 + " min";
  if (seconds < 86400) return seconds / 3600 + " h";
  return seconds / 86400 + " d";
}

async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = "";
    try { detail = ": " + (await response.json()).error; } catch (err) { /* not JSON */ }
    const error = new Error(`${url}: HTTP ${response.status}${detail}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

// Query strings carry the selected fleet on every API call.
function apiQuery(params) {
  const query = new URLSearchParams(params || {});
  if (state.fleet && !query.has("fleet")) query.set("fleet", state.fleet);
  return query.toString();
}

// While any request of a user action is out, body[data-loading] is set (the browser tests wait for it to go).
let loadingCount = 0;
function loading(promise) {
  loadingCount += 1;
  document.body.dataset.loading = "1";
  return Promise.resolve(promise).finally(() => {
    loadingCount -= 1;
    if (!loadingCount) delete document.body.dataset.loading;
  });
}

// -- URL hash: #fleet=f&range=1&device=fleet/device&by=target ------------------------------------------

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("range") in RANGES) state.hours = params.get("range");
  if (["bundle_id", "target", "power_mode", "model"].includes(params.get("by"))) state.by = params.get("by");
  state.fleet = params.get("fleet") || "";
  const device = params.get("device");
  if (device && device.includes("/")) {
    const cut = device.indexOf("/");
    state.selected = { fleet: device.slice(0, cut), device: device.slice(cut + 1) };
  }
}

function writeHash() {
  const params = new URLSearchParams(state.fleet ? { fleet: state.fleet } : {});
  params.set("range", state.hours);
  params.set("by", state.by);
  if (state.selected) params.set("device", `${state.selected.fleet}/${state.selected.device}`);
  history.replaceState(null, "", "#" + params.toString());
}

// -- tables -----------------------------------------------------------------------------------------

function fill(tableId, rows, none) {
  if (!rows.length && none) {
    const columns = document.querySelectorAll(`#${tableId} thead th`).length;
    const tr = el("tr", { class: "none" });
    tr.appendChild(el("td", { colspan: columns, class: "muted" }, none));
    rows = [tr];
  }
  document.querySelector(`#${tableId} tbody`).replaceChildren(...rows);
}

function cell(value, cls) {
  return el("td", cls ? { class: cls } : {}, value);
}

// A cell for an id: a long one loses its middle (bundle ids differ at the end: precision, version, date), and
// CSS still cuts it with an ellipsis if the column is narrower; the whole id is in the tooltip.
function clipped(value, max = 34) {
  const text = String(value);
  const td = el("td");
  td.appendChild(el("span", { class: "clip", title: text }, shortId(text, max)));
  return td;
}

// An id of at most `max` characters: the start, an ellipsis, and the end (the longer part).
function shortId(text, max) {
  if (text.length <= max) return text;
  const tail = Math.ceil((max - 1) * 0.55);
  return text.slice(0, max - 1 - tail) + "…" + text.slice(text.length - tail);
}

function stateCell(value) {
  const td = el("td", { class: "state state-" + (STATE_NAMES.includes(value) ? value : "other") });
  td.textContent = value;
  return td;
}

// Counts per state (coloured; a click shows only that state in the table), devices breaching an alert when the
// collector evaluates alerts, bundles and rejected messages.
function renderCards(overview) {
  const c = overview.counts;
  const rejected = Object.values(overview.rejected || {}).reduce((a, b) => a + b, 0);
  const cards = [["devices", c.devices, null]].concat(Object.entries(c.states).map(([name, count]) => [name, count, name]));
  if (c.breaching !== undefined) cards.push(["breaching", c.breaching, null]);
  if (c.simulated) cards.push(["simulated", c.simulated, null]);
  cards.push(["bundles", overview.bundles.length, null], ["rejected messages", rejected, null]);
  document.getElementById("cards").replaceChildren(...cards.map(([label, value, filter]) => {
    const card = el(filter || label === "devices" ? "button" : "div", { class: "card", "data-card": label });
    if (filter) {
      card.classList.add("state-card", "state-" + (STATE_NAMES.includes(filter) ? filter : "other"));
      card.setAttribute("aria-pressed", String(state.states.length === 1 && state.states[0] === filter));
      card.title = `show only ${filter} devices (click again for all)`;
      card.addEventListener("click", () => setStates(state.states.length === 1 && state.states[0] === filter ? [] : [filter]));
    } else if (label === "devices") {
      card.title = "show every device";
      card.addEventListener("click", () => setStates([]));
    }
    if (label === "breaching" && value > 0) card.classList.add("breaching");
    if (label === "simulated") {
      card.classList.add("simulated");
      card.title = "devices run by edgekit fleet simulate (agent sim-*): their latency, power and temperature are SYNTHETIC";
    }
    card.appendChild(el("b", {}, value));
    card.appendChild(document.createTextNode(label === "simulated" ? "simulated (SYNTHETIC numbers)" : value === 1 ? ({ devices: "device", bundles: "bundle", "rejected messages": "rejected message" }[label] || label) : label));
    return card;
  }));
}

function renderDevices() {
  const page = state.page;
  if (!page) return;
  document.querySelectorAll("#devices th").forEach((th) => {
    if (th.dataset.key === state.sort) th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
    else th.removeAttribute("aria-sort");
  });
  document.getElementById("worst-first").setAttribute("aria-pressed", String(state.sort === "worst"));
  const filtered = page.total !== page.fleet_devices;
  document.getElementById("device-count").textContent = filtered ? `${page.total} of ${page.fleet_devices} match` : `${page.total}`;
  const first = page.devices.length ? page.offset + 1 : 0;
  document.getElementById("page-position").textContent = `${first}–${page.offset + page.devices.length} of ${page.total}`;
  document.getElementById("page-prev").disabled = page.offset <= 0;
  document.getElementById("page-next").disabled = page.offset + page.limit >= page.total;
  document.getElementById("state-filter").textContent = state.states.length ? `state: ${state.states.join(", ")}` : "";
  // the power mode column only when some device reports one (agents on boards without nvpmodel do not)
  document.getElementById("devices").classList.toggle("no-mode", !page.columns.power_mode);
  // the models column only when some device serves named models (agents with a model repository)
  document.getElementById("devices").classList.toggle("no-models", !page.columns.models);
  fill("devices", page.devices.map((d) => {
    const tr = el("tr", { "data-device": d.device, "data-fleet": d.fleet, "data-state": d.state });
    if (d.breaching) {
      tr.classList.add("breaching");
      tr.title = "an alert is firing for this device";
    }
    const mode = clipped(d.power_mode || "–", 20);
    mode.classList.add("mode");
    const models = clipped(d.models || "–", 30);
    models.classList.add("models");
    if (state.selected && state.selected.device === d.device && state.selected.fleet === d.fleet) tr.classList.add("selected");
    tr.append(clipped(d.device), clipped(d.fleet, 20), stateCell(d.state), clipped(d.bundle_id || "–"), models, clipped(d.target || "–"), mode,
      latencyCell(d, d.p50_ms), latencyCell(d, d.p99_ms), cell(formatPower(d.power_mw, false), "num"),
      cell(formatNumber(d.energy_per_inference_mj, 1), "num"), cell(formatNumber(d.temperature_c, 1), "num"), cell(ago(d.last_seen)), cell(d.missing_seqs, "num"));
    tr.addEventListener("click", () => selectDevice(d.fleet, d.device));
    return tr;
  }), state.q || state.states.length ? `no device matches${state.q ? ` "${state.q}"` : ""}${state.states.length ? " in state " + state.states.join(", ") : ""}` : "no devices");
}

// p50/p99 of a device's newest window: "idle" when it is online and that window had no inference (not "–", which
// would read as missing telemetry)
function latencyCell(d, value) {
  if ((value === null || value === undefined) && d.state === "online" && d.windows > 0) {
    const td = cell("idle", "num idle");
    td.title = "online, but its newest telemetry window had no inference";
    return td;
  }
  return cell(formatNumber(value, 2), "num");
}

function renderFleets(overview) {
  const select = document.getElementById("fleet");
  const fleets = overview.fleets || [];
  const wanted = ["", ...fleets];
  if (state.fleet && !fleets.includes(state.fleet)) wanted.push(state.fleet);
  const have = [...select.options].map((o) => o.value);
  if (JSON.stringify(have) !== JSON.stringify(wanted)) {
    select.replaceChildren(...wanted.map((name) => el("option", { value: name }, name || `all fleets (${fleets.length})`)));
  }
  select.value = state.fleet;
}

function renderOverview(overview) {
  state.overview = overview;
  const empty = overview.counts.devices === 0 && !state.fleet;
  document.getElementById("empty").hidden = !empty;
  for (const id of ["cards", "devices-section", "device-charts", "fleet-charts"]) document.getElementById(id).hidden = empty;
  document.getElementById("empty-store").textContent = overview.store;
  document.querySelectorAll(".store-url").forEach((node) => { node.textContent = overview.store; });
  document.getElementById("store").textContent = overview.store;
  document.getElementById("store").title = overview.store;
  document.getElementById("updated").textContent = "updated " + formatClock(overview.generated_at);
  renderFleets(overview);
  renderCards(overview);
  fill("bundles", overview.bundles.map((b) => {
    const tr = el("tr");
    tr.append(clipped(b.bundle_id || "(none)"), cell(b.devices, "num"), cell(b.online, "num"), cell(b.targets.join(", "), "wrap"));
    return tr;
  }), "no bundles reported");
  fill("rejected", Object.entries(overview.rejected || {}).map(([reason, count]) => {
    const tr = el("tr");
    tr.append(clipped(reason), cell(count, "num"));
    return tr;
  }), "none: every message was valid");
  fill("rollouts", overview.rollouts.map(rolloutRow), "no rollouts yet (edgekit fleet deploy)");
  fill("events", overview.events.map((e) => {
    const tr = el("tr");
    tr.append(cell(formatWhen(e.at)), clipped(e.fleet, 20), clipped(e.device), cell(e.kind), cell(e.level, "level-" + e.level), cell(e.message, "wrap wide"));
    return tr;
  }), "no events yet");
}

// -- rollouts ---------------------------------------------------------------------------------------

// The wave a rollout is at (deploying or watching), else the last one it started; null before any.
function currentWave(r) {
  const waves = r.waves || [];
  return waves.find((w) => w.state === "deploying" || w.state === "watching")
    || [...waves].reverse().find((w) => w.state !== "pending" && w.state !== "not_started") || null;
}

// "error rate 0.0% (limit 2.0%), p99 8.00 → 7.50 ms (0.94×, limit 1.50×)" from a gate's figures
function gateText(h) {
  if (!h || h.error_rate === undefined) return DASH;
  const limit = (v, f) => (v === null || v === undefined ? "" : ` (limit ${f(v)})`);
  let ratio = "";
  if (h.p99_ratio !== null && h.p99_ratio !== undefined) {
    ratio = ` (${formatNumber(h.p99_ratio, 2)}×` + (h.max_p99_ratio === undefined ? "" : `, limit ${formatNumber(h.max_p99_ratio, 2)}×`) + ")";
  }
  return `error rate ${formatPercent(h.error_rate)}${limit(h.max_error_rate, formatPercent)}, p99 ${formatNumber(h.p99_before_ms, 2)} → ${formatNumber(h.p99_after_ms, 2)} ms${ratio}`
    + (h.final === false ? ` so far, ${plural(h.healthy || 0, "device")} of ${h.devices} heard from` : "");
}

// devices per outcome ("3 succeeded, 5 pending"), and when opened the devices that did not succeed (the summary lists
// at most 50, with how many more; the whole record, every device, is at r.detail: /api/rollout?id=...)
function outcomesCell(r) {
  const counts = r.outcome_counts || {};
  const summary = Object.entries(counts).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([o, n]) => `${n} ${o}`).join(", ");
  const td = el("td", { class: "wrap outcomes" });
  const details = el("details");
  details.appendChild(el("summary", {}, `${plural(r.device_count || 0, "device")}: ${summary || DASH}`));
  const listed = r.not_succeeded || [];
  if (listed.length) {
    const list = el("ul");
    for (const result of listed) {
      const outcome = result.outcome;
      const reason = result.reason && !["succeeded", "pending", "not_started"].includes(outcome) ? `: ${result.reason}` : "";
      list.appendChild(el("li", { "data-device": result.device, "data-outcome": outcome }, `${result.device}: ${outcome}${result.wave ? ` (wave ${result.wave})` : ""}${reason}`));
    }
    details.appendChild(list);
  } else {
    details.appendChild(el("div", { class: "muted" }, "every device succeeded"));
  }
  const more = el("div", { class: "muted more-devices" });
  if (r.not_succeeded_more) more.appendChild(document.createTextNode(`${plural(r.not_succeeded_more, "more device")} did not succeed, not listed here; `));
  more.appendChild(el("a", { href: r.detail || `/api/rollout?id=${encodeURIComponent(r.rollout_id)}` }, "every device's outcome (JSON)"));
  details.appendChild(more);
  td.appendChild(details);
  return td;
}

// elapsed since the start (to the end once final), and while a gate watches, the seconds it has left
function rolloutTime(r, wave) {
  const end = r.finished_at ? Date.parse(r.finished_at) : Date.now();
  let text = formatSeconds((end - Date.parse(r.started_at)) / 1000);
  if (!r.finished_at && wave && wave.state === "watching" && wave.watch_ends_at) {
    text += `, gate ${formatSeconds((Date.parse(wave.watch_ends_at) - Date.now()) / 1000)} left`;
  }
  return text;
}

function rolloutRow(r) {
  const tr = el("tr", { "data-rollout": r.rollout_id, "data-state": r.state });
  const wave = currentWave(r), waves = (r.waves || []).length;
  const where = wave ? `wave ${wave.index}/${waves}` + (wave.state === r.state ? "" : ` ${wave.state}`) : (waves ? `${plural(waves, "wave")}` : "");
  const stateTd = el("td", { class: "wrap rollout-state" });
  stateTd.appendChild(el("b", {}, r.state));
  if (where) stateTd.appendChild(el("span", { class: "muted wave" }, " " + where));
  if (r.silent_s) {  // still "deploying" or "watching", but its deploy has not saved it for longer than it ever waits
    stateTd.appendChild(el("div", { class: "silent", title: "the fleet deploy that ran it has most likely ended (killed, or its host lost)" },
      `no update for ${formatSeconds(r.silent_s)}`));
  }
  const dropped = (r.options && r.options.dropped_waves) || [];
  if (dropped.length) stateTd.appendChild(el("div", { class: "muted", title: dropped.map((d) => d.reason).join("; ") }, `dropped: ${dropped.map((d) => d.spec).join(", ")}`));
  const gate = wave && wave.health && wave.health.error_rate !== undefined ? wave.health : r.health;
  tr.append(cell(formatWhen(r.started_at)), clipped(r.fleet, 20), clipped(r.bundle_id), stateTd, outcomesCell(r),
    cell(gateText(gate), "wrap gate"), cell(rolloutTime(r, wave), "time"), cell(r.reason || "", "wrap wide"));
  return tr;
}

// Rollouts as chart markers: [{t (s), short, label}]; with `detail` (/api/device) those that included that device.
function rolloutMarkers(detail) {
  const rollouts = (detail ? detail.rollouts : state.overview && state.overview.rollouts) || [];
  return rollouts
    .map((r) => ({ t: Date.parse(r.started_at) / 1000, short: shortId(r.bundle_id, 14), id: r.rollout_id,
      label: `${formatWhen(r.started_at)} rollout ${r.bundle_id}: ${r.state}` }));
}

// -- data flow --------------------------------------------------------------------------------------

function resolutionText(data) {
  return `${RANGES[state.hours]}, one point per ${duration(data.bucket_s)}`;
}

// the resolution, and that the newest bucket is left out of the lines while it fills (charts.js dropFillingBucket)
function noteFilling(id, data, figures) {
  const filling = figures.map((f) => f.dataset.filling).find((v) => v !== undefined);
  const note = filling === undefined ? "" : `; the newest ${duration(data.bucket_s)} (from ${formatClock(Number(filling) * 1000)}) is still filling and not drawn`;
  document.getElementById(id).textContent = resolutionText(data) + note;
}

async function loadDevice() {
  const { fleet, device } = state.selected;
  const query = new URLSearchParams({ fleet, device, hours: state.hours });
  let data, detail;
  try {
    [data, detail] = await Promise.all([getJSON(`/api/series?${query}`), getJSON(`/api/device?${new URLSearchParams({ fleet, device })}`)]);
  } catch (err) {
    if (err.status !== 404 || !state.selected || state.selected.device !== device) throw err;
    showMissingDevice(fleet, device);  // a device in the URL the store does not know: say so, never show another one
    return;
  }
  if (!state.selected || state.selected.device !== device || state.selected.fleet !== fleet) return;  // clicked elsewhere meanwhile
  state.missing = null;
  document.getElementById("selected").textContent = `${device} (${fleet})`;
  document.getElementById("device-missing").hidden = true;
  document.getElementById("device-body").hidden = false;
  state.detail = detail;
  renderIdentity(detail.identity);
  renderDeviceRollouts(detail.rollouts);
  renderDeviceEvents();
  const s = data.series, range = RANGES[state.hours];
  const common = { since: data.since, until: data.until, bucket_s: data.bucket_s, empty: `no telemetry from ${device} in the last ${range}`,
    markers: rolloutMarkers(detail) };
  const heard = s.t.length > 0;  // buckets exist only where the device sent windows
  const figures = ["chart-latency", "chart-power", "chart-temperature"].map((id) => document.getElementById(id));
  timeChart(figures[0], { ...common, title: `${device}: latency`, unit: "ms", digits: 2, zero: true,
    empty: heard ? `${device} ran no inference in the last ${range} (idle): no latency to show` : common.empty, lines: [
    { name: "p50", t: s.t, v: s.p50_ms, color: COLORS[2] }, { name: "p99 (worst window)", t: s.t, v: s.p99_max_ms, color: COLORS[1] }] });
  timeChart(figures[1], { ...common, title: `${device}: power`, unit: "W", digits: 2, zero: true,
    empty: heard ? `no power sensor on ${device}: its telemetry carries no power readings` : common.empty, lines: [
    { name: "mean power", t: s.t, v: s.power_mean_mw.map((v) => (v === null ? null : v / 1000)), color: COLORS[0] }] });
  timeChart(figures[2], { ...common, title: `${device}: temperature`, unit: "°C", digits: 1, zero: false,
    empty: heard ? `${device} reports no temperature sensor` : common.empty, lines: [
    { name: "hottest sensor", t: s.t, v: s.temperature_max_c, color: COLORS[3] }] });
  noteFilling("resolution", data, figures);
}

function showMissingDevice(fleet, device) {
  state.selected = null;
  state.missing = { fleet, device };
  document.getElementById("selected").textContent = `${device} (${fleet})`;
  const notice = document.getElementById("device-missing");
  notice.textContent = `No device ${device} in fleet ${fleet} in this store: the link names a device that never reported here (a typo, or another store). Click a row to show a device.`;
  notice.hidden = false;
  document.getElementById("device-body").hidden = true;
  document.getElementById("resolution").textContent = "";
  document.querySelectorAll("#devices tbody tr.selected").forEach((tr) => tr.classList.remove("selected"));
}

// board, OS, JetPack, power mode... as the agent reports them (status.v1 identity)
function renderIdentity(identity) {
  const list = document.getElementById("device-identity");
  if (!identity) {
    list.replaceChildren(el("div", { class: "muted" }, "its agent reports no identity (board, OS, JetPack, power mode): agents before device identity and simulated devices do not"));
    return;
  }
  const items = identity.fields.filter((f) => f.value !== null && f.value !== undefined).map((f) => {
    const item = el("div", { "data-field": f.name });
    const value = f.name === "power_mode" && identity.clocks_locked ? `${f.value} (clocks locked)` : f.value;
    item.append(el("dt", {}, f.label), el("dd", {}, value));
    return item;
  });
  const when = el("div", { class: "muted" });
  when.append(el("dt", {}, "reported"), el("dd", {}, formatWhen(identity.updated_at)));
  list.replaceChildren(...items, when);
}

// "p99 11.90 → 12.60 ms, 5.00 → 4.80 W": the device's figures in the 15 min before and after a rollout started
function beforeAfter(before, after) {
  if (!before && !after) return DASH;
  const pick = (side, key) => (side ? side[key] : null);
  const p99 = `p99 ${formatNumber(pick(before, "p99_ms"), 2)} → ${formatNumber(pick(after, "p99_ms"), 2)} ms`;
  const hasPower = pick(before, "power_mean_mw") !== null || pick(after, "power_mean_mw") !== null;
  return p99 + (hasPower ? `, ${formatPower(pick(before, "power_mean_mw"), false)} → ${formatPower(pick(after, "power_mean_mw"))}` : "");
}

function renderDeviceRollouts(rollouts) {
  fill("device-rollouts", rollouts.map((r) => {
    const tr = el("tr", { "data-rollout": r.rollout_id, "data-outcome": r.outcome || "" });
    const bundles = el("td");
    bundles.append(el("span", { class: "clip", title: r.previous_bundle_id || "(none)" }, shortId(r.previous_bundle_id || "(none)", 24)),
      document.createTextNode(" → "), el("span", { class: "clip", title: r.bundle_id }, shortId(r.bundle_id, 24)));
    const outcome = `${r.outcome || DASH}${r.wave ? ` (wave ${r.wave})` : ""}` + (r.state !== r.outcome ? `; rollout ${r.state}` : "");
    tr.append(cell(formatWhen(r.started_at)), bundles, cell(outcome, "wrap"), cell(beforeAfter(r.before, r.after), "wrap compare"),
      cell(r.reason || "", "wrap wide"));
    return tr;
  }), "no rollout has included this device");
}

// the device's events, filtered by level, kind and text in the page (the API sends its newest 200)
function renderDeviceEvents() {
  const events = (state.detail && state.detail.events) || [];
  const kinds = [...new Set(events.map((e) => e.kind))].sort();
  const kindSelect = document.getElementById("device-event-kind");
  const chosen = kindSelect.value;
  const wanted = ["", ...kinds];
  if (chosen && !wanted.includes(chosen)) wanted.push(chosen);
  if (JSON.stringify([...kindSelect.options].map((o) => o.value)) !== JSON.stringify(wanted)) {
    kindSelect.replaceChildren(...wanted.map((k) => el("option", { value: k }, k || "every kind")));
    kindSelect.value = chosen;
  }
  const level = document.getElementById("device-event-level").value;
  const text = document.getElementById("device-event-filter").value.trim().toLowerCase();
  const shown = events.filter((e) => (!level || e.level === level) && (!chosen || e.kind === chosen)
    && (!text || `${e.kind} ${e.message}`.toLowerCase().includes(text)));
  document.getElementById("device-event-count").textContent = shown.length === events.length ? plural(events.length, "event") : `${shown.length} of ${plural(events.length, "event")}`;
  fill("device-events", shown.map((e) => {
    const tr = el("tr", { "data-kind": e.kind, "data-level": e.level });
    tr.append(cell(formatWhen(e.at)), cell(e.kind), cell(e.level, "level-" + e.level), cell(e.message, "wrap wide"));
    return tr;
  }), events.length ? "no event of this device matches" : "no events from this device");
}

async function loadFleet() {
  const data = await getJSON(`/api/fleet-series?${apiQuery({ by: state.by, hours: state.hours })}`);
  const groups = Object.entries(data.groups);
  const what = { bundle_id: "bundle", target: "target", power_mode: "power mode", model: "model" }[state.by];
  const common = { since: data.since, until: data.until, bucket_s: data.bucket_s, empty: `no telemetry in the last ${RANGES[state.hours]}`,
    markers: rolloutMarkers(null) };
  timeChart(document.getElementById("chart-bundles"), { ...common, title: `worst p99 by ${what}`, unit: "ms", digits: 2, zero: true,
    lines: groups.map(([name, s], i) => ({ name, t: s.t, v: s.p99_max_ms, color: COLORS[i % COLORS.length] })) });
  if (state.by === "model") {  // power is the device's, shared by its models: each model's throughput instead
    timeChart(document.getElementById("chart-fleet-power"), { ...common, title: "throughput per device by model", unit: "inf/s", digits: 2, zero: true,
      lines: groups.map(([name, s], i) => ({ name, t: s.t, v: s.throughput_per_s, color: COLORS[i % COLORS.length] })) });
  } else {
    timeChart(document.getElementById("chart-fleet-power"), { ...common, title: `mean power per device by ${what}`, unit: "W", digits: 2, zero: true,
      lines: groups.map(([name, s], i) => ({ name, t: s.t, v: s.power_mean_mw.map((v) => (v === null ? null : v / 1000)), color: COLORS[i % COLORS.length] })) });
  }
  noteFilling("fleet-resolution", data, ["chart-bundles", "chart-fleet-power"].map((id) => document.getElementById(id)));
}

// The device table's page as state asks for it; an answer to an older request (typing fast) is dropped.
let devicesAsked = 0;
async function loadDevices() {
  const asked = ++devicesAsked;
  const params = { sort: state.sort, order: state.order, offset: state.offset, limit: state.limit };
  if (state.q) params.q = state.q;
  if (state.states.length) params.state = state.states.join(",");
  const page = await getJSON(`/api/devices?${apiQuery(params)}`);
  if (asked !== devicesAsked) return state.page;
  if (page.offset > 0 && page.offset >= page.total) {  // the fleet shrank under the page: back to the first
    state.offset = 0;
    return loadDevices();
  }
  state.page = page;
  renderDevices();
  return page;
}

function reloadDevices() {
  return loading(loadDevices()).catch(showError);
}

function setStates(states) {
  state.states = states;
  state.offset = 0;
  if (state.overview) renderCards(state.overview);
  reloadDevices();
}

async function selectDevice(fleet, device) {
  state.selected = { fleet, device };
  state.missing = null;
  document.getElementById("selected").textContent = `${device} (${fleet})`;
  writeHash();
  document.querySelectorAll("#devices tbody tr.selected").forEach((tr) => tr.classList.remove("selected"));
  const row = [...document.querySelectorAll("#devices tbody tr")].find((tr) => tr.dataset.device === device && tr.dataset.fleet === fleet);
  if (row) row.classList.add("selected");
  await loadDevice();
}

function setRange(hours) {
  state.hours = hours;
  document.querySelectorAll("#range button").forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.hours === hours)));
  writeHash();
}

function showError(err) {
  document.getElementById("updated").textContent = "error: " + err.message;
  document.body.dataset.error = err.message;
}

// A device to draw when none is selected: on the page shown, an online one with telemetry, else any with telemetry.
function defaultDevice(page) {
  const rows = page.devices;
  return rows.find((x) => x.windows > 0 && x.state === "online") || rows.find((x) => x.windows > 0) || rows[0];
}

async function refresh(first) {
  try {
    let overview;
    try {
      overview = await getJSON(`/api/overview?${apiQuery()}`);
    } catch (err) {
      if (err.status !== 404 || !state.fleet) throw err;
      const unknown = state.fleet;  // a fleet in the URL that the store does not know: show every fleet
      state.fleet = "";
      writeHash();
      overview = await getJSON(`/api/overview?${apiQuery()}`);
      setTimeout(() => { document.getElementById("updated").textContent = `no fleet ${unknown} in this store: showing all fleets`; }, 0);
    }
    renderOverview(overview);
    const jobs = [];
    if (overview.counts.devices) {
      jobs.push(loadFleet());
      jobs.push(loadDevices().then(async (page) => {
        if (state.selected) {
          await loadDevice();
          if (state.selected) return;
        }
        if (state.missing) return;  // the URL named a device the store does not know: the page says so and waits for a click
        const d = page && page.devices.length ? defaultDevice(page) : null;
        if (d) await selectDevice(d.fleet, d.device);
      }));
    } else {
      state.page = null;
      fill("devices", [], "no devices");
    }
    await Promise.all(jobs);
    delete document.body.dataset.error;
    if (first) {
      document.body.dataset.ready = "1";
      window.edgekitReadyMs = performance.now();
    }
  } catch (err) {
    showError(err);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  readHash();
  setRange(state.hours);
  document.getElementById("group-by").value = state.by;
  document.getElementById("page-size").value = String(state.limit);
  document.querySelectorAll("#devices th").forEach((th) => th.addEventListener("click", () => {
    const key = th.dataset.key;
    if (!key) return;
    state.order = state.sort === key && state.order === "asc" ? "desc" : "asc";
    state.sort = key;
    state.offset = 0;
    reloadDevices();
  }));
  document.getElementById("worst-first").addEventListener("click", () => {
    state.sort = "worst";
    state.order = "asc";
    state.offset = 0;
    reloadDevices();
  });
  // the filter asks the server once typing pauses; meanwhile the page counts as loading (the request is as good as out)
  let typing = null;
  document.getElementById("filter").addEventListener("input", (event) => {
    if (typing === null) {
      loadingCount += 1;
      document.body.dataset.loading = "1";
    } else {
      clearTimeout(typing);
    }
    const text = event.target.value.trim();
    typing = setTimeout(() => {
      typing = null;
      state.q = text;
      state.offset = 0;
      loadingCount -= 1;
      reloadDevices();
    }, FILTER_DEBOUNCE_MS);
  });
  document.getElementById("page-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); reloadDevices(); });
  document.getElementById("page-next").addEventListener("click", () => { state.offset += state.limit; reloadDevices(); });
  document.getElementById("page-size").addEventListener("change", (event) => {
    state.limit = Number(event.target.value);
    state.offset = 0;
    reloadDevices();
  });
  document.getElementById("fleet").addEventListener("change", (event) => {
    state.fleet = event.target.value;
    state.offset = 0;
    if (state.selected && state.fleet && state.selected.fleet !== state.fleet) state.selected = null;
    writeHash();
    loading(refresh(false));
  });
  document.querySelectorAll("#range button").forEach((b) => b.addEventListener("click", () => {
    setRange(b.dataset.hours);
    for (const chart of Object.values(charts)) chart.edgekit.zoomed = false;  // a new range shows all of itself
    loading(Promise.all([loadFleet(), state.selected ? loadDevice() : null]));
  }));
  document.getElementById("group-by").addEventListener("change", (event) => {
    state.by = event.target.value;
    writeHash();
    loading(loadFleet());
  });
  for (const id of ["device-event-level", "device-event-kind"]) document.getElementById(id).addEventListener("change", renderDeviceEvents);
  document.getElementById("device-event-filter").addEventListener("input", renderDeviceEvents);
  if (window.ResizeObserver) new ResizeObserver(resizeCharts).observe(document.querySelector("main"));
  refresh(true);
  setInterval(() => refresh(false), REFRESH_MS);
});
