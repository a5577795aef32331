"""``edgekit-agent check``'s broker probe: connect to the configured broker once, the way the agent does (the
URL, TLS settings and credentials of ``broker:`` in the config), wait for the CONNACK with a short timeout,
and disconnect. A refusal, a TLS failure or a rejected login comes back as a message with a hint, the same
explanations the running link gives (:func:`edgekit_runtime.agent.broker.describe_connect_failure`).

The probe uses its own client id (``<agent id>-check-<pid>``): a broker drops the older of two connections with
one client id, so probing as the agent itself would disconnect a running agent.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from edgekit_runtime.agent.broker import describe_connect_failure, make_tls_context, parse_broker_url, read_password_file
from edgekit_runtime.agent.config import BrokerConfig
from edgekit_runtime.errors import EdgekitError

#: Seconds for the TCP connect, the TLS handshake and the CONNACK together.
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class BrokerProbe:
    """What the probe found: ``ok`` and a line saying what happened; ``hint`` says how to fix a failure."""

    ok: bool
    message: str
    hint: str | None = None


def probe_broker(broker: BrokerConfig, client_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> BrokerProbe:
    """Connect to ``broker`` as ``<client_id>-check-<pid>`` (MQTT 5, clean start), wait for the CONNACK, disconnect."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

    if timeout_s <= 0:
        raise ValueError(f"probe_broker: timeout_s must be positive, got {timeout_s}")
    try:
        address = parse_broker_url(broker.url)
        tls = make_tls_context(broker.tls.ca, broker.tls.cert, broker.tls.key) if address.tls else None
        password = read_password_file(broker.password_file) if broker.password_file is not None else None
    except EdgekitError as err:
        return BrokerProbe(False, f"broker {broker.url}: {err.message}", err.hint)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"{client_id}-check-{os.getpid()}",
                         protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
    if tls is not None:
        client.tls_set_context(tls)
    if broker.username is not None:
        client.username_pw_set(broker.username, password)
    client.connect_timeout = timeout_s
    answers: list[object] = []
    client.on_connect = lambda _client, _userdata, _flags, reason, _properties: answers.append(reason)
    deadline = time.monotonic() + timeout_s
    try:
        client.connect(address.host, address.port, keepalive=max(int(timeout_s) * 2, 5), clean_start=True)
        while not answers and time.monotonic() < deadline:
            rc = client.loop(timeout=0.05)
            if not answers and rc not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_AGAIN):  # a refused CONNACK closes too
                return BrokerProbe(False, f"broker {address.url} closed the connection before answering: {paho.error_string(rc)}",
                                   "check that the port is the broker's MQTT listener and that it accepts MQTT 5")  # fmt: skip
    except (OSError, ValueError) as exc:
        message, hint = describe_connect_failure(exc, address)
        return BrokerProbe(False, message, hint)
    finally:
        if answers and not getattr(answers[0], "is_failure", True):
            client.disconnect()
            client.loop(timeout=0.05)
        sock = client.socket()
        if sock is not None:
            sock.close()
    if not answers:
        return BrokerProbe(False, f"broker {address.url} accepted the TCP connection but sent no CONNACK within {timeout_s:g} s",
                           "check that the port is an MQTT listener (not another service) and that the broker is not overloaded")  # fmt: skip
    reason = answers[0]
    if getattr(reason, "is_failure", True):
        return BrokerProbe(False, f"broker {address.url} refused the login: {reason}",
                           "check broker.username, broker.password_file and the broker's password file and ACL for this device")  # fmt: skip
    who = f" as {broker.username}" if broker.username else ""
    return BrokerProbe(True, f"broker {address.url} accepted the connection{who}" + (" (TLS verified)" if address.tls else " (no TLS)"))
