"""The Open Inference Protocol's ``classification`` extension, as Triton serves it: an output asked for with
the parameter ``classification: K`` comes back as a BYTES tensor of the top ``K`` classes, each
``"score:index"``, highest first (the score printed as C's ``%f``; a bundle carries no label file, so
there is no ``:label`` part). For a model that batches along its first dim each row is classified on
its own (shape ``[batch, K]``), else the whole output (shape ``[K]``); ``K`` past the class count gives
every class.
"""

from __future__ import annotations

import struct
from http import HTTPStatus

import numpy as np

from edgekit_runtime.agent.oip_types import OipError


def classification_count(value: object, where: str) -> int | None:
    """The ``classification`` parameter's ``K`` (``None`` when absent); 400 unless a positive integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}.parameters.classification must be an integer >= 1 "
                       f"(how many top classes to return), got {value!r}")  # fmt: skip
    return value


def classify(array: np.ndarray, count: int, *, batched: bool, name: str) -> np.ndarray:
    """The top ``count`` classes of ``array`` as ``b"score:index"`` (an object array of bytes)."""
    if array.dtype.kind not in "iuf":
        raise OipError(HTTPStatus.BAD_REQUEST, f"output '{name}' is {array.dtype.name}: classification needs numbers")
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim >= 1 else array.reshape(1, -1)
    top = min(count, rows.shape[1])
    keys = rows if rows.dtype.kind == "f" else rows.astype(np.float64)  # negating a uint8 255 wraps to 1: order as floats
    order = np.argsort(-keys, axis=1, kind="stable")[:, :top]
    labels = [[f"{float(row[index]):f}:{int(index)}".encode() for index in indices] for row, indices in zip(rows, order)]
    result = np.empty((rows.shape[0], top), dtype=object)
    result[:] = labels
    return result if batched else result.reshape(top)


def bytes_blob(values: np.ndarray) -> bytes:
    """A BYTES tensor's raw form: each element as a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in values.reshape(-1))
