"""Which output channels can be removed, found on a ``torch.fx`` trace of the model.

A *producer* is a Conv (groups=1, not transposed) or Linear layer. Its output is followed through
operations that keep channels apart (activations, dropout, pooling, flatten, BatchNorm) to the
layers that read it: the next Conv's input channels or the next Linear's input features (after a
flatten each channel becomes ``block`` consecutive features, ``block`` being the flattened spatial
size). Anything else on the way (a residual add, a concatenation, a reshape that is not a flatten,
the model's output, an unknown module or function) makes the producer unprunable, with the reason
kept for the report. The analysis never guesses: what it does not understand it leaves alone.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from edgekit.errors import InternalError, PruneError

ELEMENTWISE_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Sigmoid,
    nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Softplus, nn.Identity,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
)  # fmt: skip
POOL_MODULES: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
)  # fmt: skip
BATCHNORM_TYPES: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
ELEMENTWISE_FUNCTIONS: frozenset[Any] = frozenset({
    F.relu, F.relu6, F.leaky_relu, F.elu, F.selu, F.celu, F.gelu, F.silu, F.mish, F.hardswish,
    F.hardsigmoid, F.hardtanh, F.softplus, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d,
    torch.relu, torch.sigmoid, torch.tanh, F.sigmoid, F.tanh,
})  # fmt: skip
POOL_FUNCTIONS: frozenset[Any] = frozenset({
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d,
})  # fmt: skip
ELEMENTWISE_METHODS = frozenset({"relu", "relu_", "sigmoid", "tanh", "contiguous", "clone"})
MERGE_NAMES = {operator.add: "residual add", torch.add: "residual add", operator.mul: "multiply", torch.cat: "concatenation"}


@dataclass(frozen=True)
class Dependent:
    """A layer that must shrink with a producer: ``role`` says which of its dimensions."""

    name: str
    role: Literal["inputs", "features"]  # inputs: Conv/Linear in-dim; features: BatchNorm channels
    block: int  # each producer channel is ``block`` consecutive entries of that dimension


@dataclass(frozen=True)
class ChannelGroup:
    producer: str
    channels: int
    dependents: tuple[Dependent, ...]


@dataclass(frozen=True)
class ChannelPlan:
    groups: tuple[ChannelGroup, ...]
    blocked: dict[str, str]  # producer name -> why its outputs stay
    outputs: Any  # the model's outputs on the example inputs, before pruning


class _Blocked(Exception):
    """Internal: the walk from a producer met something it cannot prune through."""


def trace(module: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(module)
    except Exception as exc:  # fx raises many types for data-dependent control flow
        raise PruneError(
            f"prune method 'channel': torch.fx cannot trace {type(module).__name__} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
            hint="channel pruning needs a traceable forward (no data-dependent Python control flow); "
            "use method 'magnitude' or '2:4', or make forward traceable",
        ) from None


def plan_channels(module: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> ChannelPlan:
    """Trace ``module`` (in eval mode, no grad) and group each prunable producer with its dependents."""
    graph_module = trace(module)
    try:
        with torch.no_grad():
            outputs = ShapeProp(graph_module).propagate(*example_inputs)
    except Exception as exc:
        raise PruneError(
            f"prune method 'channel': running {type(module).__name__} on the example inputs failed: {type(exc).__name__}: {exc}",
            hint="example_inputs must be one batch the model accepts, in forward()'s argument order",
        ) from None
    nodes = list(graph_module.graph.nodes)
    modules = dict(graph_module.named_modules())
    calls = Counter(node.target for node in nodes if node.op == "call_module")
    read_directly = {str(node.target).rpartition(".")[0] for node in nodes if node.op == "get_attr"}
    context = _Context(modules, calls, read_directly, parameter_owners(module))

    groups, blocked = [], {}
    for node in nodes:
        if node.op != "call_module" or not _is_conv_or_linear(modules[node.target]):
            continue
        name = str(node.target)
        layer = modules[name]
        try:
            context.check_layer(name, role="producer")
            if isinstance(layer, nn.Linear) and _rank(node) != 2:
                raise _Blocked(f"Linear applied to a rank-{_rank(node)} tensor; only [batch, features] outputs are pruned")
            dependents = _follow(node, context)
        except _Blocked as why:
            blocked[name] = str(why)
            continue
        channels = layer.out_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.out_features
        _check_sizes(name, channels, dependents, modules)
        groups.append(ChannelGroup(name, channels, tuple(dependents)))
    return ChannelPlan(tuple(groups), blocked, outputs)


def _is_conv_or_linear(layer: nn.Module) -> bool:
    return isinstance(layer, (nn.modules.conv._ConvNd, nn.Linear))


def _rank(node: fx.Node) -> int | None:
    meta = node.meta.get("tensor_meta")
    return len(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    meta = node.meta.get("tensor_meta")
    return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None


def parameter_owners(module: nn.Module) -> dict[int, list[str]]:
    """id of each Parameter -> the names of every module holding it directly (two or more: a tied weight)."""
    owners: dict[int, list[str]] = {}
    for name, layer in module.named_modules():  # a module reachable under two names counts once, under the name fx uses
        for param in layer.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    return owners


@dataclass(frozen=True)
class _Context:
    modules: dict[str, nn.Module]
    calls: Counter[Any]
    read_directly: set[str]
    owners: dict[int, list[str]]

    def check_layer(self, name: str, role: str) -> None:
        layer = self.modules[name]
        if self.calls[name] != 1:
            raise _Blocked(f"{role} '{name}' is called {self.calls[name]} times in forward; shared layers are not pruned")
        for param_name, param in layer.named_parameters(recurse=False):
            others = [other for other in self.owners.get(id(param), []) if other != name]
            if others:  # resizing it here would untie it: the model would grow and the other module change
                raise _Blocked(f"{role} '{name}' has its {param_name} tied to {', '.join(repr(o) for o in others)} "
                               "(one shared Parameter); tied weights are not pruned")
        if name in self.read_directly:
            raise _Blocked(f"{role} '{name}' has its parameters read directly in forward (not only through its call)")
        if isinstance(layer, nn.modules.conv._ConvTransposeNd):
            raise _Blocked(f"{role} '{name}' is a transposed convolution, which the channel pruner does not handle")
        if isinstance(layer, nn.modules.conv._ConvNd) and layer.groups != 1:
            raise _Blocked(f"{role} '{name}' is a grouped convolution (groups={layer.groups}); its channels are tied to its groups")


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda arg: found.append(arg) or arg)
    return [arg for arg in found if arg.meta.get("tensor_meta") is not None]


def _follow(producer: fx.Node, context: _Context) -> list[Dependent]:
    """Walk forward from ``producer``; return its dependents, or raise :class:`_Blocked`."""
    dependents: list[Dependent] = []
    pending: list[tuple[fx.Node, int]] = [(producer, 1)]
    while pending:
        source, block = pending.pop()
        for user in source.users:
            step = _step(user, source, block, context)
            if isinstance(step, Dependent):
                dependents.append(step)
                if step.role == "features":
                    pending.append((user, block))
            elif step is not None:
                pending.append((user, step))
    return dependents


def _step(user: fx.Node, source: fx.Node, block: int, context: _Context) -> Dependent | int | None:
    """What ``user`` does with the channels in ``source``: a dependent, a new block to follow, or
    None when it only reads the batch size. Raises :class:`_Blocked` when it cannot be followed."""
    if user.op == "output":
        raise _Blocked("its output is returned by the model (e.g. the final classifier); output shapes must not change")
    if user.op == "call_method" and user.target == "size" and _int_arg(user, 1, "dim") == 0:
        return None
    others = [arg for arg in _tensor_args(user) if arg is not source]
    if others or sum(1 for arg in _tensor_args(user) if arg is source) > 1:
        kind = MERGE_NAMES.get(user.target, f"'{getattr(user.target, '__name__', user.target)}'")
        raise _Blocked(f"its output meets another tensor at node '{user.name}' ({kind}); merged tensors are left unpruned")
    if user.op == "call_module":
        return _module_step(user, source, block, context)
    if user.op == "call_function":
        if user.target in ELEMENTWISE_FUNCTIONS:
            return block
        if user.target in POOL_FUNCTIONS:
            return _pool(user, source, block, _pool_dims(user.target))
        if user.target is torch.flatten:
            return _flatten(user, source, block, start=_int_arg(user, 1, "start_dim", 0), end=_int_arg(user, 2, "end_dim", -1))
    if user.op == "call_method":
        if user.target in ELEMENTWISE_METHODS:
            return block
        if user.target == "flatten":
            return _flatten(user, source, block, start=_int_arg(user, 1, "start_dim", 0), end=_int_arg(user, 2, "end_dim", -1))
        if user.target in ("view", "reshape"):
            return _reshape(user, source, block)
    raise _Blocked(
        f"its output passes through node '{user.name}' ({user.op} {_target_name(user)}), "
        "which the channel pruner does not understand"
    )


def _module_step(user: fx.Node, source: fx.Node, block: int, context: _Context) -> Dependent | int:
    name = str(user.target)
    layer = context.modules[name]
    if _is_conv_or_linear(layer):
        context.check_layer(name, role="consumer")
        if isinstance(layer, nn.Linear):
            if _rank(source) != 2:
                raise _Blocked(f"consumer Linear '{name}' reads a rank-{_rank(source)} tensor; only [batch, features] inputs are pruned")
        elif block != 1:
            raise _Blocked(f"consumer '{name}' reads flattened channels")
        return Dependent(name, "inputs", block)
    if isinstance(layer, BATCHNORM_TYPES):
        context.check_layer(name, role="BatchNorm")
        if block != 1 and _rank(source) != 2:
            raise _Blocked(f"BatchNorm '{name}' reads flattened channels")
        return Dependent(name, "features", block)
    if isinstance(layer, ELEMENTWISE_MODULES):
        return block
    if isinstance(layer, POOL_MODULES):
        return _pool(user, source, block, _pool_dims(type(layer)))
    if isinstance(layer, nn.Flatten):
        return _flatten(user, source, block, start=layer.start_dim, end=layer.end_dim)
    raise _Blocked(f"its output passes through module '{name}' ({type(layer).__name__}), which the channel pruner does not understand")


def _pool(user: fx.Node, source: fx.Node, block: int, spatial_dims: int) -> int:
    """A pool keeps channels apart only on a batched ``[N, C, *spatial]`` input of its own rank: ``MaxPool2d`` on a
    rank-3 ``[N, C, L]`` tensor takes it as an unbatched ``[C, H, W]`` one and pools across the channels."""
    before, after = _shape(source), _shape(user)
    if (
        block != 1
        or before is None
        or after is None
        or len(before) != spatial_dims + 2
        or len(after) != len(before)
        or after[:2] != before[:2]
    ):
        rank = len(before) if before is not None else "unknown"
        raise _Blocked(f"its output (rank {rank}) is pooled at node '{user.name}' by a {spatial_dims}-d pool, "
                       "in a way that does not keep channels on dim 1")
    return block


def _pool_dims(pool: Any) -> int:
    """Spatial dims of a pool module type or function (``MaxPool2d``, ``F.adaptive_avg_pool3d``): its name ends in them."""
    return int(pool.__name__.rstrip("d")[-1])


def _flatten(user: fx.Node, source: fx.Node, block: int, start: int | None, end: int | None) -> int:
    shape = _shape(source)
    if shape is None or start != 1 or end not in (-1, len(shape) - 1):
        raise _Blocked(f"its output is flattened at node '{user.name}' other than flatten(start_dim=1)")
    return block * math.prod(shape[2:])


def _reshape(user: fx.Node, source: fx.Node, block: int) -> int:
    """``x.view(batch, -1)`` / ``x.reshape(batch, -1)`` acts like flatten(1); other reshapes block."""
    dims = user.args[1:]
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    source_shape, out_shape = _shape(source), _shape(user)
    if (
        len(dims) != 2
        or dims[1] != -1
        or dims[0] == -1
        or source_shape is None
        or out_shape is None
        or out_shape != (source_shape[0], math.prod(source_shape[1:]))
    ):
        raise _Blocked(f"its output is reshaped at node '{user.name}' into a layout other than [batch, -1]")
    return block * math.prod(source_shape[2:])


def _int_arg(node: fx.Node, index: int, name: str, default: int | None = None) -> int | None:
    value = node.args[index] if len(node.args) > index else node.kwargs.get(name, default)
    return value if isinstance(value, int) else None


def _target_name(node: fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def _check_sizes(name: str, channels: int, dependents: list[Dependent], modules: dict[str, nn.Module]) -> None:
    """The walk's bookkeeping must match the layers' sizes; a mismatch is a bug, never pruned through."""
    for dep in dependents:
        layer = modules[dep.name]
        if dep.role == "features":
            size = layer.num_features
        else:
            size = layer.in_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.in_features
        if size != channels * dep.block:
            raise InternalError(
                f"channel pruning: '{name}' has {channels} channels x block {dep.block} but its dependent "
                f"'{dep.name}' expects {size}; please report this model structure"
            )
