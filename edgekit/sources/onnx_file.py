"""Model source: an existing ``.onnx`` file. Export is skipped; there is no PyTorch reference, so
parity is not checked and accuracy is measured against this FP32 graph run by ONNX Runtime.

Files from other toolchains (Paddle2ONNX, older exporters) need two repairs that an export never does:

* dims written as ``dim_value: -1`` (or 0, or neither value nor name) are dynamic dims without a name;
  they are named (inputs after the recipe's dim names, outputs by shape inference or after the output)
  and each renaming is noted in the manifest's ``export.source_notes``.
* a graph below the opset a precision needs (per-channel int8's ``DequantizeLinear(axis)`` is opset 13)
  is upgraded with onnx's version converter and checked against the original on the sample batches;
  if that fails, static int8 falls back to per-tensor scales, which older opsets support. Both are
  recorded in ``export.opset_conversion``. The user of a third-party file cannot re-export it, so no
  message here tells them to.
* a graph above the target's opset (``build.opset`` of the target profile, or the recipe's ``export.opset``)
  is converted down to it the same way, checked the same way, and kept as it is (with a note) when that
  fails: a device runtime refuses opsets newer than it knows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit import onnx_save
from edgekit.errors import BuildError, SourceError
from edgekit.onnx_save import EXTERNAL_DATA_BYTES
from edgekit.precision import Precision
from edgekit.quantize.float_writers import FORMAT_OPSET
from edgekit.recipe import OnnxSource, Recipe
from edgekit.sources.base import LoadedModel
from edgekit_runtime.golden import row_cosine_min
from edgekit_runtime.hashing import sha256_file

log = logging.getLogger(__name__)

#: The lowest main-domain opset the graph handed to each precision's writer must have, and why.
OPSET_NEEDED: dict[Precision | str, tuple[int, str]] = {
    Precision.INT8: (13, "per-channel int8 writes DequantizeLinear with an axis attribute (opset 13)"),
    "auto": (13, "--precision auto's sensitivity analysis writes per-axis QuantizeLinear (opset 13)"),
    **{p: (opset, f"{p.value} writes its DequantizeLinear at opset {opset}") for p, (opset, _) in FORMAT_OPSET.items()},
}
#: Precisions that can still be built when the upgrade fails, and the recipe change that makes them work.
PER_TENSOR_FALLBACK = {Precision.INT8: "per-tensor int8 (quantization.per_channel: false): opset 10+ QuantizeLinear/DequantizeLinear have no axis"}


def main_opset(model: Any) -> int | None:
    """The model's opset of the default ONNX domain (None if it imports none)."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)


def load_onnx_file(spec: OnnxSource, recipe: Recipe, workdir: Path) -> LoadedModel:
    import onnx

    path = recipe.resolve(spec.path)
    if not path.is_file():
        raise SourceError(f"{recipe.path}: model.path: ONNX file not found: {path}", hint="paths are relative to the recipe file")
    try:
        model = onnx.load(str(path), load_external_data=False)
        external = sorted({entry.value for tensor in _external_tensors(model) for entry in tensor.external_data
                           if entry.key == "location"})  # fmt: skip
        if external:
            from onnx.external_data_helper import load_external_data_for_model

            load_external_data_for_model(model, str(path.parent))
        declared = _declare_missing_shapes(model, recipe)  # ONNX Runtime runs such files; the checker refuses them
        # past protobuf's 2 GiB the graph cannot be checked in memory: the file is, with its .data beside it
        onnx.checker.check_model(str(path) if is_large(model) else model, full_check=False)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(f"{recipe.path}: model.path {path} is not a valid ONNX model: {first_line}",
                          hint=_invalid_hint(first_line, path)) from None
    notes = [*declared, *_separate_output_tensors(model), *name_dynamic_dims(model, recipe)]
    onnx_path = path
    if notes:  # the bundle's graph is the repaired copy; the source hash stays the user's file
        onnx_path = workdir / "source.onnx"
        save_onnx(model, onnx_path)
    return LoadedModel(
        kind="onnx",
        description=str(path),
        onnx_path=onnx_path,
        exporter="none",
        file_sha256=_source_sha256(path, external),
        details={"opset": main_opset(model), "notes": notes,
                 "passthrough_outputs": sorted({v.name for v in model.graph.output} & {v.name for v in model.graph.input}), "producer": " ".join(filter(None, (model.producer_name, model.producer_version))) or None},
    )




