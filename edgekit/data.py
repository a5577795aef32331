"""Recipe data: loading sample/calibration/evaluation batches, and shaping inputs for checks.

A batch is a ``dict[str, np.ndarray]`` keyed by input name; evaluation batches may carry extra keys
(``labels``) that are never fed to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from edgekit.errors import RecipeError
from edgekit.recipe import CallableData, DataSource, NpzData, Recipe, StateSpec, TensorSpec
from edgekit.sources._util import import_callable
from edgekit_runtime.signature import STRING_DTYPE, is_string_array, numpy_dtype

Batch = dict[str, np.ndarray]
RunFn = Callable[[Batch], dict[str, np.ndarray]]

#: Key of the sequence number in the chunks of a stateful recipe's data (never a valid input name).
SEQUENCE_KEY = "#sequence"


def load_batches(recipe: Recipe, source: DataSource, field: str) -> list[Batch]:
    """Load ``data.<field>`` of the recipe, checking every batch against the recipe's inputs.

    A recipe with a ``state`` section reads sequences (lists of consecutive chunks) instead; they come
    back as one flat list of chunks, each carrying its sequence number under :data:`SEQUENCE_KEY` and
    its state inputs (the initial zeros unless the first chunk of its sequence gives them)."""
    where = f"{recipe.path}: data.{field}"
    if isinstance(source, CallableData):
        fn = import_callable(source.callable, RecipeError, where, recipe.base_dir)
        try:
            items = list(fn(**source.kwargs))
        except Exception as exc:
            raise RecipeError(f"{where}: '{source.callable}' raised {type(exc).__name__}: {exc}") from exc
    elif isinstance(source, NpzData):
        items = _load_npz_dir(recipe, recipe.resolve(source.npz_dir), where)
    else:  # pragma: no cover - the schema admits only the two kinds
        raise TypeError(source)
    if not items:
        raise RecipeError(f"{where}: the data source returned no batches")
    if recipe.state:
        return _flatten_sequences(recipe, items, where)
    for index, batch in enumerate(items):
        check_batch(recipe, batch, f"{where} batch {index}")
    return items


def _load_npz(path: Path) -> Batch:
    import zipfile

    if not path.is_file():  # a FIFO would block the build, a device read for ever (docs/threats.md)
        raise RecipeError(f"{path}: not a regular file", hint="keep only .npz files (one per batch) in the data folder")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # damaged, not an npz, object arrays (pickles)
        raise RecipeError(f"{path}: cannot be read as an .npz of arrays: {exc}",
                          hint="write it with numpy.savez (numeric or string arrays, no Python objects)") from exc  # fmt: skip


def _load_npz_dir(recipe: Recipe, directory: Path, where: str) -> list[Any]:
    if recipe.state:  # one subdirectory per sequence, one .npz per chunk, in name order
        folders = sorted(d for d in directory.iterdir() if d.is_dir() and any(d.glob("*.npz"))) if directory.is_dir() else []
        if not folders:
            raise RecipeError(f"{where}: no sequence folders with .npz files in {directory}",
                              hint="the recipe has a state section: one subfolder per sequence, one .npz per chunk (sorted by name)")
        return [[_load_npz(path) for path in sorted(folder.glob("*.npz"))] for folder in folders]
    files = sorted(directory.glob("*.npz")) if directory.is_dir() else []
    if not files:
        raise RecipeError(f"{where}: no .npz files in {directory}", hint="one .npz per batch, arrays keyed by input name")
    return [_load_npz(path) for path in files]


def _flatten_sequences(recipe: Recipe, sequences: list[Any], where: str) -> list[Batch]:
    chunks: list[Batch] = []
    for number, sequence in enumerate(sequences):
        if not isinstance(sequence, (list, tuple)) or not sequence:
            got = "an empty list" if isinstance(sequence, (list, tuple)) else type(sequence).__name__
            raise RecipeError(
                f"{where}: sequence {number} is {got}: the recipe has a state section, so the data are sequences",
                hint="return a list of sequences, each a list of consecutive chunks (dicts of input name -> array) without the state inputs",
            )
        for step, chunk in enumerate(sequence):
            place = f"{where} sequence {number} chunk {step}"
            if not isinstance(chunk, dict):
                raise RecipeError(f"{place}: expected a dict of input name -> array, got {type(chunk).__name__}")
            chunk = dict(chunk)
            for state in recipe.state:
                if state.input in chunk and step > 0:
                    raise RecipeError(f"{place}: gives state input '{state.input}', which the previous call's output '{state.output}' provides",
                                      hint="leave state inputs out of the chunks (the first chunk may give a sequence's initial state)")
                if state.input not in chunk:
                    chunk[state.input] = initial_state(recipe, state, chunk)
            check_batch(recipe, chunk, place)
            chunk[SEQUENCE_KEY] = np.array(number, dtype=np.int64)
            chunks.append(chunk)
    return chunks


def initial_state(recipe: Recipe, state: StateSpec, chunk: Batch) -> np.ndarray:
    """Zeros for ``state.input``: its ``zeros`` shape, else its input shape; named dims take the size
    they have in the chunk's other inputs, else their ``opt``."""
    spec = next(s for s in recipe.inputs if s.name == state.input)
    sizes: dict[str, int] = {}
    for other in recipe.inputs:
        array = chunk.get(other.name)
        if other.name == state.input or not isinstance(array, np.ndarray) or array.ndim != len(other.shape):
            continue
        for dim, size in zip(other.shape, array.shape):
            if isinstance(dim, str):
                sizes.setdefault(dim, int(size))
    shape = tuple(d if isinstance(d, int) else sizes.get(d, recipe.dims[d].opt) for d in (state.zeros or spec.shape))
    return np.zeros(shape, dtype=numpy_dtype(spec.dtype))


