// edgekit fleet dashboard: how times and numbers are written, in one place (loaded first). Times are local and
// ISO-like on a 24 h clock (2026-11-28 03:20:04, or 03:20:04 within today), power is in W everywhere, counts
// agree with their noun ("1 device", "2 devices"), and a missing value is "–".
"use strict";

const DASH = "–";
const pad2 = (n) => String(n).padStart(2, "0");

function toDate(value) {
  if (value === null || value === undefined || value === "") return null;
  const d = value instanceof Date ? value : new Date(typeof value === "number" ? value : Date.parse(value));
  return Number.isNaN(d.getTime()) ? null : d;
}

// 2026-11-28 03:20:04 (local time)
function formatDateTime(value) {
  const d = toDate(value);
  if (!d) return DASH;
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${formatClock(d)}`;
}

// 03:20:04 (local time)
function formatClock(value) {
  const d = toDate(value);
  if (!d) return DASH;
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

// 03:20:04 today, else 2026-11-28 03:20:04
function formatWhen(value) {
  const d = toDate(value);
  if (!d) return DASH;
  return d.toDateString() === new Date().toDateString() ? formatClock(d) : formatDateTime(d);
}

function formatNumber(value, digits) {
  if (value === null || value === undefined || Number.isNaN(Number(value))) return DASH;
  return Number(value).toFixed(digits);
}

// milliwatts (as the store keeps them) as watts: 10843 -> "10.84 W"; unit=false leaves the unit to a header
function formatPower(milliwatts, unit = true) {
  if (milliwatts === null || milliwatts === undefined) return DASH;
  return formatNumber(milliwatts / 1000, 2) + (unit ? " W" : "");
}

// seconds as "42 s", "3 min 05 s", "1 h 02 min"
function formatSeconds(seconds) {
  if (seconds === null || seconds === undefined) return DASH;
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${pad2(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${pad2(Math.floor((s % 3600) / 60))} min`;
}

function plural(count, noun, nouns) {
  return `${count} ${count === 1 ? noun : nouns || noun + "s"}`;
}

function formatPercent(share, digits = 1) {
  return share === null || share === undefined ? DASH : (100 * share).toFixed(digits) + "%";
}
