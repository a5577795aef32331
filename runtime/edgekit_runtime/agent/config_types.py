"""The agent's configuration as data: frozen dataclasses, one per section of the YAML file, and the API
address. :mod:`edgekit_runtime.agent.config` reads and validates the file into them (and re-exports
them); modules that only need the shapes (the bundle fetcher, the API) import them from here.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.body_budget import DEFAULT_INFLIGHT_BODY_BYTES
from edgekit_runtime.agent.errors import AgentConfigError

DEFAULT_API_ADDRESS = "127.0.0.1:8470"
POWER_SENSORS = ("auto", "ina3221", "tegrastats", "nvml", "rapl", "none")
BROKER_SCHEMES = {"mqtt": 1883, "mqtts": 8883}
UNIX_PREFIX = "unix:"
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: `$` also matches before a final newline
#: The most models one agent serves: each telemetry window carries one entry a model, and telemetry.v1 holds 64
MAX_MODELS = 64


# -- the API address ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiAddress:
    """Where the local API listens: a loopback ``host:port`` or a Unix socket ``path``."""

    host: str | None = None
    port: int | None = None
    unix_path: Path | None = None

    @property
    def is_unix(self) -> bool:
        return self.unix_path is not None

    def __str__(self) -> str:
        if self.unix_path is not None:
            return f"{UNIX_PREFIX}{self.unix_path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}"


#: The longest Unix socket path bind() takes: ``sun_path`` is 108 bytes on Linux, the last one the terminating NUL
MAX_UNIX_SOCKET_PATH_BYTES = 107


def parse_api_address(text: object, *, where: str = "api.address") -> ApiAddress:
    """Parse ``127.0.0.1:8470``, ``[::1]:8470``, ``localhost:8470`` or ``unix:/run/edgekit/agent.sock``.

    Anything that is not loopback is refused: the API has no authentication, so it must not be
    reachable from the network.
    """
    hint = f"use '{DEFAULT_API_ADDRESS}' or 'unix:/run/edgekit/agent.sock'"
    if not isinstance(text, str) or not text.strip():
        raise AgentConfigError(f"{where}: expected an address string, got {text!r}", hint=hint)
    text = text.strip()
    if text.startswith(UNIX_PREFIX):
        path = text[len(UNIX_PREFIX) :]
        if not path.startswith("/"):
            raise AgentConfigError(f"{where}: Unix socket path '{path}' must be absolute", hint=hint)
        if "\x00" in path:
            raise AgentConfigError(f"{where}: Unix socket path {path!r} contains a NUL character", hint=hint)
        if len(os.fsencode(path)) > MAX_UNIX_SOCKET_PATH_BYTES:
            raise AgentConfigError(f"{where}: Unix socket path '{path}' is {len(os.fsencode(path))} bytes; the system "
                                   f"takes at most {MAX_UNIX_SOCKET_PATH_BYTES} (sun_path)",
                                   hint="use a shorter path, e.g. 'unix:/run/edgekit/agent.sock'")  # fmt: skip
        return ApiAddress(unix_path=Path(path))
    match = re.fullmatch(r"\[(?P<v6>[^\]]+)\]:(?P<port6>\d+)|(?P<host>[^:\[\]]+):(?P<port>\d+)", text)
    if match is None:
        raise AgentConfigError(f"{where}: '{text}' is not HOST:PORT or unix:/PATH", hint=hint)
    host = match.group("v6") or match.group("host")
    port = int(match.group("port6") or match.group("port"))
    if port > 65535:
        raise AgentConfigError(f"{where}: port {port} is out of range 0..65535", hint=hint)
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise AgentConfigError(
            f"{where}: '{text}' is not a loopback address; the agent's API has no authentication and "
            "binds only to 127.0.0.1, ::1 or a Unix socket",
            hint=hint + "; reach it from elsewhere through SSH port forwarding, never by opening it up",
        )
    return ApiAddress(host=host, port=port)


# -- the configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsConfig:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True)
class BrokerConfig:
    url: str
    tls: TlsConfig = field(default_factory=TlsConfig)
    username: str | None = None
    password_file: Path | None = None
    keepalive_s: int = 30
    #: send the password over mqtt:// (no TLS) to a host that is not loopback (refused unless true)
    allow_plaintext_password: bool = False

    @property
    def uses_tls(self) -> bool:
        return self.url.startswith("mqtts://")


@dataclass(frozen=True)
class BundlesConfig:
    """``max_download_bytes`` caps the download and the unpacked bundle; deploy commands may fetch only
    from ``inbox`` (default ``<dir>/inbox``) and the prefixes in ``allowed_sources``."""

    dir: Path
    public_key: Path | None = None
    allow_unsigned: bool = False
    max_download_bytes: int = 1024**3
    download_timeout_s: float = 60.0
    download_max_s: float = 3600.0
    inbox: Path | None = None
    allowed_sources: tuple[str, ...] = ()

    @property
    def inbox_dir(self) -> Path:
        return self.inbox if self.inbox is not None else self.dir / "inbox"


@dataclass(frozen=True)
class GrpcConfig:
    """The optional Open Inference Protocol gRPC server (``api.grpc``, see ``agent/oip_grpc.py``): loopback
    ``host:port`` or ``unix:/path``, like the API; it needs the runtime's ``grpc`` extra (from a checkout
    ``pip install './runtime[grpc]'``, or from its wheel, docs/agent.md: the package is on no index)."""

    listen: ApiAddress


@dataclass(frozen=True)
class ApiConfig:
    """The local API's address and its limits against slow or greedy clients (see ``agent/api.py``)."""

    address: ApiAddress = field(default_factory=lambda: parse_api_address(DEFAULT_API_ADDRESS))
    max_request_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 64
    idle_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    grpc: GrpcConfig | None = None  # off unless api.grpc is set
    #: host names (besides loopback ones) the API answers to in ``Host`` and ``Origin`` (``agent/http_guard.py``)
    allowed_hosts: tuple[str, ...] = ()
    #: request bodies all connections may hold at once (``agent/body_budget.py``; a quarter of the memory budget)
    max_inflight_body_bytes: int = DEFAULT_INFLIGHT_BODY_BYTES
    #: the Open Inference Protocol's repository load/unload (HTTP and gRPC); they take no credentials, so an
    #: agent whose API is reachable by others turns them off (index, statistics and config stay)
    model_control: bool = True


