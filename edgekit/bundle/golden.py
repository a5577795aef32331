"""Golden files: a few recipe inputs with their FP32 reference outputs, for the device's self-check.

Tolerances are derived per output from what the built model does on the golden inputs: its largest
element error and smallest row cosine against the reference, measured with the runtime's own
:func:`compare_output`, widened by a margin (:func:`margin_for`) and kept in sane ranges (never tighter than the recipe's
parity tolerance, ``atol`` no wider than the output's own magnitude unless the built model already
deviates that much, ``min_cosine`` within 0..1). An output that mixes ranges (boxes in pixels and scores in
0..1 in one tensor) gets a band that grows with the golden value (``atol + rtol x |golden|``) where that is
narrower on average, so wrong scores are not hidden under the boxes' error. A model of the same signature with other weights then
fails the device's self-check, while the bundle that was built passes it. The section is parsed with the
runtime's :func:`parse_tolerances` before it is written, so the host never writes what the device refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.data import Batch, sequence_steps
from edgekit.errors import BuildError, InternalError
from edgekit.precision import Precision
from edgekit.recipe import ParitySpec, Recipe, StateSpec
from edgekit_runtime.errors import BundleError
from edgekit_runtime.golden import (DEFAULT_BATCH_AXIS, GoldenTolerances, Tolerance, compare_output, merge_checks, parse_tolerances,
                                    without_equal_specials)

#: How much wider than the measured deviation a tolerance is: room for the device's kernels and threads,
#: which round differently from this host's. Reduced-precision kernels (int8, fp16) differ more between
#: instruction sets (VNNI or not, native fp16 on Arm) than FP32 ones.
MARGIN = 2.0
REDUCED_PRECISION_MARGIN = 3.0


#: Below this min_cosine the cosine check alone hardly separates two models (positive outputs, noise).
WEAK_COSINE = 0.9
#: A few elements of a quantized output can be far off while the rest are close (an int8 softmax: 0.31
#: at worst, 0.003 at the 99.9th percentile). The tolerance then covers this quantile of the elements,
#: and the rest, times the margin, may fall outside it, up to MAX_OUTLIER_FRACTION of an output.
OUTLIER_QUANTILE = 0.999
MAX_OUTLIER_FRACTION = 0.01
#: An output whose values span ranges (boxes in pixels beside scores in 0..1, in one tensor) gets a tolerance
#: band that grows with the golden value, ``atol + rtol x |golden|``, when that band is narrower on average over
#: the golden elements than one absolute band (by RELATIVE_GAIN at least): a YOLO-style head off by 3.5 px on
#: its boxes and 0.01 on its scores then no longer accepts scores off by 0.7. rtol is at most RTOL_MAX (x margin).
RTOL_MAX = 0.05
RELATIVE_GAIN = 0.8
#: The band is fitted on at most this many elements of an output (a deterministic stride), checked on all.
FIT_ELEMENTS = 1 << 20


def margin_for(precision: Precision) -> float:
    return MARGIN if precision is Precision.FP32 else REDUCED_PRECISION_MARGIN


def golden_batches(recipe: Recipe, samples: list[Batch]) -> list[Batch]:
    """The samples the golden files hold: the first ``build.golden_batches`` batches, or for a stateful
    recipe every chunk of its first ``build.golden_batches`` sequences (the self-check replays them in order)."""
    count = recipe.build.golden_batches
    steps = sequence_steps(samples) if recipe.state else None
    if steps is None:
        return samples[:count]
    first = sorted({sequence for sequence, _ in steps})[:count]
    return [batch for batch, (sequence, _) in zip(samples, steps) if sequence in first]


def output_batch_axes(recipe: Recipe, io: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Each output's batch axis (where its samples lie, for the golden row cosine): a state output's is its
    state input's (Silero's ``[2, batch, 128]``: axis 1); another output's is where the graph's output shape
    (``io``, the manifest's io section) names the batch dim. The batch dim is the named dim at axis 0 of the
    first input that has one (``batch``); without one, or where no axis names it, axis 0."""
    specs = {spec.name: list(spec.shape) for spec in recipe.inputs}
    batch_dim = next((shape[0] for shape in specs.values() if shape and isinstance(shape[0], str)), None)
    graph_shapes = {entry["name"]: list(entry.get("shape") or []) for entry in (io or {}).get("outputs", [])}
    state_inputs = {pair.output: pair.input for pair in recipe.state}
    axes: dict[str, int] = {}
    for name in recipe.outputs:
        shape = specs.get(state_inputs[name], []) if name in state_inputs else graph_shapes.get(name, [])
        axes[name] = shape.index(batch_dim) if batch_dim is not None and batch_dim in shape else DEFAULT_BATCH_AXIS
    return axes


