"""The fleet store interface: one small contract, implemented by SQLite (default) and PostgreSQL.

Records are plain frozen dataclasses with units in their names. Writers are idempotent where MQTT
redelivers: a telemetry window is keyed by (fleet, device, seq) and stored once, also after retention rolled
it up (the store keeps the rolled-up seqs).
"""

from __future__ import annotations

import abc
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

#: In a rollout row :meth:`FleetStore.rollouts` could not read, the key saying why (beside its ``rollout_id``).
DAMAGED_RECORD = "_damaged"


@dataclass(frozen=True)
class TelemetryWindow:
    """One validated telemetry message, flattened for queries; ``payload`` keeps the whole message."""

    fleet: str
    device: str
    seq: int
    window_start: dt.datetime
    window_end: dt.datetime
    received_at: dt.datetime
    bundle_id: str | None
    bundle_sha256: str | None
    count: int
    errors: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None
    throughput_per_s: float | None
    power_mean_mw: float | None
    power_max_mw: float | None
    energy_mj: float | None
    energy_per_inference_mj: float | None
    temperature_max_c: float | None
    memory_used_mb: float | None
    cpu_load_pct: float | None
    gpu_load_pct: float | None
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    #: ``payload`` as the JSON text that arrived, when known: stores keep it as is instead of encoding again.
    payload_json: str | None = field(default=None, compare=False, repr=False)
    #: the model the window's bundle and latency are for (telemetry.v1 ``model``, issue 20); None from agents naming none
    model: str | None = None
    #: every model's own window (telemetry.v1 ``models``, else the window itself under ``model``)
    models: tuple["ModelWindow", ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class ModelWindow:
    """One model's part of a telemetry window: its inferences, latency and bundle (power is the device's)."""

    model: str | None
    bundle_id: str | None
    count: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    throughput_per_s: float | None
    memory_mb: float | None = None


@dataclass(frozen=True)
class ModelAggregate:
    """Per-model telemetry summed over model windows and their rollups. Keys not grouped by are None, as is
    the model of agents that name none; ``bucket_start`` only when bucketing by time."""

    fleet: str | None
    device: str | None
    model: str | None
    bundle_id: str | None
    bucket_start: dt.datetime | None
    devices: int
    windows: int
    inferences: int
    errors: int
    p50_ms: float | None  # inference-count-weighted mean of the windows' p50
    p99_ms: float | None  # inference-count-weighted mean of the windows' p99
    p99_max_ms: float | None  # the worst window's p99
    throughput_per_s: float | None  # inferences per second of window: a device's mean rate
    memory_mb_max: float | None
    first_window_start: dt.datetime | None
    last_window_end: dt.datetime | None


#: Keys :meth:`FleetStore.model_aggregate` can group by.
MODEL_AGGREGATE_KEYS = ("fleet", "device", "model", "bundle_id")


@dataclass(frozen=True)
class DeviceIdentityRecord:
    """What a device says it is (status.v1 ``identity`` and ``power_mode``), flattened for queries.

    ``power_mode`` is the label reports group by: the nvpmodel mode name, with ``+clocks`` when
    jetson_clocks pinned the clocks; ``None`` on a device without nvpmodel. ``payload`` keeps both objects."""

    fleet: str
    device: str
    board: str | None
    soc: str | None
    os: str | None
    l4t: str | None
    jetpack: str | None
    cuda: str | None
    tensorrt: str | None
    onnxruntime: str | None
    power_mode: str | None
    clocks_locked: bool | None
    updated_at: dt.datetime
    payload: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class DeviceStatus:
    fleet: str
    device: str
    state: str  # "online" | "offline" | ...
    bundle_id: str | None
    target: str | None
    agent_version: str | None
    updated_at: dt.datetime
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    #: from agents that report it (status.v1 ``identity`` / ``power_mode``); stored by :meth:`FleetStore.upsert_status`
    identity: DeviceIdentityRecord | None = field(default=None, compare=False)
    #: sent again by the broker (MQTT retained) to a collector subscribing: the device's newest status, said at
    #: ``updated_at`` (its own ``at``) or before; stored over any other, but never moving the stored time back
    retained: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class DeviceEvent:
    fleet: str
    device: str
    event_id: str
    kind: str
    level: str
    message: str
    at: dt.datetime
    command_id: str | None = None
    payload: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RejectedMessage:
    topic: str
    reason: str
    size_bytes: int
    at: dt.datetime
    detail: str = ""  # what exactly was wrong (first schema problem, JSON error), at most 512 characters
    #: how many rejected messages the row stands for (a sampling summary stands for those kept without a row)
    count: int = 1


@dataclass(frozen=True)
class DeviceSummary:
    """What ``edgekit fleet status`` shows for one device."""

    fleet: str
    device: str
    state: str  # "online" | "stale" | "offline" | "unknown" (edgekit.fleet.liveness), or another the agent reported
    bundle_id: str | None
    target: str | None
    p50_ms: float | None
    p99_ms: float | None
    power_mean_mw: float | None
    energy_per_inference_mj: float | None
    temperature_max_c: float | None
    last_seen: dt.datetime | None
    windows: int
    missing_seqs: int  # gaps in the sequence numbers seen so far
    #: the device's telemetry interval (its newest window's length); ``state`` is judged against it
    #: (:mod:`edgekit.fleet.liveness`: ``stale`` after 3 silent intervals, ``offline`` after 10 or a last will)
    interval_s: float | None = None


#: Keys :meth:`FleetStore.known_values` lists the values of (the filters of ``fleet status|report`` and the dashboard).
KNOWN_VALUE_KEYS = ("fleet", "device", "bundle_id", "target", "model")


#: Keys :meth:`FleetStore.aggregate` can group by.
AGGREGATE_KEYS = ("fleet", "device", "bundle_id", "target", "power_mode")


@dataclass(frozen=True)
class Aggregate:
    """Telemetry summed over raw windows and rollups. Key fields not grouped by are None (as is a bundle_id
    or target that is unknown); ``bucket_start`` is set only when bucketing by time.

    ``devices``: read for named devices or per device, the distinct devices with windows in the row. Read
    fleet-wide (from the aggregates kept at ingest, :mod:`edgekit.fleet.store.fleet_reads`), the peak devices
    reporting in one minute (one hour where the read uses the hour tier) within the row, and a device that
    changed bundle, target or power mode within that minute is counted once per group it reported in: not the
    distinct devices over the row's span (a fleet reporting every 5 minutes shows about a fifth of its size).
    The same holds for :class:`ModelAggregate` (per model and bundle)."""

    fleet: str | None
    device: str | None
    bundle_id: str | None
    target: str | None
    bucket_start: dt.datetime | None
    devices: int
    windows: int
    inferences: int
    errors: int
    p50_ms: float | None  # inference-count-weighted mean of the windows' p50
    p99_ms: float | None  # inference-count-weighted mean of the windows' p99
    p99_max_ms: float | None  # the worst window's p99
    power_mean_mw: float | None  # window-duration-weighted mean power
    energy_mj: float | None  # total energy measured
    energy_per_inference_mj: float | None  # energy of the windows with inferences over their inferences
    temperature_max_c: float | None
    first_window_start: dt.datetime | None
    last_window_end: dt.datetime | None
    #: the devices' power mode (their latest reported one, see DeviceIdentityRecord) when grouped by it
    power_mode: str | None = None


@dataclass(frozen=True)
class BundleSpan:
    """When a device ran a bundle: its first and last window with it (raw or rolled up) in a time range."""

    fleet: str
    device: str
    bundle_id: str | None
    first_window_start: dt.datetime
    last_window_end: dt.datetime
    windows: int


class FleetStore(abc.ABC):
    """Storage for telemetry windows, device status, events and rejected-message counts."""

    url: str

    # writes ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def add_windows(self, windows: Sequence[TelemetryWindow]) -> int:
        """Insert windows, ignoring (fleet, device, seq) already stored or rolled up; returns how many were new."""

    @abc.abstractmethod
    def upsert_status(self, status: DeviceStatus) -> bool:
        """Set a device's status unless a newer one (by ``updated_at``) is stored, so a lagging collector
        never undoes a newer status (a stored time ahead of this host's clock is not trusted: that clock was set
        back since); a non-None ``target`` is recorded as with :meth:`set_device_target`, a non-None ``identity`` in
        the device's identity row (also only when newer). Returns whether the status was applied."""

    def upsert_statuses(self, statuses: Sequence[DeviceStatus]) -> int:
        """:meth:`upsert_status` for each, in order (SQL stores: in one transaction); returns how many were applied."""
        return sum(bool(self.upsert_status(status)) for status in statuses)

    @abc.abstractmethod
    def add_events(self, events: Sequence[DeviceEvent]) -> int:
        """Insert events, ignoring event_ids already stored; returns how many were new."""

    @abc.abstractmethod
    def add_rejected(self, rejected: Sequence[RejectedMessage]) -> None: ...

    # reads ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def device_summaries(self, fleet: str | None = None) -> list[DeviceSummary]: ...

    @abc.abstractmethod
    def windows(self, fleet: str | None = None, device: str | None = None, since: dt.datetime | None = None,
                until: dt.datetime | None = None, bundle_id: str | None = None, limit: int | None = None) -> Iterator[TelemetryWindow]:
        """Windows ordered by (fleet, device, seq); ``since``/``until`` bound the window end (``until``
        exclusive). Only raw windows: those rolled up by retention are in :meth:`aggregate`."""

    @abc.abstractmethod
    def events(self, fleet: str | None = None, device: str | None = None, since: dt.datetime | None = None, limit: int = 200,
               *, kinds: Sequence[str] = ()) -> list[DeviceEvent]:  # fmt: skip
        """Events newest first (by the device's ``at``); only those of ``kinds`` when given (filtered in the store, so
        the ``limit`` newest of those kinds, however many events of other kinds came after them)."""

    @abc.abstractmethod
    def rejected_counts(self) -> dict[str, int]:
        """reason -> count of rejected messages."""

    @abc.abstractmethod
    def missing_seqs(self, fleet: str, device: str) -> list[tuple[int, int]]:
        """Gaps in a device's stored sequence numbers, as inclusive (first missing, last missing) ranges, among
        the raw windows still kept (``DeviceSummary.missing_seqs`` also counts gaps inside rolled-up history)."""

    @abc.abstractmethod
    def aggregate(self, by: Sequence[str] = ("bundle_id", "target"), *, fleet: str | None = None,
                  devices: Sequence[tuple[str, str]] | None = None, bundle_id: str | None = None,
                  target: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
                  bucket_s: int | None = None) -> list[Aggregate]:
        """Sums over raw windows and rollups grouped by ``by`` (a subset of :data:`AGGREGATE_KEYS`) and, with
        ``bucket_s``, by time buckets of that many seconds; ``devices`` restricts to (fleet, device) pairs.
        Time filters apply to window_end (raw) and bucket start (rollups). Ordered by the keys, then bucket."""

    @abc.abstractmethod
    def model_aggregate(self, by: Sequence[str] = ("model", "bundle_id"), *, fleet: str | None = None,
                        devices: Sequence[tuple[str, str]] | None = None, model: str | None = None,
                        since: dt.datetime | None = None, until: dt.datetime | None = None,
                        bucket_s: int | None = None) -> list[ModelAggregate]:  # fmt: skip
        """Per-model telemetry over model windows and rollups, grouped by ``by`` (among
        :data:`MODEL_AGGREGATE_KEYS`) and optionally by ``bucket_s`` time buckets."""

    @abc.abstractmethod
    def bundle_spans(self, fleet: str | None = None, since: dt.datetime | None = None,
                     until: dt.datetime | None = None) -> list[BundleSpan]:
        """Per device and bundle, the first and last window seen; ordered by fleet, device, first window."""

    def device_targets(self, fleet: str | None = None) -> dict[tuple[str, str], str]:
        """(fleet, device) -> the target profile recorded for it (devices without one are left out)."""
        return {(s.fleet, s.device): s.target for s in self.device_summaries(fleet) if s.target is not None}

    def agent_versions(self, fleet: str | None = None) -> dict[tuple[str, str], str | None]:
        """(fleet, device) -> the agent version of its last status (``sim-*``: a simulated device); devices without
        a status are left out. A store that keeps no statuses returns ``{}``."""
        return {}

    def simulated_devices(self, fleet: str | None = None) -> int:
        """How many devices (of ``fleet``) last reported a simulator's agent version (``sim-*``: ``edgekit fleet
        simulate``): their latency, power and temperature are SYNTHETIC, and what shows them says so."""
        from edgekit.fleet.rollout_bundle import SIMULATED_AGENT_PREFIX

        return sum(1 for version in self.agent_versions(fleet).values() if str(version or "").startswith(SIMULATED_AGENT_PREFIX))

    def bundle_totals(self, devices: Sequence[tuple[str, str]], bundle_id: str | None) -> Aggregate | None:
        """The (fleet, device) ``devices``' figures summed over every window they ran ``bundle_id`` on, all history
        (the report's before/after of a bundle switch); None when they have none."""
        found = self.aggregate((), devices=devices, bundle_id=bundle_id)
        return found[0] if found else None

    @abc.abstractmethod
    def device_identities(self, fleet: str | None = None) -> list[DeviceIdentityRecord]:
        """The identity each device last reported (devices whose agent never did are left out), by fleet, device."""

    @abc.abstractmethod
    def known_values(self, key: str, *, fleet: str | None = None) -> list[str]:
        """Every value of ``key`` (one of :data:`KNOWN_VALUE_KEYS`) any device has ever reported, in any table
        (status, targets, raw windows, rollups, events, rollouts), sorted; with ``fleet``, only that fleet's.
        Read filters use it to tell a mistyped value from one with no telemetry in a time range."""

    @abc.abstractmethod
    def set_device_target(self, fleet: str, device: str, target: str) -> None:
        """Record the target profile a device is (deploy and simulate know it; agents since issue 19 report the
        one they detect in their status, which :meth:`upsert_status` records the same way)."""

    # rollouts -------------------------------------------------------------------------------
    @abc.abstractmethod
    def save_rollout(self, record: dict[str, Any]) -> None:
        """Insert or replace a rollout record (``RolloutRecord.to_json()`` of :mod:`edgekit.fleet.rollout_state`)."""

    @abc.abstractmethod
    def rollouts(self, fleet: str | None = None, *, rollout_id: str | None = None, bundle_id: str | None = None,
                 since: dt.datetime | None = None, until: dt.datetime | None = None, limit: int = 50) -> list[dict[str, Any]]:  # fmt: skip
        """Rollout records (JSON, as saved) newest first; ``since`` and ``until`` apply to their start. Each holds its
        waves, every device's outcome with the reason its agent gave, the health gates and the timings."""

    # maintenance ----------------------------------------------------------------------------
    @abc.abstractmethod
    def apply_retention(self, raw_for: dt.timedelta, rollup_minutes: int = 5, now: dt.datetime | None = None, *,
                        gaps_open_for: dt.timedelta = dt.timedelta(days=7),
                        rollups_for: dt.timedelta | None = None) -> int:  # fmt: skip
        """Roll raw windows older than ``raw_for`` up into ``rollup_minutes`` buckets (per device and bundle)
        and delete them; returns how many raw windows were rolled up. The rolled-up (fleet, device, seq) keys are
        remembered, so :meth:`add_windows` still ignores those windows when they come again; a gap in a device's
        rolled-up seqs stays open for a late window ``gaps_open_for`` (then such a window counts as seen). With
        ``rollups_for``, per-device rollups and fleet 1-minute buckets older than that are forgotten too (PostgreSQL
        drops whole daily partitions); the fleet 1-hour buckets and each device's totals stay."""

    @property
    @abc.abstractmethod
    def schema_version(self) -> int:
        """The newest migration applied to the database."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "FleetStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
