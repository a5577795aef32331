"""A backend lists only precisions it can build on the device, each once, and ONNX Runtime execution providers by their
real names, each once: checked when the profile loads (by the rules the build's gating applies), not at build time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from edgekit.errors import TargetError
from edgekit.precision import Backend, Precision
from edgekit.quantize import gating
from edgekit.target import (
    ONNXRUNTIME_PROVIDERS,
    OPENVINO_DEVICE_FLOATS,
    TargetProfile,
    default_registry,
    load_target_file,
)

from tests.test_target_strict_numbers import NX, edited


def refused(path: Path) -> str:
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    return info.value.message


NX_TRT = "No FP8 / FP4.\n    precisions: [fp32, fp16, int8, int4]"
NX_ORT = "precisions: [fp32, fp16, int8, int4]\n    execution_providers"


@pytest.mark.parametrize(("name", "old", "new", "column", "field", "reason"), [
    (NX, NX_TRT, "No FP8 / FP4.\n    precisions: [fp32, int8-dynamic]", 24, "backends[0].precisions[1]",
     "int8-dynamic quantizes activations at run time, which only ONNX Runtime's CPU provider does; TensorRT runs static int8 "
     "(remove int8-dynamic from the tensorrt precisions)"),
    (NX, NX_ORT, "precisions: [fp32, nvfp4, fp8]\n    execution_providers", 24, "backends[1].precisions[1]",
     "onnxruntime precision 'nvfp4' needs compute capability 10.0 or newer; this GPU is 8.7 (remove nvfp4 from the onnxruntime precisions)"),
    ("raspberry-pi-5", "precisions: [fp32, fp16, int8, int8-dynamic, int4]", "precisions: [fp32, bf16]", 24, "backends[0].precisions[1]",
     "bf16 has no CPU or NPU kernels in ONNX Runtime: it needs the CUDA or TensorRT execution provider (remove bf16 from the onnxruntime precisions)"),
    ("intel-core-ultra-npu", "device: NPU\n    precisions: [fp16, int8]", "device: NPU\n    precisions: [fp16, int8, fp32]", 30,
     "backends[0].precisions[2]", "the OpenVINO NPU compiles FP32 layers to FP16: list fp16 or int8 (remove fp32 from the openvino precisions)"),
    (NX, NX_ORT, "precisions: [fp16, fp32, fp16]\n    execution_providers", 30, "backends[1].precisions[2]",
     "precision 'fp16' is listed twice for onnxruntime: remove one"),
])  # fmt: skip
def test_a_precision_the_backend_cannot_build_is_refused_at_load(tmp_path: Path, name, old, new, column, field, reason):
    path, line = edited(tmp_path, name, old, new)
    line += new[: new.index("precisions")].count("\n")
    assert refused(path) == f"invalid target profile:\n{path}:{line}:{column}: field '{field}': {reason}"


def test_an_execution_provider_listed_twice_or_misspelt_is_refused(tmp_path: Path):
    path, line = edited(tmp_path, NX, "      - name: CPUExecutionProvider\n", "      - name: CPUExecutionProvider\n        options: {}\n"
                        "      - name: CPUExecutionProvider\n")  # fmt: skip
    assert refused(path) == (f"invalid target profile:\n{path}:{line + 2}:9: field 'backends[1].execution_providers[3].name': "
                             "execution provider 'CPUExecutionProvider' is listed twice: keep one entry (with all its options)")  # fmt: skip
    path, line = edited(tmp_path, NX, "      - name: CUDAExecutionProvider\n", "      - name: CudaExecutionProvider\n")
    assert refused(path) == (f"invalid target profile:\n{path}:{line}:9: field 'backends[1].execution_providers[1].name': "
                             "'CudaExecutionProvider' is not an ONNX Runtime execution provider: did you mean 'CUDAExecutionProvider'?")
    path, line = edited(tmp_path, NX, "      - name: CPUExecutionProvider\n", "      - name: FooExecutionProvider\n")
    assert refused(path).endswith("'FooExecutionProvider' is not an ONNX Runtime execution provider: "
                                  "onnxruntime.get_all_providers() lists their names")


def test_the_provider_table_knows_every_provider_of_the_installed_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    assert set(ort.get_all_providers()) <= ONNXRUNTIME_PROVIDERS


def test_the_openvino_table_is_the_gating_one():
    assert OPENVINO_DEVICE_FLOATS == gating.OPENVINO_FLOAT_PRECISIONS


def _with(profile: TargetProfile, index: int, precision: Precision) -> dict[str, Any]:
    data = profile.to_json()
    data["backends"][index]["precisions"] = [*data["backends"][index]["precisions"], precision.value]
    return data


@pytest.mark.parametrize("name", default_registry().names())
def test_load_time_checks_agree_with_the_build_gating(name: str):
    """Every precision added to every backend of every shipped profile: the profile loads exactly when the build's
    gating would run it (the CPU flags OpenVINO's CPU plugin needs for bf16 / fp16 only the build checks)."""
    profile = default_registry().get(name)
    for index, support in enumerate(profile.backends):
        for precision in Precision:
            if precision in support.precisions:
                assert gating.refusal_reason(profile, support.name, precision) is None  # a shipped list is buildable
                continue
            if support.name is Backend.OPENVINO:
                reason = gating.openvino_refusal(profile, precision)
                if OPENVINO_DEVICE_FLOATS[support.device or "CPU"].get(precision):
                    continue  # the CPU flags it needs: the build checks them (cpu.isa, or the build host's)
            else:
                reason = gating.REQUIREMENTS[precision].check(profile, support.name)
            try:
                TargetProfile.model_validate(_with(profile, index, precision))
            except pydantic.ValidationError as exc:
                assert reason is not None, f"{name} {support.name.value} {precision.value}: refused at load, built by gating: {exc}"
            else:
                assert reason is None, f"{name} {support.name.value} {precision.value}: loads, but the build refuses: {reason}"
