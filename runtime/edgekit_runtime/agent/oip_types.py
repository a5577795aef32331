"""What the Open Inference Protocol's HTTP (:mod:`~edgekit_runtime.agent.oip`) and gRPC
(:mod:`~edgekit_runtime.agent.oip_grpc`) adapters share below both: the error, the datatypes and the
lookup of a model (and version) in the agent's repository.

A model's version is a small integer per model slot, ``"1"`` (the one version a slot serves); the
bundle's own version (``bundle_version``, else its manifest's sha256 prefix) is in the model metadata's
``parameters`` and the repository index's ``reason``. A version path or field with the bundle's own
version resolves too, as earlier agents named it.
"""

from __future__ import annotations

import math

from http import HTTPStatus
from typing import Any

import numpy as np

#: the version every served model answers to (Triton's numbered versions; one is served per model slot)
SERVED_VERSION = "1"

#: OIP datatype <-> numpy dtype (little-endian on the wire). BYTES (a bundle's ``string`` tensors, numpy
#: object arrays of str) travels length-prefixed (:mod:`~edgekit_runtime.agent.oip_bytes`); BF16 is not served.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("bool"), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}  # fmt: skip
BY_NUMPY = {dtype.newbyteorder("=").name: name for name, dtype in DATATYPES.items()}
#: native-order numpy dtypes -> their datatype (the reply path's lookup)
_DATATYPE_OF: dict[Any, str] = {dtype.newbyteorder("="): name for name, dtype in DATATYPES.items()}


class OipError(Exception):
    """An answer ``{"error": message}`` with ``status`` (a gRPC status code of the same meaning over gRPC)."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def datatype_of(dtype: str | np.dtype) -> str:
    """The protocol's datatype of a signature dtype name or an array's dtype: a ``string`` tensor (an object or
    unicode array) is ``BYTES``."""
    known = _DATATYPE_OF.get(dtype)  # an array's dtype, mostly: skips numpy's dtype-name property
    if known is not None:
        return known
    if dtype == "string" or (isinstance(dtype, np.dtype) and dtype.kind in "OUS"):
        return "BYTES"
    name = np.dtype(dtype).name
    try:
        return BY_NUMPY[name]
    except KeyError:
        raise OipError(HTTPStatus.INTERNAL_SERVER_ERROR, f"dtype {name} has no Open Inference Protocol datatype") from None


def shape_of(tensor_shape: tuple[Any, ...]) -> list[int]:
    """A signature's shape in the protocol: a named (variable) dim is ``-1``."""
    return [dim if isinstance(dim, int) else -1 for dim in tensor_shape]


#: no tensor's dims (the zero ones left out) may multiply past this: numpy cannot shape such an array even empty
#: (its non-zero dims times the item size must stay below 2**63; 8 bytes is the largest item, a BYTES element's too)
MAX_DIMS_PRODUCT = 2**63 // 8 - 1


def refuse_impossible_shape(shape: list[int], where: str) -> None:
    """400 for a shape whose non-zero dims multiply past :data:`MAX_DIMS_PRODUCT` (``[2**31, 2**31, 0]``: no
    elements, and still no array numpy can make); the caller checked each dim is an integer >= 0."""
    if math.prod(dim for dim in shape if dim) > MAX_DIMS_PRODUCT:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape {shape} is larger than any tensor can be (its non-zero "
                       f"dims multiply past 2**60 - 1)")  # fmt: skip


def bundle_version(slot: Any) -> str:
    """The served bundle's own version (``""`` with no bundle served)."""
    return str(slot.version or "")


def protocol_version(slot: Any) -> str:
    """The version the protocol names the slot's model by: ``"1"`` while a bundle is loaded, else ``""``."""
    return SERVED_VERSION if slot.ready else ""


def find_slot(models: Any, name: str, version: str) -> Any:
    """Model ``name`` of ``models`` (a repository), checked to serve ``version`` (``""``: whatever it serves):
    404 for an unknown model or a version it does not serve."""
    slot = models.find(name)
    if slot is None:
        known = ", ".join(str(s.name) for s in models.slots() if s.name is not None) or "none"
        # worded as Triton's ("Request for unknown model: ..."), which its example clients check for
        raise OipError(HTTPStatus.NOT_FOUND, f"Request for unknown model '{name}'; this agent serves: {known}")
    if version and version not in (SERVED_VERSION, bundle_version(slot)):
        served = f"version {SERVED_VERSION} (bundle version {slot.version})" if slot.version else "no version (no bundle loaded)"
        raise OipError(HTTPStatus.NOT_FOUND, f"model '{name}' has no version '{version}'; it serves {served}; "
                       f"ask for version {SERVED_VERSION}, or leave the version out for the served one")  # fmt: skip
    return slot
