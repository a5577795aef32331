"""Model source: an existing ``.onnx`` file. Export is skipped; there is no PyTorch reference, so
parity is not checked and accuracy is measured against this FP32 graph run by ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

from edgekit.errors import SourceError
from edgekit.recipe import OnnxSource, Recipe
from edgekit.sources.base import LoadedModel
from edgekit_runtime.hashing import sha256_file


def load_onnx_file(spec: OnnxSource, recipe: Recipe, workdir: Path) -> LoadedModel:
    import onnx

    path = recipe.resolve(spec.path)
    if not path.is_file():
        raise SourceError(f"{recipe.path}: model.path: ONNX file not found: {path}", hint="paths are relative to the recipe file")
    try:
        model = onnx.load(str(path), load_external_data=True)
        onnx.checker.check_model(model, full_check=False)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(
            f"{recipe.path}: model.path {path} is not a valid ONNX model: {first_line}",
            hint="re-export the model, or check that the file was copied completely (size, hash)",
        ) from None
    return LoadedModel(
        kind="onnx",
        description=str(path),
        onnx_path=path,
        exporter="none",
        file_sha256=sha256_file(path),
        details={"opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)},
    )
