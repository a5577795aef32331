"""Node groups: the units that sensitivity analysis ranks and that ``--precision auto`` keeps in higher
precision. Each quantizable node (MatMul/Gemm/Conv) is one group, named readably from where it sits in
the source model, e.g. ``layer.3/ffn.down`` for the FFN down-projection of transformer layer 3.

Names come from, in order: the ``pkg.torch.onnx.name_scopes`` metadata the dynamo exporter writes, the
``/encoder/layer.3/output/dense/MatMul`` style node names of the TorchScript exporter, the
``….weight`` initializer a node reads, and finally the node name itself.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.quantize.plan import INT8_OP_TYPES

#: Positions of the weight input per op type (the other of inputs 0/1 is the activation).
WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Conv": 1}
#: Module path suffix -> role; the first match wins, so attention-specific patterns come first.
ROLE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(^|\.)(query|q_proj|q|wq|to_q)$", "attn.q"),
    (r"(^|\.)(key|k_proj|k|wk|to_k)$", "attn.k"),
    (r"(^|\.)(value|v_proj|v|wv|to_v)$", "attn.v"),
    (r"(^|\.)(c_attn|qkv|qkv_proj|query_key_value|wqkv|in_proj)$", "attn.qkv"),
    (r"(attention|attn|self_attn)(\.output)?\.(dense|o_proj|out_proj|c_proj|proj|wo|to_out(\.0)?)$", "attn.out"),
    (r"(^|\.)(o_proj|out_proj)$", "attn.out"),
    (r"(^|\.)(gate_proj|w3)$", "ffn.gate"),
    (r"(^|\.)(intermediate\.dense|fc1|up_proj|c_fc|w1|lin1|dense_h_to_4h|mlp\.fc_in)$", "ffn.up"),
    (r"(^|\.)(output\.dense|fc2|down_proj|c_proj|w2|lin2|dense_4h_to_h|mlp\.fc_out)$", "ffn.down"),
)
#: ``<container>.<index>`` module names that mark a repeated transformer block.
_LAYER = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks|blk)\.(\d+)(?=\.|$)")
_ATTENTION_SCOPE = re.compile(r"(^|\.)(attention|attn|self_attn)(\.self)?$")


@dataclass(frozen=True)
class NodeGroup:
    """One or more quantizable nodes that are kept in higher precision together."""

    name: str
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    layer: int | None = None
    role: str | None = None
    #: Elements of the constant weights the nodes read (0 for activation x activation MatMuls): a cost proxy.
    weight_elements: int = 0


def find_node_groups(model: Any, op_types: Sequence[str] = INT8_OP_TYPES, exclude: Iterable[str] = ()) -> list[NodeGroup]:
    """One group per node of ``op_types`` (graph order), leaving out the nodes named in ``exclude``.

    ``model`` is an ``onnx.ModelProto`` or a path (read without external data)."""
    proto = _load(model)
    graph = proto.graph
    skipped = set(exclude)
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}
    groups: list[NodeGroup] = []
    used: dict[str, int] = {}
    for node in graph.node:
        if node.op_type not in op_types or node.name in skipped:
            continue
        path = module_path(node, shapes)
        layer, rest = _split_layer(path)
        role = _role(rest, node, shapes, producers)
        base = (f"layer.{layer}/{role}" if layer is not None else role) if role else (rest or node.name)
        if layer is not None and not role and rest:
            base = f"layer.{layer}/{rest}"
        used[base] = used.get(base, 0) + 1
        name = base if used[base] == 1 else f"{base}#{used[base]}"
        weight = node.input[WEIGHT_INPUT[node.op_type]] if len(node.input) > WEIGHT_INPUT.get(node.op_type, 99) else ""
        elements = _product(shapes[weight]) if weight in shapes else 0
        groups.append(NodeGroup(name, (node.name,), (node.op_type,), layer, role, elements))
    return groups


def group_by_role(groups: Sequence[NodeGroup]) -> list[NodeGroup]:
    """Merge the groups that share a role across layers (``*/ffn.down`` holds every layer's FFN
    down-projection); groups without a layer or role stay as they are. Order: first appearance."""
    merged: dict[str, list[NodeGroup]] = {}
    for group in groups:
        key = f"*/{group.role}" if group.role and group.layer is not None else group.name
        merged.setdefault(key, []).append(group)
    out = []
    for key, members in merged.items():
        if len(members) == 1 and not key.startswith("*/"):
            out.append(members[0])
            continue
        out.append(
            NodeGroup(
                key,
                tuple(node for member in members for node in member.nodes),
                tuple(dict.fromkeys(op for member in members for op in member.op_types)),
                None,
                members[0].role,
                sum(member.weight_elements for member in members),
            )
        )
    return out


def module_path(node: Any, initializer_shapes: dict[str, tuple[int, ...]] | None = None) -> str:
    """The dotted module path of the source-model layer a node comes from ('' when unknown)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                break
            # The last entry names the op itself ('linear', 'matmul_1'); the one before is the module.
            modules = [str(scope) for scope in scopes[:-1] if scope]
            return modules[-1] if modules else ""
    if node.name.startswith("/") and node.name.count("/") >= 2:
        return ".".join(part for part in node.name.strip("/").split("/")[:-1] if part)
    for name in node.input:
        if name.endswith(".weight") and (initializer_shapes is None or name in initializer_shapes):
            return str(name)[: -len(".weight")]
    return ""


def _split_layer(path: str) -> tuple[int | None, str]:
    matches = list(_LAYER.finditer(path))
    if not matches:
        return None, path
    last = matches[-1]
    return int(last.group(1)), path[last.end() :].lstrip(".")


def _role(rest: str, node: Any, shapes: dict[str, tuple[int, ...]], producers: dict[str, Any]) -> str | None:
    weight_position = WEIGHT_INPUT.get(node.op_type)
    has_weight = weight_position is not None and len(node.input) > weight_position and node.input[weight_position] in shapes
    if not has_weight and (rest == "" or _ATTENTION_SCOPE.search(rest)) and node.op_type == "MatMul":
        return "attn.context" if any(_from_softmax(name, producers) for name in node.input) else "attn.scores"
    for pattern, role in ROLE_PATTERNS:
        if re.search(pattern, rest, flags=re.IGNORECASE):
            return role
    return None


def _from_softmax(tensor: str, producers: dict[str, Any], depth: int = 3) -> bool:
    node = producers.get(tensor)
    for _ in range(depth):
        if node is None:
            return False
        if node.op_type == "Softmax":
            return True
        if node.op_type not in ("Cast", "Dropout", "Identity", "DequantizeLinear", "QuantizeLinear") or not node.input:
            return False
        node = producers.get(node.input[0])
    return False


def _product(dims: tuple[int, ...]) -> int:
    total = 1
    for dim in dims:
        total *= int(dim)
    return total


def _load(model: Any) -> Any:
    if isinstance(model, (str, Path)):
        import onnx

        return onnx.load(str(model), load_external_data=False)
    return model
