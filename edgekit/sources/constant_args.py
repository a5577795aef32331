"""``model.constant_args``: forward() arguments that are not tensors (``sr: int``), bound before export.

The bound module takes the recipe's inputs positionally, in forward()'s order with the constants left
out, so the exported graph has one input per recipe input and the constants folded in.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

from edgekit.errors import SourceError
from edgekit.recipe import Recipe

if TYPE_CHECKING:
    import torch


def forward_parameters(module: "torch.nn.Module") -> list[str] | None:
    """forward()'s parameter names (without self), from the TorchScript schema or the Python signature."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        try:
            return [argument.name for argument in module.forward.schema.arguments][1:]
        except (AttributeError, RuntimeError):
            return None
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None
    return [p.name for p in parameters]


def bind_constant_args(module: "torch.nn.Module", constants: dict[str, Any], recipe: Recipe, field: str = "model.constant_args") -> "torch.nn.Module":
    """``module`` with ``constants`` bound; an unknown name, or a recipe input that forward() lacks, is a SourceError."""
    names = forward_parameters(module)
    if names is None:
        raise SourceError(
            f"{recipe.path}: {field}: cannot read the parameter names of {type(module).__name__}.forward() to bind {sorted(constants)}",
            hint="give forward() named parameters (no *args/**kwargs), or wrap the model in a module that fixes the constants",
        )
    unknown = sorted(set(constants) - set(names))
    if unknown:
        raise SourceError(
            f"{recipe.path}: {field}.{unknown[0]}: forward() has no parameter '{unknown[0]}' (its parameters: {', '.join(names)})",
            hint="name constant_args after forward()'s parameters",
        )
    tensor_names = [name for name in names if name not in constants]
    inputs = [spec.name for spec in recipe.inputs]
    if len(inputs) > len(tensor_names):
        raise SourceError(
            f"{recipe.path}: inputs: the recipe lists {len(inputs)} inputs {inputs} but forward() takes {len(tensor_names)} "
            f"besides {field} ({', '.join(tensor_names) or 'none'})",
            hint="list one input per tensor argument of forward(), in order; pin the others under constant_args",
        )
    values = {name: list(value) if isinstance(value, tuple) else value for name, value in constants.items()}
    # the recipe's names when they are forward()'s (in whatever order): bound by name, else by position
    bound = inputs if len(set(inputs)) == len(inputs) and set(inputs) <= set(tensor_names) else tensor_names[: len(inputs)]
    return _bound_module_class()(module, bound, values).eval()


@functools.cache
def _bound_module_class() -> type:
    """The wrapper class (made on first use: it subclasses torch.nn.Module and torch is imported lazily)."""
    import torch

    class BoundModule(torch.nn.Module):
        """Calls ``inner`` with the tensors by position (named after forward()'s parameters) and the constants by name."""

        takes_varargs = True  # its dynamic shapes go under "args" (onnx_export._dynamic_shapes_for)

        def __init__(self, inner: torch.nn.Module, tensor_names: list[str], constants: dict[str, Any]) -> None:
            super().__init__()
            self.inner = inner
            self.tensor_names = tensor_names
            self.constants = constants

        def forward(self, *tensors: torch.Tensor) -> Any:
            return self.inner(**dict(zip(self.tensor_names, tensors)), **self.constants)

    return BoundModule
