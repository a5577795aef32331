"""What an ONNX model is made of: weight bytes per consuming op type, and node counts per op type.

Weight sizes are computed from each initializer's element type and shape (or its stored bytes),
so a model with external data is measured without reading gigabytes of weights into memory; the
external data files are still checked to exist and to be long enough.
"""

from __future__ import annotations

import logging
import math
from collections import ChainMap, Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.errors import BundleError

if TYPE_CHECKING:
    import onnx

logger = logging.getLogger(__name__)

#: The op type under which initializers that no node reads are reported.
UNUSED = "unused"

#: Bits per element of each ONNX tensor element type (STRING is measured from its contents).
_BITS_BY_TYPE_NAME = {
    "FLOAT": 32, "UINT8": 8, "INT8": 8, "UINT16": 16, "INT16": 16, "INT32": 32, "INT64": 64,
    "BOOL": 8, "FLOAT16": 16, "DOUBLE": 64, "UINT32": 32, "UINT64": 64, "COMPLEX64": 64,
    "COMPLEX128": 128, "BFLOAT16": 16, "FLOAT8E4M3FN": 8, "FLOAT8E4M3FNUZ": 8, "FLOAT8E5M2": 8,
    "FLOAT8E5M2FNUZ": 8, "FLOAT8E8M0": 8, "UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4, "UINT2": 2,
    "INT2": 2, "FLOAT6E2M3": 6, "FLOAT6E3M2": 6,
}


def model_size_by_op_type(model_path: Path) -> dict[str, int]:
    """Bytes of initializer data grouped by the op type of the node that first reads each one.

    An initializer shared by several nodes is counted once, under the first consumer in graph order
    (nodes inside If/Loop/Scan bodies count as consumers of the outer initializers they read).
    Initializers read by no node are reported under ``"unused"``. Ops outside the default ONNX
    domain are named ``domain.OpType``. The result is sorted by size, largest first.
    """
    model_path = Path(model_path)
    model = _load(model_path)
    sizes: Counter[str] = Counter()
    for consumer, tensors in _initializers_with_consumer(model.graph):
        sizes[consumer or UNUSED] += sum(_tensor_nbytes(tensor, model_path.parent) for tensor in tensors)
    return dict(sorted(sizes.items(), key=lambda item: (-item[1], item[0])))


def op_type_counts(model_path: Path) -> dict[str, int]:
    """Number of nodes per op type: the main graph, every subgraph (If/Loop/Scan bodies) and the body
    of every model-local function (each function counted once, however often it is called).
    Sorted by count, most frequent first."""
    model = _load(Path(model_path))
    counts: Counter[str] = Counter()
    for node in _all_nodes(model.graph.node):
        counts[_op_key(node)] += 1
    for function in model.functions:
        for node in _all_nodes(function.node):
            counts[_op_key(node)] += 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


# ---------------------------------------------------------------- loading


def _load(model_path: Path) -> "onnx.ModelProto":
    import onnx
    from google.protobuf.message import DecodeError

    if not model_path.is_file():
        raise BundleError(
            f"{model_path}: ONNX model not found",
            hint="pass the path of the bundle's model.onnx (manifest key model.path)",
        )
    try:
        return onnx.load(str(model_path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:
        raise BundleError(
            f"{model_path}: not a readable ONNX model ({type(exc).__name__}: {exc})",
            hint="re-export the model; the file may be truncated or not an ONNX protobuf",
        ) from None


# ---------------------------------------------------------------- graph walking


def _op_key(node: "onnx.NodeProto") -> str:
    if node.domain in ("", "ai.onnx"):
        return node.op_type
    return f"{node.domain}.{node.op_type}"


def _subgraphs(node: "onnx.NodeProto") -> Iterator["onnx.GraphProto"]:
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _all_nodes(nodes: "Iterable[onnx.NodeProto]") -> Iterator["onnx.NodeProto"]:
    for node in nodes:
        yield node
        for graph in _subgraphs(node):
            yield from _all_nodes(graph.node)


def _initializers_with_consumer(
    graph: "onnx.GraphProto",
    outer: "ChainMap[str, int] | None" = None,
    records: list[tuple[str | None, tuple["onnx.TensorProto", ...]]] | None = None,
) -> list[tuple[str | None, tuple["onnx.TensorProto", ...]]]:
    """Every initializer of ``graph`` and its subgraphs with the op type of its first consumer.

    Each record is ``(consumer op type or None, tensors)``; a sparse initializer is two tensors
    (values and indices). Names resolve innermost first, so a subgraph initializer hides an outer
    one of the same name.
    """
    records = [] if records is None else records
    local: dict[str, int] = {}
    for tensor in graph.initializer:
        local[tensor.name] = len(records)
        records.append((None, (tensor,)))
    for sparse in graph.sparse_initializer:
        local[sparse.values.name] = len(records)
        records.append((None, (sparse.values, sparse.indices)))
    scope = ChainMap(local) if outer is None else outer.new_child(local)
    for node in graph.node:
        for name in node.input:
            index = scope.get(name) if name else None
            if index is not None and records[index][0] is None:
                records[index] = (_op_key(node), records[index][1])
        for subgraph in _subgraphs(node):
            _initializers_with_consumer(subgraph, scope, records)
    return records


# ---------------------------------------------------------------- tensor sizes


def _tensor_nbytes(tensor: "onnx.TensorProto", base_dir: Path) -> int:
    """The bytes of a tensor's data in dense form (4-bit types packed two to a byte)."""
    import onnx

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return _external_nbytes(tensor, base_dir)
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(item) for item in tensor.string_data)
    return _dense_nbytes(tensor)


def _dense_nbytes(tensor: "onnx.TensorProto") -> int:
    import onnx

    type_name = onnx.TensorProto.DataType.Name(tensor.data_type)
    bits = _BITS_BY_TYPE_NAME.get(type_name)
    if bits is None:
        raise BundleError(
            f"initializer '{tensor.name}' has element type {type_name}, whose size edgekit does not know",
            hint="use a standard ONNX element type for weights",
        )
    return math.ceil(math.prod(tensor.dims) * bits / 8)


def _external_nbytes(tensor: "onnx.TensorProto", base_dir: Path) -> int:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location")
    if not location:
        raise BundleError(
            f"initializer '{tensor.name}' is marked as external data but names no file (no 'location')",
            hint="re-save the model with onnx.save(..., save_as_external_data=True)",
        )
    data_path = base_dir / location
    if not data_path.is_file():
        raise BundleError(
            f"initializer '{tensor.name}': external data file {data_path} not found",
            hint="keep the .onnx.data file next to the .onnx file it belongs to",
        )
    offset = int(info.get("offset", 0))
    nbytes = int(info["length"]) if "length" in info else _dense_nbytes(tensor)
    file_size = data_path.stat().st_size
    if offset + nbytes > file_size:
        raise BundleError(
            f"initializer '{tensor.name}': external data {data_path} has {file_size} bytes, "
            f"the tensor needs bytes {offset}..{offset + nbytes}",
            hint="the data file is truncated or belongs to another model; re-export the bundle",
        )
    return nbytes
