"""``edgekit fleet up``: a whole fleet stack on one laptop, with one command.

* the broker: the embedded pure-Python one (:class:`~edgekit.fleet.embedded_broker.EmbeddedBroker`,
  amqtt, MQTT 3.1.1 only) unless ``broker_url`` names a running one (Mosquitto, EMQX: MQTT 5);
* the collector (:class:`~edgekit.fleet.collector.Collector`) writing to the store (SQLite by default);
* the dashboard (:class:`~edgekit.fleet.dashboard.DashboardServer`);
* optionally ``simulate`` virtual devices (:class:`~edgekit.fleet.simulate.FleetSimulator`), whose
  targets are recorded in the store so ``--target`` selections and the dashboard know them.

On the embedded broker every client speaks MQTT 3.1.1 and there are no shared subscriptions, so
real agents (MQTT 5) need a real broker: run Mosquitto and pass its URL.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from edgekit.fleet.dashboard import DashboardServer
from edgekit.fleet.embedded_broker import EmbeddedBroker, EmbeddedBrokerError, free_port, port_in_use
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig

logger = logging.getLogger(__name__)


#: The ports ``edgekit fleet up`` tries first (with ``*_port_fallback``: a free one when they are taken).
DEFAULT_BROKER_PORT = 1883
DEFAULT_DASHBOARD_PORT = 8480


@dataclass(frozen=True)
class LocalStackConfig:
    broker_url: str | None = None
    broker_host: str = "127.0.0.1"
    broker_port: int = 1883
    #: when ``broker_port`` is taken, listen on a free port instead (said in :attr:`LocalStack.notes`) rather than fail
    #: (``edgekit fleet up`` without --broker-port: the documented first run must not break on a host with Mosquitto)
    broker_port_fallback: bool = False
    store_url: str = "sqlite:///fleet.db"
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8480
    dashboard_port_fallback: bool = False  # as broker_port_fallback, for the dashboard
    simulate: int = 0
    simulate_rate_per_s: float = 0.1
    fleet: str = "sim"
    simulation: dict[str, Any] = field(default_factory=dict)  # more SimulationConfig fields


class LocalStack:
    """Broker (embedded unless given), collector, dashboard and optional simulated devices.
    ``start()`` brings them up in that order, ``stop()`` takes them down in reverse."""

    def __init__(self, config: LocalStackConfig) -> None:
        self.config = config
        self.broker: EmbeddedBroker | None = None
        self.broker_url = config.broker_url
        self.mqtt_version = "5"
        self.store: Any = None
        self.collector: Any = None
        self.dashboard: DashboardServer | None = None
        self.simulator: FleetSimulator | None = None
        #: what the stack chose differently from its configuration, for the user (a taken port)
        self.notes: list[str] = []

    def start(self) -> LocalStack:
        from edgekit.fleet.store import open_store

        try:
            if self.broker_url is None:
                port = self._free_if_taken("embedded broker", self.config.broker_host, self.config.broker_port,
                                           self.config.broker_port_fallback, "--broker-port")  # fmt: skip
                self.broker = EmbeddedBroker(self.config.broker_host, port).start()
                self.broker_url, self.mqtt_version = self.broker.url, self.broker.mqtt_version
            self.store = open_store(self.config.store_url)
            self.collector = self._make_collector().start()
            dashboard_port = self._free_if_taken("dashboard", self.config.dashboard_host, self.config.dashboard_port,
                                                 self.config.dashboard_port_fallback, "--port")  # fmt: skip
            self.dashboard = DashboardServer(self.config.store_url, host=self.config.dashboard_host, port=dashboard_port).start()
            if self.config.simulate:
                self.simulator = FleetSimulator(SimulationConfig(
                    self.broker_url, devices=self.config.simulate, rate_per_s=self.config.simulate_rate_per_s,
                    fleet=self.config.fleet, mqtt_version=self.mqtt_version, **self.config.simulation,  # type: ignore[arg-type]
                ))  # fmt: skip
                self.simulator.record_targets(self.store)
                self.simulator.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _free_if_taken(self, what: str, host: str, port: int, fallback: bool, option: str) -> int:
        """``port``, or with ``fallback`` a free port when something listens on ``port`` already (noted)."""
        if not port or not fallback or not port_in_use(host, port):
            return port
        chosen = free_port(host)
        also = f" (another MQTT broker? `--broker mqtt://{host}:{port}` uses it)" if what == "embedded broker" else ""
        self.notes.append(f"port {port} on {host} is taken{also}; the {what} listens on {chosen} instead ({option} picks one)")
        return chosen

    def _make_collector(self) -> Any:
        from edgekit.fleet.collector import Collector

        options: dict[str, Any] = {"client_id": "edgekit-local-collector"}
        if self.mqtt_version != "5":
            if "mqtt_version" not in inspect.signature(Collector).parameters:
                raise EmbeddedBrokerError(
                    "the collector speaks only MQTT 5, but the embedded broker (amqtt) speaks only MQTT 3.1.1",
                    hint="run a broker (e.g. `mosquitto -p 1883`) and pass --broker mqtt://127.0.0.1:1883",
                )
            options["mqtt_version"] = self.mqtt_version
        return Collector(self.broker_url, self.store, **options)

    def stop(self) -> None:
        for name, action in (("simulator", lambda: self.simulator and self.simulator.stop()),
                             ("collector", lambda: self.collector and self.collector.stop()),
                             ("dashboard", lambda: self.dashboard and self.dashboard.stop()),
                             ("store", lambda: self.store and self.store.close()),
                             ("broker", lambda: self.broker and self.broker.stop())):  # fmt: skip
            try:
                action()
            except Exception:  # take everything else down even if one part fails to stop
                logger.exception("stopping the local stack's %s failed", name)
        self.simulator = self.collector = self.dashboard = self.store = self.broker = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def dashboard_url(self) -> str | None:
        return self.dashboard.url if self.dashboard else None
