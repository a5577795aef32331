"""How tensors travel over the agent's local API: JSON, or the binary ``application/x-edgekit-tensors``.

JSON (``application/json``)::

    {"inputs": {"image": {"dtype": "float32", "shape": [1, 1, 8, 8], "data": [[[[0.1, ...]]]]}}}

``shape`` may be left out (the nesting of ``data`` gives it); when present it must agree with ``data``.
Responses carry ``"outputs"`` in the same form.

Binary (``application/x-edgekit-tensors``), all integers little-endian::

    offset 0   4 bytes   magic b"EKT1"
    offset 4   uint32    H = length of the header in bytes
    offset 8   H bytes   UTF-8 JSON header, padded with spaces so that 8 + H is a multiple of 8:
                         {"tensors": [{"name": "image", "dtype": "float32", "shape": [1, 1, 8, 8],
                                       "offset": 0, "nbytes": 256}, ...]}
    offset 8+H           the data section: each tensor's elements in C (row-major) order as
                         little-endian values, starting at its ``offset`` (relative to the data
                         section, a multiple of 8) and ``nbytes`` long

``dtype`` is a numpy dtype name from :data:`WIRE_DTYPES` (``bool`` is one byte, 0 or 1). Arrays
decoded from a request body are writable views into that body (no copy).

Untrusted JSON (the binary header here, MQTT commands in :mod:`~edgekit_runtime.agent.mqtt`) goes
through :func:`loads_limited`, which checks size and nesting depth before ``json.loads`` runs, so a
payload of 5,000 ``[`` is a :class:`JsonLimitError` rather than a ``RecursionError``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from itertools import accumulate
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgekit_runtime.errors import EdgekitError, InputSignatureError

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/x-edgekit-tensors"
MAGIC = b"EKT1"
ALIGNMENT = 8
WIRE_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"}
)
_PREFIX = struct.Struct("<4sI")
#: Deepest nesting of a binary header (``{"tensors": [{"shape": [...]}]}`` is 4).
MAX_HEADER_DEPTH = 8
_JSON_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")


class JsonLimitError(EdgekitError):
    """Untrusted JSON is not UTF-8, not JSON, larger or deeper than its limit; never a ``RecursionError``."""


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text``, brackets inside strings not counted.
    Linear in the length; meant to run *before* ``json.loads`` (whose recursion it guards)."""
    brackets = _NOT_BRACKET_RE.sub("", _JSON_STRING_RE.sub("", text))
    if not brackets:
        return 0
    return max(accumulate(1 if bracket in "[{" else -1 for bracket in brackets))


def loads_limited(data: bytes | bytearray | memoryview | str, *, what: str, max_bytes: int, max_depth: int,
                  strict: bool = False) -> Any:  # fmt: skip
    """``json.loads`` for untrusted input: at most ``max_bytes`` (UTF-8) and ``max_depth`` levels of
    nesting, checked first. Every failure is a :class:`JsonLimitError` naming ``what`` and the limit. ``strict``
    (commands, which are signed, remembered and answered) also refuses NaN and Infinity, a key twice in one object
    and unpaired surrogates: each would make the stored, signed or answered message differ from what was sent."""
    size = len(data.encode("utf-8", "surrogatepass")) if isinstance(data, str) else len(data)
    if size > max_bytes:
        raise JsonLimitError(f"{what} is {size} bytes, more than the limit of {max_bytes} bytes",
                             hint=f"send at most {max_bytes} bytes of JSON")  # fmt: skip
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as err:
            raise JsonLimitError(f"{what} is not UTF-8: byte {err.start} ({err.reason})",
                                 hint="encode the JSON as UTF-8")  # fmt: skip
    depth = json_depth(text)
    if depth > max_depth:
        raise JsonLimitError(f"{what} nests arrays and objects {depth} levels deep, more than the limit of {max_depth}",
                             hint=f"flatten the JSON to at most {max_depth} levels")  # fmt: skip
    try:
        value = json.loads(text, **(_STRICT if strict else {}))
    except json.JSONDecodeError as err:
        raise JsonLimitError(f"{what} is not valid JSON: {err}", hint="send one JSON value, UTF-8 encoded") from err
    except RecursionError as err:  # unreachable with a sane max_depth; never let it escape
        raise JsonLimitError(f"{what} nests too deeply for the JSON parser", hint=f"use max_depth <= {max_depth // 2}") from err
    except ValueError as err:  # an integer past Python's digit limit, or a strict hook's refusal
        raise JsonLimitError(f"{what} is not valid JSON: {str(err)[:200]}", hint="send one JSON value, UTF-8 encoded") from err
    if strict and "\\u" in text:
        _check_no_surrogates(value, what)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, or ValueError naming a key given twice (``object_pairs_hook``): with a key
    twice, readers disagree on which one counts (Python's json takes the last, SQL's JSON functions the first)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"key {repeated[:40]!r} appears twice in one object")
    return found


