"""Declared output shapes of an ONNX source checked against a real run, and repaired.

A file from another toolchain can declare an output shape that its graph does not produce (a captcha OCR model
declared ``[1, seqlen]`` and produced ``[T, 1, 8210]``). ONNX Runtime only warns about that; edgekit would copy the
wrong shape into the bundle's ``io`` and fail far later. :func:`repair_declared_outputs` runs the graph with its
declared output shapes cleared at the recipe's min, opt and max dims, and rewrites each disagreeing declaration:
an axis whose size follows a recipe dim takes that dim's name, one that changes otherwise becomes a dynamic dim
``<output>_dim<axis>``, one that never changes keeps its size. Each rewrite is one note for the build log and the
manifest's ``export.source_notes``. A run that fails, or an output that is not a tensor, stops the build naming
the output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgekit.data import dims_at, fit_batch, model_inputs
from edgekit.errors import SourceError
from edgekit.recipe import Recipe

Shape = list[int | str]


def repair_declared_outputs(path: Path, recipe: Recipe, batch: Mapping[str, np.ndarray]) -> list[str]:
    """Check the declared shapes of ``path``'s outputs against runs of the graph on ``batch`` fitted to the
    recipe's min/opt/max dims; rewrite the ones that disagree in place and return one note per rewritten output."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    runs = _observed_shapes(model, recipe, batch)
    notes: list[str] = []
    for value in model.graph.output:
        if not value.type.HasField("tensor_type"):
            continue
        declared = _declared(value)
        observed = [run[value.name] for run in runs]
        if all(_agrees(declared, shape, dims) for shape, dims in zip(observed, (dims for dims, _ in _points(recipe)))):
            continue
        repaired = _shape_from_runs(value.name, observed, [dims for dims, _ in _points(recipe)])
        _write_shape(value, repaired)
        notes.append(f"output '{value.name}': the file declares shape {_show(declared)} but the graph produces "
                     f"{' / '.join(str(list(s)) for s in _distinct(observed))} at the recipe's dims; declared shape rewritten to {_show(repaired)}")
    if notes:
        onnx.save(model, str(path), save_as_external_data=model.ByteSize() > 1_800_000_000, location=path.name + ".data")
    return notes


def _points(recipe: Recipe) -> list[tuple[dict[str, int], str]]:
    """The dims the graph is run at: min, opt and max (each once)."""
    points: list[tuple[dict[str, int], str]] = []
    points_named: tuple[Literal["min", "opt", "max"], ...] = ("min", "opt", "max")
    for point in points_named:
        dims = dims_at(recipe, point)
        if all(dims != seen for seen, _ in points):
            points.append((dims, point))
    return points


def _observed_shapes(model: Any, recipe: Recipe, batch: Mapping[str, np.ndarray]) -> list[dict[str, tuple[int, ...]]]:
    """Output name -> shape, one dict per point of :func:`_points`, from the graph with its output shapes cleared
    (so neither onnx nor ONNX Runtime trusts the declarations while running it)."""
    import onnx
    import onnxruntime as ort

    cleared = onnx.ModelProto()
    cleared.CopyFrom(model)
    for value in cleared.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(cleared.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise SourceError(f"{recipe.path}: model.path: ONNX Runtime cannot load the graph to check its output shapes: {_first_line(exc)}",
                          hint="open the file with onnxruntime.InferenceSession to see what fails; the file's producer has to fix it") from None
    names = [o.name for o in session.get_outputs()]
    runs = []
    for dims, point in _points(recipe):
        feed = fit_batch(recipe.inputs, model_inputs(recipe, dict(batch)), dims)
        try:
            arrays = session.run(None, feed)
        except Exception as exc:
            raise SourceError(f"{recipe.path}: the ONNX source does not run at the recipe's {point} dims {dims}: {_first_line(exc)}",
                              hint="check the recipe's dims (min/opt/max) against the sizes the model accepts") from None
        for name, array in zip(names, arrays):
            if not isinstance(array, np.ndarray):
                raise SourceError(f"{recipe.path}: output '{name}' of the ONNX source is a {type(array).__name__}, not a tensor",
                                  hint=f"list only tensor outputs under outputs, or remove '{name}' from the graph's outputs")
        runs.append({name: tuple(int(s) for s in np.shape(array)) for name, array in zip(names, arrays)})
    return runs


def _declared(value: Any) -> Shape | None:
    """The declared shape (None if the file declares no shape); unnamed dynamic dims read as '?'."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else "?") for d in tensor.shape.dim]


def _agrees(declared: Shape | None, observed: Sequence[int], dims: Mapping[str, int]) -> bool:
    """Does a run's shape fit the declaration? A named dim that is a recipe dim must have that dim's size."""
    if declared is None:
        return True
    if len(declared) != len(observed):
        return False
    for want, got in zip(declared, observed):
        if isinstance(want, int) and want != got:
            return False
        if isinstance(want, str) and want in dims and dims[want] != got:
            return False
    return True


def _shape_from_runs(name: str, observed: Sequence[Sequence[int]], dims: Sequence[Mapping[str, int]]) -> Shape:
    """The shape the runs show: a recipe dim's name where an axis follows it, a size that never changes, else a
    dynamic dim named after the output."""
    ranks = {len(shape) for shape in observed}
    if len(ranks) != 1:
        raise SourceError(f"output '{name}' of the ONNX source changes rank with the input sizes ({', '.join(str(list(s)) for s in observed)})",
                          hint="edgekit bundles need a fixed output rank; export the model so that the output's rank does not depend on the inputs")
    shape: Shape = []
    for axis in range(ranks.pop()):
        sizes = [run[axis] for run in observed]
        follows = [dim for dim in dims[0] if any(point[dim] != 1 for point in dims) and all(point[dim] == size for point, size in zip(dims, sizes))]
        if len(set(sizes)) == 1 and (len(observed) > 1 or not follows):
            shape.append(sizes[0])
        elif len(follows) == 1:
            shape.append(follows[0])
        else:
            shape.append(f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_dim{axis}")
    return shape


def _write_shape(value: Any, shape: Shape) -> None:
    tensor_shape = value.type.tensor_type.shape
    tensor_shape.Clear()
    for size in shape:
        dim = tensor_shape.dim.add()
        if isinstance(size, str):
            dim.dim_param = size
        else:
            dim.dim_value = size


def _distinct(shapes: Sequence[Sequence[int]]) -> list[Sequence[int]]:
    return list(dict.fromkeys(tuple(s) for s in shapes))


def _show(shape: Shape | None) -> str:
    return "(none)" if shape is None else "[" + ", ".join(str(s) for s in shape) + "]"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