def derive_tolerances(expected: Sequence[Mapping[str, np.ndarray]], built: Sequence[Mapping[str, np.ndarray]], parity: ParitySpec,
                      *, device_applied: tuple[float, float] | None = None, margin: float = MARGIN,
                      batch_axes: Mapping[str, int] | None = None, state_outputs: Sequence[str] = ()) -> tuple[GoldenTolerances, dict[str, Any]]:
    """Per-output tolerances from the built model's outputs (``built``) against the reference (``expected``),
    one mapping per golden batch; returns them with the measurements they came from (for the manifest).
    ``batch_axes`` gives an output's batch axis (default 0): its row cosine is taken per sample along it,
    and the tolerance records it for the device.

    ``device_applied`` is ``(rtol, min_cosine)`` of a precision the device applies (TensorRT builder flags),
    which this host cannot measure: the tolerance is then at least that wide."""
    outputs: dict[str, Tolerance] = {}
    loosest: dict[str, Tolerance] = {}  # every element inside: what runtimes that read only golden.atol/... need
    measured: dict[str, Any] = {}
    for name in expected[0]:
        axis = (batch_axes or {}).get(name, DEFAULT_BATCH_AXIS)
        checks = [compare_output(name, e[name], b[name], atol=0.0, rtol=0.0, min_cosine=-1.0, batch=i, batch_axis=axis)
                  for i, (e, b) in enumerate(zip(expected, built))]
        check = merge_checks(checks)
        if check.shape_error is not None:
            raise InternalError(f"golden output '{name}': the built model's {check.shape_error} (batch {check.worst_batch})")
        error, cosine = check.max_abs_diff, check.cosine_min
        if np.asarray(expected[0][name]).dtype.kind in "OUS":  # strings (labels): the self-check wants them equal
            if check.mismatched_elements:
                raise BuildError(f"golden output '{name}': {check.mismatched_elements} of {check.total_elements} strings the built model "
                                 f"answers differ from the reference's (golden batch {check.worst_batch})",
                                 hint="string outputs must match exactly: build a wider precision (fp32), or exclude the nodes that feed them from quantization")  # fmt: skip
            loosest[name] = Tolerance(atol=parity.atol, rtol=parity.rtol, min_cosine=parity.min_cosine)
            outputs[name] = replace(loosest[name], batch_axis=axis)
            measured[name] = {"max_abs_diff": 0.0, "cosine_min": 1.0, "max_abs_reference": 0.0}
            continue
        scale = max(_finite_magnitude(e[name]) for e in expected)  # a masked logit's -inf is no scale (nan_to_num made it 1.8e308)
        if not math.isfinite(error):
            raise BuildError(f"golden output '{name}': the built model computes NaN or infinity where the reference is finite (golden batch {check.worst_batch})",
                             hint="the precision overflows on this model: build a wider precision (fp16 -> fp32) or exclude the overflowing nodes from quantization")
        if cosine < 0:
            raise BuildError(f"golden output '{name}': the built model's rows{f' (samples along axis {axis})' if axis else ''} point away "
                             f"from the reference (cosine {cosine:.3f}, golden batch {check.worst_batch}), so no self-check could accept it and still reject a wrong model",
                             hint=(f"'{name}' is recurrent state fed to the next call: this precision computes it unlike FP32 from the first "
                                   "calls on, so errors compound; build fp16 or int8-dynamic, keep the nodes that compute the state in float "
                                   "(build.quantization.exclude_nodes), or tighten evaluation.budget so the build stops there"
                                   if name in state_outputs else
                                   "the accuracy budget let a broken build through: tighten evaluation.budget, or build a wider precision"))
        atol = max(parity.atol, min(margin * error, max(error, scale)))
        min_cosine = min(parity.min_cosine, max(0.0, cosine - (margin - 1) * (1 - cosine)))
        rtol = parity.rtol
        if device_applied is not None:
            extra_rtol, extra_cosine = device_applied
            atol, rtol, min_cosine = max(atol, extra_rtol * scale), max(rtol, extra_rtol), min(min_cosine, extra_cosine)
        loosest[name] = Tolerance(atol=atol, rtol=rtol, min_cosine=min_cosine)
        measured[name] = {"max_abs_diff": error, "cosine_min": cosine, "max_abs_reference": scale}
        tolerance = loosest[name]
        if device_applied is None:  # the device's own deviation was not measured here: keep its format's band
            relative = _relative_tolerance([e[name] for e in expected], [b[name] for b in built], loosest[name], parity, margin)
            if relative is not None:
                tolerance, measured[name]["relative_error"] = relative
            outliers = _outlier_tolerance([e[name] for e in expected], [b[name] for b in built], tolerance, parity.atol, margin)
            if outliers is not None:
                measured[name]["outlier_fraction"] = outliers.max_mismatched_fraction / margin
                tolerance = outliers
        outputs[name] = tolerance = replace(tolerance, batch_axis=axis)
        atol = outputs[name].atol
        if atol >= scale and min_cosine < WEAK_COSINE:
            measured[name]["weak"] = (f"output '{name}': the golden outputs stay within atol {atol:.3g} of zero (largest {scale:.3g}) and "
                                      f"min_cosine is {min_cosine:.3g}, so the self-check cannot tell this model from another on these "
                                      "inputs; give data.samples the model responds to (real images, speech, text)")
    default = Tolerance(atol=max(t.atol for t in loosest.values()), rtol=max(t.rtol for t in loosest.values()),
                        min_cosine=min(t.min_cosine for t in loosest.values()))
    return GoldenTolerances(default, outputs), measured


