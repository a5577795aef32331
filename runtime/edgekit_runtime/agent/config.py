"""The agent's configuration: YAML loaded into frozen dataclasses (example: ``runtime/agent.example.yaml``).

Every problem raises :class:`AgentConfigError` naming the file, the key (``broker.tls.ca``) and the
fix; an unknown key suggests the closest known one. Relative paths are resolved against the
directory of the configuration file, so a config and its keys can move together. The sections' dataclasses
live in :mod:`edgekit_runtime.agent.config_types` and are re-exported here.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.body_budget import default_inflight_body_bytes
from edgekit_runtime.agent.config_types import (
    BROKER_SCHEMES,
    DEFAULT_API_ADDRESS,
    ID_PATTERN,
    MAX_MODELS,
    POWER_SENSORS,
    UNIX_PREFIX,
    AgentConfig,
    ApiAddress,
    ApiConfig,
    BatchingConfig,
    BrokerConfig,
    BundlesConfig,
    CommandsConfig,
    GrpcConfig,
    HealthConfig,
    ModelsConfig,
    PowerConfig,
    ProbeConfig,
    RunnerConfig,
    SpoolConfig,
    TelemetryConfig,
    TlsConfig,
    parse_api_address,
)
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.backends.onnxruntime import MAX_SPIN_US
from edgekit_runtime.yaml_limited import Location, Positions, parse_yaml_limited, read_limited_bytes

__all__ = [
    "AgentConfig",
    "ApiAddress",
    "ApiConfig",
    "BROKER_SCHEMES",
    "BatchingConfig",
    "BrokerConfig",
    "BundlesConfig",
    "CommandsConfig",
    "DEFAULT_API_ADDRESS",
    "GrpcConfig",
    "HealthConfig",
    "MODEL_NAME_PATTERN",
    "ModelsConfig",
    "POWER_SENSORS",
    "PowerConfig",
    "ProbeConfig",
    "RunnerConfig",
    "SpoolConfig",
    "TelemetryConfig",
    "TlsConfig",
    "UNIX_PREFIX",
    "load_config",
    "parse_api_address",
    "parse_config",
]

#: The largest value of a number field without a bound of its own: beyond it a time or size means "never"
#: or "unbounded", which the field's own setting says better.
MAX_NUMBER = 1e12
#: The longest time a ``*_s`` key may hold (about 31 years): Python's thread and socket timeouts stop at ~9.2e9 s,
#: so a larger one was accepted and then crashed the API (every request) or a thread (in a restart loop).
MAX_SECONDS = 1e9
#: The smallest size a ``*_mb`` limit may hold (about 1 KB): a tinier positive one rounded to a 0-byte limit.
MIN_SIZE_MB = 0.001
_ID_PATTERN = ID_PATTERN
_REQUIRED = object()
_KEY_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def _location(key: str) -> Location:
    """``models.names[1]`` -> ``("models", "names", 1)``: the YAML path of a key as errors name it."""
    return tuple(int(index) if index else name for index, name in _KEY_PART.findall(key))


def _position(key: str, positions: Positions) -> tuple[int, int] | None:
    """Line and column of ``key``, else of the nearest enclosing key the file has (a missing key: its section)."""
    loc = _location(key)
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in positions:
            return positions[loc[:cut]]
    return None


# -- reading ------------------------------------------------------------------------------------------


class _Section:
    """One mapping of the YAML file; every read names ``file: key`` in its errors."""

    def __init__(self, data: object, *, file: Path, prefix: str, known: tuple[str, ...], positions: Positions) -> None:
        self.file = file
        self.prefix = prefix
        self.positions = positions
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise self.error(prefix.rstrip(".") or "top level", f"must be a mapping of keys, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        for key in data:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                raise self.error(
                    f"{prefix}{key}",
                    "is not a known key",
                    hint=(f"did you mean '{prefix}{close[0]}'? " if close else "")
                    + f"known keys here: {', '.join(known)}",
                )

    def where(self, key: str) -> str:
        """``FILE:LINE:COLUMN`` of ``key`` (the column of its name), as recipe errors name theirs."""
        position = _position("" if key == "top level" else key, self.positions)
        return f"{self.file}:{position[0]}:{position[1]}" if position else str(self.file)

    def error(self, key: str, problem: str, *, hint: str | None = None) -> AgentConfigError:
        return AgentConfigError(f"{self.where(key)}: {key}: {problem}", hint=hint)

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def section(self, name: str, known: tuple[str, ...]) -> _Section:
        return _Section(self.data.get(name), file=self.file, prefix=f"{self.prefix}{name}.", known=known,
                        positions=self.positions)  # fmt: skip

    def _get(self, name: str, default: object, example: str) -> object:
        value = self.data.get(name)
        if value is None:
            if default is _REQUIRED:
                raise self.error(self.key(name), "is required", hint=f"add it, e.g. {name}: {example}")
            return default
        return value

    def string(self, name: str, default: object = _REQUIRED, *, example: str = "...") -> Any:
        value = self._get(name, default, example)
        if value is not default and not isinstance(value, str):
            raise self.error(self.key(name), f"expected a string, got {value!r}", hint=f"e.g. {name}: {example}")
        return value

    def identifier(self, name: str, *, example: str) -> str:
        value: str = self.string(name, example=example)
        if not _ID_PATTERN.match(value):
            raise self.error(
                self.key(name),
                f"{value!r} may only hold letters, digits, '_', '.' and '-' (it becomes part of MQTT topics)",
                hint=f"e.g. {name}: {example}",
            )
        return value

    def number(
        self, name: str, default: object = _REQUIRED, *, minimum: float, integer: bool = False,
        maximum: float | None = None, exclusive_minimum: bool = False, example: str = "1",
    ) -> Any:
        value = self._get(name, default, example)
        if value is default:
            return value
        kinds = (int,) if integer else (int, float)
        bad_type = isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value)  # .nan, .inf
        shown_maximum = maximum
        if maximum is None:  # past it every time and size means "never"; a time past MAX_SECONDS overflows a timeout
            maximum = MAX_SECONDS if name.endswith("_s") else MAX_NUMBER
        too_low = not bad_type and (value <= minimum if exclusive_minimum else value < minimum)
        too_high = not bad_type and value > maximum
        shown_maximum = maximum if too_high else shown_maximum
        if bad_type or too_low or too_high:
            kind = "an integer" if integer else "a number"
            low = f"> {minimum}" if exclusive_minimum else f">= {minimum}"
            bounds = low + (f" and <= {shown_maximum:g}" if shown_maximum is not None else "")
            raise self.error(self.key(name), f"expected {kind} {bounds}, got {value!r}", hint=f"e.g. {name}: {example}")
        return float(value) if not integer else int(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name, default, "false")
        if not isinstance(value, bool):
            raise self.error(self.key(name), f"expected true or false, got {value!r}")
        return value

    def path(self, name: str, default: object = _REQUIRED, *, example: str = "/path") -> Any:
        value = self.string(name, default, example=example)
        if value is default or value is None:
            return value
        if "\x00" in value:
            raise self.error(self.key(name), "the path contains a NUL character", hint=f"e.g. {name}: {example}")
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else (self.file.parent / path).resolve()


def load_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and validate the agent's YAML configuration file."""
    file = Path(path)
    if not file.exists():
        raise AgentConfigError(
            f"agent configuration '{file}' does not exist",
            hint="copy runtime/agent.example.yaml and edit it, then pass --config PATH",
        )
    try:  # the reader recipes use: size, nesting and alias limits, UTF-8, duplicate keys (edgekit_runtime.yaml_limited)
        raw = read_limited_bytes(file, AgentConfigError, "agent configuration")
    except OSError as err:
        raise AgentConfigError(f"agent configuration '{file}' cannot be read: {err.strerror or err}") from err
    data, positions = parse_yaml_limited(raw, file, AgentConfigError, "agent configuration",
                                         empty_hint="copy runtime/agent.example.yaml and edit it")  # fmt: skip
    return parse_config(data, file=file.resolve(), positions=positions)