def is_large(model: Any) -> bool:
    """Whether ``model`` (weights loaded) is too big to serialise as one protobuf (:data:`EXTERNAL_DATA_BYTES`)."""
    return model.ByteSize() > EXTERNAL_DATA_BYTES


def save_onnx(model: Any, path: Path) -> None:
    """Save ``model`` at ``path``; past :data:`EXTERNAL_DATA_BYTES` its weights go to ``<path>.data`` beside it."""
    onnx_save.save_onnx(model, path, external=is_large(model))


def _invalid_hint(first_line: str, path: Path) -> str:
    """The fix for the checker's or loader's first line about the file at ``path``."""
    if "TensorProto" in first_line and ("outside the directory" in first_line or "absolute path" in first_line):
        return (f"its external data files must sit in {path.parent} (or below it), named by relative paths; they are not read "
                "from anywhere else")
    if "2GB" in first_line or "2 GB" in first_line or "protobuf" in first_line.lower():
        return ("the graph is over protobuf's 2 GiB limit: save it with its weights as external data "
                "(onnx.save(model, path, save_as_external_data=True)) and keep the .data file beside it")
    return "check that the file was copied completely (size, hash), or open it with onnx.load to see what its producer wrote"


def _declare_missing_shapes(model: Any, recipe: Recipe) -> list[str]:
    """Give graph inputs that declare a dtype but no shape the recipe's shape, and such outputs the shape ONNX's
    inference finds; one note per tensor so declared."""
    notes: list[str] = []
    specs = {spec.name: spec for spec in recipe.inputs}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and not tensor.HasField("shape") and value.name in specs:
            for size in specs[value.name].shape:
                dim = tensor.shape.dim.add()
                if isinstance(size, int):
                    dim.dim_value = size
                else:
                    dim.dim_param = size
            notes.append(f"input '{value.name}' declared no shape: {list(specs[value.name].shape)} from the recipe")
    missing = [v for v in model.graph.output if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if missing:
        import onnx

        try:
            inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
        except Exception:  # noqa: BLE001 - past 2 GB, or a graph inference cannot follow: the checker says what is missing
            inferred = {}
        for value in missing:
            found = inferred.get(value.name)
            if found is not None and found.type.tensor_type.HasField("shape"):
                value.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)
                dims = [d.dim_param or d.dim_value for d in found.type.tensor_type.shape.dim]
                notes.append(f"output '{value.name}' declared no shape: {dims} inferred")
    return notes


def _separate_output_tensors(model: Any) -> list[str]:
    """Graph outputs listed twice are listed once, and an output that is an initializer is fed through an Identity
    node: fp16 conversion and the int8 writers give every output a node of its own and would define the name twice."""
    from onnx import helper

    notes: list[str] = []
    seen: set[str] = set()
    kept = []
    for value in model.graph.output:
        if value.name in seen:
            notes.append(f"output '{value.name}' was listed twice in the graph: once now")
            continue
        seen.add(value.name)
        kept.append(value)
    if len(kept) < len(model.graph.output):
        del model.graph.output[:]
        model.graph.output.extend(kept)
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    for value in model.graph.output:
        tensor = initializers.get(value.name)
        if tensor is None:
            continue
        inner = f"{value.name}__edgekit_constant"
        tensor.name = inner
        for node in model.graph.node:  # other nodes that read the constant read it under its new name
            node.input[:] = [inner if name == value.name else name for name in node.input]
        model.graph.node.append(helper.make_node("Identity", [inner], [value.name], name=f"{value.name}__edgekit_output"))
        notes.append(f"output '{value.name}' is a constant of the graph: fed through an Identity node")
    return notes


def _external_tensors(model: Any) -> list[Any]:
    """The model's tensors whose data live in external files (initializers and node attributes, subgraphs too)."""
    from onnx.external_data_helper import uses_external_data

    def tensors(graph: Any) -> Any:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from tensors(subgraph)

    return [tensor for tensor in tensors(model.graph) if uses_external_data(tensor)]


