"""The agent process: serve the current bundle, report telemetry, carry out fleet commands.

:class:`AgentService` wires the parts together:

* a :class:`~edgekit_runtime.agent.ota.Deployer` picks the bundle to serve at start (``current``,
  else ``previous``) and applies ``deploy`` / ``rollback`` commands;
* an :class:`~edgekit_runtime.agent.serving.InferenceServer` behind the local
  :class:`~edgekit_runtime.agent.api.AgentApi`;
* a power sampling thread feeding a :class:`~edgekit_runtime.sensors.PowerIntegrator`;
* a telemetry thread that every ``telemetry.interval_s`` closes a window (latency, power integrated
  over the window, energy per inference, device state) and publishes it through the
  :class:`~edgekit_runtime.agent.mqtt.MqttLink` (which spools it on disk until the broker has it);
* a command thread for ``deploy``, ``rollback``, ``set_interval`` and ``ping`` (deploys and rollbacks
  run on a thread of their own so pings are answered during a deploy's health watch);
* optionally a probe thread that sends a synthetic request every ``probe.interval_s``.

Each of these threads runs under a supervisor (:meth:`AgentService._spawn`): a thread that dies of an
unexpected exception is restarted after an exponential backoff (0.5 s doubling to 30 s, reset after a
minute of good running), and the crash is reported as a ``thread_restarted`` event, a
``agent.thread_restarted`` problem in the next telemetry window and ``threads`` in ``health()``. The
local API's serving thread is watched the same way (``edgekit-api``): when it ends, the API is started
again on the same address.

Telemetry windows and events reach the spool through one ordered outbox. When the spool cannot be
written (a full disk) they wait in memory (at most ``telemetry.spool.overflow_messages``; past that
the oldest are dropped and added to the spool's ``dropped`` counter once it can be written again),
and go to the spool in order when space returns. A window's ``seq`` is taken in the same commit that
stores it, so windows kept in memory get their numbers then: no number used twice; windows dropped
from memory take theirs then too (a gap the collector sees, reported in a ``telemetry_dropped`` event).
``health()`` reports the state (``problems``, ``spool``) meanwhile, and serving goes on.

``stop()`` (SIGTERM in ``edgekit-agent run``) publishes a last window and shuts everything down.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.bounded import bound_event
from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.config import AgentConfig, parse_api_address
from edgekit_runtime.agent.errors import AgentApiError
from edgekit_runtime.agent.probation import resume_watches
from edgekit_runtime.agent.repository import ModelRepository
from edgekit_runtime.agent.service_commands import COMMAND_HANDLERS, CommandHandling
from edgekit_runtime.agent.service_outbox import SpoolOutbox
from edgekit_runtime.agent.service_telemetry import TelemetryReporting, synthetic_feeds
from edgekit_runtime.agent.telemetry import (
    EVENT_THREAD_RESTARTED,
    BundleRef,
    TelemetryProblem,
    build_event,
)
from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.sensors import DeviceStateReader, PowerIntegrator, PowerSensor, create_sensor
from edgekit_runtime.sensors.identity import DeviceIdentity, read_identity
from edgekit_runtime.sensors.power_mode import PowerModeReader, PowerModeState
from edgekit_runtime.sensors.target_detect import TargetDetection, detect_target

logger = logging.getLogger(__name__)

LinkFactory = Callable[..., Any]
MAX_RECENT_EVENTS = 200
#: a supervised thread that crashes waits this long before its restart, doubling up to the max
RESTART_INITIAL_S = 0.5
RESTART_MAX_S = 30.0
#: a thread that ran this long before crashing restarts after RESTART_INITIAL_S again
_RESTART_RESET_AFTER_S = 60.0
#: how often the supervised ``edgekit-api`` watch checks that the local API's serving thread is alive
_API_CHECK_S = 0.2


def _default_link_factory(**kwargs: Any) -> Any:
    from edgekit_runtime.agent.mqtt import MqttLink

    return MqttLink(**kwargs)


__all__ = ["COMMAND_HANDLERS", "RESTART_INITIAL_S", "RESTART_MAX_S", "AgentService", "synthetic_feeds"]


class AgentService(SpoolOutbox, TelemetryReporting, CommandHandling):
    """The running agent. ``start()`` returns once everything runs; ``stop()`` shuts it down. Its parts:
    the outbox to the spool (:mod:`~edgekit_runtime.agent.service_outbox`), the measuring threads
    (:mod:`~edgekit_runtime.agent.service_telemetry`) and the fleet commands
    (:mod:`~edgekit_runtime.agent.service_commands`)."""

    def __init__(self, config: AgentConfig, *, link_factory: LinkFactory | None = None) -> None:
        self.config = config
        self._link_factory = link_factory or _default_link_factory
        self._stop = threading.Event()
        self._started_monotonic_s = time.monotonic()
        self._interval_s = config.telemetry.interval_s
        self._interval_changed = threading.Event()
        self._commands: queue.Queue[dict[str, Any]] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._problems: list[TelemetryProblem] = []
        self._problems_lock = threading.Lock()
        self._telemetry_lock = threading.Lock()
        self.recent_events: deque[dict[str, Any]] = deque(maxlen=MAX_RECENT_EVENTS)
        self._pending_events: list[dict[str, Any]] = []
        self._events_lock = threading.Lock()
        self._link: Any = None
        self._link_started = False
        self._spool: Any = None
        # Messages not yet on disk, oldest first: ("telemetry" | "event", message); guarded by _events_lock.
        self._outbox: deque[tuple[str, dict[str, Any]]] = deque()
        self._outbox_dropped_unrecorded = 0
        self._outbox_dropped_windows: list[str] = []  # window_start of windows dropped here: they take seqs later
        self._outbox_dropped_total = 0
        self._outbox_retry_at = 0.0
        self._threads_health: dict[str, dict[str, Any]] = {}
        self._api_bound_address: str | None = None  # where the API served when last checked (for a restart)
        self._sensor: PowerSensor | None = None
        self._open_window()

        # The models served (one per bundle store); server, store and deployer are the default model's.
        self.models = ModelRepository(config, self._emit, stop=self._stop, on_change=self._served_changed)
        default = self.models.default
        self.server, self.store, self.deployer = default.server, default.store, default.deployer
        self.api = AgentApi.from_config(self.models, config.api, health_provider=self.health)
        self.grpc: Any = None  # the Open Inference Protocol over gRPC, when api.grpc is set (the grpc extra)
        if config.api.grpc is not None:
            from edgekit_runtime.agent.oip_grpc import OipGrpcServer

            self.grpc = OipGrpcServer(self.models, config.api.grpc, config.api)
        self.state_reader = DeviceStateReader(config.power.root)
        self.integrator: PowerIntegrator | None = None
        # Device identity (read once at start) and power mode (re-read every telemetry window).
        self.power_mode_reader = PowerModeReader(config.power.root)
        self.identity: DeviceIdentity | None = None
        self.target_detection: TargetDetection | None = None
        self.power_mode: PowerModeState | None = None

    # -- life cycle ---------------------------------------------------------------------------------

    @property
    def api_address(self) -> str:
        return self.api.bound_address

    @property
    def link(self) -> Any:
        return self._link

    @property
    def telemetry_interval_s(self) -> float:
        return self._interval_s

    def start(self) -> AgentService:
        """Serve the current bundle, open the API, connect to the broker and start the loops."""
        self._start_sensor()
        self._read_identity()
        self.models.start()
        try:
            self.api.start()
            if self.grpc is not None:
                self.grpc.start()
        except BaseException:  # (a port taken) what started stops, and the models let go of their bundle dirs' locks
            self.api.stop()
            self.models.close()
            raise
        self._start_link()
        self._open_window()
        self.server.take_window()  # the first window starts now, not when the server was built
        if self.integrator is not None:
            self.integrator.take_window()
        self._spawn("edgekit-power", self._power_loop)
        self._spawn("edgekit-telemetry", self._telemetry_loop)
        self._spawn("edgekit-commands", self._command_loop)
        self._spawn("edgekit-api", self._api_loop)
        if self.config.probe is not None:
            self._spawn("edgekit-probe", self._probe_loop)
        resume_watches(self.models.slots(), self._spawn_ota)  # health watches the last run did not finish
        logger.info("agent %s/%s started; API on %s", self.config.fleet, self.config.device_id, self.api_address)
        return self

    def run_forever(self) -> None:
        """``start()``, then block until :meth:`request_stop` (SIGTERM), then ``stop()``."""
        self.start()
        try:
            self._stop.wait()
        finally:
            self.stop()

    def request_stop(self) -> None:
        """Ask the agent to stop; safe from signal handlers and other threads."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(timeout=10)
        self._threads.clear()
        if self._link is not None and self._link_started:
            try:
                self.publish_telemetry()  # the last partial window
            except EdgekitError as err:
                logger.warning("last telemetry window not published: %s", err)
        if self.grpc is not None:
            self.grpc.stop()
        self.api.stop()
        if self._outbox and not self.retry_outbox():
            logger.error("%d message(s) were never written to the spool (it could not be written) and are lost",
                         len(self._outbox))  # fmt: skip
        if self._link is not None and self._link_started:
            self._link.stop()
            self._link_started = False
        self.models.close()
        if self._sensor is not None:
            self._sensor.close()
        if self._spool is not None:
            self._spool.close()
        logger.info("agent stopped")

    def __enter__(self) -> AgentService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        """Run ``target`` on a supervised daemon thread (restarted with backoff when it raises)."""
        self._threads_health[name] = {"state": "running", "restarts": 0, "last_error": None}
        thread = threading.Thread(target=self._supervise, args=(name, target), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _supervise(self, name: str, target: Callable[[], None]) -> None:
        record = self._threads_health[name]
        backoff = Backoff(RESTART_INITIAL_S, RESTART_MAX_S)
        try:
            while not self._stop.is_set():
                started_s = time.monotonic()
                try:
                    target()
                    return  # the loops return when the agent stops (or have nothing to do)
                except Exception as exc:
                    if time.monotonic() - started_s >= _RESTART_RESET_AFTER_S:
                        backoff.reset()
                    delay_s = backoff.next_delay_s()
                    record["restarts"] += 1
                    record["last_error"] = f"{type(exc).__name__}: {exc}"[:500]
                    logger.exception("agent thread %s crashed; restarting it in %.1f s (restart %d)", name, delay_s,
                                     record["restarts"])  # fmt: skip
                    record["state"] = "restarting"
                    self._report_crash(name, record, delay_s)
                if self._stop.wait(delay_s):
                    return
                record["state"] = "running"
        finally:
            record["state"] = "stopped" if self._stop.is_set() else "finished"

    def _api_loop(self) -> None:
        """Supervise the local API, whose serving thread :class:`AgentApi` runs: while the agent runs, a
        serving thread that has ended (every client refused while MQTT looks fine) is a crash of
        ``edgekit-api``, reported like any other thread's; the supervisor calls this again after its
        backoff, and it starts the API again on the address clients know (the port it had)."""
        if not self._api_serving():
            address = self._api_bound_address
            self.api.stop()
            if address is not None and not self.api.address.is_unix:
                self.api.address = parse_api_address(address)  # not a new port for ``127.0.0.1:0``
            self.api.start()
            logger.warning("local API serving again on %s", self.api.bound_address)
        self._api_bound_address = self.api.bound_address
        while not self._stop.wait(_API_CHECK_S):
            if not self._api_serving():
                raise AgentApiError(f"the local API on {self._api_bound_address} stopped serving: its thread ended "
                                    "(its traceback is on the agent's stderr)")  # fmt: skip

    def _api_serving(self) -> bool:
        thread = getattr(self.api, "_thread", None)  # AgentApi's serving thread (serve_forever)
        return thread is not None and thread.is_alive()

    def _report_crash(self, name: str, record: dict[str, Any], delay_s: float) -> None:
        message = f"agent thread {name} crashed ({record['last_error']}); restart {record['restarts']} in {delay_s:.1f} s"
        try:
            self._problem("agent.thread_restarted", message)
            self._emit({"kind": EVENT_THREAD_RESTARTED, "level": "error", "message": message,
                        "details": {"thread": name, "restarts": record["restarts"], "error": record["last_error"]}})  # fmt: skip
        except Exception:  # reporting must never stop the restart
            logger.exception("cannot report the crash of thread %s", name)

    def _start_sensor(self) -> None:
        power = self.config.power
        self._sensor = create_sensor(power.sensor, power.root)
        if not self._sensor.available():
            reason = self._sensor.unavailable_reason
            self._problem("power.unavailable", f"power sensor '{power.sensor}' is unavailable: {reason}")
            logger.error("power sensor %s unavailable (%s); telemetry will carry no power", power.sensor, reason)
        self.integrator = PowerIntegrator.for_sensor(self._sensor)

    def _read_identity(self) -> None:
        """Identity, detected target and power mode, under ``power.root``; a failure is a problem, not fatal."""
        root = self.config.power.root
        try:
            self.identity = read_identity(root)
            self.target_detection = detect_target(self.identity, self.power_mode_reader.config)
            self.power_mode = self.power_mode_reader.read()
        except Exception as exc:  # identity is informative: never keep the agent from serving
            logger.exception("device identity under %s not read", root)
            self._problem("identity.read_failed", f"device identity under {root} not read: {type(exc).__name__}: {exc}")
            return
        detection = self.target_detection
        logger.info("device %s: board %s, target %s, power mode %s", self.config.device_id, self.identity.board,
                    detection.target or f"none ({detection.reason})", self.power_mode.label)  # fmt: skip

    def _status_fields(self) -> dict[str, Any]:
        """The optional status.v1 fields: identity, target, power_mode (``None`` when not read)."""
        return {
            "identity": self.identity.to_dict() if self.identity is not None else None,
            "target": self.target_detection.to_status() if self.target_detection is not None else None,
            "power_mode": self.power_mode.to_dict() if self.power_mode is not None else None,
        }

    def _refresh_power_mode(self) -> TelemetryProblem | None:
        """Re-read the power mode and clocks; republish the status when they changed (and say so)."""
        if self.identity is None:
            return None
        try:
            state = self.power_mode_reader.read()
        except Exception as exc:  # a few small files; never fail a telemetry window over them
            logger.warning("power mode not read: %s", exc)
            return None
        previous = self.power_mode
        if previous is not None and state.to_dict() == previous.to_dict():
            return None
        logger.info("power mode now %s (was %s)", state.label, previous.label if previous else None)
        self.power_mode = state
        if self._link is not None:
            self._link.set_status_fields(power_mode=state.to_dict())
        if previous is None or previous.label == state.label:
            return None  # the clock ranges moved within the same mode and lock
        return TelemetryProblem("power_mode.changed", f"power mode changed from {previous.label} to {state.label} "
                                                      "during this window (nvpmodel -m or jetson_clocks)")  # fmt: skip

    def _start_link(self) -> None:
        broker = self.config.broker
        if broker is None:
            logger.warning("no broker configured: telemetry and events stay local")
            return
        from edgekit_runtime.agent.backoff import Backoff
        from edgekit_runtime.agent.spool_opening import open_spool

        spool_config = self.config.telemetry.spool
        self._spool = open_spool(spool_config.path, max_messages=spool_config.max_messages, max_bytes=spool_config.max_bytes,
                                 notice=lambda kind, level, message, details: self._emit(
                                     {"kind": kind, "level": level, "message": message, "command_id": None, "details": details}))  # fmt: skip
        self._link = self._link_factory(
            broker_url=broker.url,
            client_id=f"edgekit-{self.config.fleet}-{self.config.device_id}",
            fleet=self.config.fleet,
            device=self.config.device_id,
            tls_ca=broker.tls.ca,
            tls_cert=broker.tls.cert,
            tls_key=broker.tls.key,
            username=broker.username,
            password_file=broker.password_file,
            keepalive_s=broker.keepalive_s,
            backoff=Backoff(),
            spool=self._spool,
            on_command=self.handle_command,
            event_sink=self._link_event,
            bundle=self._bundle_ref(),
            replay=self._open_replay_window(),
            command_key=self._command_key(),
            require_signed_commands=self.config.commands.require_signed,
            delivery=self.config.telemetry.delivery,
            resend_after_s=self.config.telemetry.resend_after_s,
        )
        from edgekit_runtime.agent.spool_space import drop_event_reporter

        self._spool.set_drop_reporter(self._link.topics.events,  # dropped windows: a telemetry_dropped event
                                      drop_event_reporter(device=self.config.device_id, fleet=self.config.fleet))  # fmt: skip
        self._link.set_status_fields(**self._status_fields())
        self._link.start()
        with self._events_lock:  # events from the start-up go out first, in order
            self._link_started = True
            pending, self._pending_events = self._pending_events, []
            for event in pending:
                self._send("event", event)

    def _command_key(self) -> Any:
        """The fleet's public key: command signatures are checked against it whenever present."""
        from edgekit_runtime.signing import load_public_key

        key_path = self.config.bundles.public_key
        return load_public_key(key_path) if key_path is not None else None

    def _open_replay_window(self) -> Any:
        from edgekit_runtime.agent.replay import ReplayPolicy, ReplayWindow

        commands = self.config.commands
        policy = ReplayPolicy(window_s=commands.replay_window_s, max_clock_skew_s=commands.max_clock_skew_s,
                              require_issued_at=commands.require_issued_at, max_entries=commands.max_remembered)  # fmt: skip
        return ReplayWindow(self.config.replay_path, policy)

    # -- events and health ----------------------------------------------------------------------------

    def _emit(self, partial: dict[str, Any]) -> None:
        """Wrap a ``{kind, level, message, command_id, details}`` dict as an event.v1, bounded to
        ``MAX_EVENT_BYTES`` (details cut with a marker), and publish it."""
        try:
            event = bound_event(build_event(device=self.config.device_id, fleet=self.config.fleet, **partial))
        except EdgekitError as err:  # a malformed event is a bug; never let it break a deploy
            logger.error("event %s not published: %s", partial.get("kind"), err)
            return
        self.recent_events.append(event)
        with self._events_lock:
            if self._link_started:
                self._send("event", event)  # a spool append: quick, and keeps events in order
            elif self.config.broker is not None:
                self._pending_events.append(event)

    def _link_event(self, event: dict[str, Any]) -> None:
        """The link's ``event_sink``: its own events (pong, command_rejected) join the ordered outbox."""
        self.recent_events.append(event)
        with self._events_lock:
            if self._link_started:
                self._send("event", event)
            else:
                self._pending_events.append(event)

    def _bundle_ref(self) -> BundleRef | None:
        served = self.deployer.served
        return None if served is None else BundleRef(served.bundle_id[:128], served.manifest_sha256)

    def _served_changed(self, served: object) -> None:
        grpc_server = getattr(self, "grpc", None)  # None while the repository is being made, or without api.grpc
        if grpc_server is not None:
            grpc_server.models_changed()
        identity = self.identity
        if identity is not None and served is not None:  # a model loaded: onnxruntime (and its providers) now imported
            self.identity = identity.with_onnxruntime_providers()
        if self._link is not None:
            self._link.set_bundle(self._bundle_ref())
            if self.identity is not identity:
                self._link.set_status_fields(identity=self.identity.to_dict())

    def _problem(self, code: str, message: str) -> None:
        with self._problems_lock:
            self._problems.append(TelemetryProblem(code, message))

    def health(self) -> dict[str, Any]:
        served = self.deployer.served
        if self.server.signature is None:  # unloaded (the OIP repository's unload): its bundle stays, nothing is served
            served = None
        link_state = self._link.link_state.to_dict() if self._link is not None else None
        return {
            "status": "ok" if served is not None else "no_model",
            "model": served.name if served else None,
            "bundle_id": served.bundle_id if served else None,
            "manifest_sha256": served.manifest_sha256 if served else None,
            "signed_by": served.signed_by if served else None,
            "self_check_passed": self.deployer.last_self_check_passed,
            "deploying": self.deployer.busy,
            "broker_connected": link_state["connected"] if link_state is not None else None,
            "broker": link_state,
            "uptime_s": round(time.monotonic() - self._started_monotonic_s, 3),
            "device": self.config.device_id,
            "fleet": self.config.fleet,
            "problems": [problem.to_dict() for problem in self._current_problems()],
            "spool": self._spool_health(),
            "threads": {name: dict(record) for name, record in self._threads_health.items()},
            **self._status_fields(),
            # every model of the repository (the fields above are the default model's)
            "models": [slot.info() for slot in self.models.slots()],
            "memory": {"budget_mb": self.models.budget_mb, "models_mb": round(self.models.held_mb(), 1)},
        }

    def _current_problems(self) -> list[TelemetryProblem]:
        """What is wrong now (health's ``problems``; also added to each telemetry window built meanwhile)."""
        problems = []
        spool = self._spool
        error = spool.write_error if spool is not None else None
        with self._events_lock:
            waiting, dropped = len(self._outbox), self._outbox_dropped_total
        if error is not None:
            code = "spool.disk_full" if spool.disk_full else "spool.write_failed"
            problems.append(TelemetryProblem(code, f"{error.message}; {waiting} message(s) wait in memory "
                                             f"(at most {self.config.telemetry.spool.overflow_messages}), {dropped} dropped"))  # fmt: skip
        return problems

    def _spool_health(self) -> dict[str, Any] | None:
        spool = self._spool
        if spool is None:
            return None
        error = spool.write_error
        with self._events_lock:
            waiting, dropped = len(self._outbox), self._outbox_dropped_total
        return {
            "state": "ok" if error is None else ("disk_full" if spool.disk_full else "write_failed"),
            "error": None if error is None else error.message,
            "in_memory": waiting,
            "in_memory_max": self.config.telemetry.spool.overflow_messages,
            "in_memory_dropped": dropped,
            "backlog": spool.backlog(),
        }