def run_batches(recipe: Recipe, run: RunFn, batches: list[Batch]) -> tuple[list[Batch], list[dict[str, np.ndarray]]]:
    """``run`` over the batches: the feeds it got and its outputs, one per batch.

    For a stateful recipe, the chunks of one sequence run in order and each call's state outputs are
    the next call's state inputs (the first chunk keeps its initial state)."""
    feeds_used: list[Batch] = []
    outputs: list[dict[str, np.ndarray]] = []
    previous: dict[str, np.ndarray] | None = None
    previous_sequence: int | None = None
    for index, batch in enumerate(batches):
        feeds = model_inputs(recipe, batch)
        sequence = int(batch[SEQUENCE_KEY]) if recipe.state and SEQUENCE_KEY in batch else None
        if previous is not None and sequence is not None and sequence == previous_sequence:
            for state in recipe.state:
                carried = np.asarray(previous[state.output])
                expected = feeds[state.input]
                if carried.dtype != expected.dtype or carried.shape != expected.shape:
                    raise RecipeError(
                        f"{recipe.path}: state: output '{state.output}' is {carried.dtype}{list(carried.shape)} but feeds input "
                        f"'{state.input}', which is {expected.dtype}{list(expected.shape)} (sequence {sequence}, chunk {index})",
                        hint="pair each state input with the output of the same dtype and shape (state[].input / state[].output)",
                    )
                feeds[state.input] = carried
        result = run(feeds)
        feeds_used.append(feeds)
        outputs.append(result)
        previous, previous_sequence = result, sequence
    return feeds_used, outputs


def sequence_steps(batches: list[Batch]) -> list[tuple[int, int]] | None:
    """(sequence, step) of each chunk of a stateful recipe's data; None for stateless batches."""
    if not batches or SEQUENCE_KEY not in batches[0]:
        return None
    steps: list[tuple[int, int]] = []
    for batch in batches:
        sequence = int(batch[SEQUENCE_KEY])
        step = steps[-1][1] + 1 if steps and steps[-1][0] == sequence else 0
        steps.append((sequence, step))
    return steps


