"""The work of a ``Loop`` / ``Scan`` body: its nodes costed as a graph of their own, once per iteration counted.

:func:`body_model` makes the body a standalone model (the values it reads from the outer graph become its
initializers or inputs, shaped as the outer graph has them; a Loop's carried values and a Scan's states and scan
slices take the shapes the node feeds them). The caller costs it with the same counting rules (passed in as
``cost_body``, so this module does not import the graph cost); :func:`body_work` sums what it found and
:meth:`BodyWork.added_to` puts that work on the Loop / Scan node, times the iterations counted
(:func:`edgekit.estimate.subgraphs.loop_bodies`), under the class, precision and kernel kind of the body's heaviest
class. A body that cannot be costed counts no work, said in the notes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Shapes = Mapping[str, tuple[tuple[int, ...], int]]


@dataclass(frozen=True)
class BodyWork:
    """One iteration of a body: its ops and bytes, and the class / precision / kind of its heaviest node class."""

    ops: float
    bytes_read: float
    bytes_written: float
    op_class: str
    precision: str
    kind: str

    def added_to(self, node: Any, iterations: int) -> Any:
        """``node`` (the Loop / Scan's NodeCost) carrying ``iterations`` x this work (the node itself computes nothing)."""
        moved = (self.bytes_read + self.bytes_written) * iterations
        return dataclasses.replace(node, ops=self.ops * iterations, bytes_read=node.bytes_read + self.bytes_read * iterations,
                                   bytes_written=node.bytes_written + self.bytes_written * iterations, op_class=self.op_class,
                                   precision=self.precision, kind=self.kind, body_bytes=moved)  # fmt: skip


def _consumed(graph: Any) -> set[str]:
    """Names read in ``graph`` (nested subgraphs included) that it does not itself define."""
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    defined |= {out for node in graph.node for out in node.output}
    read: set[str] = set()
    for node in graph.node:
        read.update(name for name in node.input if name)
        for attribute in node.attribute:
            if attribute.HasField("g"):
                read |= _consumed(attribute.g)
    return read - defined


def _fed_shapes(node: Any, body: Any, shapes: Shapes) -> dict[str, tuple[int, ...]]:
    """Body input -> the shape the Loop / Scan feeds it (where the outer graph knows it)."""
    fed: dict[str, tuple[int, ...]] = {}
    if node.op_type == "Loop":
        names = [v.name for v in body.input]
        fed.update({name: () for name in names[:2]})  # the iteration number and the condition: scalars
        pairs = zip(names[2:], node.input[2:])
        fed.update({name: shapes[outer][0] for name, outer in pairs if outer in shapes})
        return fed
    scans = next((int(a.i) for a in node.attribute if a.name == "num_scan_inputs"), 0)
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [])
    states = len(node.input) - scans
    for index, (name, outer) in enumerate(zip((v.name for v in body.input), node.input)):
        if outer not in shapes:
            continue
        shape = shapes[outer][0]
        if index >= states:  # a scan input: one slice along its scan axis
            axis = axes[index - states] if index - states < len(axes) else 0
            shape = shape[:axis % max(len(shape), 1)] + shape[axis % max(len(shape), 1) + 1:]
        fed[name] = shape
    return fed


def body_model(model: Any, node: Any, shapes: Shapes) -> tuple[Any, dict[str, tuple[int, ...]]]:
    """(the body of ``node`` as a model of its own, its input shapes)."""
    import onnx
    from onnx import helper

    body = onnx.GraphProto()
    body.CopyFrom(next(a.g for a in node.attribute if a.name == "body"))
    initializers = {i.name: i for i in model.graph.initializer}
    constants = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output}
    carried: list[Any] = []
    outer = _consumed(body)
    for name in sorted(outer):
        if name in initializers:
            body.initializer.append(initializers[name])
        elif name in constants:
            carried.append(constants[name])
        else:  # an outer activation: an input of the body's model, shaped as the outer graph has it
            shape, dtype = shapes.get(name, (None, onnx.TensorProto.FLOAT))
            body.input.append(helper.make_tensor_value_info(name, dtype, list(shape) if shape is not None else None))
    if carried:
        nodes = [*carried, *body.node]
        del body.node[:]
        body.node.extend(nodes)
    standalone = helper.make_model(body, opset_imports=list(model.opset_import))
    standalone.ir_version = model.ir_version
    fed = _fed_shapes(node, body, shapes)
    fed.update({name: tuple(shape) for name, (shape, _) in shapes.items() if name in outer and name not in fed})
    return standalone, fed


def summed(cost: Any) -> BodyWork:
    """The work of a body's costed nodes, under the class (and its heaviest node's precision and kind) with most ops."""
    by_class: dict[str, list[Any]] = {}
    for node in cost.nodes:
        if not node.fused:
            by_class.setdefault(node.op_class, []).append(node)
    if not by_class:
        return BodyWork(0.0, 0.0, 0.0, "data_movement", "fp32", "data_movement")
    heaviest = max(by_class, key=lambda c: (sum(n.ops for n in by_class[c]), sum(n.bytes for n in by_class[c])))
    top = max(by_class[heaviest], key=lambda n: (n.ops, n.bytes))
    return BodyWork(sum(n.ops for n in cost.nodes), sum(n.bytes_read for n in cost.nodes),
                    sum(n.bytes_written for n in cost.nodes), heaviest, top.precision, top.kind or heaviest)  # fmt: skip


def body_work(model: Any, loops: Mapping[str, Any], shapes: Shapes,
              cost_body: Callable[[Any, dict[str, tuple[int, ...]]], Any]) -> tuple[dict[str, BodyWork], list[str]]:  # fmt: skip
    """Loop / Scan name -> one iteration's :class:`BodyWork` (``loops``: :func:`loop_bodies`' answer), and notes."""
    work: dict[str, BodyWork] = {}
    notes: list[str] = []
    for node in model.graph.node:
        key = node.name or (node.output[0] if node.output else "")
        if node.op_type not in ("Loop", "Scan") or key not in loops:
            continue
        try:
            work[key] = summed(cost_body(*body_model(model, node, shapes)))
        except Exception as exc:  # a body the counter cannot shape or run: its work is unknown, said
            notes.append(f"{node.op_type} '{key}': its body could not be costed ({type(exc).__name__}): its work is unknown "
                         "and not counted (only its dispatches)")  # fmt: skip
            continue
        iterations = loops[key].iterations
        notes.append(f"{node.op_type} '{key}': its body's work ({work[key].ops:,.0f} ops, "
                     f"{work[key].bytes_read + work[key].bytes_written:,.0f} bytes an iteration) is counted x {iterations} "
                     f"iteration(s){'' if loops[key].iterations_known else ' (trip count unknown)'}, "
                     f"as one {work[key].op_class} node")  # fmt: skip
    return work, notes