def parse_config(data: object, *, file: Path, positions: Positions | None = None) -> AgentConfig:
    """Validate already-parsed YAML ``data``; ``file`` names the source in errors and anchors paths,
    ``positions`` (from the YAML reader) adds ``:LINE:COLUMN`` to them."""
    top = _Section(
        data,
        file=file,
        positions=positions or {},
        prefix="",
        known=("device_id", "fleet", "broker", "bundles", "api", "telemetry", "power", "probe", "batching", "health",
               "commands", "models", "runner"),
    )
    bundles = _parse_bundles(top.section("bundles", ("dir", "public_key", "allow_unsigned", "max_download_mb", "download_timeout_s", "download_max_s", "inbox", "allowed_sources")))
    models = _parse_models(top.section("models", ("dir", "names", "default", "memory_budget_mb")), bundles) if top.has("models") else None
    _check_batched_models(top, models, "batching")
    _check_batched_models(top, models, "runner")
    return AgentConfig(
        device_id=top.identifier("device_id", example="jetson-07"),
        fleet=top.identifier("fleet", example="warehouse-a"),
        broker=_parse_broker(top) if top.has("broker") else None,
        bundles=bundles,
        api=_parse_api(top.section("api", ("address", "max_request_mb", "max_header_kb", "max_connections",
                                           "idle_timeout_s", "header_timeout_s", "body_timeout_s", "grpc",
                                           "allowed_hosts", "max_inflight_body_mb", "model_control")),
                       memory_budget_mb=None if models is None else models.memory_budget_mb),
        telemetry=_parse_telemetry(top.section("telemetry", ("interval_s", "spool", "delivery", "resend_after_s"))),
        power=_parse_power(top.section("power", ("sensor", "root", "sample_interval_s"))),
        health=_parse_health(top.section("health", ("window_s", "max_error_rate", "min_requests"))),
        probe=_parse_probe(top.section("probe", ("interval_s", "dims"))) if top.has("probe") else None,
        batching=_parse_batching(top.section("batching", ("max_batch", "max_delay_ms", "dim", "instances", "models")))
        if top.has("batching")
        else None,
        runner=_parse_runner(top.section("runner", (*_RUNNER_PER_MODEL, "models"))),
        commands=_parse_commands(top.section("commands", ("replay_path", "replay_window_h", "max_clock_skew_s",
                                                          "require_issued_at", "max_remembered", "require_signed")),
                                 bundles),
        source=file,
        models=models,
    )


