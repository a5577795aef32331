"""The reduction length (K) of a matrix product node, read from its first operand and its transpose attributes.

``Gemm`` / ``FusedGemm`` / ``QGemm`` (2-D) and ONNX Runtime's ``FusedMatMul`` (N-D) take ``transA``: A is stored
``[.., K, M]`` and K is its second-to-last dim. ``FusedMatMul``'s ``transBatchA`` first moves A's leading dim next
to the last one (A ``[d0, .., d(r-1)]`` is used as ``[d1, .., d(r-2), d0, d(r-1)]``), so with ``transA`` as well K
is ``d0``. ``transB``, ``transBatchB`` and ``alpha`` change neither K nor the op count (the output shape already
gives batch x M x N). Every other product (MatMul, MatMulInteger, QLinearMatMul, ...) reduces over A's last dim.
"""

from __future__ import annotations

from typing import Any

#: ops whose A operand may be stored transposed (attribute ``transA``)
TRANSPOSABLE_A_OPS = {"Gemm", "FusedGemm", "QGemm", "FusedMatMul"}


def _int_attribute(node: Any, name: str) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return 0


def reduction_dim(node: Any, first: tuple[int, ...]) -> int:
    """K of ``node`` (a matrix product) whose first operand has shape ``first``; 0 when that shape is unknown."""
    if not first:
        return 0
    if node.op_type not in TRANSPOSABLE_A_OPS or len(first) < 2 or not _int_attribute(node, "transA"):
        return int(first[-1])
    if node.op_type == "FusedMatMul" and _int_attribute(node, "transBatchA"):
        return int(first[0])
    return int(first[-2])
