"""Control flow for the graph cost: the nodes an ``If`` runs are the nodes of the branch it takes.

:func:`inline_taken_branches` replaces every ``If`` node with the nodes of the branch that executes at the
benchmark's inputs (read by running the graph up to the condition on ONNX Runtime with those inputs, or zeros of
their shapes), or, where that cannot be read, the branch with more nodes (said in the notes). Nested ``If`` nodes
are resolved one level a pass. Each ``If`` that ran is returned as an :class:`IfCall`: the runtime pays a
subgraph invocation for it, and each node the branch brought in pays what running a node inside a subgraph costs
beyond a top-level node (both timed on a measured host by :func:`edgekit.estimate.host_kernels.subgraph_costs_us`);
:attr:`IfCall.inlined` names those nodes.

``Loop`` and ``Scan`` bodies are not inlined (their values change every iteration): :func:`loop_bodies` counts a
body's nodes (nested subgraphs included) and the iterations (a ``Loop``'s constant trip count, else one, said in the
notes; a count of :data:`WHILE_TRIP_COUNT` or more with a condition input is a while loop's "no limit": one, said),
and the cost model charges each body node's dispatch per iteration and a subgraph invocation per iteration.
:mod:`edgekit.estimate.loop_work` adds the body's work (ops and bytes) for each iteration counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_DEPTH = 8
#: a constant Loop trip count this large beside a condition input is a while loop's "no limit" (torch.onnx writes
#: INT64_MAX), not a count: its iterations are unknown
WHILE_TRIP_COUNT = 2**31


@dataclass(frozen=True)
class IfCall:
    """An ``If`` node that ran: its name, the branch taken and how that branch was chosen."""

    name: str
    branch: str  # "then_branch" or "else_branch"
    chosen_by: str  # "condition at the benchmark inputs" or "the larger branch (condition unknown)"
    inlined: tuple[str, ...] = ()  # the first output of each node the branch brought into the graph


@dataclass(frozen=True)
class LoopBody:
    """A ``Loop`` or ``Scan`` node: its body's node count (nested subgraphs included) and the iterations counted."""

    name: str
    body_nodes: int
    iterations: int
    iterations_known: bool


def _branches(node: Any) -> dict[str, Any]:
    return {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}


def _size(graph: Any) -> int:
    """Nodes in ``graph`` counting every nested subgraph's (the work a branch holds)."""
    total = 0
    for node in graph.node:
        total += 1
        for attribute in node.attribute:
            if attribute.HasField("g"):
                total += _size(attribute.g)
    return total


def _rename(graph: Any, mapping: Mapping[str, str]) -> None:
    """Rename value names in ``graph`` and every nested subgraph (inputs and outputs of nodes)."""
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for attribute in node.attribute:
            if attribute.HasField("g"):
                _rename(attribute.g, mapping)


def _inline(model: Any, node: Any, branch: Any) -> list[Any]:
    """The nodes that replace ``node`` (an If) by ``branch``: its nodes, its outputs renamed to the If's outputs."""
    import onnx
    from onnx import helper

    taken = onnx.GraphProto()
    taken.CopyFrom(branch)
    existing = {i.name for i in model.graph.initializer}
    mapping: dict[str, str] = {}
    for init in taken.initializer:  # a branch's own constants join the graph's (renamed if the name is taken)
        if init.name in existing:
            mapping[init.name] = f"{node.name or node.output[0]}/{init.name}"
    produced = {out for n in taken.node for out in n.output}
    extra: list[Any] = []
    for value, target in zip(taken.output, node.output):
        if value.name in produced and value.name not in mapping:
            mapping[value.name] = target
        else:  # the branch passes an outer value or a constant through: an Identity (a copy the runtime makes too)
            extra.append(helper.make_node("Identity", [mapping.get(value.name, value.name)], [target], name=f"{node.name}/{value.name}/out"))
    _rename(taken, mapping)
    for init in taken.initializer:
        copy = model.graph.initializer.add()
        copy.CopyFrom(init)
        copy.name = mapping.get(init.name, init.name)
    return [*taken.node, *extra]


