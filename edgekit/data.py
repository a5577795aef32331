"""Recipe data: loading sample/calibration/evaluation batches, and shaping inputs for checks.

A batch is a ``dict[str, np.ndarray]`` keyed by input name; evaluation batches may carry extra keys
(``labels``) that are never fed to the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import logging
import re
from dataclasses import replace

import numpy as np

from edgekit.errors import RecipeError
from edgekit.recipe import CallableData, DataSource, NpzData, Recipe, StateSpec, TensorSpec
from edgekit.sources._util import import_callable
from edgekit_runtime.signature import STRING_DTYPE, is_string_array, numpy_dtype

log = logging.getLogger(__name__)

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
        files: list[Any] | None = None
        try:
            returned = fn(**source.kwargs)
        except Exception as exc:
            raise RecipeError(f"{where}: '{source.callable}' raised {type(exc).__name__}: {exc}") from exc
        _check_returned(recipe, returned, f"{where}: '{source.callable}'")
        try:
            items = list(returned)
        except Exception as exc:  # a generator that raises part-way
            raise RecipeError(f"{where}: '{source.callable}' raised {type(exc).__name__}: {exc}") from exc
    elif isinstance(source, NpzData):
        items, files = _load_npz_dir(recipe, recipe.resolve(source.npz_dir), where)
    else:  # pragma: no cover - the schema admits only the two kinds
        raise TypeError(source)
    if not items:
        raise RecipeError(f"{where}: the data source returned no batches")
    if recipe.state:
        return _flatten_sequences(recipe, items, where, files)
    for index, batch in enumerate(items):
        check_batch(recipe, batch, f"{where} batch {index}" + (f" ({files[index]})" if files else ""))
    return items


def _check_returned(recipe: Recipe, returned: object, where: str) -> None:
    """A data callable returns a list (or iterable) of batches, or of sequences for a stateful recipe: a lone dict or
    None is refused here, before ``list()`` would turn a dict into its keys or fail on None."""
    wanted = ("a list of sequences, each a list of chunks (dicts of input name -> array)" if recipe.state
              else "a list of batches (dicts of input name -> array)")
    if returned is None:
        raise RecipeError(f"{where} returned None, not {wanted}", hint="end the callable with a return of the list (or yield each batch)")
    if isinstance(returned, Mapping):
        raise RecipeError(f"{where} returned a single dict (keys {sorted(map(str, returned))[:5]}), not {wanted}",
                          hint="wrap it in a list: return [batch]")
    if isinstance(returned, (str, bytes, np.ndarray)) or not isinstance(returned, Iterable):
        raise RecipeError(f"{where} returned a {type(returned).__name__}, not {wanted}", hint="return a list of dicts of input name -> array")


def _natural_key(path: Path) -> list[Any]:
    """Sort key of a file or folder name with its numbers compared as numbers: 2.npz before 10.npz."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


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


def _load_npz_dir(recipe: Recipe, directory: Path, where: str) -> tuple[list[Any], list[Any]]:
    """The batches (or sequences of chunks) of an npz_dir and, beside them, the file each came from. Names sort
    naturally (numbers as numbers: 2 before 10)."""
    if recipe.state:  # one subdirectory per sequence, one .npz per chunk, in name order
        folders = sorted((d for d in directory.iterdir() if d.is_dir() and any(d.glob("*.npz"))), key=_natural_key) if directory.is_dir() else []
        if not folders:
            raise RecipeError(f"{where}: no sequence folders with .npz files in {directory}",
                              hint="the recipe has a state section: one subfolder per sequence, one .npz per chunk (sorted by name, numbers as numbers)")
        paths = [sorted(folder.glob("*.npz"), key=_natural_key) for folder in folders]
        return [[_load_npz(path) for path in chunk_paths] for chunk_paths in paths], paths
    files = sorted(directory.glob("*.npz"), key=_natural_key) if directory.is_dir() else []
    if not files:
        raise RecipeError(f"{where}: no .npz files in {directory}", hint="one .npz per batch, arrays keyed by input name")
    return [_load_npz(path) for path in files], files


