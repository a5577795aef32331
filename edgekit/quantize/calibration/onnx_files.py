"""The files an ONNX model is made of (the model file and its external-data files)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgekit.quantize.calibration.errors import CalibrationError


def load_model_proto(model_path: Path) -> Any:
    """The model's graph without its external data (weights stay on disk)."""
    import onnx

    if not model_path.is_file():
        raise CalibrationError(f"ONNX model not found: {model_path}", hint="calibrate the exported model file")
    try:
        return onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise CalibrationError(f"{model_path} is not a readable ONNX model: {exc}", hint="re-export the model") from None


def _tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def external_data_files(model: Any, model_path: Path) -> list[tuple[str, Path]]:
    """``(location as written in the model, resolved path)`` of every external-data file, sorted and unique.

    Raises :class:`CalibrationError` when a location escapes the model's directory or the file is missing.
    """
    import onnx

    base = model_path.parent.resolve()
    locations = {
        entry.value
        for tensor in _tensors(model.graph)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    files = []
    for location in sorted(locations):
        path = (base / location).resolve()
        if not path.is_relative_to(base):
            raise CalibrationError(f"{model_path}: external data location '{location}' is outside the model's directory", hint="keep weight files next to the model")
        if not path.is_file():
            raise CalibrationError(f"{model_path}: external data file '{location}' is missing ({path})", hint="copy the weight files together with the model")
        files.append((location, path))
    return files