MODEL_NAME_PATTERN = _ID_PATTERN


def _parse_models(section: _Section, bundles: BundlesConfig) -> ModelsConfig:
    hint = "e.g. models: {names: [detector, keywords], default: detector, memory_budget_mb: 512}"
    names_data = section.data.get("names")
    names: tuple[str, ...] | None = None
    if names_data is not None:
        if not isinstance(names_data, list) or not names_data:
            raise section.error("models.names", f"expected a non-empty list of model names, got {names_data!r}", hint=hint)
        for index, name in enumerate(names_data):
            if not isinstance(name, str) or not _ID_PATTERN.match(name):
                raise section.error(f"models.names[{index}]", f"{name!r} is not a model name: letters, digits, '_', '.' "
                                    "and '-', at most 64, starting with a letter or digit (it is part of URLs)", hint=hint)  # fmt: skip
        if len(names_data) > MAX_MODELS:
            raise section.error("models.names", f"lists {len(names_data)} models; an agent serves at most {MAX_MODELS} (each "
                                f"telemetry window carries one entry a model, and telemetry.v1 holds {MAX_MODELS})",
                                hint="serve the others from another agent or device")  # fmt: skip
        if len(set(names_data)) != len(names_data):
            twice = sorted({name for name in names_data if names_data.count(name) > 1})
            raise section.error("models.names", f"lists {', '.join(twice)} more than once", hint="name each model once")
        names = tuple(names_data)
    default = section.string("default", None, example="detector")
    if default is not None and names is not None and default not in names:
        raise section.error("models.default", f"{default!r} is not one of models.names ({', '.join(names)})",
                            hint="name one of the listed models, or add it to models.names")  # fmt: skip
    if default is not None and not _ID_PATTERN.match(default):
        raise section.error("models.default", f"{default!r} is not a model name", hint=hint)
    if names is None and default is None:
        raise section.error("models.default", "is required when models.names is not given (every folder of "
                            "models.dir is a model, so none is first)", hint="e.g. default: detector")  # fmt: skip
    budget = section.number("memory_budget_mb", None, minimum=0, exclusive_minimum=True, example="512")
    return ModelsConfig(
        dir=section.path("dir", bundles.dir / "models", example="/var/lib/edgekit/models"),
        names=names,
        default=default,
        memory_budget_mb=budget,
    )


