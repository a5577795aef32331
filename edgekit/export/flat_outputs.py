"""A model's outputs as the recipe names them: one tensor per name, in the recipe's order.

Models return a tensor, a tuple or list of them, nested tuples (``((y, 2y), y + 1)``) or a dict. The exporters
name the outputs they find in order (a dict in its own key order) and the PyTorch reference looked a dict up by
name: a dict whose order differs from the recipe's was exported under swapped names and failed parity as if the
model were wrong. Here every result is flattened the same way for both, a dict taken by the recipe's names.
"""

from __future__ import annotations

from typing import Any

from edgekit.errors import SourceError
from edgekit.recipe import Recipe


def flat_outputs(result: Any, recipe: Recipe) -> tuple[Any, ...]:
    """``result`` as a tuple of tensors in the recipe's output order (a dict by name, nested sequences flattened)."""
    import torch
    from torch.utils._pytree import tree_flatten

    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, dict):
        missing = [name for name in recipe.outputs if name not in result]
        if missing:
            raise SourceError(f"{recipe.path}: outputs: the model returns a dict with keys {sorted(map(str, result))}, "
                              f"which has no '{missing[0]}'",
                              hint="name the outputs as the model's dict keys, in the order you want them")  # fmt: skip
        leaves = [result[name] for name in recipe.outputs]
    else:
        leaves, _ = tree_flatten(result)
    odd = next((leaf for leaf in leaves if not isinstance(leaf, torch.Tensor)), None)
    if odd is not None:
        raise SourceError(f"{recipe.path}: the model returns a {type(odd).__name__} among its outputs; every output "
                          "must be a tensor", hint="return tensors only (a tuple, list or dict of them)")  # fmt: skip
    return tuple(leaves)


def needs_flattening(result: Any) -> bool:
    """Whether ``result`` is anything but a tensor or a flat tuple / list of tensors."""
    import torch

    if isinstance(result, torch.Tensor):
        return False
    return not (isinstance(result, (tuple, list)) and all(isinstance(item, torch.Tensor) for item in result))


def flattened_module(module: Any, recipe: Recipe, example: Any) -> Any:
    """``module`` returning its outputs flat in the recipe's order (what the exporters are given); ``example`` is
    what it returned once, which fixes how: by the recipe's names for a dict, else flattened (nothing in ``forward``
    but container access, which both exporters trace)."""
    import torch
    from torch.utils._pytree import tree_flatten

    flat_outputs(example, recipe)  # the checks, with their errors, before any export
    keys = tuple(recipe.outputs) if isinstance(example, dict) else None

    class FlatOutputs(torch.nn.Module):
        takes_varargs = True  # its dynamic shapes go under "args" (onnx_export._dynamic_shapes_for)

        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *args: Any) -> tuple[Any, ...]:
            result = self.inner(*args)
            if keys is not None:
                return tuple(result[key] for key in keys)
            return tuple(tree_flatten(result)[0])

    return FlatOutputs().eval()


__all__ = ["flat_outputs", "flattened_module", "needs_flattening"]
