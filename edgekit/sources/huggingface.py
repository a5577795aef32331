"""Model source: a local Hugging Face model directory, exported through Optimum's ONNX exporter.

Optimum knows how to export each architecture (inputs, dynamic axes, past key values); edgekit keeps
the PyTorch model as the parity reference, wrapped so that it returns the recipe's outputs by name.
Nothing is fetched from the hub: loading is ``local_files_only``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from edgekit.errors import ExportError, SourceError
from edgekit.recipe import HuggingFaceSource, Recipe
from edgekit.sources._util import import_callable
from edgekit.sources.base import LoadedModel

log = logging.getLogger(__name__)


def _model_dir(spec: HuggingFaceSource, recipe: Recipe) -> Path:
    if spec.path is not None:
        directory = recipe.resolve(spec.path)
    else:
        directory = _called_path_from(spec, recipe)
    if not (directory / "config.json").is_file():
        raise SourceError(
            f"{recipe.path}: model directory {directory} has no config.json: not a Hugging Face model directory",
            hint="point model.path at a folder saved with save_pretrained() (config.json + weights)",
        )
    return directory


def _called_path_from(spec: HuggingFaceSource, recipe: Recipe) -> Path:
    """The directory ``model.path_from`` returns; what it raises, or a result that is no path, as a SourceError."""
    field = f"{recipe.path}: model.path_from"
    if spec.path_from is None:  # the schema requires path or path_from
        raise SourceError(f"{recipe.path}: model: neither path nor path_from is set", hint="set model.path to the model directory")
    fn = import_callable(spec.path_from, SourceError, field, recipe.base_dir)
    try:
        result = fn()
    except Exception as exc:
        raise SourceError(f"{field} '{spec.path_from}' raised {type(exc).__name__}: {exc}",
                          hint="the callable takes no arguments and returns the model directory (str or Path)") from exc
    if not isinstance(result, (str, PathLike)):
        raise SourceError(f"{field} '{spec.path_from}' returned {type(result).__name__}, not a path",
                          hint="return the model directory as a str or pathlib.Path, e.g. `return Path(...)`")
    return Path(result)


def _wrap(model: Any, input_names: list[str], output_names: list[str], where: str = "model") -> Any:
    """The model as a module returning the recipe's outputs, in order; ``where`` ("<recipe>: model.path") leads its errors."""
    import torch

    class HuggingFaceOutputs(torch.nn.Module):
        takes_varargs = True  # its dynamic shapes go under "args" (onnx_export._dynamic_shapes_for)

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # return_dict=True: a config.json saved with "return_dict": false would give a tuple, without names
            result = self.model(**dict(zip(input_names, args)), return_dict=True)
            if not isinstance(result, Mapping):
                raise SourceError(
                    f"{where}: the Hugging Face model returns a {type(result).__name__}, not its outputs by name",
                    hint="use a transformers model whose forward() returns a ModelOutput (return_dict=True)",
                )
            missing = [n for n in output_names if n not in result]
            if missing:
                raise SourceError(
                    f"{where}: the Hugging Face model returns {list(result.keys())}, not {missing}",
                    hint="set the recipe's outputs to names the model returns for its task",
                )
            return tuple(result[n] for n in output_names)

    return HuggingFaceOutputs().eval()


def load_huggingface(spec: HuggingFaceSource, recipe: Recipe, workdir: Path) -> LoadedModel:
    directory = _model_dir(spec, recipe)
    where = f"{recipe.path}: {'model.path' if spec.path is not None else 'model.path_from'}"
    try:
        from optimum.exporters.onnx import main_export
        from transformers import AutoConfig
    except ImportError as exc:
        raise SourceError(
            f"{recipe.path}: model.kind huggingface needs Optimum's ONNX exporter ({exc})",
            hint="pip install 'edgekit[hf]' (optimum-onnx with transformers < 4.58)",
        ) from None
    from optimum.exporters.tasks import TasksManager

    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as exc:  # OSError: not JSON; ValueError: a model_type this transformers does not know
        text = " ".join(str(exc).split())
        raise SourceError(
            f"{where}: cannot read {directory / 'config.json'}: {type(exc).__name__}: {text[:300]}",
            hint="config.json must be the JSON that save_pretrained() wrote, with a model_type this transformers "
                 "version knows (re-save the model, or upgrade transformers within edgekit[hf])",
        ) from None
    try:
        model = TasksManager.get_model_from_task(spec.task, str(directory), local_files_only=True, framework="pt", library_name="transformers")
    except Exception as exc:
        raise SourceError(f"{recipe.path}: cannot load {directory} for task '{spec.task}': {exc}") from None
    model.eval()
    out_dir = workdir / "optimum"
    opset = recipe.export.opset
    started = time.perf_counter()
    try:
        main_export(
            str(directory),
            output=out_dir,
            task=spec.task,
            opset=opset,
            local_files_only=True,
            do_validation=False,  # edgekit's own parity check runs next, at min/opt/max shapes
            no_post_process=True,
            # A directory that also holds a sentence-transformers config would otherwise export that library's
            # pooled outputs; the recipe names the transformers model's outputs.
            library_name="transformers",
        )
    except Exception as exc:
        raise ExportError(f"{recipe.path}: Optimum's ONNX export of {directory} failed: {exc}") from exc
    onnx_path = out_dir / "model.onnx"
    if not onnx_path.is_file():
        raise ExportError(f"Optimum wrote no model.onnx into {out_dir}: found {sorted(p.name for p in out_dir.iterdir())}")
    log.info("optimum export took %.1f s", time.perf_counter() - started)
    written_opset, renamed = _as_the_recipe_names_it(onnx_path, recipe)
    wrapped = _wrap(model, [s.name for s in recipe.inputs], list(recipe.outputs), where)
    return LoadedModel(
        kind="huggingface",
        description=f"{directory} ({config.model_type}, task {spec.task})",
        module=wrapped,
        onnx_path=onnx_path,
        exporter="optimum",
        details={"model_type": config.model_type, "task": spec.task, "directory": str(directory), "opset": written_opset,
                 **({"notes": renamed} if renamed else {})},
    )


def _as_the_recipe_names_it(path: Path, recipe: Recipe) -> tuple[int, list[str]]:
    """The opset Optimum wrote (the manifest's, not the one asked for), and its dim names (``batch_size``,
    ``sequence_length``) renamed to the recipe's at the same input axes, across inputs and outputs, in place;
    one note per renamed dim."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    specs = {spec.name: spec for spec in recipe.inputs}
    renames: dict[str, str] = {}
    for value in model.graph.input:
        spec = specs.get(value.name)
        for axis, dim in enumerate(value.type.tensor_type.shape.dim if spec is not None else ()):
            wanted = spec.shape[axis] if axis < len(spec.shape) else None
            if dim.dim_param and isinstance(wanted, str) and dim.dim_param != wanted:
                renames.setdefault(dim.dim_param, wanted)
    if renames:
        for value in (*model.graph.input, *model.graph.output):
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param in renames:
                    dim.dim_param = renames[dim.dim_param]
        onnx.save(model, str(path))  # the weights stay in their external file, untouched
    return opset, [f"dim '{old}' of Optimum's export named '{new}', as the recipe names it" for old, new in renames.items()]
