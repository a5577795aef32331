"""Comparing computed outputs with reference ("golden") outputs.

An output passes when every element satisfies ``|actual - golden| <= atol + rtol * |golden|`` (or all
but ``max_mismatched_fraction`` of them, where the bundle allows a few outliers) and the
cosine similarity of every row (one sample of the batch, along the output's ``batch_axis``: 0 unless the
bundle records another, as for a recurrent state ``[layers, batch, hidden]``) is at least ``min_cosine``,
the same measures the host's export parity check uses. Both are computed in float64, so an fp16 or
int8 build is compared with its FP32 reference directly. String outputs (BYTES) must match exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edgekit_runtime.errors import BundleError


@dataclass(frozen=True)
class OutputCheck:
    """How far one output is from its golden reference (over one batch, or merged over several)."""

    name: str
    max_abs_diff: float
    cosine_min: float
    mismatched_elements: int
    total_elements: int
    passed: bool
    worst_batch: int = 0
    shape_error: str | None = None

    def describe(self, *, atol: float, rtol: float, min_cosine: float, max_mismatched_fraction: float = 0.0, batch_axis: int = 0) -> str:
        where = f"golden batch {self.worst_batch}"
        if self.shape_error is not None:
            return f"output '{self.name}': {self.shape_error} in {where}"
        allowed = f"; {max_mismatched_fraction:.3%} may be" if max_mismatched_fraction else ""
        return (
            f"output '{self.name}': max_abs_diff {self.max_abs_diff:.3g} "
            f"({self.mismatched_elements}/{self.total_elements} elements outside atol {atol:g} + "
            f"rtol {rtol:g} x |golden|{allowed}), cosine_min {self.cosine_min:.6f} (min_cosine {min_cosine:g}"
            f"{f', samples along axis {batch_axis}' if batch_axis else ''}), "
            f"worst in {where}"
        )

    def to_dict(self) -> dict[str, Any]:
        def number(value: float) -> float | None:  # JSON has no inf or nan
            return value if math.isfinite(value) else None

        return {
            "name": self.name,
            "max_abs_diff": number(self.max_abs_diff),
            "cosine_min": number(self.cosine_min),
            "mismatched_elements": self.mismatched_elements,
            "total_elements": self.total_elements,
            "passed": self.passed,
            "worst_batch": self.worst_batch,
            "shape_error": self.shape_error,
        }


def row_cosine_min(actual: np.ndarray, expected: np.ndarray, batch_axis: int = 0) -> float:
    """The smallest cosine similarity over the rows (samples) along ``batch_axis``.

    Scalars and 1-D arrays count as one row. Non-finite entries count as 0 here (the tolerance check
    catches them); a row that is all zeros in both arrays has cosine 1.0, in only one of them 0.0.
    """
    a = np.nan_to_num(np.asarray(actual, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    e = np.nan_to_num(np.asarray(expected, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if a.size == 0:
        return 1.0
    if a.ndim > 1 and batch_axis:
        a, e = np.moveaxis(a, batch_axis, 0), np.moveaxis(e, batch_axis, 0)
    rows = a.shape[0] if a.ndim > 1 else 1
    a, e = a.reshape(rows, -1), e.reshape(rows, -1)
    norm_a, norm_e = np.linalg.norm(a, axis=1), np.linalg.norm(e, axis=1)
    norms = norm_a * norm_e
    dots = np.einsum("ij,ij->i", a, e)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(norm_a == norm_e, 1.0, 0.0))
    return float(np.clip(cosines, -1.0, 1.0).min())


def equal_specials(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The mask of elements where both arrays hold NaN, or the same infinity (a masked logit's -inf): such
    elements are equal, and are left out of every difference and cosine, which they would make NaN."""
    return np.asarray((np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b)), dtype=bool)