@dataclass(frozen=True)
class SpoolConfig:
    path: Path
    max_messages: int = 10_000
    max_bytes: int = 50 * 1024 * 1024
    #: messages kept in memory while the spool cannot be written (a full disk); past it the oldest go, counted
    overflow_messages: int = 1000


@dataclass(frozen=True)
class TelemetryConfig:
    spool: SpoolConfig
    interval_s: float = 10.0
    #: collector_ack: a window leaves the spool when the collector's ack names it; broker_ack: on the PUBACK
    delivery: str = "collector_ack"
    #: seconds before a window the collector has not confirmed is published again (doubling, at most 300 s)
    resend_after_s: float = 30.0


@dataclass(frozen=True)
class PowerConfig:
    sensor: str = "auto"
    root: Path = Path("/")
    sample_interval_s: float = 0.1


@dataclass(frozen=True)
class ProbeConfig:
    """A synthetic request every ``interval_s`` so that an idle device still reports latency."""

    interval_s: float
    dims: Mapping[str, int] = field(default_factory=dict)


#: the queue delay when the agent config names none: chosen by the sweep in docs/agent.md ("Dynamic batching")
DEFAULT_MAX_DELAY_MS = 0.5


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching: requests that arrive within ``max_delay_ms`` run as one call of at most
    ``max_batch`` items along the dimension named ``dim`` (``None``: as many as the bundle's signature
    allows for ``dim``); ``instances`` runner calls of the model may run at once. ``models`` overrides
    any of these for one model by name (:meth:`for_model`)."""

    max_batch: int | None = None
    max_delay_ms: float = DEFAULT_MAX_DELAY_MS
    dim: str = "batch"
    instances: int = 1
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_model(self, name: str | None) -> BatchingConfig:
        """The settings for model ``name``: these, with its entry of ``models`` applied."""
        override = self.models.get(name or "")
        if not override:
            return replace(self, models={}) if self.models else self
        return replace(self, models={}, **override)


#: whether ONNX Runtime's intra-op threads spin-wait between runs in a serving agent whose config names nothing:
#: yes, but only for DEFAULT_SERVING_SPIN_US (docs/agent.md, "Intra-op threads: a brief spin"); unbounded
#: spinning burnt a core at c=16 ("Per-request work in the event loop"), parking them cost a wake-up per operator
DEFAULT_SERVING_SPINNING = True
#: how long those threads spin before they sleep, in microseconds (ONNX Runtime 1.26 and later; older ones park them)
DEFAULT_SERVING_SPIN_US = 10


@dataclass(frozen=True)
class RunnerConfig:
    """Runner options the agent sets over a bundle's own when it loads the bundle to serve (ONNX Runtime
    bundles only; ``None``: the bundle's setting). ``intra_op_spinning``: whether the intra-op threads
    spin-wait between runs (ONNX Runtime's default is to spin); ``intra_op_spin_us``: for how long, where they
    spin (``None``: ONNX Runtime's own length); ``intra_op_threads``: the intra-op pool's size.
    ``models`` overrides them for one model by name (:meth:`for_model`)."""

    intra_op_spinning: bool | None = DEFAULT_SERVING_SPINNING
    intra_op_spin_us: int | None = DEFAULT_SERVING_SPIN_US
    intra_op_threads: int | None = None
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def for_model(self, name: str | None) -> RunnerConfig:
        """The settings for model ``name``: these, with its entry of ``models`` applied."""
        override = self.models.get(name or "")
        return replace(self, models={}, **(override or {}))

    def backend_options(self, name: str | None) -> dict[str, dict[str, Any]]:
        """Model ``name``'s runner options by backend name, as :func:`~edgekit_runtime.agent.loading.load_bundle`
        takes them (options a backend does not know are not given to it)."""
        chosen = self.for_model(name)
        options = {"intra_op_spinning": chosen.intra_op_spinning, "intra_op_spin_us": chosen.intra_op_spin_us,
                   "intra_op_threads": chosen.intra_op_threads}  # fmt: skip
        given = {key: value for key, value in options.items() if value is not None}
        return {"onnxruntime": given} if given else {}


@dataclass(frozen=True)
class HealthConfig:
    """After a deploy the agent watches ``window_s`` seconds; more than ``max_error_rate`` failed
    requests (of at least ``min_requests``) or a failing self-check roll the deploy back."""

    window_s: float = 60.0
    max_error_rate: float = 0.05
    min_requests: int = 1


@dataclass(frozen=True)
class CommandsConfig:
    """Replay protection for fleet commands (see ``agent/replay.py``): a command runs only when its
    ``issued_at`` is at most ``replay_window_s`` old and ``max_clock_skew_s`` ahead, and its id was not
    seen inside the window; ids are kept at ``replay_path`` (default: ``commands.db`` beside the spool)."""

    replay_path: Path | None = None
    replay_window_s: float = 24 * 3600.0
    max_clock_skew_s: float = 300.0
    require_issued_at: bool = True
    max_remembered: int = 10_000
    #: refuse commands without a valid Ed25519 signature by the fleet key (``bundles.public_key``)
    require_signed: bool = False


@dataclass(frozen=True)
class ModelsConfig:
    """The model repository: several bundles served at once, each under a model name.

    Each model keeps its own bundle store (``current``/``previous`` versions) in ``<dir>/<name>/``.
    ``names`` lists the models; without it every folder of ``dir`` is one, and a deploy naming a new
    model creates its folder. ``default`` is the model ``/v1`` serves and commands without ``model``
    address. ``memory_budget_mb`` caps what the loaded models may hold together (RSS growth at load).
    """

    dir: Path
    names: tuple[str, ...] | None = None
    default: str | None = None
    memory_budget_mb: float | None = None

    @property
    def default_name(self) -> str:
        return self.default or (self.names[0] if self.names else "")


@dataclass(frozen=True)
class AgentConfig:
    device_id: str
    fleet: str
    bundles: BundlesConfig
    telemetry: TelemetryConfig
    broker: BrokerConfig | None = None
    api: ApiConfig = field(default_factory=ApiConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    probe: ProbeConfig | None = None
    batching: BatchingConfig | None = None
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    commands: CommandsConfig = field(default_factory=CommandsConfig)
    source: Path | None = None
    #: ``None``: one model, served from ``bundles.dir`` and named after its bundle (the single-bundle layout)
    models: ModelsConfig | None = None

    @property
    def replay_path(self) -> Path:
        """Where the command replay record lives (``commands.replay_path``, else beside the spool)."""
        return self.commands.replay_path or self.telemetry.spool.path.parent / "commands.db"
