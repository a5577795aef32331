"""Where and how the agent reaches its broker: URL parsing, TLS context, password file, and
readable explanations of connection failures."""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgekit_runtime.agent.topics import TelemetryError

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}
_PASSWORD_HINT = "put the password alone in a file readable only by the agent, and pass its path as password_file"


class BrokerConnectionError(TelemetryError):
    """The link could not connect to the broker (refused, unreachable, TLS or credentials failure)."""


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def parse_broker_url(url: str) -> BrokerAddress:
    """``mqtt://host[:port]`` (plain, 1883) or ``mqtts://host[:port]`` (TLS, 8883)."""
    hint = "write the broker as mqtt://host:1883 or mqtts://host:8883"
    if not isinstance(url, str):
        raise TelemetryError(f"broker URL must be a string, got {url!r}", hint=hint)
    try:
        parts = urlsplit(url)  # "mqtt://[::1" (an unclosed IPv6 literal) raises
    except ValueError as exc:
        raise TelemetryError(f"broker URL {url!r} cannot be read: {exc}", hint=hint) from None
    if parts.scheme not in DEFAULT_PORTS:
        raise TelemetryError(f"broker URL {url!r} has scheme {parts.scheme!r}; only mqtt and mqtts are supported",
                             hint=hint)  # fmt: skip
    if parts.username is not None or parts.password is not None:
        raise TelemetryError(f"broker URL {url!r} carries credentials",
                             hint="pass username=... and password_file=... instead")  # fmt: skip
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise TelemetryError(f"broker URL {url!r} has a path, query or fragment", hint=hint)
    try:
        port = parts.port
    except ValueError as exc:
        raise TelemetryError(f"broker URL {url!r} has an invalid port: {exc}", hint=hint) from exc
    if not parts.hostname:
        raise TelemetryError(f"broker URL {url!r} has no host", hint=hint)
    return BrokerAddress(parts.hostname, port or DEFAULT_PORTS[parts.scheme], parts.scheme == "mqtts")


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1); names are not resolved, so a host
    name that happens to resolve to loopback still counts as the network."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def sends_password_in_clear(url: str, *, has_password: bool) -> bool:
    """True when a password would cross ``url`` unencrypted: ``mqtt://`` (no TLS) with a password."""
    return has_password and not parse_broker_url(url).tls


def refuse_plaintext_password(url: str, *, has_password: bool, allow: bool, source: str, field: str,
                              allow_option: str) -> None:
    """Raise :class:`TelemetryError` when a password would go in clear text (``mqtt://``) to a host that is not
    loopback and ``allow`` (the ``allow_option`` of ``source``) is not set. ``source`` names the config file or
    command, ``field`` the setting that holds the password."""
    address = parse_broker_url(url)
    if allow or not sends_password_in_clear(url, has_password=has_password) or is_loopback_host(address.host):
        return
    raise TelemetryError(
        f"{source}: {field}: the broker password would be sent in clear text over {address.url} (mqtt:// has no TLS, "
        f"and {address.host} is not a loopback address), where anyone on the path can read it",
        hint=f"use mqtts:// (TLS, port 8883) in the broker URL; only on a network you trust, set {allow_option} "
             "to send it anyway",
    )


def read_password_file(path: str | Path) -> str:
    """The password in ``path``: its first line, without the line break."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise TelemetryError(f"password_file {file} is a folder, not a file", hint=_PASSWORD_HINT) from None
    except OSError as exc:
        raise TelemetryError(f"cannot read password_file {file}: {exc.strerror or exc}", hint=_PASSWORD_HINT) from exc
    except UnicodeDecodeError:
        raise TelemetryError(f"password_file {file} is not UTF-8 text", hint=_PASSWORD_HINT) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise TelemetryError(f"password_file {file} is empty", hint=_PASSWORD_HINT)
    if file.stat().st_mode & 0o077:
        logger.warning("password_file %s is readable by group or others; chmod 600 it", file)
    return password


def make_tls_context(
    tls_ca: str | Path | None, tls_cert: str | Path | None, tls_key: str | Path | None
) -> ssl.SSLContext:
    """A client context that verifies the broker's certificate (against ``tls_ca``, else the system CAs)
    and its host name, optionally presenting a client certificate."""
    if (tls_cert is None) != (tls_key is None):
        raise TelemetryError("tls_cert and tls_key go together: give both or neither",
                             hint="tls_cert is the device's PEM certificate, tls_key its PEM private key")  # fmt: skip
    for label, value in (("tls_ca", tls_ca), ("tls_cert", tls_cert), ("tls_key", tls_key)):
        if value is not None and not Path(value).is_file():
            raise TelemetryError(f"{label} file {value} does not exist", hint=f"point {label} at a PEM file")
    try:
        context = ssl.create_default_context(cafile=str(tls_ca) if tls_ca is not None else None)
    except ssl.SSLError as exc:
        raise TelemetryError(f"tls_ca {tls_ca} is not a PEM CA certificate: {exc}",
                             hint="pass the CA certificate (PEM) that signed the broker's certificate") from exc  # fmt: skip
    if tls_cert is not None and tls_key is not None:
        try:
            context.load_cert_chain(str(tls_cert), str(tls_key))
        except ssl.SSLError as exc:
            raise TelemetryError(f"tls_cert {tls_cert} / tls_key {tls_key} cannot be loaded: {exc}",
                                 hint="both must be PEM, and the key must belong to the certificate") from exc  # fmt: skip
    return context


def describe_connect_failure(exc: BaseException, address: BrokerAddress) -> tuple[str, str]:
    """A message and a hint for an exception raised while opening a connection to ``address``."""
    where = f"{address.host}:{address.port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            f"TLS certificate of broker {where} was rejected: {exc.verify_message or exc}",
            f"check that tls_ca is the CA that signed the broker's certificate and that the certificate "
            f"names '{address.host}'",
        )
    if address.tls and isinstance(exc, (ConnectionResetError, ssl.SSLEOFError)):
        return (f"TLS handshake with broker {where} failed: the broker closed the connection ({exc})",
                "check that the port is the broker's TLS listener (mqtts), not a plain MQTT one")  # fmt: skip
    if isinstance(exc, ssl.SSLError):
        return (f"TLS handshake with broker {where} failed: {exc}",
                "check that the port is the broker's TLS listener (mqtts) and the TLS settings match")  # fmt: skip
    if isinstance(exc, ConnectionRefusedError):
        return (f"broker {where} refused the TCP connection (nothing listening?)",
                "check that the broker is running and the URL's host and port are right")  # fmt: skip
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return (f"connecting to broker {where} timed out", "check the network path to the broker")
    if isinstance(exc, socket.gaierror):
        return (f"cannot resolve broker host '{address.host}': {exc}", "check the broker URL's host name and DNS")
    return (f"cannot connect to broker {where}: {exc}", "check the broker URL and the network")