def without_equal_specials(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays as float64, with zero where they hold an equal NaN or infinity (``equal_specials``)."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same = equal_specials(a64, b64)
    return np.where(same, 0.0, a64), np.where(same, 0.0, b64)


def compare_output(
    name: str,
    expected: np.ndarray,
    actual: np.ndarray,
    *,
    atol: float,
    rtol: float,
    min_cosine: float,
    batch: int = 0,
    max_mismatched_fraction: float = 0.0,
    batch_axis: int = 0,
) -> OutputCheck:
    """Compare one computed output with its golden reference; rows for the cosine are taken along ``batch_axis``."""
    expected_array, actual_array = np.asarray(expected), np.asarray(actual)
    total = int(expected_array.size)
    shape_error = None
    if expected_array.shape != actual_array.shape:
        shape_error = f"shape {list(actual_array.shape)} differs from golden {list(expected_array.shape)}"
    elif batch_axis and batch_axis >= expected_array.ndim:
        shape_error = f"golden shape {list(expected_array.shape)} has no batch axis {batch_axis} (the manifest's golden.outputs[...].batch_axis)"
    if shape_error is not None:
        return OutputCheck(
            name=name,
            max_abs_diff=math.inf,
            cosine_min=-1.0,
            mismatched_elements=total,
            total_elements=total,
            passed=False,
            worst_batch=batch,
            shape_error=shape_error,
        )
    if expected_array.dtype.kind in "OUS" or actual_array.dtype.kind in "OUS":
        return _compare_strings(name, expected_array, actual_array, batch, max_mismatched_fraction)
    a, e = without_equal_specials(actual_array, expected_array)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - e)
    diff = np.where(np.isnan(diff), np.inf, diff)
    max_abs_diff = float(diff.max()) if total else 0.0
    within = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=False)
    mismatched = int(total - np.count_nonzero(within))
    if expected_array.dtype.kind in "fc" or actual_array.dtype.kind in "fc":
        cosine = row_cosine_min(a, e, batch_axis)
    else:  # labels, indices, masks: equal or not, as the host's parity check counts them
        cosine = 1.0 if mismatched == 0 else 0.0
    return OutputCheck(
        name=name,
        max_abs_diff=max_abs_diff,
        cosine_min=cosine,
        mismatched_elements=mismatched,
        total_elements=total,
        passed=mismatched <= allowed_mismatches(total, max_mismatched_fraction) and cosine >= min_cosine,
        worst_batch=batch,
    )


def _compare_strings(name: str, expected: np.ndarray, actual: np.ndarray, batch: int, max_mismatched_fraction: float) -> OutputCheck:
    """String outputs (labels, tokens) match element for element: no tolerance applies. ``max_abs_diff`` is 1
    where any element differs (0 otherwise) and the cosine 1 or 0, as for integer labels."""
    as_text = np.vectorize(lambda item: item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item), otypes=[object])
    equal = as_text(expected) == as_text(actual) if expected.size else np.ones(expected.shape, bool)
    total = int(expected.size)
    mismatched = int(total - np.count_nonzero(equal))
    return OutputCheck(name=name, max_abs_diff=1.0 if mismatched else 0.0, cosine_min=0.0 if mismatched else 1.0,
                       mismatched_elements=mismatched, total_elements=total,
                       passed=mismatched <= allowed_mismatches(total, max_mismatched_fraction), worst_batch=batch)  # fmt: skip


def allowed_mismatches(total: int, max_mismatched_fraction: float) -> int:
    """How many of ``total`` elements may fall outside the tolerance (rounded down)."""
    return math.floor(total * max_mismatched_fraction + 1e-9)


