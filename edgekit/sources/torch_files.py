"""Model sources stored as PyTorch files: TorchScript (``.pt``) and ``torch.export`` programs (``.pt2``)."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

from edgekit.errors import SourceError
from edgekit.recipe import ExportedProgramSource, Recipe, TorchScriptSource
from edgekit.sources.base import LoadedModel
from edgekit.sources.constant_args import bind_constant_args
from edgekit_runtime.hashing import sha256_file


def _existing(path: Path, recipe: Recipe, field: str) -> Path:
    resolved = recipe.resolve(path)
    if not resolved.is_file():
        raise SourceError(f"{recipe.path}: {field}: file not found: {resolved}", hint="paths are relative to the recipe file")
    return resolved


def load_torchscript(spec: TorchScriptSource, recipe: Recipe, workdir: Path) -> LoadedModel:
    import torch

    path = _existing(spec.path, recipe, "model.path")
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise SourceError(
            f"{recipe.path}: model.path {path} is not a loadable TorchScript file: {exc}",
            hint="save it with torch.jit.save(torch.jit.script(model), path); for torch.export programs use kind: exported_program",
        ) from None
    module.eval()
    details = {}
    if spec.constant_args:
        module = bind_constant_args(module, dict(spec.constant_args), recipe)
        details["constant_args"] = dict(spec.constant_args)
    return LoadedModel(kind="torchscript", description=str(path), module=module, file_sha256=sha256_file(path), details=details)


def load_exported_program(spec: ExportedProgramSource, recipe: Recipe, workdir: Path) -> LoadedModel:
    import torch

    path = _existing(spec.path, recipe, "model.path")
    _refuse_untrusted_pickles(path, recipe)
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise SourceError(
            f"{recipe.path}: model.path {path} is not a torch.export program: {exc}",
            hint="save it with torch.export.save(torch.export.export(model, args), 'model.pt2')",
        ) from None
    return LoadedModel(
        kind="exported_program",
        description=str(path),
        module=program.module(),
        file_sha256=sha256_file(path),
        details={"program": program},
    )


def _refuse_untrusted_pickles(path: Path, recipe: Recipe) -> None:
    """Refuse a ``.pt2`` that loading would unpickle parts of (code it could run), unless the recipe is trusted."""
    from edgekit.sources.pt2_pickles import unpickled_parts

    trust = recipe._code_trust
    if trust is None or trust.trust_code or any(folder in path.resolve().parents for folder in trust.folders):
        return  # a recipe built in Python (its caller's code), --trust-code, or a trusted folder
    try:
        parts = unpickled_parts(path)
    except zipfile.BadZipFile:  # not a zip: torch.export.load says what it is below
        return
    except (OSError, ValueError, EOFError, zlib.error) as exc:
        raise SourceError(f"{recipe.path}: model.path {path} cannot be read as a torch.export archive: {exc}",
                          hint="save it with torch.export.save(torch.export.export(model, args), 'model.pt2')") from None
    if parts:
        raise SourceError(
            f"{recipe.path}: model.path {path} holds parts torch.export.load unpickles or loads as native code, either of which can run any code: "
            f"{'; '.join(parts[:3])}{' ...' if len(parts) > 3 else ''}. A model file is not trusted as code",
            hint="if you trust this file, pass --trust-code (edgekit build, edgekit sweep) or put it in a folder listed in "
                 "EDGEKIT_TRUSTED_CODE_DIRS; a program saved from plain tensors (torch.export.save) holds no pickles",
        )


def check_dynamic_dims(program: Any, recipe: Recipe, path: Path | str) -> None:
    """(Before export.) A program exported with an axis fixed (torch.export without dynamic_shapes) where the recipe has a dim of
    several sizes is a SourceError naming both (the export would otherwise fail with torch's constraint error)."""
    import torch

    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    user_inputs = list(program.graph_signature.user_inputs)
    by_position = dict(zip((spec.name for spec in recipe.inputs), user_inputs))
    for spec in recipe.inputs:  # by forward()'s parameter name (as the export binds them), else by position
        name = spec.name if spec.name in user_inputs else by_position.get(spec.name)
        value = placeholders[name].meta.get("val") if name in placeholders else None
        if not isinstance(value, torch.Tensor):
            continue
        for axis, dim in enumerate(spec.shape):
            size = value.shape[axis] if axis < value.dim() else None
            bounds = recipe.dims.get(dim) if isinstance(dim, str) else None
            if bounds is not None and isinstance(size, int) and bounds.min != bounds.max:
                raise SourceError(
                    f"{recipe.path}: model.path {path} was exported with input '{spec.name}' axis {axis} fixed at {size}, "
                    f"but the recipe's dim '{dim}' ranges {bounds.min}..{bounds.max}",
                    hint=f"re-export with dynamic_shapes (torch.export.export(model, args, dynamic_shapes={{'{spec.name}': "
                         f"{{{axis}: torch.export.Dim('{dim}', min={bounds.min}, max={bounds.max})}}}})), or fix dims.{dim} "
                         f"at {size} (min = opt = max = {size})",
                )