_STRICT: dict[str, Any] = {"parse_constant": _refuse_constant, "object_pairs_hook": refuse_repeated_keys}


def _check_no_surrogates(value: Any, what: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise JsonLimitError(f"{what} holds an unpaired UTF-16 surrogate ({value.encode('utf-8', 'backslashreplace')[:60]!r})",
                                 hint="send text as UTF-8 (\\ud800-\\udfff escapes must come in pairs)") from None  # fmt: skip
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_no_surrogates(key, what)
            _check_no_surrogates(item, what)
    elif isinstance(value, list):
        for item in value:
            _check_no_surrogates(item, what)


def _wire_dtype(name: object, *, tensor: str) -> np.dtype:
    if not isinstance(name, str) or name not in WIRE_DTYPES:
        raise InputSignatureError(
            f"tensor '{tensor}': dtype {name!r} cannot be sent over the API",
            hint=f"use one of: {', '.join(sorted(WIRE_DTYPES))}",
        )
    return np.dtype(name).newbyteorder("<")


def _pad(size: int) -> int:
    return -size % ALIGNMENT


# -- binary -----------------------------------------------------------------------------------------------


def encode_binary(tensors: Mapping[str, np.ndarray]) -> bytes:
    """Encode named arrays in the binary wire format."""
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        array = np.asarray(array)
        dtype = _wire_dtype(array.dtype.name, tensor=name)
        data = np.ascontiguousarray(array, dtype=dtype).tobytes()
        entries.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape), "offset": offset, "nbytes": len(data)})
        chunks.append(data + b"\0" * _pad(len(data)))
        offset += len(data) + _pad(len(data))
    header = json.dumps({"tensors": entries}, separators=(",", ":")).encode("utf-8")
    header += b" " * _pad(_PREFIX.size + len(header))
    return _PREFIX.pack(MAGIC, len(header)) + header + b"".join(chunks)