def check_batch(recipe: Recipe, batch: object, where: str) -> None:
    if not isinstance(batch, dict):
        raise RecipeError(f"{where}: expected a dict of input name -> array, got {type(batch).__name__}")
    sizes: dict[str, tuple[int, str]] = {}  # dynamic dim -> (its size in this batch, the input it was first seen in)
    for spec in recipe.inputs:
        if spec.name not in batch:
            raise RecipeError(f"{where}: missing input '{spec.name}' (has {sorted(batch)})")
        array = batch[spec.name]
        if not isinstance(array, np.ndarray):
            raise RecipeError(f"{where}: input '{spec.name}' is a {type(array).__name__}, not a NumPy array")
        if array.dtype != numpy_dtype(spec.dtype) and not (spec.dtype == STRING_DTYPE and is_string_array(array)):
            raise RecipeError(f"{where}: input '{spec.name}' has dtype {array.dtype}, the recipe says {spec.dtype}")
        if array.ndim != len(spec.shape):
            raise RecipeError(f"{where}: input '{spec.name}' has shape {array.shape}, the recipe says {list(spec.shape)}")
        for axis, (dim, size) in enumerate(zip(spec.shape, array.shape)):
            if isinstance(dim, int) and dim != size:
                raise RecipeError(f"{where}: input '{spec.name}' axis {axis} is {size}, the recipe fixes it at {dim}")
            if isinstance(dim, str) and size < 1:
                raise RecipeError(f"{where}: input '{spec.name}' axis {axis} ({dim}) is empty",
                                  hint="every batch needs at least one item along each dynamic dim")  # fmt: skip
            if isinstance(dim, str):
                _check_in_range(recipe, spec.name, axis, dim, size, where)
            seen = sizes.setdefault(dim, (size, spec.name)) if isinstance(dim, str) else (size, spec.name)
            if seen[0] != size:
                raise RecipeError(f"{where}: dim '{dim}' is {seen[0]} in input '{seen[1]}' but {size} in input '{spec.name}'",
                                  hint="inputs that share a dynamic dim name must agree on its size within a batch")  # fmt: skip


def _check_in_range(recipe: Recipe, name: str, axis: int, dim: str, size: int, where: str) -> None:
    """A dynamic axis of a batch lies within its dim's min..max (what the exported model, its golden self-check and the
    device accept)."""
    bounds = recipe.dims.get(dim)
    if bounds is not None and not bounds.min <= size <= bounds.max:
        fix = f"raise dims.{dim}.max to {size}" if size > bounds.max else f"lower dims.{dim}.min to {size}"
        raise RecipeError(f"{where}: input '{name}' axis {axis} ({dim}) is {size}, outside dims.{dim} ({bounds.min} .. {bounds.max})",
                          hint=f"give batches with {dim} from {bounds.min} to {bounds.max}, or {fix} in the recipe")


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


class NamedShape(Protocol):
    """An input's ``name`` and ``shape`` (names for dynamic dims): a recipe's TensorSpec or a bundle signature's tensor."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[Any]: ...


def fit_batch(inputs: Iterable[NamedShape], batch: Batch, dims: Mapping[str, int]) -> Batch:
    """The arrays of ``inputs`` (``recipe.inputs``, ``signature.inputs``) from a real batch, each dynamic axis cut or
    tiled to its dim's value in ``dims``."""
    out = {}
    for spec in inputs:
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
    if spec.dtype == STRING_DTYPE:  # decimal integers as text, within low..high (default 0..1000)
        first, end = (0 if spec.low is None else int(spec.low)), (1000 if spec.high is None else int(spec.high))
        numbers = np.full(shape, int(spec.value)) if spec.value is not None else rng.integers(first, end, size=shape, dtype=np.int64)
        return np.asarray(numbers.astype(str), dtype=object)
    dtype = np.dtype(spec.dtype) if spec.dtype != "bfloat16" else np.dtype(np.float32)
    if spec.value is not None:  # a pinned value (a sample rate): every test input uses it
        return np.full(shape, spec.value, dtype=dtype)
    if dtype.kind == "f":
        low = 0.0 if spec.low is None else spec.low
        high = 1.0 if spec.high is None else spec.high
        return np.asarray(rng.uniform(low, high, size=shape), dtype=dtype)  # asarray: size () gives a scalar
    if dtype.kind == "b":
        return np.asarray(rng.integers(0, 2, size=shape), dtype=bool)
    info = np.iinfo(dtype)
    low = 0 if spec.low is None else int(spec.low)
    high = min(int(info.max), 100) if spec.high is None else int(spec.high)
    return np.asarray(rng.integers(low, high, size=shape, dtype=np.int64), dtype=dtype)


def dims_at(recipe: Recipe, point: Literal["min", "opt", "max"]) -> dict[str, int]:
    return {name: getattr(dim, point) for name, dim in recipe.dims.items()}
