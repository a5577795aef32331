"""The manifest's ``io`` section: input specs from the recipe, output dtypes and shapes from the graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import ExportError
from edgekit.recipe import Recipe
from edgekit_runtime.signature import STRING_DTYPE


def _onnx_dtype(elem_type: int) -> str:
    import onnx

    if elem_type == onnx.TensorProto.STRING:
        return STRING_DTYPE
    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def _graph_inputs(graph: Any) -> dict[str, Any]:
    initializers = {i.name for i in graph.initializer}
    return {i.name: i for i in graph.input if i.name not in initializers}


def check_inputs(recipe: Recipe, onnx_path: Path) -> None:
    """The recipe's inputs against the graph's: each by name, rank and dtype, and no graph input left unlisted;
    the first mismatch is an ExportError naming both sides."""
    import onnx

    graph_inputs = _graph_inputs(onnx.load(str(onnx_path), load_external_data=False).graph)
    onnx_file = getattr(recipe.model, "kind", None) == "onnx"
    for spec in recipe.inputs:
        if spec.name not in graph_inputs:
            raise ExportError(
                f"{recipe.path}: input '{spec.name}' is not an input of the ONNX graph (it has {sorted(graph_inputs)})",
                hint="name the recipe's inputs after the graph's inputs (netron or onnx.load shows them)" if onnx_file
                else "make the recipe's inputs match the model's forward() arguments, in order",
            )
        tensor = graph_inputs[spec.name].type.tensor_type
        _check_rank(recipe, spec.name, list(spec.shape), tensor)
        if graph_inputs[spec.name].type.HasField("tensor_type") and tensor.elem_type:
            graph_dtype = _onnx_dtype(tensor.elem_type)
            if graph_dtype != spec.dtype:
                raise ExportError(f"{recipe.path}: inputs.{spec.name}: dtype {spec.dtype} in the recipe, but the ONNX graph "
                                  f"takes {graph_dtype}", hint=f"set inputs.{spec.name}.dtype to {graph_dtype}")  # fmt: skip
    extra = sorted(set(graph_inputs) - {s.name for s in recipe.inputs})
    if extra:
        raise ExportError(f"{recipe.path}: the ONNX graph has inputs the recipe does not list: {extra}",
                          hint=f"add {extra[0]} under inputs (name, dtype and shape as the graph has them)")


def io_section(recipe: Recipe, onnx_path: Path) -> dict[str, Any]:
    """Inputs/outputs (name, dtype, shape with dim names) and dim ranges, checked against the graph."""
    import onnx

    check_inputs(recipe, onnx_path)
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    inputs = []
    for spec in recipe.inputs:
        entry: dict[str, Any] = {"name": spec.name, "dtype": spec.dtype, "shape": list(spec.shape)}
        if spec.value is not None:  # what probes and benchmarks feed (a sample rate)
            entry["value"] = spec.value if isinstance(spec.value, bool) or spec.dtype.startswith(("float", "bfloat")) else int(spec.value)
        inputs.append(entry)
    graph_outputs = {o.name: o for o in graph.output}
    outputs = []
    for name in recipe.outputs:
        if name not in graph_outputs:
            raise ExportError(f"{recipe.path}: output '{name}' is not an output of the ONNX graph (it has {sorted(graph_outputs)})",
                              hint="set the recipe's outputs to the graph's output names")
        tensor = graph_outputs[name].type.tensor_type
        shape: list[int | str] = [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in tensor.shape.dim]
        outputs.append({"name": name, "dtype": _onnx_dtype(tensor.elem_type), "shape": shape})
    section: dict[str, Any] = {
        "inputs": inputs,
        "outputs": outputs,
        "dims": {name: {"min": d.min, "opt": d.opt, "max": d.max} for name, d in recipe.dims.items()},
    }
    if recipe.state:
        section["state"] = [{"input": s.input, "output": s.output} for s in recipe.state]
    constants = getattr(recipe.model, "constant_args", None)
    if constants:
        section["constant_args"] = {name: list(v) if isinstance(v, tuple) else v for name, v in constants.items()}
    return section


def _check_rank(recipe: Recipe, name: str, shape: list[int | str], tensor: Any) -> None:
    """A recipe input of another rank than the graph's (``[]`` against ``[1]``) fails here, not at the first call."""
    if not tensor.HasField("shape"):
        return
    graph_shape = [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in tensor.shape.dim]
    if len(graph_shape) != len(shape):
        raise ExportError(
            f"{recipe.path}: input '{name}' has shape {shape} (rank {len(shape)}) in the recipe but {graph_shape} "
            f"(rank {len(graph_shape)}) in the ONNX graph",
            hint="write the graph's shape under inputs (a scalar is shape: [])",
        )
