"""One copy of each constant tensor in a graph and its subgraphs.

ONNX Runtime's offline constant folding runs inside each branch of an ``If`` (and each ``Loop``/``Scan``
body) separately: a weight that both branches read through the same ``Unsqueeze`` comes out as two
folded initializers, one per branch. On Silero VAD (opset 15, 1.29 MB) the LSTM weights were stored
twice and the FP32 bundle grew to 1.81 MB. :func:`share_constants` stores identical tensors once, in
the main graph, where every subgraph can read it (outer-scope values are visible in subgraphs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Smaller tensors (shapes, axes, scalars) are cheap; renaming them would only churn the graph.
MIN_SHARED_BYTES = 1024


@dataclass(frozen=True)
class _Member:
    graph: Any  # the GraphProto holding the initializer
    tensor: Any  # the TensorProto


def _subgraphs(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield attribute.g
            yield from attribute.graphs


def _graphs(graph: Any) -> Iterator[Any]:
    yield graph
    for sub in _subgraphs(graph):
        yield from _graphs(sub)


def _names(graph: Any) -> set[str]:
    names: set[str] = set()
    for g in _graphs(graph):
        names.update(t.name for t in g.initializer)
        names.update(v.name for v in (*g.input, *g.output, *g.value_info))
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
    return names


def _returned(graph: Any) -> set[str]:
    """Names that ``graph`` or a subgraph nested in it returns as a graph output."""
    return {value.name for g in _graphs(graph) for value in g.output}


def _rename(graph: Any, old: str, new: str) -> None:
    """Rename uses of ``old`` by nodes in ``graph`` and the subgraphs nested in it (its scope). Graph outputs
    are never renamed: a subgraph that returned an outer-scope value directly would be invalid (ONNX Runtime:
    "Subgraph output ... is an outer scope value being returned directly"), so such tensors are not shared."""
    for g in _graphs(graph):
        for node in g.node:
            for index, name in enumerate(node.input):
                if name == old:
                    node.input[index] = new
        for value in list(g.value_info):
            if value.name == old:
                g.value_info.remove(value)


def _content_key(tensor: Any) -> tuple[Any, ...] | None:
    from onnx import TensorProto, numpy_helper

    if tensor.data_location == TensorProto.EXTERNAL:
        return None
    data = numpy_helper.to_array(tensor)
    if data.nbytes < MIN_SHARED_BYTES:
        return None
    return tensor.data_type, tuple(tensor.dims), hashlib.sha256(data.tobytes()).hexdigest()


def share_constants(model: Any) -> dict[str, int]:
    """Store each group of identical initializers (equal dtype, dims and bytes, at least
    :data:`MIN_SHARED_BYTES`) once in the main graph, in place; returns how many copies were removed and
    the bytes they held. Initializers that are also graph inputs (overridable at run time) or outputs of
    their graph or a subgraph in its scope (the main graph's are names callers use; an ``If`` branch whose
    output is a folded constant must keep returning a value of its own) are left alone."""
    main = model.graph
    overridable = {value.name for value in main.input}
    groups: dict[tuple[Any, ...], list[_Member]] = {}
    for graph in _graphs(main):
        kept = _returned(graph) | (overridable if graph is main else set())
        for tensor in graph.initializer:
            key = None if tensor.name in kept else _content_key(tensor)
            if key is not None:
                groups.setdefault(key, []).append(_Member(graph, tensor))
    taken = _names(main)
    removed = saved = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        keep = next((m for m in members if m.graph is main), members[0])
        shared_name = keep.tensor.name
        if keep.graph is not main:  # hoisted under a name no graph of the model uses (siblings may reuse names)
            shared_name = f"{keep.tensor.name}.shared"
            while shared_name in taken:
                shared_name += "_"
            taken.add(shared_name)
            hoisted = main.initializer.add()
            hoisted.CopyFrom(keep.tensor)
            hoisted.name = shared_name
            _rename(keep.graph, keep.tensor.name, shared_name)
            keep.graph.initializer.remove(keep.tensor)
        for member in members:
            if member is keep:
                continue
            saved += member.tensor.ByteSize()
            removed += 1
            _rename(member.graph, member.tensor.name, shared_name)
            member.graph.initializer.remove(member.tensor)
    return {"initializers_shared": removed, "bytes_saved": saved}
