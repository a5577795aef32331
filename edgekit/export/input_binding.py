"""How the recipe's inputs reach forward(): by name when the recipe names forward()'s parameters, and as tensors
torch can hold (bfloat16 arrays included).

The exporters and the PyTorch reference call the module positionally, in the recipe's input order. A recipe
listing ``[attention_mask, input_ids]`` for ``forward(input_ids, attention_mask)`` then fed the mask as the ids
on both sides: parity passed, and the bundle was silently wrong. Here such a module is wrapped to take the
recipe's order and pass each tensor by its name, for export and reference alike.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.errors import SourceError
from edgekit.recipe import Recipe

if TYPE_CHECKING:
    import torch


def name_order(module: Any, recipe: Recipe) -> list[str] | None:
    """The recipe's input names when they are forward()'s parameters in another order than forward()'s
    (binding by position would swap them), else None (position and name agree, or the names are not forward()'s)."""
    from edgekit.sources.constant_args import forward_parameters

    try:
        parameters = forward_parameters(module)
    except Exception:  # noqa: BLE001 - a module whose signature cannot be read is called by position, as before
        return None
    inputs = [spec.name for spec in recipe.inputs]
    if not parameters or len(set(inputs)) != len(inputs) or not set(inputs) <= set(parameters):
        return None
    if inputs == parameters[: len(inputs)]:
        return None
    return inputs


def bind_inputs_by_name(module: Any, recipe: Recipe) -> Any:
    """``module``, or a wrapper taking the recipe's inputs in the recipe's order and passing them to forward() by
    name when the recipe lists forward()'s parameters in another order (see :func:`name_order`)."""
    names = name_order(module, recipe)
    if names is None:
        return module
    return _by_name_class()(module, names).eval()


@functools.cache
def _by_name_class() -> type:
    import torch

    class ByName(torch.nn.Module):
        """Calls ``inner`` with the tensors (in the recipe's order) by forward()'s parameter names."""

        takes_varargs = True  # its dynamic shapes go under "args" (onnx_export._dynamic_shapes_for)

        def __init__(self, inner: torch.nn.Module, names: list[str]) -> None:
            super().__init__()
            self.inner = inner
            self.names = names

        def forward(self, *tensors: torch.Tensor) -> Any:
            return self.inner(**dict(zip(self.names, tensors)))

    return ByName


def to_tensor(array: np.ndarray, recipe: Recipe, name: str) -> "torch.Tensor":
    """``array`` as a torch tensor (rank 0 kept); a bfloat16 array (ml_dtypes) through its uint16 bits, which
    torch.from_numpy cannot take directly."""
    import torch

    array = np.require(array, requirements="C")
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    try:
        return torch.from_numpy(array)
    except TypeError as exc:
        raise SourceError(f"{recipe.path}: input '{name}' has dtype {array.dtype}, which PyTorch cannot take ({exc})",
                          hint="give the input a dtype torch supports (float32, float16, bfloat16, int64, int32, bool ...)") from None


def from_tensor(tensor: "torch.Tensor") -> np.ndarray:
    """A torch tensor back as NumPy (bfloat16 as ml_dtypes' bfloat16, which numpy() cannot give)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()
