"""A pure-Python MQTT broker (amqtt) in a background thread, for ``edgekit fleet up`` on a laptop.

What it can and cannot do, checked against amqtt 0.12:

* MQTT **3.1.1 only**. An MQTT 5 CONNECT is refused ("unsupported protocol version"). So the real
  agent's :class:`~edgekit_runtime.agent.mqtt.MqttLink` (MQTT 5 only) cannot connect to it; the local
  stack's collector and simulated devices connect with MQTT 3.1.1 instead.
* QoS 1, retained messages and last wills work (the collector's device status relies on them).
* No shared subscriptions (``$share/...``): one collector per embedded broker. Scaling out means a
  real broker (Mosquitto, EMQX): pass ``--broker mqtt://HOST:1883``.
* Loopback and anonymous by default; it is a demo broker, not one to expose on a network.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from edgekit.fleet.errors import FleetError

logger = logging.getLogger(__name__)

EMBEDDED_MQTT_VERSION = "3.1.1"


class EmbeddedBrokerError(FleetError):
    """The embedded broker cannot start (amqtt missing, port in use)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` already (a bind as amqtt makes it, with SO_REUSEADDR, fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class EmbeddedBroker:
    """``EmbeddedBroker(port=1883).start()``; ``url``; ``stop()``. A context manager."""

    mqtt_version = EMBEDDED_MQTT_VERSION

    def __init__(self, host: str = "127.0.0.1", port: int = 1883) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broker: Any = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def config(self) -> dict[str, Any]:
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        try:
            import amqtt.broker  # noqa: F401
        except ImportError as err:
            raise EmbeddedBrokerError(f"the embedded broker needs the 'amqtt' package, which cannot be imported: {err}",
                                      hint="pip install amqtt, or run a broker yourself and pass --broker mqtt://HOST:1883") from err  # fmt: skip
        if port_in_use(self.host, self.port):  # said here, before amqtt logs a traceback about it
            raise EmbeddedBrokerError(f"the embedded broker cannot listen on {self.host}:{self.port}: something listens there already",
                                      hint=f"pass --broker mqtt://{self.host}:{self.port} if that is an MQTT broker you want to use, "
                                      "--broker-port 0 for a free port, or stop what uses this one")  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="edgekit-embedded-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise EmbeddedBrokerError(f"the embedded broker did not start within {timeout_s:g} s")
        if self._error is not None:
            raise EmbeddedBrokerError(f"the embedded broker cannot listen on {self.host}:{self.port}: {self._error}",
                                      hint="pick another --broker-port, or stop what uses this one") from self._error  # fmt: skip
        logger.info("embedded MQTT %s broker (amqtt) on %s", self.mqtt_version, self.url)
        return self

    def _run(self) -> None:
        from amqtt.broker import Broker

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._broker = Broker(self.config(), loop=loop)
            loop.run_until_complete(self._broker.start())
        except BaseException as err:  # reported to start()
            self._error = err
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(self._broker.shutdown())
            except Exception:  # shutting down: nothing left to save
                logger.debug("embedded broker shutdown raised", exc_info=True)
            loop.close()

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(15)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