def _parse_broker(top: _Section) -> BrokerConfig:
    section = top.section("broker", ("url", "tls", "username", "password_file", "keepalive_s",
                                      "allow_plaintext_password"))
    url: str = section.string("url", example="mqtts://broker.example.com:8883")
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in BROKER_SCHEMES or not url.split("://", 1)[1].strip("/"):
        raise section.error(
            "broker.url",
            f"{url!r} must be mqtt://HOST[:PORT] or mqtts://HOST[:PORT]",
            hint="mqtts:// (TLS, port 8883) on real networks; mqtt:// only on loopback or a trusted LAN",
        )
    tls_section = section.section("tls", ("ca", "cert", "key"))
    tls = TlsConfig(
        ca=tls_section.path("ca", None),
        cert=tls_section.path("cert", None),
        key=tls_section.path("key", None),
    )
    if (tls.cert is None) != (tls.key is None):
        raise section.error("broker.tls", "cert and key must be given together (client certificate authentication)")
    if scheme == "mqtt" and (tls.ca or tls.cert):
        raise section.error("broker.tls", "is set but broker.url uses mqtt:// (no TLS)", hint="use mqtts:// in broker.url")
    for name in ("ca", "cert", "key"):
        tls_path = getattr(tls, name)
        if tls_path is not None and not tls_path.is_file():
            raise section.error(f"broker.tls.{name}", f"file '{tls_path}' does not exist", hint="fix the path")
    password_file = section.path("password_file", None)
    username = section.string("username", None)
    if password_file is not None and username is None:
        raise section.error("broker.password_file", "is set without broker.username", hint="add broker.username")
    if password_file is not None and not password_file.is_file():
        raise section.error("broker.password_file", f"file '{password_file}' does not exist", hint="fix the path")
    allow_plaintext = section.boolean("allow_plaintext_password", False)
    from edgekit_runtime.agent.broker import refuse_plaintext_password
    from edgekit_runtime.agent.topics import TelemetryError

    try:
        refuse_plaintext_password(url, has_password=password_file is not None, allow=allow_plaintext,
                                  source=section.where("broker.password_file"), field="broker.password_file",
                                  allow_option="broker.allow_plaintext_password: true")  # fmt: skip
    except TelemetryError as err:  # the refusal names the file; a URL the broker parser refuses does not yet
        message = err.message if err.message.startswith(str(section.file)) else f"{section.where('broker.url')}: broker.url: {err.message}"
        raise AgentConfigError(message, hint=err.hint) from err
    return BrokerConfig(
        url=url,
        tls=tls,
        username=username,
        password_file=password_file,
        keepalive_s=section.number("keepalive_s", 30, minimum=5, integer=True, maximum=3600, example="30"),
        allow_plaintext_password=allow_plaintext,
    )


def _parse_bundles(section: _Section) -> BundlesConfig:
    allow_unsigned = section.boolean("allow_unsigned", False)
    public_key = section.path("public_key", None, example="/etc/edgekit/fleet_public.pem")
    if public_key is None and not allow_unsigned:
        raise section.error(
            "bundles.public_key",
            "is required: every bundle's signature is checked against the fleet's public key",
            hint="create keys with `edgekit keygen --out DIR` and set bundles.public_key to DIR's public "
            "key; only for development set bundles.allow_unsigned: true",
        )
    if public_key is not None and not public_key.is_file():
        raise section.error("bundles.public_key", f"file '{public_key}' does not exist", hint="copy the fleet public key there")
    max_mb = section.number("max_download_mb", 1024, minimum=MIN_SIZE_MB, example="1024")
    return BundlesConfig(
        dir=section.path("dir", example="/var/lib/edgekit/bundles"),
        public_key=public_key,
        allow_unsigned=allow_unsigned,
        max_download_bytes=int(max_mb * 1024 * 1024),
        download_timeout_s=section.number("download_timeout_s", 60.0, minimum=0, exclusive_minimum=True, example="60"),
        download_max_s=section.number("download_max_s", 3600.0, minimum=0, exclusive_minimum=True, example="3600"),
        inbox=section.path("inbox", None, example="/var/lib/edgekit/inbox"),
        allowed_sources=_parse_allowed_sources(section),
    )


