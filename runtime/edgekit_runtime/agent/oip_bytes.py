"""BYTES tensors of the Open Inference Protocol, shared by the HTTP (:mod:`~edgekit_runtime.agent.oip`) and
gRPC (:mod:`~edgekit_runtime.agent.oip_grpc`) adapters.

A bundle's ``string`` tensor (ONNX ``tensor(string)``) is the protocol's ``BYTES`` datatype. On the way in
each element becomes a ``str`` of a numpy object array (what ONNX Runtime takes), decoded as UTF-8 (ONNX
strings are text: other bytes are a 400 naming the element). On the wire an element is:

* JSON (HTTP): a string of ``data`` (flat in row-major order, or nested);
* binary (HTTP's binary tensor data extension, gRPC's ``raw_input_contents`` / ``raw_output_contents``):
  a 4-byte little-endian length, then that many bytes, element after element;
* gRPC typed contents: one ``bytes_contents`` entry per element.

Outputs go back the same ways, each ``str`` encoded as UTF-8.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import numpy as np

from edgekit_runtime.agent.oip_types import OipError

BYTES = "BYTES"
_LENGTH = struct.Struct("<I")


def _text(item: bytes, where: str, index: int) -> str:
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError as err:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: element {index} is not UTF-8 text ({err}); the model's "
                       "string inputs take text") from err  # fmt: skip


def _shaped(items: list[str], shape: Sequence[int], where: str) -> np.ndarray:
    if len(items) != math.prod(shape):
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape {list(shape)} has {math.prod(shape)} elements but "
                       f"{len(items)} strings were sent")  # fmt: skip
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(list(shape))


def from_blob(blob: bytes | memoryview, shape: Sequence[int], where: str) -> np.ndarray:
    """A BYTES tensor of ``shape`` from its binary form (length-prefixed elements filling ``blob`` exactly)."""
    view, offset, expected = memoryview(blob), 0, math.prod(shape)
    if 4 * expected > len(view):  # every element has its 4-byte length
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape {list(shape)} has {expected} elements, which take at least "
                       f"{4 * expected} bytes (a 4-byte length each), but the binary BYTES data is {len(view)} bytes")  # fmt: skip
    items: list[str] = []
    while offset < len(view):
        if len(items) == expected:  # said before decoding the rest: a body of millions of tiny elements costs nothing
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape {list(shape)} has {expected} elements but the binary "
                           f"BYTES data holds more ({len(view) - offset} bytes follow element {expected - 1})")  # fmt: skip
        if offset + 4 > len(view):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: the binary BYTES data ends inside the 4-byte length of "
                           f"element {len(items)}; each element is a little-endian uint32 length, then its bytes")  # fmt: skip
        (size,) = _LENGTH.unpack_from(view, offset)
        if offset + 4 + size > len(view):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: element {len(items)} says {size} bytes but only "
                           f"{len(view) - offset - 4} follow; check the lengths and binary_data_size")  # fmt: skip
        items.append(_text(bytes(view[offset + 4 : offset + 4 + size]), where, len(items)))
        offset += 4 + size
    return _shaped(items, shape, where)


def from_items(values: Sequence[bytes], shape: Sequence[int], where: str) -> np.ndarray:
    """A BYTES tensor of ``shape`` from one ``bytes`` per element (gRPC ``bytes_contents``)."""
    return _shaped([_text(item, where, index) for index, item in enumerate(values)], shape, where)


def from_json(data: object, shape: Sequence[int], where: str) -> np.ndarray:
    """A BYTES tensor of ``shape`` from JSON ``data``: strings, flat or nested."""
    items: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            items.append(value)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        else:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: a BYTES tensor's data holds strings, got {value!r}; send "
                           "[\"text\", ...] (or the binary tensor data extension for other bytes)")  # fmt: skip

    walk(data)
    return _shaped(items, shape, where)


def _encoded(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")


def to_blob(array: np.ndarray) -> bytes:
    """A BYTES tensor's binary form: each element's 4-byte little-endian length, then its UTF-8 bytes."""
    return b"".join(_LENGTH.pack(len(data)) + data for data in map(_encoded, array.reshape(-1)))


def to_items(array: np.ndarray) -> list[bytes]:
    return [_encoded(item) for item in array.reshape(-1)]


def to_json(array: np.ndarray) -> list[str]:
    """A BYTES tensor's JSON ``data``: flat, one string per element (bytes decoded as UTF-8)."""
    return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]


def is_bytes(array: np.ndarray) -> bool:
    return array.dtype.kind in "OUS"
