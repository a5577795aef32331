"""Virtual edgekit agents for demos, rollout tests and load tests (``edgekit fleet simulate``).

Each simulated device is a real MQTT client with its own connection, client id, retained
``online`` status and ``offline`` will, subscribed to its ``cmd`` topic. Its messages are built by
the runtime's own builders (:func:`~edgekit_runtime.agent.telemetry.build_telemetry` and friends),
so they are schema-valid and shaped exactly like a real agent's; it answers ``ping``,
``set_interval``, ``deploy`` and ``rollback`` commands like the agent does (see
:mod:`edgekit.fleet.sim.device`). One thread drives every connection (:mod:`edgekit.fleet.sim.mux`).

The latency, power, temperature and load figures are SYNTHETIC, derived from the target profiles
(:mod:`edgekit.fleet.sim.profiles`). Never mistake them for measurements.

Python::

    with FleetSimulator(SimulationConfig("mqtt://127.0.0.1:1883", devices=20, rate_per_s=0.2)) as sim:
        sim.run_for(60)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from edgekit.fleet.sim.device import BundleBehaviour, DeployTiming, VirtualAgent
from edgekit.fleet.sim.limits import raise_open_files_limit
from edgekit.fleet.sim.mux import DEFAULT_MAX_CONNECTING, BrokerOptions, Connection, MqttMux, MqttVersion
from edgekit.fleet.sim.profiles import DEFAULT_TARGETS, SyntheticProfile, profiles_for
from edgekit_runtime.agent.telemetry import BundleRef, encode_message
from edgekit_runtime.agent.topics import TelemetryError, TopicKind, validate_id

__all__ = [
    "BundleBehaviour",
    "DeployTiming",
    "FleetSimulator",
    "SimulationConfig",
    "SimulatorCounters",
    "SimulationError",
    "synthetic_bundle",
]

logger = logging.getLogger(__name__)

MAX_RATE_PER_S = 1000.0
#: Devices added to the mux per turn of its loop while connecting (the loop stays responsive in between).
_ADD_CHUNK = 200
#: Fleets up to this size validate every window by default; bigger ones every AUTO_VALIDATE_EVERY-th.
AUTO_VALIDATE_DEVICES, AUTO_VALIDATE_EVERY = 1000, 100
#: ``start()`` gives up when no device got connected for this long.
CONNECT_STALL_S = 15.0


class SimulationError(TelemetryError):
    """The simulator cannot run as configured (bad device count or rate, broker unreachable)."""


def synthetic_bundle(bundle_id: str) -> BundleRef:
    """A bundle reference for a simulated device: the id, and a sha256 made from it."""
    return BundleRef(bundle_id, hashlib.sha256(bundle_id.encode("utf-8")).hexdigest())


@dataclass(frozen=True)
class SimulationConfig:
    """What to simulate. ``rate_per_s`` is telemetry windows per second per device (0.1 = one 10 s window)."""

    broker_url: str
    devices: int = 10
    rate_per_s: float = 0.1
    fleet: str = "sim"
    targets: tuple[str, ...] = DEFAULT_TARGETS
    initial_bundle: str | None = "demo-v1"
    mqtt_version: MqttVersion = "5"
    behaviours: Mapping[str, BundleBehaviour] = field(default_factory=dict)
    deploy_timing: DeployTiming = DeployTiming()
    verify_downloads: bool = False
    seed: int = 0
    tls_ca: Path | None = None
    username: str | None = None
    password_file: Path | None = None
    window: int = 32
    allow_plaintext_password: bool = False  # a password over mqtt:// to a broker off loopback
    load: float | None = None  # a fixed load in [0.05, 1] instead of each device's daily cycle (tests that must not depend on the hour)
    max_connecting: int = DEFAULT_MAX_CONNECTING  # connections waiting for a CONNACK at once (paced connecting)
    #: MQTT keep-alive of each device's connection; None: the agent's 30 s up to AUTO_VALIDATE_DEVICES devices,
    #: 60 s above (half the pings, and a starved simulator may lag 90 s before the broker drops a device as
    #: silent). A crash is seen at once either way (the socket closes).
    keepalive_s: int | None = None
    first_device: int = 0  # index of the first device: names are <target>-<index> (a shard of a bigger fleet starts later)
    #: 1: every telemetry window built by the runtime's validating builder; N: each device's first and every Nth
    #: (the others by the simulator's identical unchecked copy, a fifth of the CPU); None: 1 up to
    #: AUTO_VALIDATE_DEVICES devices, AUTO_VALIDATE_EVERY above
    validate_every: int | None = None

    def resolved(self) -> SimulationConfig:
        """This config with the size-dependent defaults (``validate_every``, ``keepalive_s``) filled in for its
        number of devices (shards of a bigger fleet get the whole fleet's)."""
        big = self.devices > AUTO_VALIDATE_DEVICES
        return dataclasses.replace(
            self, validate_every=self.validate_every or (AUTO_VALIDATE_EVERY if big else 1),
            keepalive_s=self.keepalive_s or (60 if big else 30),
        )  # fmt: skip

    def check(self) -> None:
        if isinstance(self.devices, bool) or not isinstance(self.devices, int) or not 1 <= self.devices <= 100_000:
            raise SimulationError(f"devices must be an integer from 1 to 100000, got {self.devices!r}", hint="e.g. --devices 20")
        if not 0 < self.rate_per_s <= MAX_RATE_PER_S:
            raise SimulationError(
                f"rate must be > 0 and <= {MAX_RATE_PER_S:g} telemetry windows per second per device, got {self.rate_per_s!r}",
                hint="e.g. --rate 0.1 for one 10 s window per device",
            )
        if self.load is not None and not 0.05 <= self.load <= 1.0:
            raise SimulationError(f"load must be from 0.05 to 1 (a share of full load), got {self.load!r}", hint="e.g. load=0.6, or None for the daily cycle")
        if self.validate_every is not None and (isinstance(self.validate_every, bool) or not isinstance(self.validate_every, int)
                                                or self.validate_every < 1):  # fmt: skip
            raise SimulationError(f"validate_every must be an integer >= 1 or None, got {self.validate_every!r}",
                                  hint="1 checks every window against telemetry.v1; 100 every hundredth")  # fmt: skip
        if self.max_connecting < 1 or self.first_device < 0:
            raise SimulationError(f"max_connecting must be >= 1 and first_device >= 0, got {self.max_connecting!r} and {self.first_device!r}",
                                  hint="e.g. max_connecting=64, first_device=0")  # fmt: skip
        if not self.targets:
            raise SimulationError("no targets given", hint=f"e.g. --targets {','.join(DEFAULT_TARGETS)}")
        validate_id(self.fleet, "fleet id")


@dataclass(frozen=True)
class SimulatorCounters:
    devices: int
    connected: int
    published: int
    acked: int
    queued: int
    windows: int


def block_for(duration_s: float | None) -> None:
    """Sleep ``duration_s`` seconds (forever when None) in short steps, so Ctrl-C ends it at once."""
    deadline = None if duration_s is None else time.monotonic() + duration_s
    while deadline is None or time.monotonic() < deadline:
        time.sleep(0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic())))


