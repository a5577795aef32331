"""Run the PyTorch reference model on NumPy batches (the FP32 truth that parity and accuracy use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgekit.errors import SourceError
from edgekit.export.flat_outputs import flat_outputs
from edgekit.export.input_binding import bind_inputs_by_name, from_tensor, to_tensor
from edgekit.recipe import Recipe

if TYPE_CHECKING:
    import torch


class TorchReference:
    """Callable: ``reference(feeds) -> {output name: array}`` with the recipe's output names."""

    def __init__(self, module: "torch.nn.Module", recipe: Recipe, device: str = "cpu") -> None:
        self.module = bind_inputs_by_name(module, recipe)  # the recipe's inputs by forward()'s names, as the export binds them
        self.recipe = recipe
        self.device = device  # where the module's parameters are; feeds go there, outputs come back to numpy

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        args = [to_tensor(feeds[s.name], self.recipe, s.name).to(self.device) for s in self.recipe.inputs]  # keeps rank 0
        with torch.inference_mode():
            result = self.module(*args)
        result = flat_outputs(result, self.recipe)  # as the exporters see it: a dict by name, nested tuples flattened
        if len(result) != len(self.recipe.outputs):
            raise SourceError(
                f"{self.recipe.path}: the model returns {len(result)} outputs, the recipe names {len(self.recipe.outputs)}: {list(self.recipe.outputs)}",
                hint="list one name per returned tensor under outputs, in order",
            )
        return {name: from_tensor(tensor) for name, tensor in zip(self.recipe.outputs, result)}
