"""Gating enforces int4's stated requirement: on TensorRT it needs compute capability >= 8.0 (ONNX Runtime's
MatMulNBits runs anywhere). Every shipped target still runs every precision it declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.precision import Backend, Precision
from edgekit.quantize.gating import refusal_reason, supported_precisions
from edgekit.target import get_target

TARGETS = Path(__file__).resolve().parents[2] / "targets"


def _with_cc(name: str, compute_capability: str):
    target = get_target(name)
    return target.model_copy(update={"gpu": target.gpu.model_copy(update={"compute_capability": compute_capability})})


def test_int4_on_tensorrt_needs_compute_capability_8_0():
    turing = _with_cc("jetson-orin-nano-8gb", "7.5")
    assert turing.gpu.sm == (7, 5)
    reason = refusal_reason(turing, Backend.TENSORRT, Precision.INT4)
    assert reason == "int4 weight-only on TensorRT needs compute capability >= 8.0; this GPU is 7.5 (ampere)"
    assert Precision.INT4 not in supported_precisions(turing, Backend.TENSORRT)
    assert refusal_reason(get_target("jetson-orin-nano-8gb"), Backend.TENSORRT, Precision.INT4) is None  # 8.7
    assert refusal_reason(get_target("x86-64-cpu"), Backend.ONNXRUNTIME, Precision.INT4) is None  # MatMulNBits on CPU


@pytest.mark.parametrize("path", sorted(TARGETS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_target_runs_the_precisions_it_declares(path):
    target = get_target(path.stem)
    for spec in target.backends:
        for precision in spec.precisions:
            assert refusal_reason(target, spec.name, precision) is None, (path.stem, spec.name.value, precision.value)