def _parse_allowed_sources(section: _Section) -> tuple[str, ...]:
    from edgekit_runtime.agent.fetch import parse_allowed_source

    hint = "e.g. allowed_sources: [https://bundles.example.com/fleet-a/, /mnt/usb/bundles]"
    entries = section.data.get("allowed_sources") or []
    if not isinstance(entries, list):
        raise section.error("bundles.allowed_sources", f"expected a list of URL prefixes and directories, got {entries!r}", hint=hint)
    for index, entry in enumerate(entries):
        try:
            parse_allowed_source(entry if isinstance(entry, str) else "")
        except ValueError as err:
            raise section.error(f"bundles.allowed_sources[{index}]", str(err) if isinstance(entry, str) else f"expected a string, got {entry!r}", hint=hint) from err
    return tuple(entries)


def _parse_api(section: _Section, *, memory_budget_mb: float | None) -> ApiConfig:
    address = parse_api_address(section.string("address", DEFAULT_API_ADDRESS), where=f"{section.where('api.address')}: api.address")
    max_mb = section.number("max_request_mb", 64, minimum=MIN_SIZE_MB, example="64")
    max_header_kb = section.number("max_header_kb", 16, minimum=1, example="16")
    inflight_mb = section.number("max_inflight_body_mb", None, minimum=MIN_SIZE_MB, example="128")
    return ApiConfig(
        address=address,
        max_request_bytes=int(max_mb * 1024 * 1024),
        max_header_bytes=int(max_header_kb * 1024),
        max_connections=section.number("max_connections", 64, minimum=1, integer=True, example="64"),
        idle_timeout_s=section.number("idle_timeout_s", 60.0, minimum=0, exclusive_minimum=True, example="60"),
        header_timeout_s=section.number("header_timeout_s", 10.0, minimum=0, exclusive_minimum=True, example="10"),
        body_timeout_s=section.number("body_timeout_s", 60.0, minimum=0, exclusive_minimum=True, example="60"),
        grpc=_parse_grpc(section.section("grpc", ("listen",))) if section.has("grpc") else None,
        allowed_hosts=_parse_allowed_hosts(section),
        max_inflight_body_bytes=default_inflight_body_bytes(memory_budget_mb) if inflight_mb is None else int(inflight_mb * 1024 * 1024),
        model_control=section.boolean("model_control", True),
    )


def _parse_allowed_hosts(section: _Section) -> tuple[str, ...]:
    hint = "e.g. allowed_hosts: [jetson-01.local] (names the API may be called by, besides localhost and 127.0.0.1)"
    entries = section.data.get("allowed_hosts") or []
    if not isinstance(entries, list) or not all(isinstance(e, str) and e.strip() and not any(c in e for c in " /:@") for e in entries):
        raise section.error("api.allowed_hosts", f"expected a list of host names without ports, got {entries!r}", hint=hint)
    return tuple(entries)


def _parse_grpc(section: _Section) -> GrpcConfig:
    listen = section.string("listen", example="127.0.0.1:8001")
    return GrpcConfig(listen=parse_api_address(listen, where=f"{section.where(section.key('listen'))}: {section.key('listen')}"))