def _source_sha256(path: Path, external: Sequence[str]) -> str:
    """The source's hash: the file's own, or, with external data, one over the file and each data file (so that other
    weights beside the same graph are another source)."""
    if not external:
        return sha256_file(path)
    import hashlib

    digest = hashlib.sha256(f"model\0{sha256_file(path)}\n".encode())
    for location in external:
        digest.update(f"external\0{location}\0{sha256_file(path.parent / location)}\n".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------- dims


def _unnamed(dim: Any) -> bool:
    """``dim_value`` -1 or 0, or neither a value nor a name: a dynamic dim some exporters leave unnamed."""
    return not dim.dim_param and (not dim.HasField("dim_value") or dim.dim_value <= 0)


def _written(dim: Any) -> str:
    return f"dim_value: {dim.dim_value}" if dim.HasField("dim_value") else "no dim_value or dim_param"


def _dim_name(tensor: str, axis: int) -> str:
    return f"{re.sub(r'[^0-9A-Za-z_]', '_', tensor)}_dim{axis}"


def _rename_to_recipe_dims(graph: Any, specs: Mapping[str, Any], initializers: set[str]) -> list[str]:
    """Dims the file names otherwise than the recipe (``N`` where the recipe says ``batch``) take the recipe's name,
    on every input and output that carries them: the bundle declares only the recipe's dims. One note per name."""
    renames: dict[str, str] = {}
    for value in graph.input:
        spec = specs.get(value.name)
        if spec is None or value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            recipe_dim = spec.shape[axis] if axis < len(spec.shape) else None
            if dim.dim_param and isinstance(recipe_dim, str) and dim.dim_param != recipe_dim:
                renames.setdefault(dim.dim_param, recipe_dim)
    if not renames:
        return []
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]
    return [f"dim '{old}' of the file is the recipe's dim '{new}' (renamed on the graph's inputs and outputs)" for old, new in renames.items()]


def name_dynamic_dims(model: Any, recipe: Recipe) -> list[str]:
    """Name every unnamed dynamic dim of the graph's inputs and outputs, in place; returns one note per
    renamed dim. An input dim takes the recipe's dim name at that axis (``<input>_dim<axis>`` where the
    recipe fixes a size there); an output dim takes what shape inference derives from the named inputs
    (e.g. ``batch``), else ``<output>_dim<axis>``."""
    import onnx

    graph = model.graph
    specs = {spec.name: spec for spec in recipe.inputs}
    initializers = {init.name for init in graph.initializer}
    notes = _rename_to_recipe_dims(graph, specs, initializers)
    for value in graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        spec = specs.get(value.name)
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not _unnamed(dim):
                continue
            recipe_dim = spec.shape[axis] if spec is not None and axis < len(spec.shape) else None
            name = recipe_dim if isinstance(recipe_dim, str) else _dim_name(value.name, axis)
            notes.append(f"input '{value.name}' axis {axis}: {_written(dim)} in the file, treated as the dynamic dim '{name}'")
            dim.Clear()
            dim.dim_param = name
    unnamed_outputs = [(value, axis) for value in graph.output if value.type.HasField("tensor_type")
                       for axis, dim in enumerate(value.type.tensor_type.shape.dim) if _unnamed(dim)]
    if not unnamed_outputs:
        return notes
    written = {(value.name, axis): _written(value.type.tensor_type.shape.dim[axis]) for value, axis in unnamed_outputs}
    for value, axis in unnamed_outputs:
        value.type.tensor_type.shape.dim[axis].Clear()  # unknown, so inference may fill it in
    try:
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    except Exception as exc:  # inference is a nicety here; the names below are still valid
        log.info("shape inference of the ONNX source failed while naming output dims: %s", exc)
        inferred = {}
    for value, axis in unnamed_outputs:
        dim = value.type.tensor_type.shape.dim[axis]
        found = inferred.get(value.name)
        found_dims = found.type.tensor_type.shape.dim if found is not None else []
        if axis < len(found_dims) and found_dims[axis].dim_param:
            name, how = found_dims[axis].dim_param, "inferred from the inputs as"
        elif axis < len(found_dims) and found_dims[axis].dim_value > 0:
            dim.dim_value = found_dims[axis].dim_value
            notes.append(f"output '{value.name}' axis {axis}: {written[(value.name, axis)]} in the file, inferred from the inputs as size {dim.dim_value}")
            continue
        else:
            name, how = _dim_name(value.name, axis), "named"
        dim.dim_param = name
        notes.append(f"output '{value.name}' axis {axis}: {written[(value.name, axis)]} in the file, {how} the dynamic dim '{name}'")
    return notes