def _finite_magnitude(values: np.ndarray) -> float:
    """The largest finite ``|value|`` (0 for none)."""
    array = np.abs(np.asarray(values, dtype=np.float64))
    return float(array[np.isfinite(array)].max(initial=0.0))


def _relative_tolerance(expected: Sequence[np.ndarray], built: Sequence[np.ndarray], absolute: Tolerance, parity: ParitySpec,
                        margin: float) -> tuple[Tolerance, float] | None:
    """A band ``atol + rtol x |golden|`` that holds every element and is narrower on average over the golden
    elements than ``absolute`` (by RELATIVE_GAIN), with the relative error it was fitted at; None when one
    absolute band is as good (outputs of one range), or the output is not floating point."""
    if np.asarray(expected[0]).dtype.kind not in "fc":
        return None
    pairs = [without_equal_specials(e, b) for e, b in zip(expected, built)]
    magnitude = np.concatenate([np.abs(e).reshape(-1) for e, _ in pairs])
    error = np.concatenate([np.abs(b - e).reshape(-1) for e, b in pairs])
    if error.size == 0 or not np.isfinite(error).all() or error.max() == 0:
        return None
    stride = max(1, error.size // FIT_ELEMENTS)
    fit_magnitude, fit_error, mean_magnitude = magnitude[::stride], error[::stride], float(magnitude.mean())
    best_width, best_rtol = float(error.max()), 0.0  # rtol 0: one absolute band, every element inside
    for rtol in np.geomspace(1e-5, RTOL_MAX, 48):
        width = max(0.0, float((fit_error - rtol * fit_magnitude).max())) + rtol * mean_magnitude
        if width < best_width:
            best_width, best_rtol = width, float(rtol)
    if best_rtol == 0.0 or best_width > RELATIVE_GAIN * float(error.max()):
        return None
    atol = max(0.0, float((error - best_rtol * magnitude).max()))  # every element, not only the fitted ones
    band = Tolerance(atol=max(parity.atol, margin * atol), rtol=max(parity.rtol, margin * best_rtol), min_cosine=absolute.min_cosine)
    return (band, best_rtol) if band.atol < absolute.atol else None


def _outlier_tolerance(expected: Sequence[np.ndarray], built: Sequence[np.ndarray], loosest: Tolerance, floor: float,
                       margin: float) -> Tolerance | None:
    """A tighter ``atol`` that most elements meet, with the fraction outside it allowed (times ``margin``);
    None when every element is close anyway, or when too many (over MAX_OUTLIER_FRACTION) would be outside."""
    if np.asarray(expected[0]).dtype.kind not in "fc":
        return None
    excess = [np.abs(b - e) - loosest.rtol * np.abs(e) for e, b in (without_equal_specials(e, b) for e, b in zip(expected, built))]
    flat = np.concatenate([x.reshape(-1) for x in excess])
    if flat.size == 0:
        return None
    atol = max(floor, margin * max(float(np.quantile(flat, OUTLIER_QUANTILE)), 0.0))
    if atol >= loosest.atol:
        return None
    fraction = max(float(np.count_nonzero(x > atol)) / x.size for x in excess if x.size)
    allowed = min(1.0, margin * fraction)
    if allowed > MAX_OUTLIER_FRACTION:
        return None
    return Tolerance(atol=atol, rtol=loosest.rtol, min_cosine=loosest.min_cosine, max_mismatched_fraction=allowed)


def _storable(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The arrays as .npz holds them without pickle: a string tensor (an object array of ``str``) as a numpy
    unicode array (``<U``; the runtime reads it back with ``allow_pickle=False`` and feeds it as it is)."""
    return {name: np.asarray(array, dtype=str) if np.asarray(array).dtype.kind == "O" else array for name, array in arrays.items()}


def write_golden(root: Path, pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]], tolerances: GoldenTolerances,
                 *, measured: Mapping[str, Any] | None = None, steps: list[tuple[int, int]] | None = None,
                 state: tuple[StateSpec, ...] = ()) -> dict[str, Any]:
    """Write ``golden/inputs_NNN.npz`` and ``golden/outputs_NNN.npz`` (compressed); return the manifest section:
    ``atol/rtol/min_cosine`` (the loosest, for runtimes that read only those) and per output ``outputs[name]``.

    For a stateful model ``steps`` gives each pair's (sequence, step) and ``state`` the state pairs: the
    manifest then lists them so that the self-check feeds each call's state outputs to the next call of
    its sequence. The inputs files keep the reference's state inputs too (a runtime that does not know
    sequences replays them as recorded)."""
    directory = root / "golden"
    directory.mkdir(exist_ok=True)
    batches = []
    for index, (inputs, outputs) in enumerate(pairs):
        inputs_name = f"golden/inputs_{index:03d}.npz"
        outputs_name = f"golden/outputs_{index:03d}.npz"
        np.savez_compressed(root / inputs_name, **_storable(inputs))
        np.savez_compressed(root / outputs_name, **_storable(outputs))
        entry: dict[str, Any] = {"inputs": inputs_name, "outputs": outputs_name}
        if steps is not None and state:
            entry["sequence"], entry["step"] = steps[index]
        batches.append(entry)
    default = {key: value for key, value in tolerances.default.to_dict().items() if key != "batch_axis"}  # per output only
    section: dict[str, Any] = {"batches": batches, **default,
                               "outputs": {name: {**t.to_dict(), **({"measured": measured[name]} if measured and name in measured else {})}
                                           for name, t in tolerances.outputs.items()}}
    if steps is not None and state:
        section["state"] = [{"input": s.input, "output": s.output} for s in state]
    weak = [entry["weak"] for entry in (measured or {}).values() if entry.get("weak")]
    if weak:
        section["warnings"] = weak
    try:
        parse_tolerances(section, where=str(root / "manifest.json"))
    except BundleError as err:  # the runtime would refuse to open the bundle
        raise InternalError(f"the golden section this build derived is one the runtime refuses: {err}") from err
    return section