def _parse_telemetry(section: _Section) -> TelemetryConfig:
    spool = section.section("spool", ("path", "max_messages", "max_bytes", "overflow_messages"))
    delivery = section.string("delivery", "collector_ack")
    if delivery not in ("collector_ack", "broker_ack"):  # edgekit_runtime.agent.delivery.DELIVERY_MODES
        raise section.error("telemetry.delivery", f"must be collector_ack or broker_ack, got {delivery!r}",
                            hint="collector_ack (default) keeps a window until the collector stored it; broker_ack "
                                 "is for a collector that publishes no acks (docs/agent.md, Delivery)")  # fmt: skip
    return TelemetryConfig(
        interval_s=section.number("interval_s", 10.0, minimum=0, exclusive_minimum=True, maximum=86400, example="10"),
        delivery=delivery,
        resend_after_s=section.number("resend_after_s", 30.0, minimum=0, exclusive_minimum=True, example="30"),
        spool=SpoolConfig(
            path=spool.path("path", example="/var/lib/edgekit/spool"),
            max_messages=spool.number("max_messages", 10_000, minimum=1, integer=True, example="10000"),
            max_bytes=spool.number("max_bytes", 50 * 1024 * 1024, minimum=1024, integer=True, example="52428800"),
            overflow_messages=spool.number("overflow_messages", 1000, minimum=1, integer=True, example="1000"),
        ),
    )


def _parse_power(section: _Section) -> PowerConfig:
    sensor = section.string("sensor", "auto")
    if sensor not in POWER_SENSORS:
        close = difflib.get_close_matches(sensor, POWER_SENSORS, n=1)
        raise section.error(
            "power.sensor",
            f"unknown sensor {sensor!r}",
            hint=(f"did you mean '{close[0]}'? " if close else "") + f"choose one of {', '.join(POWER_SENSORS)}",
        )
    return PowerConfig(
        sensor=sensor,
        root=section.path("root", Path("/")),
        sample_interval_s=section.number("sample_interval_s", 0.1, minimum=0, exclusive_minimum=True, example="0.1"),
    )


def _parse_probe(section: _Section) -> ProbeConfig:
    dims_data = section.data.get("dims") or {}
    if not isinstance(dims_data, Mapping):
        raise section.error("probe.dims", "must map dim names to sizes", hint="e.g. dims: {batch: 1}")
    for name, size in dims_data.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise section.error(f"probe.dims.{name}", f"expected an integer >= 1, got {size!r}", hint="e.g. batch: 1")
    return ProbeConfig(
        interval_s=section.number("interval_s", minimum=0, exclusive_minimum=True, example="60"),
        dims={str(name): int(size) for name, size in dims_data.items()},
    )


_BATCHING_PER_MODEL = ("max_batch", "max_delay_ms", "instances")


def _batching_values(section: _Section) -> dict[str, Any]:
    """The per-model settings ``section`` names (unnamed ones left out, so the agent-wide ones apply)."""
    values: dict[str, Any] = {}
    if section.has("max_batch"):
        values["max_batch"] = section.number("max_batch", minimum=1, integer=True, example="8")
    if section.has("max_delay_ms"):
        values["max_delay_ms"] = section.number("max_delay_ms", minimum=0, maximum=10_000, example="0.5")
    if section.has("instances"):
        values["instances"] = section.number("instances", minimum=1, integer=True, maximum=64, example="1")
    return values


def _check_batched_models(top: _Section, models: ModelsConfig | None, section: str) -> None:
    """``<section>.models`` (``batching``, ``runner``) may only name models the repository lists (a typo would
    silently not apply)."""
    named = (top.data.get(section) or {}).get("models") if isinstance(top.data.get(section), Mapping) else None
    if not isinstance(named, Mapping) or not named:
        return
    known = None if models is None else models.names
    for name in named:
        if models is None or (known is not None and name not in known):
            listed = "the agent serves one model (no models section)" if models is None else f"models.names lists {', '.join(known or ())}"
            raise top.error(f"{section}.models.{name}", f"names a model the agent does not serve: {listed}",
                            hint=f"name models of models.names, or put the settings directly under {section}")  # fmt: skip


