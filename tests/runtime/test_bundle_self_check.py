"""self_check on real bundles, and the golden comparison it is built on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.errors import BundleError
from edgekit_runtime.golden import compare_output, merge_checks, row_cosine_min


def test_self_check_passes_on_an_intact_bundle(bundle_dir: Path) -> None:
    bundle = open_bundle(bundle_dir)
    runner = create_runner(bundle)
    result = self_check(bundle, runner)
    assert result.passed
    assert result.batches == 2
    assert (result.atol, result.rtol, result.min_cosine) == (1e-4, 1e-3, 0.999)
    assert result.providers == ("CPUExecutionProvider",)
    logits = result.output("logits")
    assert logits.passed and logits.mismatched_elements == 0
    assert logits.total_elements == (2 + 3) * 10  # two golden batches of 2 and 3 images
    assert 0.0 <= logits.max_abs_diff < 1e-4
    assert logits.cosine_min > 0.999999
    assert json.loads(json.dumps(result.to_dict()))["outputs"][0]["name"] == "logits"
    assert not runner.is_loaded  # loaded for the check, closed afterwards


def test_self_check_leaves_a_loaded_runner_loaded(bundle_dir: Path) -> None:
    bundle = open_bundle(bundle_dir)
    with create_runner(bundle) as runner:
        assert self_check(bundle, runner).passed
        assert runner.is_loaded


def _tamper_outputs(bundle_dir: Path, index: int, change) -> None:  # type: ignore[no-untyped-def]
    path = bundle_dir / "golden" / f"outputs_{index:03d}.npz"
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    np.savez(path, **change(arrays))


def test_tampered_golden_outputs_fail_with_the_numbers(bundle_dir: Path) -> None:
    _tamper_outputs(bundle_dir, 1, lambda a: {"logits": a["logits"] + np.float32(0.5)})
    bundle = open_bundle(bundle_dir, verify=False)  # a verified open would stop at the hash already
    with pytest.raises(BundleError) as caught:
        self_check(bundle, create_runner(bundle))
    message = str(caught.value)
    assert f"self-check of bundle 'tiny-linear-x86-64-cpu-fp32' at '{bundle_dir}' failed on CPUExecutionProvider" in message
    assert "output 'logits': max_abs_diff 0.5 (30/50 elements outside atol 0.0001 + rtol 0.001 x |golden|)" in message
    assert "(min_cosine 0.999), worst in golden batch 1" in message
    assert "loosen the golden tolerances" in message


def test_raise_on_failure_false_returns_the_result(bundle_dir: Path) -> None:
    _tamper_outputs(bundle_dir, 0, lambda a: {"logits": -a["logits"]})
    bundle = open_bundle(bundle_dir, verify=False)
    result = self_check(bundle, create_runner(bundle), raise_on_failure=False)
    assert not result.passed
    logits = result.output("logits")
    assert not logits.passed
    assert logits.cosine_min == pytest.approx(-1.0)
    assert logits.worst_batch == 0
    assert logits.mismatched_elements == 20


def test_golden_output_of_the_wrong_shape(bundle_dir: Path) -> None:
    _tamper_outputs(bundle_dir, 0, lambda a: {"logits": a["logits"][:, :5]})
    bundle = open_bundle(bundle_dir, verify=False)
    with pytest.raises(BundleError, match=r"output 'logits': shape \[2, 10\] differs from golden \[2, 5\] in golden batch 0"):
        self_check(bundle, create_runner(bundle))
    result = self_check(bundle, create_runner(bundle), raise_on_failure=False)
    assert result.to_dict()["outputs"][0]["max_abs_diff"] is None  # inf is not JSON


def test_golden_output_the_model_does_not_produce(bundle_dir: Path) -> None:
    _tamper_outputs(bundle_dir, 0, lambda a: {**a, "probabilities": a["logits"]})
    bundle = open_bundle(bundle_dir, verify=False)
    with pytest.raises(BundleError, match="hold 'probabilities', which the model does not produce \\(its outputs: logits\\)"):
        self_check(bundle, create_runner(bundle))


def test_golden_inputs_that_break_the_signature(bundle_dir: Path) -> None:
    path = bundle_dir / "golden" / "inputs_000.npz"
    np.savez(path, image=np.zeros((2, 1, 8, 8), dtype=np.float64))
    bundle = open_bundle(bundle_dir, verify=False)
    with pytest.raises(BundleError) as caught:
        self_check(bundle, create_runner(bundle))
    assert f"golden inputs '{path}' do not match the model signature: input 'image'" in str(caught.value)
    assert "got float64[2, 1, 8, 8]" in str(caught.value)


def test_unreadable_golden_file(bundle_dir: Path) -> None:
    path = bundle_dir / "golden" / "outputs_000.npz"
    path.write_bytes(b"not a zip archive")
    bundle = open_bundle(bundle_dir, verify=False)
    with pytest.raises(BundleError, match=f"golden file '{path}' cannot be read as a .npz archive"):
        self_check(bundle, create_runner(bundle))


# -- the comparison itself --------------------------------------------------------------------------


def test_compare_output_uses_atol_plus_rtol_times_golden() -> None:
    golden = np.array([[1.0, 100.0]], dtype=np.float32)
    inside = compare_output("y", golden, golden + np.array([[0.01, 0.9]], np.float32), atol=0.02, rtol=0.01, min_cosine=0.9)
    assert inside.passed and inside.max_abs_diff == pytest.approx(0.9, rel=1e-5)
    outside = compare_output("y", golden, golden + np.array([[0.05, 0.0]], np.float32), atol=0.02, rtol=0.01, min_cosine=0.9)
    assert not outside.passed and outside.mismatched_elements == 1


def test_row_cosine_catches_one_bad_sample_in_a_batch() -> None:
    golden = np.ones((100, 4))
    actual = golden.copy()
    actual[7] = -1.0
    assert row_cosine_min(actual, golden) == pytest.approx(-1.0)
    whole = float(actual.ravel() @ golden.ravel() / (np.linalg.norm(actual) * np.linalg.norm(golden)))
    assert whole > 0.9  # a whole-array cosine would have hidden it
    assert row_cosine_min(np.zeros((2, 3)), np.zeros((2, 3))) == 1.0
    assert row_cosine_min(np.zeros((2, 3)), np.ones((2, 3))) == 0.0


def test_nan_and_integer_outputs() -> None:
    nan_golden = np.array([1.0, np.nan])
    assert compare_output("y", nan_golden, nan_golden.copy(), atol=0, rtol=0, min_cosine=1.0).passed
    broken = compare_output("y", np.array([1.0, 2.0]), np.array([1.0, np.nan]), atol=1, rtol=0, min_cosine=0.0)
    assert not broken.passed and math.isinf(broken.max_abs_diff)
    labels = np.array([3, 1, 4], dtype=np.int64)
    assert compare_output("label", labels, labels.copy(), atol=0, rtol=0, min_cosine=1.0).cosine_min == 1.0
    wrong = compare_output("label", labels, np.array([3, 1, 5]), atol=0, rtol=0, min_cosine=0.0)
    assert not wrong.passed and wrong.cosine_min == 0.0


def test_merge_keeps_the_worst_numbers() -> None:
    golden = np.ones((2, 3), dtype=np.float32)
    good = compare_output("y", golden, golden, atol=0.1, rtol=0, min_cosine=0.9, batch=0)
    bad = compare_output("y", golden, golden + 1, atol=0.1, rtol=0, min_cosine=0.9, batch=1)
    merged = merge_checks([good, bad])
    assert (merged.passed, merged.worst_batch, merged.max_abs_diff) == (False, 1, 1.0)
    assert (merged.mismatched_elements, merged.total_elements) == (6, 12)
    with pytest.raises(ValueError, match="at least one"):
        merge_checks([])