def merge_checks(checks: Sequence[OutputCheck]) -> OutputCheck:
    """Merge the per-batch checks of one output: worst numbers, summed counts, passed if all passed."""
    if not checks:
        raise ValueError("merge_checks needs at least one check")
    failing = [check for check in checks if not check.passed]
    worst = failing[0] if failing else max(checks, key=lambda check: check.max_abs_diff)
    return replace(
        worst,
        max_abs_diff=max(check.max_abs_diff for check in checks),
        cosine_min=min(check.cosine_min for check in checks),
        mismatched_elements=sum(check.mismatched_elements for check in checks),
        total_elements=sum(check.total_elements for check in checks),
        passed=not failing,
    )


# -- golden sequences of stateful models ---------------------------------------------------------------


@dataclass(frozen=True)
class StatePair:
    """A state input of a recurrent model and the output that feeds it on the next call."""

    input: str
    output: str


def parse_golden_state(golden: Mapping[str, Any], *, where: str) -> tuple[StatePair, ...]:
    """The manifest's ``golden.state`` (``[{input, output}]``, absent for stateless models), checked
    together with each batch's ``sequence`` and ``step`` (ints >= 0, steps counting up within a sequence)."""
    raw = golden.get("state")
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise BundleError(f"'{where}': golden.state must be a non-empty list of {{input, output}}, got {raw!r}")
    pairs = []
    for index, entry in enumerate(raw):
        names = [entry.get(key) if isinstance(entry, Mapping) else None for key in ("input", "output")]
        if not all(isinstance(name, str) and name for name in names):
            raise BundleError(f"'{where}': golden.state[{index}] must be {{input: name, output: name}}, got {entry!r}")
        pairs.append(StatePair(str(names[0]), str(names[1])))
    previous: tuple[int, int] | None = None
    for index, batch in enumerate(golden.get("batches") or []):
        sequence, step = (batch.get("sequence"), batch.get("step")) if isinstance(batch, Mapping) else (None, None)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (sequence, step)):
            raise BundleError(f"'{where}': golden.batches[{index}] needs sequence and step (ints >= 0) when golden.state is set, "
                              f"got sequence={sequence!r} step={step!r}", hint="rebuild the bundle")
        expected_step = previous[1] + 1 if previous is not None and previous[0] == sequence else 0
        if step != expected_step:
            raise BundleError(f"'{where}': golden.batches[{index}] is step {step} of sequence {sequence}; expected step {expected_step} "
                              "(the chunks of a sequence are listed in order)", hint="rebuild the bundle")
        previous = (int(sequence), int(step))  # type: ignore[arg-type]
    return tuple(pairs)


class StateCarrier:
    """Replays golden sequences as the device runs them: from step 1 on, each call's state inputs are
    the state outputs this device computed on the previous call (the recorded ones are the host's)."""

    def __init__(self, pairs: Sequence[StatePair]) -> None:
        self.pairs = tuple(pairs)
        self._previous: Mapping[str, np.ndarray] | None = None

    def feeds(self, step: int | None, inputs: dict[str, np.ndarray], *, where: str) -> dict[str, np.ndarray]:
        if not self.pairs or not step or self._previous is None:
            return inputs
        carried = dict(inputs)
        for pair in self.pairs:
            if pair.output not in self._previous:
                raise BundleError(f"{where}: state output '{pair.output}' (for input '{pair.input}') is not among the model's outputs "
                                  f"({', '.join(self._previous)})", hint="the manifest's golden.state and io disagree; rebuild the bundle")
            carried[pair.input] = np.asarray(self._previous[pair.output])
        return carried

    def remember(self, outputs: Mapping[str, np.ndarray]) -> None:
        self._previous = outputs


# -- tolerances ----------------------------------------------------------------------------------------

#: The range of each tolerance key this runtime accepts. The host derives per-output tolerances inside
#: these (min_cosine within 0..1) and parses its section with :func:`parse_tolerances` before writing it.
TOLERANCE_BOUNDS: dict[str, tuple[float, float | None]] = {"atol": (0.0, None), "rtol": (0.0, None), "min_cosine": (-1.0, 1.0),
                                                           "max_mismatched_fraction": (0.0, 1.0)}
