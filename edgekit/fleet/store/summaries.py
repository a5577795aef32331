"""``fleet status``'s device summaries from one row of :data:`edgekit.fleet.store.queries.SUMMARIES` (no raw window
read: device_latest is kept as windows arrive), with the state judged by :mod:`edgekit.fleet.liveness`."""

from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

from edgekit.fleet.liveness import liveness_state
from edgekit.fleet.store.base import DeviceSummary


def summary_from_row(row: Sequence[Any], now: dt.datetime, time_out: Any) -> DeviceSummary:
    """A row of :data:`queries.SUMMARIES` as what ``fleet status`` shows (the state judged by liveness)."""
    (fleet, device, state, status_bundle, status_at, windows, seq_min, seq_max, received, latest_seq, bundle_id, p50_ms,
     p99_ms, power_mw, energy_mj, temperature_c, interval_s, target) = row
    windows = int(windows or 0)
    seen = [time_out(moment) for moment in (received if windows else None, status_at) if moment is not None]
    last_seen = max(seen) if seen else None
    has_latest = windows > 0 and latest_seq is not None
    interval = _float(interval_s) if has_latest else None
    return DeviceSummary(
        fleet=fleet, device=device, state=liveness_state(state, last_seen, interval, now),
        bundle_id=bundle_id if has_latest else status_bundle, target=target, p50_ms=_float(p50_ms) if has_latest else None,
        p99_ms=_float(p99_ms) if has_latest else None, power_mean_mw=_float(power_mw) if has_latest else None,
        energy_per_inference_mj=_float(energy_mj) if has_latest else None,
        temperature_max_c=_float(temperature_c) if has_latest else None, last_seen=last_seen, windows=windows,
        missing_seqs=max(int(seq_max) - int(seq_min) + 1 - windows, 0) if windows else 0, interval_s=interval,
    )  # fmt: skip


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


__all__ = ["summary_from_row"]
