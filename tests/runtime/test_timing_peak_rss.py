"""benchmark_runner's peak RSS is the benchmark's, not the lifetime peak of the process that ran it (a build's
VmHWM after torch, export, quantization and evaluation read 641 MB for a 657 KB model; ONNX Runtime alone: ~80 MiB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime import timing
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.timing import PEAK_PROCESS_LIFETIME, PEAK_SINCE_BENCHMARK, benchmark_runner, peak_rss_mb, reset_peak_rss
from tests.runtime.tiny_bundle import io_section


def test_reset_peak_rss_falls_back_where_the_os_refuses(tmp_path: Path) -> None:
    assert reset_peak_rss(tmp_path / "no" / "clear_refs") is False  # cannot be written: nothing reset
    status = tmp_path / "status"
    status.write_text("VmHWM:\t  204800 kB\nVmRSS:\t  1024 kB\n")  # the write "worked" but the peak did not move
    assert reset_peak_rss(tmp_path / "clear_refs", status) is False


def test_benchmark_peak_excludes_what_the_process_touched_before(model_path: Path, images: np.ndarray) -> None:
    block = np.ones(256 * 1024 * 1024 // 8)  # 256 MiB touched before the benchmark, then freed
    del block
    lifetime = peak_rss_mb()
    with OnnxRuntimeRunner(model_path, IOSignature.from_manifest(io_section()), intra_op_threads=1) as runner:
        result = benchmark_runner(runner, {"image": images}, warmup=1, iterations=5)
    if result.peak_rss_scope != PEAK_SINCE_BENCHMARK:
        pytest.skip("this OS cannot reset the peak RSS (/proc/self/clear_refs)")
    assert result.peak_rss_mb < lifetime - 200
    assert result.to_dict()["peak_rss_scope"] == "process during the benchmark"


def test_benchmark_records_a_lifetime_peak_as_such(model_path: Path, images: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "reset_peak_rss", lambda *args: False)
    with OnnxRuntimeRunner(model_path, IOSignature.from_manifest(io_section()), intra_op_threads=1) as runner:
        result = benchmark_runner(runner, {"image": images}, warmup=1, iterations=3)
    assert result.peak_rss_scope == PEAK_PROCESS_LIFETIME == "process lifetime"
    assert result.to_dict()["peak_rss_scope"] == "process lifetime"
