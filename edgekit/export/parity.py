"""Parity of an exported ONNX graph with its PyTorch reference, at min/opt/max of every dynamic dim.

Inputs are the recipe's own samples (cut or tiled to each shape) and seeded random tensors. A miss
raises :class:`~edgekit.errors.ParityError` naming the output, the shape, the worst element and the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from edgekit.data import Batch, dims_at, fit_batch, random_batch
from edgekit.errors import EdgekitError, ParityError
from edgekit.recipe import Recipe
from edgekit_runtime.golden import equal_specials

RunFn = Callable[[Batch], dict[str, np.ndarray]]


@dataclass(frozen=True)
class OutputComparison:
    output: str
    point: str
    dims: dict[str, int]
    inputs: str  # "sample" | "random"
    max_abs_diff: float
    cosine_min: float
    worst_index: tuple[int, ...]
    expected: float
    got: float
    within_tolerance: bool


@dataclass(frozen=True)
class ParityReport:
    atol: float
    rtol: float
    min_cosine: float
    comparisons: list[OutputComparison] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.comparisons), default=0.0)

    @property
    def cosine_min(self) -> float:
        return min((c.cosine_min for c in self.comparisons), default=1.0)

    @property
    def worst(self) -> OutputComparison | None:
        return max(self.comparisons, key=lambda c: c.max_abs_diff, default=None)

    @property
    def failing(self) -> list[OutputComparison]:
        """The comparisons outside tolerance or below min_cosine (a NaN cosine fails: ``not >=``)."""
        return [c for c in self.comparisons if not (c.within_tolerance and c.cosine_min >= self.min_cosine)]

    @property
    def passed(self) -> bool:
        return not self.failing

    def to_manifest(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "max_abs_diff": self.max_abs_diff,
            "worst_output": worst.output if worst else None,
            "cosine_min": self.cosine_min,
            "atol": self.atol,
            "rtol": self.rtol,
            "min_cosine": self.min_cosine,
            "shapes": [
                {k: v for k, v in asdict(c).items() if k not in ("worst_index",)} | {"worst_index": list(c.worst_index)}
                for c in self.comparisons
            ],
            "passed": self.passed,
        }


def row_cosines(expected: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Cosine similarity per leading-axis row (the whole tensor for scalars/1-D)."""
    a = _rows(expected)
    b = got.astype(np.float64).reshape(a.shape)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norms > 0, dots / np.where(norms > 0, norms, 1), np.where(both_zero, 1.0, 0.0))
    return cos


def _rows(array: np.ndarray) -> np.ndarray:
    """``array`` as float64 rows along its leading axis (one row for a scalar or a 1-D array)."""
    a = array.astype(np.float64)
    return a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)


