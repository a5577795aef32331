"""Latency statistics, the timing loop, peak RSS and benchmark_runner on a real runner."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.errors import EdgekitError, InputSignatureError
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.timing import LatencyStats, benchmark_runner, peak_rss_mb, rss_mb, throughput_per_s, time_calls
from tests.runtime.tiny_bundle import io_section


def test_stats_match_numpy() -> None:
    samples = np.random.default_rng(0).gamma(2.0, 1.5, size=997)
    stats = LatencyStats.from_samples(samples.tolist())
    assert stats.count == 997
    for field, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99)):
        assert getattr(stats, field) == pytest.approx(float(np.percentile(samples, q)), rel=1e-12)
    assert stats.mean_ms == pytest.approx(samples.mean())
    assert stats.std_ms == pytest.approx(samples.std(ddof=0))
    assert (stats.min_ms, stats.max_ms) == (samples.min(), samples.max())
    assert list(stats.to_dict()) == ["count", "mean_ms", "min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "std_ms"]


def test_stats_of_one_sample_and_bad_samples() -> None:
    single = LatencyStats.from_samples([2.5])
    assert (single.p50_ms, single.p99_ms, single.std_ms) == (2.5, 2.5, 0.0)
    with pytest.raises(ValueError, match="non-empty"):
        LatencyStats.from_samples([])
    with pytest.raises(ValueError, match="finite and >= 0 ms"):
        LatencyStats.from_samples([1.0, -0.5])


def test_time_calls_counts_and_measures() -> None:
    calls: list[int] = []
    samples = time_calls(lambda: calls.append(1), warmup=3, iterations=7)
    assert len(calls) == 10 and len(samples) == 7
    assert all(sample >= 0 for sample in samples)
    slow = time_calls(lambda: time.sleep(0.002), warmup=0, iterations=3)
    assert min(slow) >= 2.0 and max(slow) < 1000.0  # milliseconds, not seconds or ns
    assert gc.isenabled()


def test_time_calls_restores_gc_after_an_exception() -> None:
    def fail() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        time_calls(fail, warmup=0, iterations=1)
    assert gc.isenabled()


@pytest.mark.parametrize(("warmup", "iterations", "text"), [
    (-1, 5, "benchmark warmup must be an int >= 0, got -1"),
    (0, 0, "benchmark iterations must be an int >= 1, got 0"),
    (0, 2.5, "benchmark iterations must be an int >= 1, got 2.5"),
])  # fmt: skip
def test_time_calls_rejects_bad_counts(warmup: int, iterations: int, text: str) -> None:
    with pytest.raises(EdgekitError) as caught:
        time_calls(lambda: None, warmup, iterations)
    assert text in str(caught.value)


def test_throughput() -> None:
    stats = LatencyStats.from_samples([4.0, 4.0])
    assert throughput_per_s(8, stats) == pytest.approx(2000.0)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        throughput_per_s(0, stats)


def test_peak_rss_reads_vmhwm_and_grows(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  999999 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  1024 kB\n")
    assert peak_rss_mb(status) == 200.0
    fallback = peak_rss_mb(tmp_path / "missing")  # getrusage
    assert fallback > 10.0
    before = peak_rss_mb()
    block = np.ones(48 * 1024 * 1024 // 8)  # 48 MiB, touched
    after = peak_rss_mb()
    assert after >= before and after >= 48.0
    del block


def test_rss_reads_vmrss_now_and_none_without_proc(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  1024 kB\n")
    assert rss_mb(status) == 1.0
    assert rss_mb(tmp_path / "missing") is None
    status.write_text("VmRSS:\t  lots\n")
    assert rss_mb(status) is None
    now = rss_mb()
    assert now is not None and 10.0 < now <= peak_rss_mb()


def test_benchmark_runner_on_a_real_runner(model_path: Path, images: np.ndarray) -> None:
    with OnnxRuntimeRunner(model_path, IOSignature.from_manifest(io_section()), intra_op_threads=1) as runner:
        result = benchmark_runner(runner, {"image": images}, warmup=2, iterations=15)
        with pytest.raises(InputSignatureError, match="input 'image'"):
            benchmark_runner(runner, {"image": images.astype(np.float64)}, warmup=1, iterations=1)
    assert result.stats.count == 15 and len(result.samples_ms) == 15
    assert result.batch == 4 and dict(result.shape) == {"batch": 4}
    assert result.stats.min_ms > 0
    assert result.throughput_per_s == pytest.approx(4 * 1000.0 / result.stats.mean_ms)
    assert result.peak_rss_mb > 0
    record = result.to_dict()
    for key in ("batch", "shape", "warmup", "iterations", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms",
                "throughput_per_s", "peak_rss_mb"):  # fmt: skip
        assert key in record  # the manifest's benchmark keys this result owns
    assert "samples_ms" not in record and len(result.to_dict(include_samples=True)["samples_ms"]) == 15


def test_benchmark_batch_defaults_to_one_without_a_batch_dim(model_path: Path, images: np.ndarray) -> None:
    io = io_section()
    io["inputs"][0]["shape"] = ["n", 1, 8, 8]
    io["outputs"][0]["shape"] = ["n", 10]
    io["dims"] = {"n": {"min": 1, "opt": 4, "max": 8}}
    with OnnxRuntimeRunner(model_path, IOSignature.from_manifest(io)) as runner:
        assert benchmark_runner(runner, {"image": images}, warmup=0, iterations=2).batch == 1
        assert benchmark_runner(runner, {"image": images}, warmup=0, iterations=2, batch=4).batch == 4
        with pytest.raises(EdgekitError, match="benchmark batch must be >= 1, got 0"):
            benchmark_runner(runner, {"image": images}, warmup=0, iterations=2, batch=0)
