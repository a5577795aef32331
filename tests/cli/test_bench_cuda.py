"""``edgekit bench --device cuda``: onnxruntime-gpu's CUDA provider beside PyTorch on the same GPU.

Without onnxruntime-gpu the option is a clear error; the GPU test runs on a lent GPU machine
(scripts/check_ort_gpu.sh) and skips elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest

from edgekit.cli.main import main


def _cuda_ready() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers() and Path("/dev/nvidia0").exists()


@pytest.fixture
def built(tiny_recipe, tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["build", str(tiny_recipe()), "--target", "x86-64-cpu", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    return out


def test_cpu_bench_says_where_it_ran(built, capsys):
    assert main(["bench", str(built), "--iterations", "5", "--warmup", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["device"] == "cpu" and report["providers"] == ["CPUExecutionProvider"]
    assert set(report["variants"]) == {"bundle"}


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime has CUDA built in")
def test_cuda_without_onnxruntime_gpu_is_a_clear_error(built, capsys):
    assert main(["bench", str(built), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda needs onnxruntime-gpu's CUDAExecutionProvider" in err
    assert "pip install 'edgekit[gpu]'" in err


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs onnxruntime-gpu with CUDAExecutionProvider and a visible NVIDIA GPU")
def test_cuda_bench_times_every_variant_beside_pytorch_on_the_gpu(built, capsys, record_property):
    assert main(["bench", str(built), "--device", "cuda", "--vs-pytorch", "--iterations", "50", "--warmup", "5", "--json"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed.strip().splitlines()[-1])
    assert report["device"] == "cuda" and report["providers"][0] == "CUDAExecutionProvider"
    assert set(report["variants"]) == {"bundle", "bundle_device_io", "bundle_cuda_graph", "pytorch_eager"}
    for variant in report["variants"].values():
        assert variant["count"] == 50 and variant["p50_ms"] > 0
    if "energy_note" not in report:  # NVML with an energy counter (data-centre GPUs have one)
        energy = report["variants"]["bundle"]["energy"]
        assert energy["mj_per_inference"] > 0 and energy["calls"] > 0 and energy["mean_w"] > 0
    for name, variant in report["variants"].items():  # the numbers, for the check's summary
        record_property(f"{name}_p50_ms", variant["p50_ms"])
        if "energy" in variant:
            record_property(f"{name}_mj_per_inference", variant["energy"]["mj_per_inference"])
