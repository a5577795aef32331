"""Model source: a Python factory ``package.module:function(**kwargs)`` returning an ``nn.Module``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import SourceError
from edgekit.recipe import FactorySource, Recipe
from edgekit.sources._util import import_callable
from edgekit.sources.base import LoadedModel
from edgekit.sources.constant_args import bind_constant_args


def load_factory(spec: FactorySource, recipe: Recipe, workdir: Path) -> LoadedModel:
    import torch

    fn = import_callable(spec.factory, SourceError, f"{recipe.path}: model.factory", recipe.base_dir)
    try:
        module = fn(**spec.kwargs)
    except TypeError as exc:
        raise SourceError(
            f"{recipe.path}: model.factory '{spec.factory}' rejected its kwargs {spec.kwargs}: {exc}",
            hint="check model.kwargs against the factory's signature",
        ) from None
    except Exception as exc:
        raise SourceError(f"{recipe.path}: model.factory '{spec.factory}' raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(module, torch.nn.Module):
        raise SourceError(
            f"{recipe.path}: model.factory '{spec.factory}' returned {type(module).__name__}, not a torch.nn.Module",
            hint="the factory must return the model (an nn.Module instance), e.g. `return MyNet().eval()`",
        )
    module.eval()
    details: dict[str, Any] = {"kwargs": dict(spec.kwargs)}
    if spec.constant_args:
        module = bind_constant_args(module, dict(spec.constant_args), recipe)
        details["constant_args"] = dict(spec.constant_args)
    return LoadedModel(kind="factory", description=spec.factory, module=module, details=details)
