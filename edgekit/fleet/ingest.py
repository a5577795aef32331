"""Turn one MQTT message from an agent into a typed record, or into a :class:`Rejection` saying why not.

:func:`parse_message` is pure and never raises: the collector feeds it whatever arrives on the wire.
Messages are validated against the agent's own JSON Schema files (imported from
:mod:`edgekit_runtime.schemas`), compiled once with ``fastjsonschema`` so validation keeps up with
thousands of messages a second.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Union

from fastjsonschema import JsonSchemaValueException as _JsonSchemaValueException

from edgekit.fleet.store.base import (DeviceEvent, DeviceIdentityRecord, DeviceStatus, ModelWindow, RejectedMessage,
                                      TelemetryWindow)
from edgekit_runtime.agent.wire import refuse_repeated_keys

logger = logging.getLogger(__name__)

#: Default largest payload the collector accepts; agents send about 1 KiB a window.
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_DETAIL_CHARS = 512
INT64_MAX = 2**63 - 1
#: Times a message may carry: from a device clock still at 1970 (no RTC yet) to before the year 3000; later ones
#: would not survive the store's epoch seconds (9999-12-31T23:59:59.999999 comes back as the year 10000).
EARLIEST_TIME = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
LATEST_TIME = dt.datetime(3000, 1, 1, tzinfo=dt.timezone.utc)
#: The longest telemetry window taken: a longer one comes from a clock that jumped within it, and would make the
#: device look alive (its expected interval) for that long.
MAX_WINDOW = dt.timedelta(days=1)
#: The largest request or error count a window may carry (a million requests a second for twelve days): the
#: store's sums over a fleet stay 64-bit integers.
MAX_COUNT = 2**40
#: The largest magnitude of a measured value (milliseconds, milliwatts, millijoules, MB, percent, degrees): the
#: store's sums of value x count stay finite.
MAX_MEASURE = 1e12
#: Topics longer than this are parsed without the cache (real ones are far shorter: ids have at most 64 characters).
CACHED_TOPIC_CHARS = 256
#: Event kinds starting with this are written by the collector's alert engine (edgekit.fleet.alerts), never by devices.
RESERVED_EVENT_KIND_PREFIX = "alert_"

#: Every reason a message can be rejected for, with what it means.
REJECTION_REASONS: dict[str, str] = {
    "oversized": "the payload is larger than the collector accepts",
    "bad_topic": "the topic is not an edgekit v1 telemetry, status or events topic",
    "not_utf8": "the payload is not UTF-8 text",
    "malformed_json": "the payload is not valid JSON (or holds NaN, Infinity, numbers out of range or a key twice in "
                      "one object)",
    "not_an_object": "the payload is JSON but not an object",
    "unknown_schema": "the 'schema' field is missing or names a message version this collector does not read",
    "wrong_topic": "the message's schema does not belong on the topic it came on",
    "schema_mismatch": "the message does not validate against its JSON Schema",
    "device_mismatch": "the fleet or device in the payload differs from the one in the topic",
    "reserved_kind": "an event's kind starts with 'alert_': those events (alert_firing, alert_resolved) are the "
                     "collector's alert engine's own, never a device's",
    "bad_value": "the message validates but holds a value the store cannot keep (impossible date or one outside "
                 "1970-2999, huge integer or measurement, NUL character, window ending before it starts or longer "
                 "than a day, a model named twice)",
    "store_refused": "the store refused to write the message",
    "internal_error": "the collector failed on the message (a bug: please report it)",
}  # fmt: skip

#: ``schema`` field -> (schema file in edgekit_runtime.schemas, topic kind it belongs on).
SCHEMAS: dict[str, tuple[str, str]] = {
    "edgekit.telemetry/1": ("telemetry.v1", "telemetry"),
    "edgekit.status/1": ("status.v1", "status"),
    "edgekit.event/1": ("event.v1", "events"),
}
READ_KINDS = ("telemetry", "status", "events")

_UTC_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z$")

Record = Union[TelemetryWindow, DeviceStatus, DeviceEvent]


@dataclass(frozen=True)
class Rejection:
    """A message the collector will not store: which topic, why (a key of :data:`REJECTION_REASONS`), details."""

    topic: str
    reason: str
    detail: str
    size_bytes: int
    received_at: dt.datetime

    def to_record(self) -> RejectedMessage:
        return RejectedMessage(topic=self.topic[:1024], reason=self.reason, size_bytes=self.size_bytes,
                               at=self.received_at, detail=self.detail)  # fmt: skip


class _Rejected(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = _storable_text(detail)[:MAX_DETAIL_CHARS]


def _storable_text(text: str) -> str:
    """``text`` with what UTF-8 and PostgreSQL text cannot hold (unpaired surrogates, NUL) written as escapes: a
    rejection quoting a bad value must itself be storable."""
    if text.isascii() and "\x00" not in text:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def parse_message(
    topic: str,
    payload: bytes | bytearray | memoryview | str,
    *,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    received_at: dt.datetime | None = None,
    retained: bool = False,
) -> TelemetryWindow | DeviceStatus | DeviceEvent | Rejection:
    """The record ``payload`` on ``topic`` carries, or a :class:`Rejection`; never raises.

    ``received_at`` (default: now, UTC) becomes the window's ``received_at`` and the status's ``updated_at``
    (when the device was last heard from). A ``retained`` status is one the broker kept and sends again to each
    new subscriber (a collector starting or reconnecting): the device said it at its own ``at``, not now, so that
    time (never later than ``received_at``, for a device clock running ahead) becomes its ``updated_at``, and the
    status comes back marked ``retained``: the store takes its state (the broker keeps only a device's newest, such
    as the last will of a device that died while no collector ran) but keeps a later heard-from time it holds, so a
    device silent for an hour stays offline across a collector restart.
    """
    at = received_at if received_at is not None else dt.datetime.now(dt.timezone.utc)
    if isinstance(payload, bytes):  # what paho gives: used as it is
        raw = payload
    elif isinstance(payload, str):
        raw = payload.encode("utf-8", "surrogatepass")
    else:  # a bytearray or memoryview: measured before it is copied, so a huge one costs no second copy
        size = memoryview(payload).nbytes
        if size > max_payload_bytes:
            return Rejection(_storable_text(str(topic)), "oversized", _oversized(size, max_payload_bytes), size, at)
        raw = bytes(payload)
    try:
        return _parse(str(topic), raw, max_payload_bytes, at, retained)
    except _Rejected as rejected:
        return Rejection(_storable_text(str(topic)), rejected.reason, rejected.detail, len(raw), at)
    except Exception as exc:  # a bug; the collector must keep running, and the message is kept as rejected
        logger.exception("parsing a message on %r failed", topic)
        return Rejection(_storable_text(str(topic)), "internal_error",
                         _storable_text(f"{type(exc).__name__}: {exc}")[:MAX_DETAIL_CHARS], len(raw), at)  # fmt: skip


def _parse(topic: str, raw: bytes, max_payload_bytes: int, at: dt.datetime, retained: bool = False) -> Record:
    if len(raw) > max_payload_bytes:
        raise _Rejected("oversized", _oversized(len(raw), max_payload_bytes))
    fleet, device, kind = _split_topic(topic)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Rejected("not_utf8", f"byte {exc.start} is not UTF-8: {exc.reason}") from None
    message = _load_json(text)
    if not isinstance(message, dict):
        raise _Rejected("not_an_object", f"payload is a JSON {type(message).__name__}, expected an object")
    schema_field = message.get("schema")
    if not isinstance(schema_field, str) or schema_field not in SCHEMAS:
        known = ", ".join(SCHEMAS)
        shown = repr(schema_field)[:80] if "schema" in message else "no 'schema' field"
        raise _Rejected("unknown_schema", f"schema is {shown}; this collector reads {known}")
    schema_name, schema_kind = SCHEMAS[schema_field]
    if schema_kind != kind:
        raise _Rejected("wrong_topic", f"a {schema_field} message arrived on a '{kind}' topic")
    problem = _schema_problem(schema_name, message)
    if problem is not None:
        raise _Rejected("schema_mismatch", f"{schema_name}: {problem}")
    if message["fleet"] != fleet or message["device"] != device:
        raise _Rejected("device_mismatch", f"payload names fleet {message['fleet']!r} device {message['device']!r}, "
                                           f"the topic fleet {fleet!r} device {device!r}")  # fmt: skip
    if "\\u" in text:
        _check_storable(message)
    if retained and kind == "status":  # said at its own time, not now (see parse_message)
        return dataclasses.replace(_status(message, min(_time(message["at"], "at"), at), text), retained=True)
    return _BUILDERS[kind](message, at, text)


def _oversized(size: int, max_payload_bytes: int) -> str:
    return f"payload of {size} bytes is over the limit of {max_payload_bytes} bytes"


def _split_topic(topic: str) -> tuple[str, str, str]:
    parsed = _topic_parts(topic) if len(topic) <= CACHED_TOPIC_CHARS else _topic_parts.__wrapped__(topic)
    if isinstance(parsed, str):
        raise _Rejected("bad_topic", parsed)
    return parsed


@lru_cache(maxsize=16384)
def _topic_parts(topic: str) -> tuple[str, str, str] | str:
    """(fleet, device, kind), or why the topic is not one the collector reads; cached (topics repeat)."""
    from edgekit_runtime.agent.topics import TelemetryError, parse_topic

    try:
        parsed = parse_topic(topic)
    except TelemetryError as exc:
        return exc.message
    if parsed.kind not in READ_KINDS:
        return f"the collector does not read '{parsed.kind}' topics"
    return parsed.fleet, parsed.device, parsed.kind


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


# A key twice would make the stored text and the parsed message disagree: refused (~3 us a window).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float,
                            object_pairs_hook=refuse_repeated_keys)  # fmt: skip


def _load_json(text: str) -> Any:
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise _Rejected("malformed_json", "JSON nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, and the hooks' and int conversion's ValueErrors
        raise _Rejected("malformed_json", str(exc)) from None


@lru_cache(maxsize=None)
def _validator(schema_name: str) -> Callable[[Any], Any]:
    import fastjsonschema
    from edgekit_runtime.schemas import load_schema

    # Formats are annotations in these schemas (patterns carry the rules); dates are parsed below.
    # fastjsonschema calls a function per $ref use (17 per telemetry window); inlined, it validates ~25 % faster.
    return fastjsonschema.compile(_inline_refs(load_schema(schema_name)), use_formats=False)  # type: ignore[no-any-return]


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``{"$ref": "#/$defs/<name>"}`` replaced by that definition (same rules, same
    error messages); unchanged if a definition refers to itself or the schema uses other references."""
    defs = schema.get("$defs", {})

    def inline(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref is not None:
                name = ref[len("#/$defs/"):] if isinstance(ref, str) and ref.startswith("#/$defs/") else ""
                if not node.keys() - {"$ref"} <= _ANNOTATIONS or name not in defs or name in seen:
                    raise _CannotInline
                return {**inline(defs[name], (*seen, name)), **{k: v for k, v in node.items() if k != "$ref"}}
            return {key: inline(value, seen) for key, value in node.items() if key != "$defs"}
        if isinstance(node, list):
            return [inline(value, seen) for value in node]
        return node

    try:
        return inline(schema, ())  # type: ignore[no-any-return]
    except _CannotInline:
        return schema


class _CannotInline(Exception):
    pass


#: Keywords beside a ``$ref`` that validate nothing, so the reference can still be inlined.
_ANNOTATIONS = frozenset({"description", "title", "$comment", "examples"})


def _schema_problem(schema_name: str, message: dict[str, Any]) -> str | None:
    try:
        _validator(schema_name)(message)
    except _JsonSchemaValueException as exc:
        return str(exc.message)
    except RecursionError:
        return "nested too deeply"
    return None


def _check_storable(value: Any, path: str = "") -> None:
    """Refuse NUL characters and unpaired surrogates: PostgreSQL text and UTF-8 cannot hold them."""
    if isinstance(value, str):
        if "\x00" in value:
            raise _Rejected("bad_value", f"{path or '(root)'} contains a NUL character")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _Rejected("bad_value", f"{path or '(root)'} contains an unpaired UTF-16 surrogate") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_storable(key, f"{path}.{key!s:.40}(key)")
            _check_storable(item, f"{path}.{key!s:.40}" if path else f"{key!s:.40}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_storable(item, f"{path}[{index}]")


def _parse_utc(text: str, where: str) -> dt.datetime:
    """``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` as an aware UTC datetime (1 to 6 fraction digits)."""
    match = _UTC_RE.match(text)
    if match is None:
        raise _Rejected("bad_value", f"{where} {text[:40]!r} is not an ISO-8601 UTC time")
    year, month, day, hour, minute, second, fraction = match.groups()
    try:
        return dt.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                           int((fraction or "0").ljust(6, "0")), tzinfo=dt.timezone.utc)  # fmt: skip
    except ValueError as exc:
        raise _Rejected("bad_value", f"{where} {text!r} is not a real time: {exc}") from None


if sys.version_info >= (3, 11):  # fromisoformat reads the schema's whole time pattern, 20 times faster

    def _parse_utc_fast(text: str, where: str) -> dt.datetime:
        try:
            return dt.datetime.fromisoformat(text)
        except ValueError:
            return _parse_utc(text, where)  # says why

else:  # pragma: no cover (Python 3.10)
    _parse_utc_fast = _parse_utc


def _int64(value: int, where: str) -> int:
    if value > INT64_MAX:
        raise _Rejected("bad_value", f"{where} {value} is larger than a 64-bit integer")
    return int(value)


def _count(value: int, where: str) -> int:
    if value > MAX_COUNT:
        raise _Rejected("bad_value", f"{where} {value} is larger than {MAX_COUNT} (2**40), more than a device counts")
    return int(value)


def _time(text: str, where: str) -> dt.datetime:
    moment = _parse_utc_fast(text, where)
    if not EARLIEST_TIME <= moment < LATEST_TIME:
        raise _Rejected("bad_value", f"{where} {text[:40]} is outside 1970-01-01 to 2999-12-31: the device's clock is wrong")
    return moment


def _telemetry(message: dict[str, Any], at: dt.datetime, text: str) -> TelemetryWindow:
    start = _time(message["window"]["start"], "window.start")
    end = _time(message["window"]["end"], "window.end")
    if end < start:
        raise _Rejected("bad_value", f"window ends ({message['window']['end']}) before it starts "
                                     f"({message['window']['start']})")  # fmt: skip
    if end - start > MAX_WINDOW:
        raise _Rejected("bad_value", f"window from {message['window']['start']} to {message['window']['end']} is longer "
                                     "than a day: the device's clock jumped within it")  # fmt: skip
    latency, power, bundle = message["latency"], message["power"], message["bundle"]
    for where, value in (("spool.dropped", message["spool"]["dropped"]), ("spool.backlog", message["spool"]["backlog"])):
        _int64(value, where)
    temperatures = [_float(v, f"temperatures_c.{k}") for k, v in message["temperatures_c"].items()]
    return TelemetryWindow(
        fleet=message["fleet"], device=message["device"], seq=_int64(message["seq"], "seq"),
        window_start=start, window_end=end, received_at=at,
        bundle_id=bundle["id"] if bundle else None, bundle_sha256=bundle["sha256"] if bundle else None,
        count=_count(latency["count"], "latency.count"), errors=_count(latency["errors"], "latency.errors"),
        p50_ms=_float(latency["p50_ms"], "latency.p50_ms"), p90_ms=_float(latency["p90_ms"], "latency.p90_ms"),
        p99_ms=_float(latency["p99_ms"], "latency.p99_ms"), max_ms=_float(latency["max_ms"], "latency.max_ms"),
        mean_ms=_float(latency["mean_ms"], "latency.mean_ms"),
        throughput_per_s=_float(latency["throughput_per_s"], "latency.throughput_per_s"),
        power_mean_mw=_float(power["mean_mw"], "power.mean_mw"), power_max_mw=_float(power["max_mw"], "power.max_mw"),
        energy_mj=_float(power["energy_mj"], "power.energy_mj"),
        energy_per_inference_mj=_float(message["energy_per_inference_mj"], "energy_per_inference_mj"),
        temperature_max_c=max(temperatures) if temperatures else None,  # type: ignore[type-var]
        memory_used_mb=_float(message["memory"]["used_mb"], "memory.used_mb"),
        cpu_load_pct=_float(message["cpu_load_pct"], "cpu_load_pct"),
        gpu_load_pct=_float(message["gpu_load_pct"], "gpu_load_pct"),
        payload=message, payload_json=text, model=message.get("model"), models=_model_windows(message),
    )  # fmt: skip


def _model_windows(message: dict[str, Any]) -> tuple[ModelWindow, ...]:
    """telemetry.v1's optional ``models`` (issue 20: every model's window on an agent serving several)."""
    found = []
    for entry in message.get("models") or ():
        bundle = entry["bundle"]
        found.append(ModelWindow(
            model=entry["model"], bundle_id=bundle["id"] if bundle else None,
            count=_count(entry["count"], "models[].count"), errors=_count(entry["errors"], "models[].errors"),
            p50_ms=_float(entry["p50_ms"], "models[].p50_ms"), p99_ms=_float(entry["p99_ms"], "models[].p99_ms"),
            throughput_per_s=_float(entry["throughput_per_s"], "models[].throughput_per_s"),
            memory_mb=_float(entry.get("memory_mb"), "models[].memory_mb"),
        ))  # fmt: skip
    if len({m.model for m in found}) < len(found):  # each view would count a different one of them
        named = sorted({m.model or "" for m in found if sum(1 for o in found if o.model == m.model) > 1})
        raise _Rejected("bad_value", f"models[] names model {named[0]!r} more than once")
    return tuple(found)


def _status(message: dict[str, Any], at: dt.datetime, text: str) -> DeviceStatus:
    _time(message["at"], "at")
    bundle = message.get("bundle")
    target = message.get("target")  # optional (issue 19): the profile the agent detected, name null when none
    return DeviceStatus(fleet=message["fleet"], device=message["device"], state=message["state"],
                        bundle_id=bundle["id"] if bundle else None, target=target.get("name") if target else None,
                        agent_version=message["agent_version"], updated_at=at, payload=message,
                        identity=_identity(message, at))  # fmt: skip


def _identity(message: dict[str, Any], at: dt.datetime) -> DeviceIdentityRecord | None:
    """The status's optional ``identity`` and ``power_mode``, flattened; ``None`` from agents that send neither."""
    identity, mode = message.get("identity"), message.get("power_mode")
    if identity is None and mode is None:
        return None
    from edgekit_runtime.sensors.power_mode import power_mode_label

    identity, mode = identity or {}, mode or {}
    label = power_mode_label(mode.get("name"), mode.get("clocks_locked"))
    return DeviceIdentityRecord(
        fleet=message["fleet"], device=message["device"], board=identity.get("board"), soc=identity.get("soc"),
        os=(identity.get("os") or {}).get("name"), l4t=identity.get("l4t"), jetpack=identity.get("jetpack"),
        cuda=identity.get("cuda"), tensorrt=identity.get("tensorrt"),
        onnxruntime=(identity.get("onnxruntime") or {}).get("version"), power_mode=label,
        clocks_locked=mode.get("clocks_locked"), updated_at=at,
        payload={"identity": message.get("identity"), "power_mode": message.get("power_mode")},
    )  # fmt: skip


def _event(message: dict[str, Any], at: dt.datetime, text: str) -> DeviceEvent:
    if message["kind"].startswith(RESERVED_EVENT_KIND_PREFIX):
        raise _Rejected("reserved_kind", f"event kind {message['kind']!r} is reserved for the collector's alerts; "
                                         f"a device's event kinds must not start with {RESERVED_EVENT_KIND_PREFIX!r}")  # fmt: skip
    return DeviceEvent(fleet=message["fleet"], device=message["device"], event_id=message["event_id"],
                       kind=message["kind"], level=message["level"], message=message["message"],
                       at=_time(message["at"], "at"), command_id=message.get("command_id"), payload=message)  # fmt: skip


def _float(value: float | int | None, where: str) -> float | None:
    """A measured value as a float; refused when it is beyond :data:`MAX_MEASURE` (or beyond any float)."""
    if value is None:
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise _Rejected("bad_value", f"{where} is too large to be a number") from None
    if not -MAX_MEASURE <= number <= MAX_MEASURE:
        raise _Rejected("bad_value", f"{where} {number:g} is beyond {MAX_MEASURE:g}, more than a device measures")
    return number


_BUILDERS: dict[str, Callable[[dict[str, Any], dt.datetime, str], Record]] = {
    "telemetry": _telemetry, "status": _status, "events": _event,
}  # fmt: skip

__all__ = ["MAX_PAYLOAD_BYTES", "REJECTION_REASONS", "RESERVED_EVENT_KIND_PREFIX", "SCHEMAS", "Rejection", "parse_message"]
