"""Per-output golden tolerances (``golden.outputs``) as the runtime reads and applies them."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import BundleError
from edgekit_runtime.golden import Tolerance, parse_tolerances
from tests.runtime.tiny_bundle import load_manifest, write_manifest


def _with_outputs(bundle_dir: Path, outputs: object) -> Path:
    manifest = load_manifest(bundle_dir)
    manifest["golden"]["outputs"] = outputs
    write_manifest(bundle_dir, manifest)
    return bundle_dir


def test_an_output_s_own_tolerance_replaces_the_default(bundle_dir: Path) -> None:
    # numpy's float64 golden logits differ from ONNX Runtime's float32 ones by about 1e-6: inside the
    # default atol 1e-4, outside an output tolerance of 1e-9.
    bundle = open_bundle(_with_outputs(bundle_dir, {"logits": {"atol": 1e-9, "rtol": 0.0, "min_cosine": 0.5}}))
    assert bundle.output_tolerances.for_output("logits") == Tolerance(1e-9, 0.0, 0.5)
    result = self_check(bundle, create_runner(bundle), raise_on_failure=False)
    logits = result.output("logits")
    assert not logits.passed and logits.mismatched_elements > 0
    with pytest.raises(BundleError, match=r"output 'logits': max_abs_diff .* outside atol 1e-09 \+ rtol 0 x \|golden\|\), cosine_min .* \(min_cosine 0\.5\)"):
        self_check(bundle, create_runner(bundle))


def test_missing_keys_of_an_output_take_the_defaults(bundle_dir: Path) -> None:
    bundle = open_bundle(_with_outputs(bundle_dir, {"logits": {"min_cosine": 0.25}}))
    assert bundle.output_tolerances.for_output("logits") == Tolerance(1e-4, 1e-3, 0.25)
    assert self_check(bundle, create_runner(bundle)).passed


def test_a_bundle_without_per_output_tolerances_uses_the_defaults(bundle_dir: Path) -> None:
    bundle = open_bundle(bundle_dir)
    assert bundle.output_tolerances.outputs == {}
    assert bundle.output_tolerances.for_output("logits") == Tolerance(1e-4, 1e-3, 0.999)


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (["logits"], r"golden\.outputs must map output names to \{atol, rtol, min_cosine\}, got \['logits'\]"),
        ({"logits": 0.1}, r"golden\.outputs\['logits'\] must be \{atol, rtol, min_cosine\}, got 0\.1"),
        ({"logits": {"min_cosine": -2.69}}, r"golden\.outputs\['logits'\]\.min_cosine must be a number in -1\.0\.\.1\.0, got -2\.69"),
        ({"logits": {"atol": -1}}, r"golden\.outputs\['logits'\]\.atol must be a number >= 0\.0, got -1"),
        ({"logits": {"atol": "0.1"}}, r"golden\.outputs\['logits'\]\.atol must be a number >= 0\.0, got '0\.1'"),
        ({"logits": {"max_mismatched_fraction": 1.5}}, r"golden\.outputs\['logits'\]\.max_mismatched_fraction must be a number in 0\.0\.\.1\.0, got 1\.5"),
    ],
)
def test_bad_per_output_tolerances_are_refused_with_the_key(bundle_dir: Path, outputs: object, message: str) -> None:
    _with_outputs(bundle_dir, outputs)
    with pytest.raises(BundleError, match=r"manifest\.json'?: " + message):
        open_bundle(bundle_dir)


def test_non_finite_default_tolerance_is_refused() -> None:
    with pytest.raises(BundleError, match=r"'m': golden\.atol must be a number >= 0\.0, got inf"):
        parse_tolerances({"atol": float("inf"), "rtol": 0.0, "min_cosine": 0.9}, where="m")


def test_a_tolerance_too_large_for_a_float_is_refused_with_the_key(bundle_dir: Path) -> None:
    """JSON allows 10**400 written as digits; float() of it overflows: a BundleError naming the field, not OverflowError."""
    manifest = load_manifest(bundle_dir)
    manifest["golden"]["atol"] = 10**400
    manifest["golden"]["outputs"] = {"logits": {"rtol": -(10**400)}}
    write_manifest(bundle_dir, manifest)
    with pytest.raises(BundleError, match=r"manifest\.json': golden\.atol must be a number >= 0\.0, got an integer too large for a float"):
        open_bundle(bundle_dir)
    with pytest.raises(BundleError, match=r"'m': golden\.outputs\['logits'\]\.rtol must be a number >= 0\.0, got an integer too large"):
        parse_tolerances({"atol": 0.1, "rtol": 0.0, "min_cosine": 0.9, "outputs": {"logits": {"rtol": -(10**400)}}}, where="m")


def test_an_allowed_fraction_of_mismatched_elements_passes_and_one_more_fails(bundle_dir: Path) -> None:
    bundle = open_bundle(_with_outputs(bundle_dir, {"logits": {"atol": 1e-9, "rtol": 0.0, "min_cosine": 0.5}}))
    batches = [batch.load() for batch in bundle.golden_batches]
    worst = self_check(bundle, create_runner(bundle), raise_on_failure=False).output("logits")
    per_batch = max(out["logits"].size for _, out in batches)
    assert 0 < worst.mismatched_elements
    _with_outputs(bundle_dir, {"logits": {"atol": 1e-9, "rtol": 0.0, "min_cosine": 0.5, "max_mismatched_fraction": 1.0}})
    assert self_check(open_bundle(bundle_dir), create_runner(bundle)).passed
    _with_outputs(bundle_dir, {"logits": {"atol": 1e-9, "rtol": 0.0, "min_cosine": 0.5, "max_mismatched_fraction": 0.5 / per_batch}})
    failed = self_check(open_bundle(bundle_dir), create_runner(bundle), raise_on_failure=False)
    assert not failed.output("logits").passed  # rounds down to zero allowed elements
