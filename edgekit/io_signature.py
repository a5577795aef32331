"""The manifest's ``io`` section: input specs from the recipe, output dtypes and shapes from the graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import ExportError
from edgekit.recipe import Recipe


def _onnx_dtype(elem_type: int) -> str:
    import onnx

    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def io_section(recipe: Recipe, onnx_path: Path) -> dict[str, Any]:
    """Inputs/outputs (name, dtype, shape with dim names) and dim ranges, checked against the graph."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    graph_inputs = {i.name: i for i in graph.input if i.name not in initializers}
    inputs = []
    for spec in recipe.inputs:
        if spec.name not in graph_inputs:
            raise ExportError(
                f"{recipe.path}: input '{spec.name}' is not an input of the ONNX graph (it has {sorted(graph_inputs)})",
                hint="make the recipe's inputs match the model's forward() arguments, in order",
            )
        inputs.append({"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)})
    extra = sorted(set(graph_inputs) - {s.name for s in recipe.inputs})
    if extra:
        raise ExportError(f"{recipe.path}: the ONNX graph has inputs the recipe does not list: {extra}", hint="add them under inputs")
    graph_outputs = {o.name: o for o in graph.output}
    outputs = []
    for name in recipe.outputs:
        if name not in graph_outputs:
            raise ExportError(f"{recipe.path}: output '{name}' is not an output of the ONNX graph (it has {sorted(graph_outputs)})",
                              hint="set the recipe's outputs to the graph's output names")
        tensor = graph_outputs[name].type.tensor_type
        shape: list[int | str] = [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in tensor.shape.dim]
        outputs.append({"name": name, "dtype": _onnx_dtype(tensor.elem_type), "shape": shape})
    return {
        "inputs": inputs,
        "outputs": outputs,
        "dims": {name: {"min": d.min, "opt": d.opt, "max": d.max} for name, d in recipe.dims.items()},
    }
