"""Recipe data: loading sample/calibration/evaluation batches, and shaping inputs for checks.

A batch is a ``dict[str, np.ndarray]`` keyed by input name; evaluation batches may carry extra keys
(``labels``) that are never fed to the model.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from edgekit.errors import RecipeError
from edgekit.recipe import CallableData, DataSource, NpzData, Recipe, TensorSpec
from edgekit.sources._util import import_callable

Batch = dict[str, np.ndarray]


def load_batches(recipe: Recipe, source: DataSource, field: str) -> list[Batch]:
    """Load ``data.<field>`` of the recipe, checking every batch against the recipe's inputs."""
    where = f"{recipe.path}: data.{field}"
    if isinstance(source, CallableData):
        fn = import_callable(source.callable, RecipeError, where, recipe.base_dir)
        try:
            batches = list(fn(**source.kwargs))
        except Exception as exc:
            raise RecipeError(f"{where}: '{source.callable}' raised {type(exc).__name__}: {exc}") from exc
    elif isinstance(source, NpzData):
        directory = recipe.resolve(source.npz_dir)
        files = sorted(directory.glob("*.npz")) if directory.is_dir() else []
        if not files:
            raise RecipeError(f"{where}: no .npz files in {directory}", hint="one .npz per batch, arrays keyed by input name")
        batches = []
        for path in files:
            with np.load(path, allow_pickle=False) as npz:
                batches.append({k: npz[k] for k in npz.files})
    else:  # pragma: no cover - the schema admits only the two kinds
        raise TypeError(source)
    if not batches:
        raise RecipeError(f"{where}: the data source returned no batches")
    for index, batch in enumerate(batches):
        check_batch(recipe, batch, f"{where} batch {index}")
    return batches


def check_batch(recipe: Recipe, batch: object, where: str) -> None:
    if not isinstance(batch, dict):
        raise RecipeError(f"{where}: expected a dict of input name -> array, got {type(batch).__name__}")
    for spec in recipe.inputs:
        if spec.name not in batch:
            raise RecipeError(f"{where}: missing input '{spec.name}' (has {sorted(batch)})")
        array = batch[spec.name]
        if not isinstance(array, np.ndarray):
            raise RecipeError(f"{where}: input '{spec.name}' is a {type(array).__name__}, not a NumPy array")
        if array.dtype != np.dtype(spec.dtype):
            raise RecipeError(f"{where}: input '{spec.name}' has dtype {array.dtype}, the recipe says {spec.dtype}")
        if array.ndim != len(spec.shape):
            raise RecipeError(f"{where}: input '{spec.name}' has shape {array.shape}, the recipe says {list(spec.shape)}")
        for axis, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            if isinstance(dim, int) and dim != size:
                raise RecipeError(f"{where}: input '{spec.name}' axis {axis} is {size}, the recipe fixes it at {dim}")


def model_inputs(recipe: Recipe, batch: Batch) -> Batch:
    """The batch without extra keys such as labels."""
    return {spec.name: batch[spec.name] for spec in recipe.inputs}


def fit_axis(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """``array`` cut (or tiled and cut) to ``size`` along ``axis``."""
    current = array.shape[axis]
    if current == size:
        return array
    if current > size:
        return np.take(array, np.arange(size), axis=axis)
    reps = [1] * array.ndim
    reps[axis] = -(-size // current)
    return np.take(np.tile(array, reps), np.arange(size), axis=axis)


def fit_batch(recipe: Recipe, batch: Batch, dims: dict[str, int]) -> Batch:
    """Cut or tile each dynamic axis of a real batch to the given dim values."""
    out = {}
    for spec in recipe.inputs:
        array = batch[spec.name]
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, str):
                array = fit_axis(array, axis, dims[dim])
        out[spec.name] = np.require(array, requirements="C")  # ascontiguousarray would make a rank-0 input rank 1
    return out


def random_batch(recipe: Recipe, dims: dict[str, int], rng: np.random.Generator) -> Batch:
    """Random inputs at the given dim values, within each input's ``low``/``high`` when set."""
    out = {}
    for spec in recipe.inputs:
        shape = recipe.shape_at(spec, dims)
        out[spec.name] = random_tensor(spec, shape, rng)
    return out


def random_tensor(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(spec.dtype) if spec.dtype != "bfloat16" else np.dtype(np.float32)
    if dtype.kind == "f":
        low = 0.0 if spec.low is None else spec.low
        high = 1.0 if spec.high is None else spec.high
        return rng.uniform(low, high, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    info = np.iinfo(dtype)
    low = 0 if spec.low is None else int(spec.low)
    high = min(int(info.max), 100) if spec.high is None else int(spec.high)
    return rng.integers(low, high, size=shape, dtype=np.int64).astype(dtype)


def dims_at(recipe: Recipe, point: Literal["min", "opt", "max"]) -> dict[str, int]:
    return {name: getattr(dim, point) for name, dim in recipe.dims.items()}