# ---------------------------------------------------------------------------------------------- opset


@dataclass(frozen=True)
class OpsetConversion:
    """What happened to an ONNX source's opset for the chosen precision (``export.opset_conversion``)."""

    original_opset: int
    needed_opset: int
    reason: str
    converted_opset: int | None = None
    max_abs_diff: float | None = None  # converted vs original graph on the sample batches
    error: str | None = None
    fallback: str | None = None

    def describe(self) -> str:
        way = "upgrade" if self.needed_opset > self.original_opset else "conversion"
        if self.fallback is not None:
            return f"opset {self.original_opset} kept ({way} to {self.needed_opset} failed: {self.error}); {self.fallback}"
        done = "upgraded" if way == "upgrade" else "converted"
        return f"opset {self.original_opset} {done} to {self.converted_opset} ({self.reason}); max abs diff {self.max_abs_diff:.2g} on the samples"

    def to_manifest(self) -> dict[str, Any]:
        return {
            "original_opset": self.original_opset,
            "needed_opset": self.needed_opset,
            "converted_opset": self.converted_opset,
            "reason": self.reason,
            "max_abs_diff": self.max_abs_diff,
            "error": self.error,
            "fallback": self.fallback,
        }


def upgrade_source_opset(path: Path, recipe: Recipe, precision: Precision, auto: bool,
                         feeds: Sequence[Mapping[str, np.ndarray]]) -> tuple[Recipe, OpsetConversion | None]:
    """Upgrade the ONNX source at ``path`` in place to the opset the precision needs (None when it has it).

    The converted graph must load in ONNX Runtime and match the original on ``feeds`` within the recipe's
    parity tolerance; otherwise the original stays, and static int8 continues per-tensor (the returned
    recipe says so), while precisions without a fallback raise :class:`BuildError`."""
    import onnx

    needed = OPSET_NEEDED.get("auto" if auto else precision)
    if needed is None:
        return recipe, None
    opset, reason = needed
    model = onnx.load(str(path), load_external_data=True)
    original = main_opset(model) or 0
    if original >= opset:
        return recipe, None
    conversion = _converted_in_place(path, model, opset, reason, feeds, recipe)
    if conversion.error is None:
        return recipe, conversion
    error = conversion.error
    where = f"{recipe.path}: model.path {recipe.resolve(recipe.model.path)}"  # type: ignore[union-attr]
    fallback = PER_TENSOR_FALLBACK.get(precision) if not auto and original >= 10 else None  # QuantizeLinear is opset 10
    if fallback is None:
        what = "--precision auto" if auto else f"precision {precision.value}"
        supported = "fp32, fp16" + (", int8 with per-tensor scales (quantization.per_channel: false), int8-dynamic" if original >= 11 else "")
        raise BuildError(
            f"{where} is opset {original}; {what} needs opset {opset} ({reason}), and upgrading it with onnx's "
            f"version converter failed: {error}",
            hint=f"build an explicit precision that opset {original} supports ({supported}), or upgrade the file with the tool "
            "that produced it (for Paddle models: paddle2onnx --opset_version 13)",
        )
    log.warning("opset %d -> %d conversion failed (%s); %s", original, opset, error, fallback)
    quantization = recipe.build.quantization.model_copy(update={"per_channel": False})
    recipe = recipe.model_copy(update={"build": recipe.build.model_copy(update={"quantization": quantization})})
    return recipe, OpsetConversion(original, opset, reason, error=error, fallback=fallback)


def needed_opset(precision: Precision, auto: bool) -> int:
    """The least opset the precision's writers need (0 when any will do)."""
    needed = OPSET_NEEDED.get("auto" if auto else precision)
    return needed[0] if needed is not None else 0


