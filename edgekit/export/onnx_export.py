"""Export a PyTorch module to ONNX: the dynamo exporter chosen explicitly, the legacy TorchScript
exporter as fallback, then ``onnx.checker`` (full check) and shape inference."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.errors import ExportError
from edgekit.recipe import Recipe

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    exporter: str  # "dynamo" | "legacy" | "optimum" | "none"
    opset: int
    seconds: float
    fallback_reason: str | None = None


def _example_args(recipe: Recipe, batch: dict[str, np.ndarray]) -> tuple["torch.Tensor", ...]:
    import torch

    return tuple(torch.from_numpy(np.require(batch[s.name], requirements="C")) for s in recipe.inputs)  # keeps rank 0


def _dynamo_shapes(recipe: Recipe) -> tuple[dict[int, Any], ...]:
    import torch

    dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in recipe.dims.items()}
    return tuple({axis: dims[dim] for axis, dim in enumerate(spec.shape) if isinstance(dim, str)} for spec in recipe.inputs)


def _legacy_axes(recipe: Recipe) -> dict[str, dict[int, str]]:
    return {spec.name: {axis: dim for axis, dim in enumerate(spec.shape) if isinstance(dim, str)} for spec in recipe.inputs}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_OP_PATTERNS = (
    re.compile(r"(aten[:.]{1,2}[\w.]+)"),
    re.compile(r"operator '?([\w:.]+)'?"),
    re.compile(r"No decompositions registered for .*?'?(\w+::\w+)'?"),
)


def _unsupported_op(message: str) -> str | None:
    for pattern in _OP_PATTERNS:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


def _export_dynamo(module: Any, args: tuple[Any, ...], recipe: Recipe, opset: int, path: Path) -> None:
    import torch

    # torch's logging setup resets its loggers on import; quiet the per-op "torchvision is not installed"
    # notices of the op registry unless the user asked for debug output.
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    if not log.isEnabledFor(logging.DEBUG):
        registry_log.setLevel(logging.ERROR)

    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        input_names=[s.name for s in recipe.inputs],
        output_names=list(recipe.outputs),
        dynamic_shapes=_dynamo_shapes(recipe) if recipe.dims else None,
        opset_version=opset,
        optimize=True,
        verbose=False,
    )
    if program is None:
        raise ExportError("torch.onnx.export(dynamo=True) returned no program")
    large = sum(t.numel() * t.element_size() for t in module.state_dict().values()) > recipe.export.external_data_mb * 2**20
    program.save(str(path), external_data=large)


def _traceable(module: Any, args: tuple[Any, ...]) -> Any:
    """The legacy exporter cannot trace into a TorchScript submodule of a Python module (a loaded ``.pt``
    with ``model.constant_args`` bound around it); ``torch.jit.trace`` can, and the exporter takes its result."""
    import torch

    if isinstance(module, torch.jit.ScriptModule) or not any(isinstance(m, torch.jit.ScriptModule) for m in module.modules()):
        return module
    return torch.jit.trace(module, args, check_trace=False)


def _export_legacy(module: Any, args: tuple[Any, ...], recipe: Recipe, opset: int, path: Path) -> None:
    import torch

    torch.onnx.export(
        _traceable(module, args),
        args,
        str(path),
        dynamo=False,
        input_names=[s.name for s in recipe.inputs],
        output_names=list(recipe.outputs),
        dynamic_axes=_legacy_axes(recipe) or None,
        opset_version=min(opset, 20),  # the TorchScript exporter stops at opset 20
        do_constant_folding=True,
    )


EXPORTERS = {"dynamo": _export_dynamo, "legacy": _export_legacy}


def export_onnx(module: "torch.nn.Module", recipe: Recipe, example: dict[str, np.ndarray], opset: int, path: Path) -> ExportResult:
    """Export ``module`` to ``path`` with the recipe's exporter choice; the graph is checked after."""
    import torch

    order = ["dynamo", "legacy"] if recipe.export.exporter == "auto" else [recipe.export.exporter]
    args = _example_args(recipe, example)
    failures: dict[str, str] = {}
    started = time.perf_counter()
    for name in order:
        captured = io.StringIO()
        try:
            with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(captured):
                warnings.simplefilter("ignore")
                EXPORTERS[name](module, args, recipe, opset, path)
        except ExportError:
            raise
        except Exception as exc:  # exporters raise many types; all are reported with the op they name
            text = _ANSI.sub("", f"{type(exc).__name__}: {exc}")
            failures[name] = text
            log.info("%s exporter failed: %s", name, text.splitlines()[0] if text else text)
            continue
        check_and_infer(path)
        reason = None
        if failures:
            reason = "; ".join(f"{k}: {v.splitlines()[0][:300]}" for k, v in failures.items())
            log.warning("exported with the %s exporter after: %s", name, reason)
        return ExportResult(path=path, exporter=name, opset=opset if name == "dynamo" else min(opset, 20), seconds=time.perf_counter() - started, fallback_reason=reason)
    raise _export_error(failures, recipe, opset)


def _export_error(failures: dict[str, str], recipe: Recipe, opset: int) -> ExportError:
    ops = {name: _unsupported_op(text) for name, text in failures.items()}
    op = next((o for o in ops.values() if o), None)
    detail = "\n".join(f"  {name} exporter: {text.strip().splitlines()[0][:400]}" for name, text in failures.items())
    node = None
    for text in failures.values():
        match = re.search(r"node[ :]+'?([\w./:-]+)'?", text)
        if match:
            node = match.group(1)
            break
    what = f"unsupported op {op}" if op else "export failed"
    where = f" at node {node}" if node else ""
    return ExportError(
        f"{recipe.path}: ONNX export of '{recipe.name}' failed: {what}{where} (opset {opset})\n{detail}",
        hint=(
            f"try a newer opset (export.opset, up to 23), the other exporter (export.exporter: legacy|dynamo), "
            f"or replace {op or 'the op'} in the model / register a custom op (torch.onnx custom translation table)"
        ),
    )


def check_and_infer(path: Path) -> None:
    """``onnx.checker`` full check and in-place shape inference; problems raise ExportError."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
        onnx.shape_inference.infer_shapes_path(str(path), str(path))
    except Exception as exc:
        raise ExportError(f"the exported ONNX model {path} fails onnx.checker: {exc}", hint="report this with the recipe; try export.exporter: legacy") from None