def _condition_values(model: Any, names: list[str], feeds: Mapping[str, np.ndarray]) -> dict[str, bool]:
    """The value of each condition tensor, running ``model`` once on ONNX Runtime (CPU) with ``feeds``."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in names:
        if name not in known:
            probe.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # a graph that cannot run at these inputs is reported by the caller, not on stderr
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    values = session.run(names, {k: v for k, v in feeds.items() if k in wanted})
    return {name: bool(np.asarray(value).reshape(-1)[0]) for name, value in zip(names, values)}


def inline_taken_branches(model: Any, feeds: Callable[[], Mapping[str, np.ndarray]] | None,
                          prepare: Callable[[Any], Any] = lambda m: m) -> tuple[list[IfCall], list[str]]:  # fmt: skip
    """Replace every If in ``model`` (in place) by the branch it takes; ``feeds`` gives the benchmark's inputs
    (None: no run, the larger branch); ``prepare`` makes a runnable copy (external weights loaded).
    Returns the Ifs that ran and notes on what was assumed."""
    calls: list[IfCall] = []
    notes: list[str] = []
    for _ in range(MAX_DEPTH):
        ifs = [n for n in model.graph.node if n.op_type == "If" and len(_branches(n)) == 2]
        if not ifs:
            break
        values: dict[str, bool] = {}
        if feeds is not None:
            try:
                values = _condition_values(prepare(model), sorted({n.input[0] for n in ifs}), feeds())
            except Exception as exc:  # a graph ORT cannot run here: fall back to the larger branch, said below
                notes.append(f"If conditions could not be read on ONNX Runtime ({type(exc).__name__}): the larger branch is counted")
                feeds = None
        replaced: list[Any] = []
        for node in model.graph.node:
            if node.op_type != "If" or node not in ifs:
                replaced.append(node)
                continue
            branches = _branches(node)
            if node.input[0] in values:
                name, how = ("then_branch" if values[node.input[0]] else "else_branch"), "condition at the benchmark inputs"
            else:
                name, how = max(branches, key=lambda b: _size(branches[b])), "the larger branch (condition unknown)"
            inlined = _inline(model, node, branches[name])
            calls.append(IfCall(node.name or node.output[0], name, how, tuple(n.output[0] for n in inlined if n.output)))
            replaced.extend(inlined)
        del model.graph.node[:]
        model.graph.node.extend(replaced)
    if calls:
        unknown = sum(1 for c in calls if c.chosen_by.startswith("the larger"))
        notes.append(f"{len(calls)} If node(s): the nodes of the branch taken are counted"
                     + (f" ({unknown} without a readable condition: the larger branch)" if unknown else " (condition read at the benchmark inputs)")
                     + ", plus a subgraph invocation each")  # fmt: skip
    return calls, notes


def _constant_int(model: Any, name: str) -> int | None:
    """The value of ``name`` when it is a scalar initializer or Constant output of ``model``'s graph, else None."""
    from onnx import numpy_helper

    for init in model.graph.initializer:
        if init.name == name:
            return int(np.asarray(numpy_helper.to_array(init)).reshape(-1)[0])
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for attribute in node.attribute:
                if attribute.name == "value":
                    return int(np.asarray(numpy_helper.to_array(attribute.t)).reshape(-1)[0])
    return None


def _scan_length(node: Any, shapes: Mapping[str, Any]) -> int | None:
    """A Scan's iterations: its first scan input's length along its scan axis, where ``shapes`` know it."""
    scans = next((int(a.i) for a in node.attribute if a.name == "num_scan_inputs"), 0)
    if scans <= 0 or scans > len(node.input):
        return None
    first = node.input[len(node.input) - scans]
    shape = tuple(shapes[first][0]) if first in shapes and shapes[first][0] is not None else ()
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [])
    axis = axes[0] if axes else 0
    if not shape or not -len(shape) <= axis < len(shape):
        return None
    length = shape[axis]
    return int(length) if isinstance(length, (int, np.integer)) and length >= 0 else None


def loop_bodies(model: Any, shapes: Mapping[str, Any] | None = None) -> tuple[dict[str, LoopBody], list[str]]:
    """Each ``Loop`` / ``Scan`` node of ``model``'s graph (by name, else first output) -> its :class:`LoopBody`: a Loop's
    trip count when its ``M`` input is a constant (below :data:`WHILE_TRIP_COUNT` when a condition input is present), a
    Scan's the length of its scan inputs where ``shapes`` (name -> (shape, dtype)) know it, else one iteration (said
    in the notes)."""
    bodies: dict[str, LoopBody] = {}
    notes: list[str] = []
    for node in model.graph.node:
        if node.op_type not in ("Loop", "Scan"):
            continue
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if body is None:
            continue
        if node.op_type == "Scan":
            trips = _scan_length(node, shapes or {})
        else:
            trips = _constant_int(model, node.input[0]) if node.input and node.input[0] else None
        key = node.name or node.output[0]
        if trips is not None and trips >= WHILE_TRIP_COUNT and len(node.input) > 1 and node.input[1]:
            trips = None  # a while loop (torch.onnx exports M = INT64_MAX): its condition stops it, at a count unknown here
            notes.append(f"Loop '{key}' runs while its condition holds (trip count {WHILE_TRIP_COUNT:,} or more): iterations "
                         "unknown, one counted")  # fmt: skip
        bodies[key] = LoopBody(key, _size(body), max(1, trips) if trips is not None else 1, trips is not None)
    unknown = [b.name for b in bodies.values() if not b.iterations_known]
    if bodies:
        notes.insert(0, f"{len(bodies)} Loop/Scan node(s): each body node's dispatch and one subgraph call are counted per "
                        "iteration" + (f" ({len(unknown)} without a known trip count: one iteration counted)" if unknown else ""))  # fmt: skip
    return bodies, notes