def _flatten_sequences(recipe: Recipe, sequences: list[Any], where: str, files: list[Any] | None = None) -> list[Batch]:
    chunks: list[Batch] = []
    for number, sequence in enumerate(sequences):
        state_shapes: dict[str, tuple[int, ...]] = {}  # state input -> its shape at the sequence's first chunk
        if not isinstance(sequence, (list, tuple)) or not sequence:
            got = "an empty list" if isinstance(sequence, (list, tuple)) else type(sequence).__name__
            raise RecipeError(
                f"{where}: sequence {number} is {got}: the recipe has a state section, so the data are sequences",
                hint="return a list of sequences, each a list of consecutive chunks (dicts of input name -> array) without the state inputs",
            )
        for step, chunk in enumerate(sequence):
            place = f"{where} sequence {number} chunk {step}" + (f" ({files[number][step]})" if files else "")
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
            _check_state_dims(recipe, chunk, state_shapes, place)
            chunk[SEQUENCE_KEY] = np.array(number, dtype=np.int64)
            chunks.append(chunk)
    return chunks


def _check_state_dims(recipe: Recipe, chunk: Batch, first: dict[str, tuple[int, ...]], place: str) -> None:
    """The state a sequence carries from call to call keeps its shape: the dims it takes from the chunks (batch) must
    not change within the sequence, or the previous call's state output cannot feed this call."""
    for state in recipe.state:
        shape = tuple(chunk[state.input].shape)
        if first.setdefault(state.input, shape) == shape:
            continue
        spec = next(s for s in recipe.inputs if s.name == state.input)
        dims = sorted({str(d) for d, a, b in zip(state.zeros or spec.shape, first[state.input], shape) if isinstance(d, str) and a != b})
        named = f" (dim {', '.join(repr(d) for d in dims)})" if dims else ""
        raise RecipeError(f"{place}: state input '{state.input}' is {list(shape)} at this chunk but {list(first[state.input])} at the "
                          f"sequence's chunk 0{named}: the state carried between the sequence's calls cannot change shape",
                          hint="keep the dims the state depends on (e.g. batch) the same in every chunk of a sequence; "
                               "start a new sequence for another size")


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
        _check_finite(array, spec.name, where)


def _check_finite(array: np.ndarray, name: str, where: str) -> None:
    """Float inputs hold no NaN and no +inf: one poisons the reference, the calibration ranges, the accuracy and the
    golden outputs alike (a NaN pixel once made int8 'beat' FP32). -inf is taken: additive attention masks use it."""
    if array.dtype.kind != "f" and "bfloat16" not in str(array.dtype):
        return
    values = array if array.dtype.kind == "f" else np.asarray(array, dtype=np.float32)  # no copy of a float batch
    nan, positive = int(np.count_nonzero(np.isnan(values))), int(np.count_nonzero(values == np.inf))
    if nan or positive:
        raise RecipeError(f"{where}: input '{name}' holds {nan + positive} non-finite value(s) of {array.size} ({nan} NaN, "
                          f"{positive} +inf)",
                          hint="replace or leave out the samples with NaN or infinity (e.g. numpy.nan_to_num, or drop that batch): "
                               "they make the reference, calibration, accuracy and golden outputs meaningless (-inf, as in "
                               "additive attention masks, is accepted)")


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


def samples_accuracy_note(recipe: Recipe) -> str:
    """Why an accuracy measured without ``data.evaluation`` is not on held-out data."""
    calibrates = "" if recipe.data.calibration is not None else ", also calibrate a quantized model (no data.calibration)"
    return (f"measured on data.samples (the recipe has no data.evaluation): the same batches give the golden outputs{calibrates}, "
            "so this is not an accuracy on held-out data")


def accuracy_batches(recipe: Recipe, evaluation: list[Batch] | None, samples: list[Batch]) -> tuple[list[Batch], str]:
    """The batches the accuracy is measured on and which data field they are (``evaluation``, else ``samples`` with a
    warning: builds without data.evaluation keep working, but say what their accuracy means)."""
    if evaluation is not None:
        return evaluation, "evaluation"
    log.warning("%s: accuracy %s; add data.evaluation (held-out batches, with labels for the metric) to measure it apart",
                recipe.path, samples_accuracy_note(recipe))
    return samples, "samples"


def with_accuracy_data(recipe: Recipe, result: Any, data: str) -> Any:
    """An AccuracyResult that records its data field (``details.data``), with the note of a samples-measured accuracy."""
    note = samples_accuracy_note(recipe) if data == "samples" else None
    return replace(result, details={**(result.details or {}), "data": data},
                   note="; ".join(n for n in (result.note, note) if n) or None)