class FleetSimulator:
    """Simulated devices on one broker: ``start()``, ``run_for()`` or your own waiting, ``stop()``."""

    def __init__(self, config: SimulationConfig) -> None:
        config.check()
        self.config = config
        self.mux = MqttMux(BrokerOptions(config.broker_url, config.mqtt_version, config.tls_ca, config.username,
                                         config.password_file, allow_plaintext_password=config.allow_plaintext_password,
                                         keepalive_s=config.resolved().keepalive_s or 30),
                            window=config.window, max_connecting=config.max_connecting)  # fmt: skip
        profiles = profiles_for(list(dict.fromkeys(config.targets)))
        by_target = {profile.target: profile for profile in profiles}
        self.agents: dict[str, VirtualAgent] = {}
        self._connections: dict[str, Connection] = {}
        self._windows = 0
        self._ticking = False
        bundle = synthetic_bundle(config.initial_bundle) if config.initial_bundle else None
        validate_every = config.resolved().validate_every or 1
        for index in range(config.first_device, config.first_device + config.devices):
            profile: SyntheticProfile = by_target[config.targets[index % len(config.targets)]]
            device = f"{profile.target}-{index:03d}"
            self.agents[device] = VirtualAgent(
                config.fleet, device, profile, send=self._sender(device), schedule=self.mux.schedule, bundle=bundle,
                behaviours=config.behaviours, deploy_timing=config.deploy_timing,
                verify_downloads=config.verify_downloads, interval_s=1.0 / config.rate_per_s, seed=config.seed * 100_003 + index, load=config.load,
                validate_every=validate_every,
            )  # fmt: skip
        self._started = False
        #: seconds ``start()`` took to connect every device (None before)
        self.connect_seconds: float | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, *, wait_s: float | None = None, stall_s: float = CONNECT_STALL_S, telemetry: bool = True) -> FleetSimulator:
        """Connect every device, then start the telemetry windows unless ``telemetry`` is False.

        Devices connect in paced batches (``max_connecting`` at a time). Raises :class:`SimulationError`
        when no further device connected for ``stall_s`` seconds, or when they are not all connected
        within ``wait_s`` (default: 30 s plus 20 ms a device)."""
        if self._started:
            raise SimulationError("this simulator was already started", hint="create a new FleetSimulator")
        raise_open_files_limit(len(self.agents) + 64, what=f"{len(self.agents)} simulated devices")
        self._started = True
        started = time.monotonic()
        wait_s = 30.0 + 0.02 * len(self.agents) if wait_s is None else wait_s
        self.mux.start()
        self.mux.call(lambda: self._connect_from(list(self.agents), 0))
        best, progress_at = 0, started
        while True:
            connected = self.counters().connected
            now = time.monotonic()
            if connected == len(self.agents):
                break
            if connected > best:
                best, progress_at = connected, now
            if now - progress_at > stall_s or now - started > wait_s:
                self.stop(flush_s=1.0)
                why = f"none more for {stall_s:g} s" if now - progress_at > stall_s else f"not all within {wait_s:g} s"
                raise SimulationError(
                    f"only {connected} of {len(self.agents)} simulated devices connected to {self.config.broker_url} "
                    f"({why}; {now - started:.1f} s since start)",
                    hint="check that the broker is running at that URL (and speaks MQTT "
                    f"{self.config.mqtt_version}; amqtt speaks only 3.1.1: pass mqtt_version='3.1.1'), and that it "
                    "allows this many connections (Mosquitto: max_connections, and its open-files limit, ulimit -n)",
                )
            time.sleep(0.05)
        self.connect_seconds = time.monotonic() - started
        if telemetry:
            self.start_telemetry()
        return self

    def start_telemetry(self) -> None:
        """Begin periodic windows (spread over the first interval so devices do not publish in step)."""
        def begin() -> None:
            if self._ticking:
                return
            self._ticking = True
            for index, device in enumerate(self.agents):
                agent = self.agents[device]
                offset = agent.interval_s * (index / max(1, len(self.agents)))
                last_end = datetime.now(timezone.utc) - timedelta(seconds=agent.interval_s - offset)
                due = time.monotonic() + offset
                self.mux.schedule(offset, functools.partial(self._tick, device, last_end, due))

        self.mux.call(begin)

    def stop(self, *, flush_s: float = 5.0) -> None:
        """Flush what is queued, publish ``offline`` (retained) for every device, disconnect cleanly."""
        if not self._started:
            return
        call_s = 10.0 + 0.005 * len(self.agents)  # saying offline builds a status per device on a loaded loop
        try:
            self.mux.call(self._stop_ticking, timeout_s=call_s)
            self.flush(flush_s)
            self.mux.call(self._say_offline, timeout_s=call_s)
            self.flush(flush_s)
            self.mux.call(lambda: [self.mux.disconnect(c) for c in self._connections.values()], timeout_s=call_s)
            time.sleep(0.05)
        except TelemetryError as err:
            logger.warning("simulator stop: %s", err.message)
        self.mux.stop()

    def __enter__(self) -> FleetSimulator:
        return self if self._started else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_for(self, duration_s: float | None) -> None:
        """Block for ``duration_s`` seconds (forever when None) while the devices run."""
        block_for(duration_s)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued message is acknowledged by the broker (on every connection not cut by
        :meth:`crash`, whose unacknowledged messages died with it); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = [c for c in list(self._connections.values()) if not c.dropped]
            if all(not c.queue and c.published == c.acked for c in live):
                return True
            time.sleep(0.02)
        return False

    # -- inspection and control (thread-safe) -------------------------------------------------------

    def counters(self) -> SimulatorCounters:
        connections = list(self._connections.values())
        return SimulatorCounters(
            devices=len(self.agents),
            connected=sum(1 for c in connections if c.connected),
            published=sum(c.published for c in connections),
            acked=sum(c.acked for c in connections),
            queued=sum(len(c.queue) for c in connections),
            windows=self._windows,
        )

    def bundles(self) -> dict[str, str | None]:
        """device -> the bundle id it runs now."""
        return self.mux.call(lambda: {d: (a.bundle.id if a.bundle else None) for d, a in self.agents.items()})

    def record_targets(self, store: Any) -> None:
        """Tell a fleet store each simulated device's target (agents do not report it; the simulator knows)."""
        for device, agent in self.agents.items():
            store.set_device_target(self.config.fleet, device, agent.profile.target)

    def crash(self, device: str) -> None:
        """Cut ``device``'s connection as ``kill -9`` or a cut cable would: the socket is closed without an
        MQTT DISCONNECT, so the broker publishes the device's last will (retained ``offline`` status with
        reason ``connection lost``) at once. The device stays down (no reconnect, no more telemetry);
        messages it had in flight are lost with it, as on a real crash. Thread-safe; the other devices
        carry on."""
        self._agent(device)
        self.mux.call(lambda: self.mux.drop(self._connections[device]))

    def publish_backlog(self, windows_per_device: int, *, window_s: float = 10.0, end: datetime | None = None) -> int:
        """Build ``windows_per_device`` consecutive windows for every device (ending at ``end``, default
        now), then publish them all as fast as the broker acknowledges; returns how many were queued.
        Building happens before anything is sent, so a load test measures the network path only."""
        end = end or datetime.now(timezone.utc)
        start = end - timedelta(seconds=window_s * windows_per_device)
        built: dict[str, list[bytes]] = {}
        for device, agent in self.agents.items():
            built[device] = [
                encode_message(agent.telemetry(start + timedelta(seconds=window_s * i), start + timedelta(seconds=window_s * (i + 1))))
                for i in range(windows_per_device)
            ]  # fmt: skip

        def enqueue() -> None:
            for i in range(windows_per_device):
                for device, payloads in built.items():
                    self.mux.publish(self._connections[device], self.agents[device].topics.telemetry, payloads[i])

        self.mux.call(enqueue, timeout_s=60.0)
        self._windows += windows_per_device * len(built)
        return windows_per_device * len(built)

    def agent_state(self, device: str) -> dict[str, Any]:
        agent = self._agent(device)
        return self.mux.call(lambda: {"bundle": agent.bundle.id if agent.bundle else None,
                                      "previous_bundle": agent.previous_bundle.id if agent.previous_bundle else None,
                                      "interval_s": agent.interval_s, "seq": agent.seq})  # fmt: skip

    # -- mux thread ---------------------------------------------------------------------------------

    def _agent(self, device: str) -> VirtualAgent:
        if device not in self.agents:
            raise SimulationError(f"no simulated device {device!r}", hint=f"devices: {', '.join(list(self.agents)[:5])}, ...")
        return self.agents[device]

    def _sender(self, device: str) -> Any:
        def send(kind: TopicKind, message: dict[str, Any], retain: bool) -> None:
            agent = self.agents[device]
            connection = self._connections.get(device)
            if connection is not None:
                self.mux.publish(connection, agent.topics.topic(kind), encode_message(message), retain=retain)

        return send

    def _connect_from(self, devices: list[str], first: int) -> None:
        """Add ``_ADD_CHUNK`` devices to the mux, then come back for the rest on the loop's next turn."""
        self._connect_devices(devices[first:first + _ADD_CHUNK])
        if first + _ADD_CHUNK < len(devices):
            self.mux.schedule(0.0, lambda: self._connect_from(devices, first + _ADD_CHUNK))

    def _connect_devices(self, devices: list[str]) -> None:
        for device in devices:
            agent = self.agents[device]

            def will(agent: VirtualAgent = agent) -> tuple[str, bytes]:
                return agent.topics.status, encode_message(agent.status("offline", "connection lost"))

            def on_connected(connection: Connection, agent: VirtualAgent = agent) -> None:
                connection.client.subscribe(agent.topics.cmd, qos=1)
                self.mux.publish(connection, agent.topics.status, encode_message(agent.status("online")), retain=True)
                if not connection.ever_connected:
                    self.mux.publish(connection, agent.topics.events, encode_message(agent.started_event()))

            def on_message(topic: str, payload: bytes, agent: VirtualAgent = agent) -> None:
                if topic == agent.topics.cmd:
                    agent.handle_command_payload(payload)

            self._connections[device] = self.mux.add(f"edgekit-sim-{self.config.fleet}-{device}", on_connected=on_connected,
                                                     on_message=on_message, will=will)  # fmt: skip

    def _tick(self, device: str, last_end: datetime, due: float) -> None:
        """One window of ``device`` (from ``last_end`` to now), then the next one due ``interval_s`` after this
        one was due: a loop running late keeps the fleet's rate instead of drifting, and one that fell more
        than an interval behind starts afresh from now (longer windows, as a busy agent's)."""
        if not self._ticking:
            return
        agent = self.agents[device]
        connection = self._connections[device]
        now = datetime.now(timezone.utc)
        if not connection.closing and (connection.connected or connection.ever_connected):
            self.mux.publish(connection, agent.topics.telemetry, encode_message(agent.telemetry(last_end, now)))
            self._windows += 1
        next_due = due + agent.interval_s
        late_s = time.monotonic() - next_due
        if late_s > agent.interval_s:
            next_due += late_s
        self.mux.schedule(next_due - time.monotonic(), lambda: self._tick(device, now, next_due))

    def _stop_ticking(self) -> None:
        self._ticking = False

    def _say_offline(self) -> None:
        for device, connection in self._connections.items():
            if connection.connected:
                agent = self.agents[device]
                self.mux.publish(connection, agent.topics.status, encode_message(agent.status("offline", "agent stopped")),
                                 retain=True)  # fmt: skip
