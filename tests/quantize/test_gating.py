"""Target gating: every precision's requirement, every refusal's text, the explicit fallback policy."""

from __future__ import annotations

import pytest

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize.gating import REQUIREMENTS, decide_precision, refusal_reason, supported_precisions
from edgekit.target import get_target


@pytest.fixture(scope="module")
def targets():
    return {name: get_target(name) for name in ("x86-64-cpu", "jetson-orin-nano-8gb", "jetson-agx-orin-64gb", "jetson-agx-thor", "nvidia-h100", "qualcomm-qcs6490")}


def test_every_precision_has_a_requirement():
    assert set(REQUIREMENTS) == set(Precision)


@pytest.mark.parametrize(
    ("target", "backend", "precision", "runs"),
    [
        ("x86-64-cpu", "onnxruntime", "fp32", True),
        ("x86-64-cpu", "onnxruntime", "fp16", True),
        ("x86-64-cpu", "onnxruntime", "int8", True),
        ("x86-64-cpu", "onnxruntime", "int8-dynamic", True),
        ("x86-64-cpu", "onnxruntime", "int4", True),
        ("x86-64-cpu", "onnxruntime", "fp8", False),
        ("x86-64-cpu", "onnxruntime", "bf16", False),
        ("x86-64-cpu", "onnxruntime", "mxfp4", False),
        ("x86-64-cpu", "onnxruntime", "nvfp4", False),
        ("x86-64-cpu", "onnxruntime", "mxfp8", False),
        ("jetson-orin-nano-8gb", "tensorrt", "fp8", False),
        ("jetson-orin-nano-8gb", "tensorrt", "int8", True),
        ("jetson-orin-nano-8gb", "tensorrt", "int8-dynamic", False),
        ("jetson-agx-thor", "tensorrt", "fp8", True),
        ("jetson-agx-thor", "tensorrt", "nvfp4", True),
        ("nvidia-h100", "tensorrt", "fp8", True),
        ("nvidia-h100", "tensorrt", "nvfp4", False),
        ("qualcomm-qcs6490", "onnxruntime", "int8", True),
        ("qualcomm-qcs6490", "onnxruntime", "int8-dynamic", False),
        ("qualcomm-qcs6490", "onnxruntime", "fp32", False),
    ],
)
def test_refusal_matrix(targets, target, backend, precision, runs):
    reason = refusal_reason(targets[target], Backend(backend), Precision(precision))
    assert (reason is None) == runs, reason


def test_fp8_on_orin_names_precision_target_reason_and_alternatives(targets):
    with pytest.raises(QuantizationError) as info:
        decide_precision(targets["jetson-orin-nano-8gb"], Backend.TENSORRT, Precision.FP8)
    message = str(info.value)
    assert "precision fp8 cannot run on target 'jetson-orin-nano-8gb' (tensorrt)" in message
    assert "compute capability >= 8.9; this GPU is 8.7 (ampere)" in message
    assert "use one of: fp32, fp16, int8, int4" in message and "precision_fallback" in message


def test_fp8_on_cpu_says_no_cpu_kernels(targets):
    with pytest.raises(QuantizationError, match=r"fp8 \(E4M3\) has no CPU or NPU kernels"):
        decide_precision(targets["x86-64-cpu"], Backend.ONNXRUNTIME, Precision.FP8)


def test_dla_runs_only_fp16_and_int8(targets):
    orin = targets["jetson-agx-orin-64gb"]
    assert refusal_reason(orin, Backend.TENSORRT, Precision.INT8, use_dla=True) is None
    assert "DLA runs only fp16 and int8" in refusal_reason(orin, Backend.TENSORRT, Precision.INT4, use_dla=True)
    assert "has no DLA cores" in refusal_reason(targets["jetson-orin-nano-8gb"], Backend.TENSORRT, Precision.INT8, use_dla=True)
    assert supported_precisions(orin, Backend.TENSORRT, use_dla=True) == [Precision.FP16, Precision.INT8]


def test_explicit_fallback_policy_is_recorded(targets):
    decision = decide_precision(targets["x86-64-cpu"], Backend.ONNXRUNTIME, Precision.FP8, fallback=(Precision.NVFP4, Precision.INT8))
    assert decision.used is Precision.INT8
    manifest = decision.to_manifest()
    assert manifest == {"requested": "fp8", "used": "int8", "refused_because": manifest["refused_because"], "policy": "recipe build.precision_fallback"}
    assert "no CPU or NPU kernels" in manifest["refused_because"]


def test_fallback_that_also_fails_says_what_was_tried(targets):
    with pytest.raises(QuantizationError, match=r"fallbacks tried: mxfp4"):
        decide_precision(targets["x86-64-cpu"], Backend.ONNXRUNTIME, Precision.FP8, fallback=(Precision.MXFP4,))