#: Keys a manifest may leave out, and their value then (bundles built before the key existed).
TOLERANCE_OPTIONAL = {"max_mismatched_fraction": 0.0}
#: Per output (``golden.outputs[name]``): which axis holds the batch's samples, for the row cosine. Bundles
#: built before the key existed leave it out: axis 0.
DEFAULT_BATCH_AXIS = 0


@dataclass(frozen=True)
class Tolerance:
    """How close one output must stay to its golden reference: every element (all but a
    ``max_mismatched_fraction`` of them) within ``atol + rtol * |golden|``, and every row's cosine
    similarity at least ``min_cosine``, rows taken along ``batch_axis`` (the axis of the batch's samples)."""

    atol: float
    rtol: float
    min_cosine: float
    max_mismatched_fraction: float = 0.0
    batch_axis: int = DEFAULT_BATCH_AXIS

    def to_dict(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine, "max_mismatched_fraction": self.max_mismatched_fraction,
                "batch_axis": self.batch_axis}


@dataclass(frozen=True)
class GoldenTolerances:
    """The manifest's ``golden`` tolerances: ``default`` (``golden.atol/rtol/min_cosine``) and, per output,
    ``golden.outputs[name]``, which bundles built since the host derived tolerances per output carry."""

    default: Tolerance
    outputs: Mapping[str, Tolerance]

    def for_output(self, name: str) -> Tolerance:
        return self.outputs.get(name, self.default)


def _finite_float(value: object) -> float | None:
    """``value`` as a finite float, or ``None`` for a bool, a non-number, NaN, infinity or an int too large for a
    float (JSON allows ``1e400`` written as digits: ``float()`` of it raises OverflowError)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _tolerance(section: Mapping[str, Any], *, where: str, prefix: str, default: Tolerance | None = None) -> Tolerance:
    values: dict[str, float] = {}
    for key, (low, high) in TOLERANCE_BOUNDS.items():
        value = section.get(key, TOLERANCE_OPTIONAL.get(key) if default is None else getattr(default, key))
        number = _finite_float(value)
        if number is None or number < low or (high is not None and number > high):
            bounds = f"in {low}..{high}" if high is not None else f">= {low}"
            shown = "an integer too large for a float" if isinstance(value, int) and number is None else repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise BundleError(f"'{where}': {prefix}.{key} must be a number {bounds}, got {shown}",
                              hint="rebuild the bundle with edgekit build, which derives the golden tolerances")
        values[key] = number
    axis = section.get("batch_axis", DEFAULT_BATCH_AXIS) if default is not None else DEFAULT_BATCH_AXIS
    if not isinstance(axis, int) or isinstance(axis, bool) or axis < 0:
        raise BundleError(f"'{where}': {prefix}.batch_axis must be an int >= 0 (the axis of the batch's samples), got {axis!r}",
                          hint="rebuild the bundle with edgekit build, which records each output's batch axis")
    return Tolerance(**values, batch_axis=axis)


def parse_tolerances(golden: Mapping[str, Any], *, where: str) -> GoldenTolerances:
    """Check and read the ``golden`` section's tolerances; :class:`BundleError` names the bad key."""
    default = _tolerance(golden, where=where, prefix="golden")
    raw = golden.get("outputs")
    if raw is None:
        return GoldenTolerances(default, {})
    if not isinstance(raw, Mapping):
        raise BundleError(f"'{where}': golden.outputs must map output names to {{atol, rtol, min_cosine}}, got {raw!r}")
    outputs = {}
    for name, entry in raw.items():
        if not isinstance(entry, Mapping):
            raise BundleError(f"'{where}': golden.outputs['{name}'] must be {{atol, rtol, min_cosine}}, got {entry!r}")
        outputs[str(name)] = _tolerance(entry, where=where, prefix=f"golden.outputs['{name}']", default=default)
    return GoldenTolerances(default, outputs)