def decode_binary(body: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    """Decode the binary wire format; malformed bodies raise :class:`InputSignatureError`."""
    hint = f"see the {BINARY_CONTENT_TYPE} layout in edgekit_runtime/agent/wire.py, or send JSON"
    view = memoryview(body)
    if len(view) < _PREFIX.size:
        raise InputSignatureError(f"{BINARY_CONTENT_TYPE} body is {len(view)} bytes, too short for its prefix", hint=hint)
    magic, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise InputSignatureError(f"{BINARY_CONTENT_TYPE} body starts with {bytes(magic)!r}, expected {MAGIC!r}", hint=hint)
    data_start = _PREFIX.size + header_len
    if data_start > len(view):
        raise InputSignatureError(f"{BINARY_CONTENT_TYPE} header length {header_len} runs past the body ({len(view)} bytes)", hint=hint)
    try:
        header = loads_limited(view[_PREFIX.size : data_start], what=f"{BINARY_CONTENT_TYPE} header",
                               max_bytes=header_len, max_depth=MAX_HEADER_DEPTH)  # fmt: skip
        entries = header["tensors"]
        if not isinstance(entries, list):
            raise TypeError("tensors is not a list")
    except JsonLimitError as err:
        raise InputSignatureError(err.message, hint=hint) from err
    except (ValueError, KeyError, TypeError) as err:
        raise InputSignatureError(f"{BINARY_CONTENT_TYPE} header is not valid: {err}", hint=hint) from err
    data = view[data_start:]
    tensors: dict[str, np.ndarray] = {}
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or name in tensors:
            raise InputSignatureError(f"{BINARY_CONTENT_TYPE} header: tensors[{index}] has a missing or repeated name {name!r}", hint=hint)
        dtype = _wire_dtype(entry.get("dtype"), tensor=name)
        shape = entry.get("shape")
        offset, nbytes = entry.get("offset"), entry.get("nbytes")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise InputSignatureError(f"tensor '{name}': shape must be a list of sizes >= 0, got {shape!r}", hint=hint)
        count = math.prod(shape)
        if nbytes != count * dtype.itemsize:
            raise InputSignatureError(
                f"tensor '{name}': nbytes {nbytes!r} does not match {dtype.name}{shape} ({count * dtype.itemsize} bytes)", hint=hint
            )
        if not isinstance(offset, int) or offset < 0 or offset + nbytes > len(data):
            raise InputSignatureError(f"tensor '{name}': offset {offset!r} + nbytes {nbytes} runs past the data section ({len(data)} bytes)", hint=hint)
        array = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        tensors[name] = array if dtype.isnative else array.astype(dtype.newbyteorder("="))
    return tensors


# -- JSON -------------------------------------------------------------------------------------------------

# Which kinds of JSON-parsed arrays may become which declared dtype kind without losing information.
_ACCEPTED_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}


def decode_json_tensors(tensors: object, *, section: str = "inputs") -> dict[str, np.ndarray]:
    """``{"name": {"dtype", "shape", "data"}}`` -> arrays. No silent rounding or overflow."""
    hint = f'send {{"{section}": {{"NAME": {{"dtype": "float32", "shape": [...], "data": [...]}}}}}}'
    if not isinstance(tensors, Mapping) or not tensors:
        raise InputSignatureError(f"'{section}' must be a non-empty object of named tensors, got {type(tensors).__name__}", hint=hint)
    arrays: dict[str, np.ndarray] = {}
    for name, spec in tensors.items():
        if not isinstance(spec, Mapping) or "data" not in spec or "dtype" not in spec:
            raise InputSignatureError(f"{section} '{name}': expected an object with dtype, shape and data", hint=hint)
        dtype = _wire_dtype(spec["dtype"], tensor=name).newbyteorder("=")
        try:
            raw = np.asarray(spec["data"])
        except ValueError as err:
            raise InputSignatureError(f"{section} '{name}': data is not a rectangular nested list ({err})", hint=hint) from err
        if raw.size and raw.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
            raise InputSignatureError(
                f"{section} '{name}': data holds {raw.dtype.name} values, which do not fit dtype {dtype.name} without rounding",
                hint=f"send values of dtype {dtype.name}, or change the declared dtype",
            )
        array = raw.astype(dtype)
        if raw.size and dtype.kind in "iu" and not np.array_equal(array, raw):
            raise InputSignatureError(f"{section} '{name}': values overflow {dtype.name}", hint="check the data range")
        shape = spec.get("shape")
        if shape is not None and list(array.shape) != list(shape):
            if array.size == 0 and isinstance(shape, list) and math.prod(shape) == 0:
                array = array.reshape(shape)
            else:
                raise InputSignatureError(
                    f"{section} '{name}': data has shape {list(array.shape)} but shape says {shape}",
                    hint="make the nesting of data match shape",
                )
        arrays[str(name)] = array
    return arrays


def encode_json_tensors(tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Arrays -> ``{"name": {"dtype", "shape", "data"}}`` (floats round-trip exactly)."""
    return {
        name: {"dtype": np.asarray(array).dtype.name, "shape": list(np.shape(array)), "data": np.asarray(array).tolist()}
        for name, array in tensors.items()
    }