def compare_output(name: str, point: str, dims: dict[str, int], kind: str, expected: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> OutputComparison:
    if expected.shape != got.shape:
        raise ParityError(
            f"output '{name}' at {point} shape {dims}: ONNX gives shape {list(got.shape)}, PyTorch {list(expected.shape)}",
            hint="a dynamic dim may have been fixed during export; check the recipe's dims and the model's reshapes",
        )
    if expected.dtype.kind != "f":
        equal = np.array_equal(expected, got)
        diff = np.abs(expected.astype(np.float64) - got.astype(np.float64))
        index = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
        return OutputComparison(name, point, dims, kind, float(diff.max(initial=0.0)), 1.0 if equal else 0.0, tuple(int(i) for i in index),
                                float(expected[index]) if diff.size else 0.0, float(got[index]) if diff.size else 0.0, equal)
    e = expected.astype(np.float64)
    g = got.astype(np.float64)
    finite = _check_non_finite(name, point, dims, e, g)
    # inf/NaN lie at the same positions with the same values: compare (and take the cosine of) the finite elements
    e_finite, g_finite = np.where(finite, e, 0.0), np.where(finite, g, 0.0)
    diff = np.abs(e_finite - g_finite)
    excess = diff - (atol + rtol * np.abs(e_finite))  # > 0 past the tolerance
    within = bool(np.all(excess <= 0))
    # the element reported: the largest difference when all pass, else the one furthest past its tolerance
    # (the largest difference may be one within rtol of a large value)
    index = np.unravel_index(int(np.argmax(diff if within else excess)), diff.shape) if diff.size else ()
    cos = _cosine_min(e_finite, g_finite, atol) if e.size else 1.0
    return OutputComparison(name, point, dims, kind, float(diff.max(initial=0.0)), cos, tuple(int(i) for i in index),
                            float(e[index]) if diff.size else 0.0, float(g[index]) if diff.size else 0.0, within)


def _cosine_min(e: np.ndarray, g: np.ndarray, atol: float) -> float:
    """The least row cosine, rows whose reference and ONNX norms are both within ``atol`` of zero left out: their
    direction is rounding noise (3e-9 against -2e-9 is cosine -1), and atol already bounds them."""
    cosines = row_cosines(e, g)
    near_zero = (np.linalg.norm(_rows(e), axis=1) <= atol) & (np.linalg.norm(_rows(g), axis=1) <= atol)
    return float(np.where(near_zero, 1.0, cosines).min())


def _check_non_finite(name: str, point: str, dims: dict[str, int], e: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The mask of finite elements; a ParityError where the two models' inf/NaN differ in place or value."""
    finite_e: np.ndarray = np.isfinite(e)
    finite_g: np.ndarray = np.isfinite(g)
    mismatch = (finite_e != finite_g) | (~finite_e & ~equal_specials(e, g))  # inf equals only an inf of its sign
    if mismatch.any():
        bad = tuple(int(i) for i in np.unravel_index(int(np.argmax(mismatch)), g.shape))
        raise ParityError(f"output '{name}' at {point} shape {dims}: ONNX gives {g[bad]} at index {list(bad)} where PyTorch gives {e[bad]}")
    return finite_e


def parity_points(recipe: Recipe) -> list[tuple[str, dict[str, int]]]:
    if not recipe.dims:
        return [("static", {})]
    points = []
    for point in ("min", "opt", "max"):
        dims = dims_at(recipe, point)  # type: ignore[arg-type]
        if all(dims != d for _, d in points):
            points.append((point, dims))
    return points


def check_parity(recipe: Recipe, reference: RunFn, candidate: RunFn, samples: list[Batch]) -> ParityReport:
    """Compare ``candidate`` (ONNX Runtime) with ``reference`` (PyTorch) at every parity point."""
    spec = recipe.export.parity
    rng = np.random.default_rng(spec.seed)
    comparisons: list[OutputComparison] = []
    for point, dims in parity_points(recipe):
        cases: list[tuple[str, Batch]] = [("sample", fit_batch(recipe.inputs, samples[0], dims))]
        cases += [("random", random_batch(recipe, dims, rng)) for _ in range(spec.random_inputs)]
        for kind, feeds in cases:
            expected = run_case(recipe, reference, "PyTorch", feeds, point, kind)
            got = run_case(recipe, candidate, "ONNX Runtime", feeds, point, kind)
            for name in recipe.outputs:
                comparisons.append(compare_output(name, point, dims, kind, expected[name], got[name], spec.atol, spec.rtol))
    report = ParityReport(spec.atol, spec.rtol, spec.min_cosine, comparisons)
    if not report.passed:
        raise parity_failure(recipe, report)
    return report


#: What to change when a model fails on a parity case's inputs.
CASE_HINTS = {
    "random": "random inputs are drawn from inputs[].low/high (integers from 0 to 100 unless set): set inputs[].low/high in "
              "the recipe to the values the model takes (e.g. high: the vocabulary size for token ids)",
    "sample": "the sample is cut or tiled to each parity shape (dims min/opt/max): check that the model runs on data.samples "
              "at those shapes, or set the dims in the recipe to the sizes it takes",
}


def run_case(recipe: Recipe, run: RunFn, what: str, feeds: Batch, point: str, kind: str) -> dict[str, np.ndarray]:
    """``run(feeds)``; a failure is a ParityError naming the case, the shapes and each integer input's range."""
    try:
        return run(feeds)
    except EdgekitError:
        raise
    except Exception as exc:
        shapes = ", ".join(f"{name} {array.dtype}{list(array.shape)}" for name, array in feeds.items())
        ranges = [f"{name} {int(array.min())}..{int(array.max())}" for name, array in feeds.items()
                  if array.dtype.kind in "iu" and array.size]
        raise ParityError(
            f"{recipe.path}: parity: the {what} model failed on the {kind} inputs at the {point} shape ({shapes}): "
            f"{type(exc).__name__}: {exc}" + (f"; integer inputs span {', '.join(ranges)}" if ranges else ""),
            hint=CASE_HINTS[kind],
        ) from exc


def parity_failure(recipe: Recipe, report: ParityReport) -> ParityError:
    failing = report.failing
    worst = max(failing, key=lambda c: c.max_abs_diff)
    where = "at index" if worst.within_tolerance else "furthest past the tolerance at index"
    lines = [
        f"{recipe.path}: the ONNX model does not match PyTorch: output '{worst.output}' at the {worst.point} shape {worst.dims} "
        f"({worst.inputs} inputs): max abs diff {worst.max_abs_diff:.3g}; {where} {list(worst.worst_index)} "
        f"(ONNX {worst.got:.6g}, PyTorch {worst.expected:.6g}); tolerance atol {report.atol:g} + rtol {report.rtol:g}·|ref|, "
        f"cosine min {worst.cosine_min:.6f} (need >= {report.min_cosine})",
    ]
    others = [c for c in failing if c is not worst]
    if others:
        lines.append(f"  {len(others)} more failing comparisons: " + ", ".join(f"{c.output}@{c.point}/{c.inputs} {c.max_abs_diff:.3g}" for c in others[:6]))
    return ParityError(
        "\n".join(lines),
        hint="look for ops that differ between PyTorch and ONNX (e.g. random, in-place ops, data-dependent shapes); "
        "if the difference is expected, loosen export.parity.atol/rtol in the recipe",
    )