def convert_to_target_opset(path: Path, recipe: Recipe, opset: int, target: str,
                            feeds: Sequence[Mapping[str, np.ndarray]]) -> OpsetConversion | None:
    """Convert the ONNX source at ``path`` in place down to ``opset`` (the target's, or the recipe's export.opset)
    when it is newer: a file stamped opset 28 does not load in a device runtime that reads opset 18 (ONNX Runtime
    refuses opsets it does not know; TensorRT's parser too). The converted graph must pass the checker and match
    the original on ``feeds``; otherwise the original stays, said in the returned record and the log: it is
    refused at deploy (the agent's self-check) where the device's runtime cannot load it."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    original = main_opset(model) or 0
    if original <= opset:
        return None
    reason = f"{target} builds at opset {opset}"
    conversion = _converted_in_place(path, model, opset, reason, feeds, recipe)
    if conversion.error is None:
        return conversion
    fallback = f"the device's runtime must load opset {original} (the agent's self-check refuses the bundle where it cannot)"
    log.warning("opset %d -> %d conversion failed (%s); %s", original, opset, conversion.error, fallback)
    return replace(conversion, fallback=fallback)


def _converted_in_place(path: Path, model: Any, opset: int, reason: str, feeds: Sequence[Mapping[str, np.ndarray]],
                        recipe: Recipe) -> OpsetConversion:
    """Convert ``model`` (the file at ``path``) to ``opset``; saved over ``path`` when it passes the checker and matches
    the original on ``feeds``, else left alone with the ``error`` said in the record."""
    import onnx

    original = main_opset(model) or 0
    try:
        converted = _convert(model, opset)
        if not is_large(converted):  # a graph past 2 GiB is checked as a file after saving (pipeline's check_and_infer)
            onnx.checker.check_model(converted, full_check=True)
        max_abs_diff = _compare_graphs(model, converted, feeds, recipe)
    except _ConversionMismatch as exc:
        return OpsetConversion(original, opset, reason, error=str(exc))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return OpsetConversion(original, opset, reason, error=f"{type(exc).__name__}: {first}")
    save_onnx(converted, path)
    log.info("ONNX source converted from opset %d to %d: %s", original, opset, reason)
    return OpsetConversion(original, opset, reason, converted_opset=main_opset(converted), max_abs_diff=max_abs_diff)


class _ConversionMismatch(Exception):
    pass


def _convert(model: Any, opset: int) -> Any:
    from onnx import version_converter

    converted = version_converter.convert_version(model, opset)
    if converted.ir_version < 7:  # opset 13 needs IR 7
        converted.ir_version = 7
    return converted


def _compare_graphs(original: Any, converted: Any, feeds: Sequence[Mapping[str, np.ndarray]], recipe: Recipe) -> float:
    """Run both graphs on ``feeds``; the largest difference, or :class:`_ConversionMismatch` past parity."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (original, converted)]
    parity = recipe.export.parity
    worst = 0.0
    for feed in feeds:
        before, after = (dict(zip([o.name for o in s.get_outputs()], s.run(None, dict(feed)))) for s in sessions)
        for name, expected in before.items():
            got = after.get(name)
            if got is None or np.shape(got) != np.shape(expected):
                raise _ConversionMismatch(f"output '{name}' changed shape ({np.shape(expected)} -> {np.shape(got)}) after conversion")
            if np.asarray(expected).dtype.kind not in "biuf":  # strings (labels): equal, or the conversion changed them
                if not np.array_equal(np.asarray(expected), np.asarray(got)):
                    raise _ConversionMismatch(f"the converted graph's output '{name}' holds other values than the original's")
                continue
            e, g = np.asarray(expected, dtype=np.float64), np.asarray(got, dtype=np.float64)
            diff = float(np.abs(e - g).max(initial=0.0))
            worst = max(worst, diff)
            if not np.allclose(g, e, atol=parity.atol, rtol=parity.rtol, equal_nan=True) or (
                    np.asarray(expected).dtype.kind == "f" and row_cosine_min(g, e) < parity.min_cosine):
                raise _ConversionMismatch(f"the converted graph's output '{name}' differs from the original's by up to {diff:.3g} "
                                          f"(parity atol {parity.atol:g}, rtol {parity.rtol:g})")
    return worst
