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

from edgekit.errors import ExportError, SourceError
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
    warnings: tuple[str, ...] = ()  # what the exporter warned about the graph (the legacy tracer's baked-in branches)


def _example_args(recipe: Recipe, batch: dict[str, np.ndarray]) -> tuple["torch.Tensor", ...]:
    from edgekit.export.input_binding import to_tensor

    return tuple(to_tensor(batch[s.name], recipe, s.name) for s in recipe.inputs)  # keeps rank 0


def _dynamo_shapes(recipe: Recipe) -> tuple[dict[int, Any], ...]:
    import torch

    # a dim of one size (min == max, as static-shape targets such as NPUs want) is no Dim: torch.export refuses
    # Dim(min=2, max=2); the axis is exported at that one size, a static axis (what such targets want)
    dims = {name: torch.export.Dim(name, min=d.min, max=d.max) for name, d in recipe.dims.items() if d.min != d.max}
    return tuple({axis: dims[dim] for axis, dim in enumerate(spec.shape) if isinstance(dim, str) and dim in dims}
                 for spec in recipe.inputs)  # fmt: skip


def _dynamic_shapes_for(module: Any, recipe: Recipe) -> Any:
    """:func:`_dynamo_shapes` as ``module``'s signature takes them: under ``args`` for a ``forward(*args)``
    (the wrappers of :mod:`edgekit.export.flat_outputs`, ``model.constant_args`` and Hugging Face sources), keyed by
    that parameter's own name."""
    if not recipe.dims:
        return None
    shapes = _dynamo_shapes(recipe)
    varargs = _varargs_name(module)
    return {varargs: shapes} if varargs else shapes


def _varargs_name(module: Any) -> str | None:
    """The name of ``module.forward``'s ``*args`` parameter (torch.export keys dynamic shapes by it), else None."""
    import inspect

    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return "args" if getattr(module, "takes_varargs", False) else None
    return next((p.name for p in parameters if p.kind is p.VAR_POSITIONAL), None)


def _legacy_axes(recipe: Recipe) -> dict[str, dict[int, str]]:
    return {spec.name: {axis: dim for axis, dim in enumerate(spec.shape) if isinstance(dim, str)} for spec in recipe.inputs}


