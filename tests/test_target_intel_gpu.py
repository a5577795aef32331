"""An Intel GPU in the target schema (``gpu.api: openvino``) beside the CUDA GPUs: the shipped Core Ultra iGPU profile,
what each kind of GPU may and may not declare, the precision gating on OpenVINO's GPU device, and the estimate for the
OpenVINO devices labelled as a projection."""

from __future__ import annotations

import pydantic
import pytest

from edgekit.errors import TargetError
from edgekit.estimate.hardware import hardware_for
from edgekit.precision import Backend, Precision
from edgekit.quantize.gating import refusal_reason, supported_precisions
from edgekit.target import TargetProfile, get_target


def _data(name: str) -> dict:
    return get_target(name).to_json()


def test_the_core_ultra_igpu_is_an_openvino_gpu_with_its_figures() -> None:
    igpu = get_target("intel-core-ultra-igpu")
    assert igpu.gpu is not None and igpu.gpu.api == "openvino" and not igpu.gpu.is_cuda
    assert (igpu.gpu.architecture, igpu.gpu.xe_cores, igpu.gpu.vector_engines, igpu.gpu.max_clock_mhz) == ("xe-lpg", 8, 128, 2250)
    assert igpu.default_backend is Backend.OPENVINO and igpu.backend(Backend.OPENVINO).device == "GPU"
    gpu_peaks = {p.precision: p for p in igpu.peak_throughput if p.engine == "gpu"}
    assert set(gpu_peaks) == {Precision.INT8, Precision.FP16, Precision.FP32}
    assert all((p.derivation or "").startswith("PROJECTED") for p in gpu_peaks.values())  # derived, labelled so
    # the derivations multiply out: vector engines x per-clock rate x 2 x clock
    assert gpu_peaks[Precision.FP32].value == pytest.approx(128 * 8 * 2 * 2.25e9 / 1e12, abs=0.05)
    assert gpu_peaks[Precision.INT8].value == pytest.approx(128 * 32 * 2 * 2.25e9 / 1e12, abs=0.05)
    with pytest.raises(TargetError, match="has no CUDA compute capability"):
        _ = igpu.gpu.sm


def test_cuda_targets_still_need_their_compute_capability() -> None:
    data = _data("nvidia-h100")
    assert data["gpu"]["api"] == "cuda"
    del data["gpu"]["compute_capability"]
    with pytest.raises(pydantic.ValidationError, match="compute_capability is required for a CUDA GPU"):
        TargetProfile.model_validate(data)


@pytest.mark.parametrize(("source", "change", "message"), [
    ("nvidia-h100", {"xe_cores": 8}, "describe Intel GPUs"),
    ("intel-core-ultra-igpu", {"cuda_cores": 1024}, "describe CUDA GPUs"),
    ("intel-core-ultra-igpu", {"compute_capability": "8.7"}, "describe CUDA GPUs"),
])  # fmt: skip
def test_each_kind_of_gpu_declares_only_its_own_fields(source: str, change: dict, message: str) -> None:
    data = _data(source)
    data["gpu"].update(change)
    with pytest.raises(pydantic.ValidationError, match=message):
        TargetProfile.model_validate(data)


def test_backends_need_the_gpu_they_drive() -> None:
    tensorrt_on_intel = _data("intel-core-ultra-igpu")
    tensorrt_on_intel["backends"].insert(0, {"name": "tensorrt", "precisions": ["fp16"]})
    with pytest.raises(pydantic.ValidationError, match="tensorrt backend needs a gpu section with a CUDA GPU"):
        TargetProfile.model_validate(tensorrt_on_intel)
    no_gpu = _data("intel-core-ultra-igpu")
    no_gpu["gpu"] = None
    with pytest.raises(pydantic.ValidationError, match="device GPU needs a gpu section with gpu.api: openvino"):
        TargetProfile.model_validate(no_gpu)
    cuda_on_intel = _data("intel-core-ultra-igpu")
    cuda_on_intel["backends"].append({"name": "onnxruntime", "precisions": ["fp32"], "execution_providers": [{"name": "CUDAExecutionProvider"}]})
    with pytest.raises(pydantic.ValidationError, match="CUDAExecutionProvider need a gpu section with a CUDA GPU"):
        TargetProfile.model_validate(cuda_on_intel)


def test_the_igpu_gates_precisions_like_openvinos_gpu_plugin() -> None:
    igpu = get_target("intel-core-ultra-igpu")
    assert supported_precisions(igpu, Backend.OPENVINO) == [Precision.FP16, Precision.FP32, Precision.INT8]
    assert "OpenVINO on GPU runs fp32, int8 (static QDQ) and fp16, not bf16" in (refusal_reason(igpu, Backend.OPENVINO, Precision.BF16) or "")


@pytest.mark.parametrize(("name", "engine"), [("intel-core-ultra-igpu", "gpu"), ("intel-core-ultra-npu", "npu")])
def test_estimates_for_the_openvino_devices_are_labelled_projected(name: str, engine: str) -> None:
    hardware = hardware_for(get_target(name))
    assert hardware.engine == engine
    assert any(s.startswith(f"PROJECTED for the OpenVINO {engine.upper()} device") for s in hardware.sources)
    assert hardware.peak_for("int8")[0] > 0 and hardware.bandwidth_bytes_s == 120e9
    assert not any(s.startswith("PROJECTED") for s in hardware_for(get_target("jetson-orin-nano-8gb")).sources)