def _per_model_values(section: _Section, name: str, keys: tuple[str, ...], values: Callable[[_Section], dict[str, Any]],
                      example: str) -> dict[str, dict[str, Any]]:
    """``NAME.models``: each model name mapped to ``values`` of its own settings (only ``keys``)."""
    models_data = section.data.get("models") or {}
    if not isinstance(models_data, Mapping):
        raise section.error(f"{name}.models", f"expected model names mapped to settings, got {models_data!r}",
                            hint=f"e.g. models: {example}")  # fmt: skip
    models = {}
    per_model = section.section("models", tuple(str(model) for model in models_data))
    for model in models_data:
        if not isinstance(model, str) or not _ID_PATTERN.match(model):
            raise section.error(f"{name}.models", f"{model!r} is not a model name", hint="use a name from models.names")
        models[model] = values(per_model.section(model, keys))
    return models


def _parse_batching(section: _Section) -> BatchingConfig:
    models = _per_model_values(section, "batching", _BATCHING_PER_MODEL, _batching_values,
                               "{detector: {max_delay_ms: 2, instances: 2}}")
    return BatchingConfig(**_batching_values(section), dim=section.string("dim", "batch"), models=models)


_RUNNER_PER_MODEL = ("intra_op_spinning", "intra_op_spin_us", "intra_op_threads")


def _runner_values(section: _Section) -> dict[str, Any]:
    """The runner options ``section`` names (null: the bundle's setting; unnamed ones left out)."""
    values: dict[str, Any] = {}
    if "intra_op_spinning" in section.data:
        value = section.data["intra_op_spinning"]
        if value is not None and not isinstance(value, bool):
            raise section.error(section.key("intra_op_spinning"), f"expected true, false or null, got {value!r}",
                                hint="true (the default) lets ONNX Runtime's intra-op threads spin intra_op_spin_us after a run; false parks them; null keeps the bundle's setting")  # fmt: skip
        values["intra_op_spinning"] = value
    if "intra_op_spin_us" in section.data:
        values["intra_op_spin_us"] = None if section.data["intra_op_spin_us"] is None else section.number(
            "intra_op_spin_us", minimum=1, integer=True, maximum=MAX_SPIN_US, example="10")
        if values["intra_op_spin_us"] is not None and values.get("intra_op_spinning") is False:
            raise section.error(section.key("intra_op_spin_us"), "bounds spinning, which intra_op_spinning: false turns off",
                                hint="drop one of the two: intra_op_spinning: false parks the threads, intra_op_spin_us lets them spin that long")  # fmt: skip
    if "intra_op_threads" in section.data:
        values["intra_op_threads"] = None if section.data["intra_op_threads"] is None else section.number(
            "intra_op_threads", minimum=1, integer=True, maximum=256, example="1")
    return values


def _parse_runner(section: _Section) -> RunnerConfig:
    models = _per_model_values(section, "runner", _RUNNER_PER_MODEL, _runner_values, "{detector: {intra_op_spinning: true}}")
    return RunnerConfig(**_runner_values(section), models=models)


def _parse_commands(section: _Section, bundles: BundlesConfig) -> CommandsConfig:
    require_signed = section.boolean("require_signed", False)
    if require_signed and bundles.public_key is None:
        raise section.error("commands.require_signed", "is true but bundles.public_key is not set: signatures are "
                            "checked against the fleet's public key", hint="set bundles.public_key to the fleet's "
                            ".pub.pem (from `edgekit keygen`)")  # fmt: skip
    window_h = section.number("replay_window_h", 24, minimum=0, exclusive_minimum=True, maximum=24 * 30, example="24")
    return CommandsConfig(
        replay_path=section.path("replay_path", None, example="/var/lib/edgekit/commands.db"),
        replay_window_s=float(window_h) * 3600.0,
        max_clock_skew_s=section.number("max_clock_skew_s", 300.0, minimum=0, maximum=86400, example="300"),
        require_issued_at=section.boolean("require_issued_at", True),
        max_remembered=section.number("max_remembered", 10_000, minimum=100, integer=True, maximum=1_000_000,
                                      example="10000"),
        require_signed=require_signed,
    )


def _parse_health(section: _Section) -> HealthConfig:
    return HealthConfig(
        window_s=section.number("window_s", 60.0, minimum=0, example="60"),
        max_error_rate=section.number("max_error_rate", 0.05, minimum=0, maximum=1, example="0.05"),
        min_requests=section.number("min_requests", 1, minimum=0, integer=True, example="1"),
    )