def _resized(array: "torch.Tensor", axis: int, size: int) -> "torch.Tensor":
    """``array`` with ``size`` entries along ``axis``: its first ones, or itself repeated to that length."""
    import torch

    repeats = -(-size // array.shape[axis])
    return torch.cat([array] * repeats, dim=axis).narrow(axis, 0, size) if repeats > 1 else array.narrow(axis, 0, size)


def _output_shapes(module: Any, args: tuple[Any, ...], recipe: Recipe) -> list[tuple[int, ...]] | None:
    import torch

    with torch.no_grad():
        result = module(*args)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if len(results) != len(recipe.outputs) or not all(isinstance(r, torch.Tensor) for r in results):
        return None
    return [tuple(r.shape) for r in results]


def _pin_static_output_dims(path: Path, shapes: dict[str, tuple[int, ...]], dynamic: dict[str, dict[int, str]]) -> None:
    """The exporter leaves every axis of an output with a dynamic axis unnamed-symbolic (``ConcatstateN_dim_0``);
    the axes the probe found fixed get their size back."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    changed = False
    for output in model.graph.output:
        if output.name not in dynamic or output.name not in shapes or not output.type.tensor_type.HasField("shape"):
            continue
        for axis, (dim, size) in enumerate(zip(output.type.tensor_type.shape.dim, shapes[output.name])):
            if axis not in dynamic[output.name] and not dim.HasField("dim_value"):
                dim.dim_value = size
                changed = True
    if changed:
        onnx.save(model, str(path))


def legacy_output_axes(module: Any, args: tuple[Any, ...], recipe: Recipe) -> dict[str, dict[int, str]]:
    """The outputs' dynamic axes for the TorchScript exporter, which otherwise fixes every output axis at the
    example's size (ONNX Runtime then warns "Expected shape {8,1} ... actual {1,1}" at another batch).

    Each named dim is probed: the module runs again with that dim at another size (inputs cut or repeated along
    the axes that name it), and every output axis whose size follows the dim takes its name, or where it
    changes to another size (``time`` -> frames) a name of its own. State outputs (``state``) fed back as
    inputs then carry their input's dims, batch included, at whatever axis the input has it."""
    try:
        base = _output_shapes(module, args, recipe)
    except Exception as exc:  # the exporter reports what the module cannot do; without the probe outputs keep fixed shapes
        log.info("output dims not probed (the module failed on the example): %s", exc)
        return {}
    if base is None:
        return {}
    axes: dict[str, dict[int, str]] = {}
    for dim_name, dim in recipe.dims.items():
        where = [(index, axis) for index, spec in enumerate(recipe.inputs) for axis, d in enumerate(spec.shape) if d == dim_name]
        if not where:
            continue
        current = args[where[0][0]].shape[where[0][1]]
        size = next((s for s in (current - 1, current + 1, dim.min, dim.max) if s != current and dim.min <= s <= dim.max and s > 0), None)
        if size is None:
            continue
        probe = list(args)
        for index, axis in where:
            probe[index] = _resized(probe[index], axis, size)
        try:
            shapes = _output_shapes(module, tuple(probe), recipe)
        except Exception as exc:
            log.info("output dims of '%s' not probed (the module failed at %s=%d): %s", dim_name, dim_name, size, exc)
            continue
        for name, before, after in zip(recipe.outputs, base, shapes or []):
            for axis, (a, b) in enumerate(zip(before, after)):
                if a != b and axis not in axes.get(name, {}):
                    axes.setdefault(name, {})[axis] = dim_name if (a, b) == (current, size) else f"{name}_{dim_name}_{axis}"
    return axes


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
        dynamic_shapes=_dynamic_shapes_for(module, recipe),
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

    output_axes = legacy_output_axes(module, args, recipe)
    torch.onnx.export(
        _traceable(module, args),
        args,
        str(path),
        dynamo=False,
        input_names=[s.name for s in recipe.inputs],
        output_names=list(recipe.outputs),
        dynamic_axes={**_legacy_axes(recipe), **output_axes} or None,
        opset_version=min(opset, 20),  # the TorchScript exporter stops at opset 20
        do_constant_folding=True,
    )
    if output_axes:
        shapes = _output_shapes(module, args, recipe) or []
        _pin_static_output_dims(path, dict(zip(recipe.outputs, shapes)), output_axes)


EXPORTERS = {"dynamo": _export_dynamo, "legacy": _export_legacy}


def export_onnx(module: "torch.nn.Module", recipe: Recipe, example: dict[str, np.ndarray], opset: int, path: Path) -> ExportResult:
    """Export ``module`` to ``path`` with the recipe's exporter choice; the graph is checked after."""
    import torch

    from edgekit.export.input_binding import bind_inputs_by_name

    _refuse_bfloat16_inputs(recipe)
    order = ["dynamo", "legacy"] if recipe.export.exporter == "auto" else [recipe.export.exporter]
    args = _example_args(recipe, example)
    module = bind_inputs_by_name(module, recipe)  # forward(input_ids, attention_mask) fed by name, whatever the recipe's order
    module = _with_flat_outputs(module, args, recipe)
    failures: dict[str, str] = {}
    started = time.perf_counter()
    for name in order:
        captured = io.StringIO()
        try:
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(captured):
                warnings.simplefilter("always")
                EXPORTERS[name](module, args, recipe, opset, path)
        except ExportError:
            raise
        except Exception as exc:  # exporters raise many types; all are reported with the op they name
            text = _failure_text(exc)
            failures[name] = text
            log.info("%s exporter failed: %s", name, text.splitlines()[0] if text else text)
            continue
        written = _file_opset(path)
        if written is not None and written > opset:  # the dynamo exporter writes its own opset when it cannot convert down
            failures[name] = f"it wrote opset {written}, above the requested opset {opset}"
            log.info("%s exporter: %s", name, failures[name])
            if name != order[-1]:
                continue
            raise ExportError(f"{recipe.path}: ONNX export of '{recipe.name}': the {name} exporter wrote opset {written}, "
                              f"above export.opset {opset}, which the target's runtime may not load",
                              hint=f"set export.exporter: legacy (it writes opset {min(opset, 20)}) or auto, or raise export.opset to {written}")  # fmt: skip
        check_and_infer(path)
        reason = None
        if failures:
            reason = "; ".join(f"{k}: {_summary(v)}" for k, v in failures.items())
            log.warning("exported with the %s exporter after: %s", name, reason)
        notes = _graph_warnings(caught)
        for note in notes:
            log.warning("%s exporter: %s", name, note)
        return ExportResult(path=path, exporter=name, opset=written or (opset if name == "dynamo" else min(opset, 20)),
                            seconds=time.perf_counter() - started, fallback_reason=reason, warnings=tuple(notes))
    raise _export_error(failures, recipe, opset)


def _refuse_bfloat16_inputs(recipe: Recipe) -> None:
    """bfloat16 inputs: the model exports, but ONNX Runtime's Python API (parity, evaluation, the device runner)
    cannot feed NumPy bfloat16 arrays; said here, before the export, rather than as its MLDataType error."""
    spec = next((s for s in recipe.inputs if s.dtype == "bfloat16"), None)
    if spec is not None:
        raise ExportError(f"{recipe.path}: inputs.{spec.name}: dtype bfloat16 cannot be fed to the exported graph: ONNX Runtime's "
                          "Python API, which parity, evaluation and the bundle's runner use, takes no NumPy bfloat16 arrays",
                          hint=f"declare '{spec.name}' as float32 (or float16) and cast inside the model (x.to(torch.bfloat16))")  # fmt: skip


def _file_opset(path: Path) -> int | None:
    """The main-domain opset the file at ``path`` imports (what the exporter really wrote)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - the checker after reports an unreadable file
        return None
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)


def _failure_text(exc: BaseException) -> str:
    """``exc`` as text with its causes: the dynamo exporter's own message is a generic "step 1/3" line and the
    real reason (a data-dependent branch, an unsupported op) is its ``__cause__``."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 4:
        seen.add(id(current))
        parts.append(_ANSI.sub("", f"{type(current).__name__}: {current}").strip())
        current = current.__cause__ or current.__context__
    return "\ncaused by ".join(parts)


#: Lines of an exporter's message that say nothing about the model (the dynamo exporter's boilerplate).
_BOILERPLATE = re.compile(r"^(#+ |TorchExportError: Failed to export the model with torch\.export|caused by $|The error above occurred"
                          r"|For more information|$)")


def _summary(text: str) -> str:
    """The informative lines of an exporter failure, joined (at most 300 characters)."""
    lines = [line.strip() for line in text.splitlines()]
    kept = [line.removeprefix("caused by ") for line in lines if line and not _BOILERPLATE.match(line)
            and not line.startswith(("[torch.onnx]", "Next steps", "- ", "This is step"))]
    kept = [line for line in kept if line] or [lines[0] if lines else text]
    return " | ".join(dict.fromkeys(kept[:3]))[:300]


def _graph_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    """The warnings that change what the graph computes: the tracer's ("converting a tensor to a Python boolean
    might cause the trace to be incorrect": a data-dependent branch frozen at the example's path), deduplicated."""
    from torch.jit._trace import TracerWarning

    notes: dict[str, None] = {}
    for warning in caught:
        if issubclass(warning.category, TracerWarning):
            where = f"{Path(warning.filename).name}:{warning.lineno}: " if warning.filename else ""
            notes[f"{where}{str(warning.message).strip().splitlines()[0][:300]}"] = None
    return list(notes)


def _with_flat_outputs(module: Any, args: tuple[Any, ...], recipe: Recipe) -> Any:
    """``module``, wrapped to return its outputs flat in the recipe's order when it returns a dict or nested
    sequences (:mod:`edgekit.export.flat_outputs`); a module that fails on the example is left to the exporters."""
    import torch

    from edgekit.export.flat_outputs import flattened_module, needs_flattening

    try:
        with torch.no_grad():
            result = module(*args)
    except Exception:  # noqa: BLE001 - the exporter reports what the module cannot do
        return module
    if not needs_flattening(result):
        return module
    flat = flattened_module(module, recipe, result)
    with torch.no_grad():
        count = len(flat(*args))
    if count != len(recipe.outputs):
        raise SourceError(f"{recipe.path}: the model returns {count} output tensors (nested ones counted), the recipe names "
                          f"{len(recipe.outputs)}: {list(recipe.outputs)}", hint="list one name per returned tensor under outputs, in order")  # fmt: skip
    return flat


def _export_error(failures: dict[str, str], recipe: Recipe, opset: int) -> ExportError:
    ops = {name: _unsupported_op(text) for name, text in failures.items()}
    op = next((o for o in ops.values() if o), None)
    detail = "\n".join(f"  {name} exporter: {_summary(text)}" for name, text in failures.items())
    node = None
    for text in failures.values():
        match = re.search(r"node[ :]+'?([\w./:-]+)'?", text)
        if match:
            node = match.group(1)
            break
    what = f"unsupported op {op}" if op else "export failed"
    where = f" at node {node}" if node else ""
    hint = (f"try a newer opset (export.opset, up to 23), the other exporter (export.exporter: legacy|dynamo), "
            f"or replace {op or 'the op'} in the model / register a custom op (torch.onnx custom translation table)")
    if any("data-dependent" in text or "GuardOnDataDependent" in text for text in failures.values()):
        what = "the model branches on a tensor's value (data-dependent control flow)"
        hint = ("compute both branches and pick with torch.where (or use torch.cond); export.exporter: legacy traces it but "
                "freezes the branch the example takes (reported in the manifest's export.warnings)")
    return ExportError(f"{recipe.path}: ONNX export of '{recipe.name}' failed: {what}{where} (opset {opset})\n{detail}", hint=hint)


def check_and_infer(path: Path) -> None:
    """``onnx.checker`` full check and in-place shape inference; problems raise ExportError."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
        onnx.shape_inference.infer_shapes_path(str(path), str(path))
    except Exception as exc:
        raise ExportError(f"the exported ONNX model {path} fails onnx.checker: {exc}", hint="report this with the recipe; try export.exporter: legacy") from None
