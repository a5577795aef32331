"""Real Mosquitto brokers for tests, each on a free loopback port with a config in a temp directory.

Reusable by any test package (the fleet collector's too)::

    from tests.runtime.agent.mosquitto import mosquitto_factory, make_tls_files  # noqa: F401 (fixture)

    def test_x(mosquitto_factory, tmp_path):
        tls = make_tls_files(tmp_path / "tls")
        broker = mosquitto_factory(tls=tls)          # started; stopped after the test
        broker.url                                   # "mqtts://127.0.0.1:<port>"
        broker.restart()

Options: ``port`` (default: a free one, kept across restarts), ``tls`` (:class:`TlsFiles` from
:func:`make_tls_files`, a CA and a server certificate made with ``cryptography``),
``password_file`` (:func:`write_password_file` runs ``mosquitto_passwd -b``), ``acl_file``
(:func:`render_acl_template` fills ``runtime/mosquitto/acl.template``), ``persistence`` (sessions
and queued messages survive :meth:`MosquittoBroker.restart`), ``extra_config`` lines.
"""

from __future__ import annotations

import datetime as dt
import getpass
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ACL_TEMPLATE = REPO / "runtime" / "mosquitto" / "acl.template"
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd")
LOOPBACK = "127.0.0.1"


def require_mosquitto() -> str:
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto mosquitto-clients)")
    return MOSQUITTO


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


# -- TLS material ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def _write_key(path: Path, key: object) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ))  # fmt: skip
    path.chmod(0o600)


def make_ca(directory: Path, common_name: str = "edgekit test CA") -> tuple[Path, Path]:
    """A self-signed CA (EC P-256, valid for a day); returns (cert path, key path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


def make_tls_files(
    directory: Path,
    *,
    hostnames: Sequence[str] = ("localhost",),
    ips: Sequence[str] = (LOOPBACK,),
    ca_name: str = "edgekit test CA",
) -> TlsFiles:
    """A CA plus a server certificate it signed, naming ``hostnames`` and ``ips``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert_path, ca_key_path = make_ca(directory, ca_name)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in hostnames]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0] if hostnames else ips[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
                       critical=False)  # fmt: skip
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    server_cert, server_key = directory / "server.crt", directory / "server.key"
    server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, key)
    return TlsFiles(ca_cert_path, ca_key_path, server_cert, server_key)


# -- credentials and ACL --------------------------------------------------------------------------


