"""Run an ONNX model on calibration batches and stream chosen intermediate tensors into observers.

A temporary copy of the model lists the tensors as extra graph outputs (their element types come from
ONNX shape inference); ONNX Runtime runs it on the CPU with graph optimisations off, so every tensor
name of the original graph still exists. Each batch's activations go to the observers and are dropped
before the next batch runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.quantize.calibration.errors import CalibrationError
from edgekit.quantize.calibration.observers import Observer
from edgekit.quantize.calibration.onnx_files import external_data_files, load_model_proto
from edgekit.quantize.calibration.ranges import TensorRange

log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]
ObserverFactory = Callable[[str], Observer]

#: Op type -> input positions whose activations QDQ quantization needs (biases are derived, not calibrated).
ACTIVATION_INPUTS: dict[str, tuple[int, ...]] = {"MatMul": (0, 1), "Gemm": (0, 1), "Conv": (0, 1)}


def constant_tensors(graph: Any) -> set[str]:
    """Initializers, Constant outputs, and outputs of nodes computed from constants only."""
    constants = {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in constants for name in inputs)):
            constants.update(name for name in node.output if name)
    return constants


def default_activation_tensors(model: Any) -> list[str]:
    """Non-constant inputs of the top-level graph's MatMul/Gemm/Conv nodes, in graph order."""
    constants = constant_tensors(model.graph)
    names: dict[str, None] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        for position in ACTIVATION_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position] and node.input[position] not in constants:
                names[node.input[position]] = None
    return list(names)


def collect_activations(
    model_path: Path,
    tensor_names: Sequence[str] | None,
    batches: Iterable[Batch],
    observers: ObserverFactory,
    *,
    work_dir: Path | None = None,
) -> dict[str, TensorRange]:
    """Calibrate ``tensor_names`` (default: :func:`default_activation_tensors`) of the model at ``model_path``.

    ``batches`` yields ``{input name: array}`` (extra keys such as labels are ignored); ``observers``
    makes a fresh :class:`Observer` per tensor name, e.g. a :class:`CalibratorSpec`. ``work_dir`` holds
    the temporary model copy (external-data files are hard-linked there, or copied across file systems).
    Returns ``{tensor name: TensorRange}`` in the order of the tensor names.
    """
    model_path = Path(model_path)
    if isinstance(tensor_names, str):
        raise CalibrationError(f"tensor_names must be a list of tensor names, got the string {tensor_names!r}", hint=f"pass [{tensor_names!r}]")
    model = load_model_proto(model_path)
    names = list(dict.fromkeys(tensor_names if tensor_names is not None else default_activation_tensors(model)))
    if not names:
        raise CalibrationError(
            f"{model_path}: no tensors to calibrate" + (" (the model has no MatMul, Gemm or Conv with activation inputs)" if tensor_names is None else ""),
            hint="pass tensor_names explicitly",
        )
    graph_inputs = _check_tensor_names(model, names, model_path)
    _add_graph_outputs(model, [name for name in names if name not in graph_inputs], model_path)
    state = {name: observers(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="edgekit-calibration-", dir=work_dir) as tmp:
        session = _open_session(_write_copy(model, model_path, Path(tmp)), model_path)
        batch_count = _stream(session, names, graph_inputs, batches, state, model_path)
        del session
    if batch_count == 0:
        raise CalibrationError(f"{model_path}: no calibration batches were given", hint="data.calibration must yield at least one batch")
    ranges = {}
    for name, observer in state.items():
        try:
            ranges[name] = observer.compute()
        except CalibrationError as exc:
            raise CalibrationError(f"{model_path}: tensor '{name}': {exc.message}", hint=exc.hint) from None
    return ranges


def _check_tensor_names(model: Any, names: list[str], model_path: Path) -> set[str]:
    """Raise for names the graph does not compute; return the requested names that are graph inputs."""
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    graph_inputs = {value.name for value in graph.input} - initializers
    produced = {name for node in graph.node for name in node.output if name}
    for name in names:
        if name in initializers:
            raise CalibrationError(f"{model_path}: tensor '{name}' is a weight (initializer), not an activation", hint="calibrate activations only; weights are quantized from their values")
        if name not in graph_inputs and name not in produced:
            close = sorted(candidate for candidate in produced | graph_inputs if name.lower() in candidate.lower())[:5]
            raise CalibrationError(
                f"{model_path}: the graph has no tensor named '{name}'",
                hint=f"similar names: {', '.join(close)}" if close else "list tensor names with onnx.load(path).graph (node outputs and graph inputs)",
            )
    return {name for name in names if name in graph_inputs}


def _add_graph_outputs(model: Any, names: list[str], model_path: Path) -> None:
    import onnx

    existing = {value.name for value in model.graph.output}
    missing = [name for name in names if name not in existing]
    if not missing:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        raise CalibrationError(f"{model_path}: ONNX shape inference failed: {exc}", hint="check the model with onnx.checker") from None
    known = {value.name: value.type for value in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    for name in missing:
        element_type = known[name].tensor_type.elem_type if name in known and known[name].HasField("tensor_type") else 0
        if element_type == onnx.TensorProto.UNDEFINED:
            raise CalibrationError(
                f"{model_path}: the element type of tensor '{name}' cannot be inferred",
                hint="it may be produced by a custom op or be a sequence/map; calibrate a tensor next to it",
            )
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, element_type, None))


def _write_copy(model: Any, model_path: Path, directory: Path) -> Path:
    import onnx

    for location, source in external_data_files(model, model_path):
        target = directory / location
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            log.info("copying external data %s for calibration (hard link not possible)", source)
            shutil.copyfile(source, target)
    copy_path = directory / model_path.name
    onnx.save(model, str(copy_path))
    return copy_path


def _open_session(path: Path, model_path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise CalibrationError(f"{model_path}: ONNX Runtime cannot load the model for calibration: {_first_line(exc)}", hint="check the model's opset and IR version against the installed onnxruntime") from None


def _stream(session: Any, names: list[str], graph_inputs: set[str], batches: Iterable[Batch], state: dict[str, Observer], model_path: Path) -> int:
    input_names = [value.name for value in session.get_inputs()]
    run_names = [name for name in names if name not in graph_inputs]
    batch_count = 0
    for index, batch in enumerate(batches):
        if not isinstance(batch, dict):
            raise CalibrationError(f"{model_path}: calibration batch {index} is a {type(batch).__name__}, not a dict of input name -> array")
        missing = [name for name in input_names if name not in batch]
        if missing:
            raise CalibrationError(f"{model_path}: calibration batch {index} has no input {', '.join(repr(m) for m in missing)} (has {sorted(batch)})", hint=f"the model's inputs: {', '.join(input_names)}")
        feed = {name: batch[name] for name in input_names}
        try:
            values = session.run(run_names, feed) if run_names else []
        except Exception as exc:
            raise CalibrationError(f"{model_path}: ONNX Runtime failed on calibration batch {index}: {_first_line(exc)}", hint="check the batch's dtypes and shapes against the model inputs") from None
        activations = dict(zip(run_names, values))
        for name in names:
            array = feed[name] if name in graph_inputs else activations[name]
            try:
                state[name].update(np.asarray(array))
            except CalibrationError as exc:
                raise CalibrationError(f"{model_path}: tensor '{name}', calibration batch {index}: {exc.message}", hint=exc.hint) from None
        del values, activations
        batch_count += 1
    return batch_count


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
