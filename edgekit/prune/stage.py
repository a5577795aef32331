"""The prune stage of a build: the recipe's PyTorch model -> a pruned (and fine-tuned) copy plus its manifest record.

The loaded model is left as it is: it stays the accuracy reference, while the pruned copy is what the build
exports, checks for parity, and takes its golden outputs from.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from edgekit.errors import BuildError, InternalError

if TYPE_CHECKING:
    from torch import nn

    from edgekit.recipe import Recipe
    from edgekit.sources.base import LoadedModel

#: model.kind -> what it loads: modules whose Conv/Linear layers are compiled away (TorchScript's
#: RecursiveScriptModule, torch.export's GraphModule), so no pruning method can find or resize them.
COMPILED_KINDS: dict[str, str] = {
    "torchscript": "a TorchScript module (its layers are compiled, not nn.Conv*/nn.Linear modules)",
    "exported_program": "a torch.export program (its graph calls aten ops, not nn.Conv*/nn.Linear modules)",
}


def check_prunable_source(recipe: Recipe, loaded: LoadedModel) -> None:
    """A :class:`BuildError` naming ``build.prune`` and ``model.kind`` unless the source is an eager PyTorch module."""
    where = f"{recipe.path}: build.prune ({recipe.build.prune.method if recipe.build.prune else 'none'})"
    if loaded.module is None:
        raise BuildError(f"{where} needs a PyTorch model; model.kind {loaded.kind} has none",
                         hint="remove build.prune for an ONNX-file source, or use model.kind: factory with the PyTorch model")
    why = COMPILED_KINDS.get(loaded.kind) or _compiled(loaded.module)
    if why:
        raise BuildError(
            f"{where} cannot prune model.kind {loaded.kind}: it loads {why}",
            hint="use model.kind: factory (a callable returning the eager nn.Module, with its weights loaded), "
                 "or remove build.prune",
        )


def _compiled(module: nn.Module) -> str | None:
    """Why a module from another source kind is compiled (a ScriptModule, or a GraphModule without Conv/Linear modules)."""
    import torch
    from torch import fx, nn

    if isinstance(module, torch.jit.ScriptModule):
        return "a TorchScript module (its layers are compiled, not nn.Conv*/nn.Linear modules)"
    layers = (nn.modules.conv._ConvNd, nn.Linear)
    if isinstance(module, fx.GraphModule) and not any(isinstance(m, layers) for m in module.modules()):
        return "a traced GraphModule with no nn.Conv*/nn.Linear module left to prune"
    return None


def prune_for_build(recipe: Recipe, loaded: LoadedModel, samples: list[dict[str, Any]]) -> tuple[nn.Module, dict[str, Any]]:
    """Prune a copy of ``loaded.module`` as ``recipe.build.prune`` says (then fine-tune it); return it, in eval
    mode, and the prune report for the manifest. The first sample batch is the example input."""
    import torch

    from edgekit.prune import fine_tune, prune_model

    spec = recipe.build.prune
    if spec is None:
        raise InternalError(f"{recipe.path}: the prune stage ran without build.prune; this is a bug in edgekit's pipeline, please report it")
    check_prunable_source(recipe, loaded)
    assert loaded.module is not None  # checked above
    example = tuple(torch.from_numpy(samples[0][s.name]) for s in recipe.inputs)
    module, report = prune_model(copy.deepcopy(loaded.module), spec.method, spec.sparsity, example, **spec.options())
    if spec.fine_tune is not None:
        module, report = fine_tune(module, spec.fine_tune.callable, spec.fine_tune.kwargs, report=report, search_dir=recipe.base_dir)
    module.eval()
    return module, report.to_dict()