def write_password_file(path: Path, users: Mapping[str, str]) -> Path:
    """A Mosquitto password file for ``users`` (name -> password), made with ``mosquitto_passwd -b``."""
    if MOSQUITTO_PASSWD is None:
        pytest.skip("mosquitto_passwd is not installed (apt-get install mosquitto)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    for user, password in users.items():
        subprocess.run([MOSQUITTO_PASSWD, "-b", str(path), user, password], check=True, capture_output=True,
                       timeout=30)  # fmt: skip
    return path


def render_acl_template(dest: Path, *, collector_user: str, template: Path = ACL_TEMPLATE) -> Path:
    """``runtime/mosquitto/acl.template`` with ``@COLLECTOR_USER@`` filled in, written to ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(template.read_text(encoding="utf-8").replace("@COLLECTOR_USER@", collector_user))
    return dest


# -- the broker -----------------------------------------------------------------------------------


class MosquittoBroker:
    """One ``mosquitto -c <workdir>/mosquitto.conf`` process; its port stays the same across restarts."""

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        tls: TlsFiles | None = None,
        password_file: Path | None = None,
        acl_file: Path | None = None,
        persistence: bool = False,
        allow_anonymous: bool | None = None,
        extra_config: Sequence[str] = (),
    ) -> None:
        self.executable = require_mosquitto()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.tls = tls
        self.host = LOOPBACK
        self.config_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        if allow_anonymous is None:
            allow_anonymous = password_file is None
        lines = [
            "per_listener_settings false",
            f"user {getpass.getuser()}",  # as root: keep root, so the files in tmp_path stay readable
            f"listener {self.port} {LOOPBACK}",
            "protocol mqtt",
            f"allow_anonymous {'true' if allow_anonymous else 'false'}",
            f"persistence {'true' if persistence else 'false'}",
            f"persistence_location {self.workdir}/",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
            "log_timestamp_format %H:%M:%S",
        ]
        if tls is not None:
            lines += [f"certfile {tls.server_cert}", f"keyfile {tls.server_key}"]
        if password_file is not None:
            lines.append(f"password_file {password_file}")
        if acl_file is not None:
            lines.append(f"acl_file {acl_file}")
        lines += list(extra_config)
        self.config_path.write_text("\n".join(lines) + "\n")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout_s: float = 10.0) -> MosquittoBroker:
        if self.running:
            return self
        output = open(self.workdir / "mosquitto.out", "ab")  # noqa: SIM115 (lives as long as the process)
        self._process = subprocess.Popen([self.executable, "-c", str(self.config_path)], stdout=output,
                                         stderr=subprocess.STDOUT)  # fmt: skip
        output.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                output_text = (self.workdir / "mosquitto.out").read_text(errors="replace")
                raise RuntimeError(f"mosquitto exited with {self._process.returncode}:\n{output_text}\n{self.log()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port} within {timeout_s} s:\n{self.log()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Mosquitto saves its persistence file), SIGKILL if it does not exit in time."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL (``kill -9``): Mosquitto saves nothing, whatever it held since its last autosave is gone."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def restart(self) -> MosquittoBroker:
        self.stop()
        return self.start()

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@pytest.fixture
def mosquitto_factory(tmp_path: Path) -> Iterator[Callable[..., MosquittoBroker]]:
    """``mosquitto_factory(**options) -> MosquittoBroker`` (started); every broker stops after the test."""
    brokers: list[MosquittoBroker] = []

    def start(**options: object) -> MosquittoBroker:
        broker = MosquittoBroker(tmp_path / f"mosquitto-{len(brokers)}", **options)  # type: ignore[arg-type]
        brokers.append(broker)
        return broker.start()

    yield start
    for broker in brokers:
        broker.stop()


@pytest.fixture
def mosquitto(mosquitto_factory: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    """A plain broker (anonymous, no TLS) on a free loopback port."""
    return mosquitto_factory()


# -- a subscriber that records what arrives -------------------------------------------------------


@dataclass(frozen=True)
class ReceivedMessage:
    topic: str
    payload: bytes
    retain: bool

    def json(self) -> object:
        import json

        return json.loads(self.payload)


class MessageRecorder:
    """A paho MQTT 5 client that subscribes to ``topics`` and records every message, for assertions.

    ``session_expiry_s`` > 0 with a fixed ``client_id`` keeps its subscriptions (and queued messages)
    on a broker with persistence across a broker restart.
    """

    def __init__(
        self,
        broker: MosquittoBroker,
        topics: Sequence[str] = ("edgekit/v1/#",),
        *,
        client_id: str = "",
        username: str | None = None,
        password: str | None = None,
        session_expiry_s: int = 0,
    ) -> None:
        import threading

        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.messages: list[ReceivedMessage] = []
        self._condition = threading.Condition()
        self._topics = list(topics)
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=MQTTProtocolVersion.MQTTv5)  # fmt: skip
        if username is not None:
            self.client.username_pw_set(username, password)
        if broker.tls is not None:
            self.client.tls_set(ca_certs=str(broker.tls.ca_cert))
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.reconnect_delay_set(0.1, 0.5)
        properties = None
        if session_expiry_s:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = session_expiry_s
        self._subscribed = threading.Event()
        self.client.connect(broker.host, broker.port, clean_start=not session_expiry_s, properties=properties)
        self.client.loop_start()
        if not self._subscribed.wait(10):
            raise RuntimeError(f"recorder could not subscribe on {broker.url}")

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:  # type: ignore[no-untyped-def]
        if not reason.is_failure:
            client.subscribe([(topic, 1) for topic in self._topics])

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:  # type: ignore[no-untyped-def]
        # Subscribed once the broker acknowledged it (SUBACK), not when SUBSCRIBE was sent: a message published
        # in between was missed (a CI run under load lost a rollout's first command that way).
        if not any(code.is_failure for code in reason_codes):
            self._subscribed.set()

    def _on_message(self, client, userdata, message) -> None:  # type: ignore[no-untyped-def]
        with self._condition:
            self.messages.append(ReceivedMessage(message.topic, bytes(message.payload), bool(message.retain)))
            self._condition.notify_all()

    def on(self, suffix: str) -> list[ReceivedMessage]:
        """The messages whose topic ends with ``suffix`` (e.g. ``"/telemetry"``), in arrival order."""
        with self._condition:
            return [m for m in self.messages if m.topic.endswith(suffix)]

    def wait_for(self, predicate: Callable[[list[ReceivedMessage]], bool], timeout_s: float = 10.0) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: predicate(list(self.messages)), timeout_s)

    def close(self) -> None:
        self.client.disconnect()  # first: it wakes the network thread, so loop_stop does not wait out select
        self.client.loop_stop()

    def __enter__(self) -> MessageRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
