"""``edgekit bench``'s counts: bad --iterations / --warmup / --threads are errors naming the option, the run count is
the one asked for, and with --device cuda energy is per call and per inference (one item), labelled so."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgekit.cli.main import main
from tests.runtime.tiny_bundle import build_bundle


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return build_bundle(tmp_path / "bundle")


@pytest.mark.parametrize(("option", "value", "minimum", "example"), [
    ("--iterations", "0", 1, 50), ("--iterations", "-3", 1, 50), ("-n", "0", 1, 50),
    ("--warmup", "-1", 0, 10), ("--threads", "-2", 1, 4), ("--threads", "0", 1, 4),
])  # fmt: skip
def test_bad_counts_name_the_option(tiny: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, minimum: int, example: int) -> None:
    assert main(["bench", str(tiny), option, value]) == 2
    captured = capsys.readouterr()
    name = "--iterations" if option == "-n" else option
    assert captured.out == "" and "Traceback" not in captured.err
    assert (f"error: {name} must be {minimum} or more, not {value} hint: pass {name} N with N >= {minimum}, e.g. {name} {example}"
            in " ".join(captured.err.split()))  # fmt: skip


@pytest.mark.parametrize("iterations", [1, 3, 7, 12])
def test_the_run_count_is_the_one_asked_for(tiny: Path, capsys: pytest.CaptureFixture[str], iterations: int) -> None:
    assert main(["bench", str(tiny), "-n", str(iterations), "--warmup", "0", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["iterations"] == iterations and report["variants"]["bundle"]["count"] == iterations
    assert re.search(rf", {iterations} runs each$", captured.err.splitlines()[0]), captured.err


@dataclass
class _Reading:
    energy_mj: float
    timestamp_s: float


class _FakeNvml:
    """NVML's board energy counter at a constant 100 W."""

    unavailable_reason = None

    def available(self) -> bool:
        return True

    def read(self) -> _Reading:
        now = time.perf_counter()
        return _Reading(energy_mj=now * 100_000.0, timestamp_s=now)

    def close(self) -> None:
        pass


def test_cuda_energy_is_per_call_and_per_inference(tiny: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundle's graph on this CPU stands in for the CUDA provider; NVML is a fake at 100 W (no GPU needed)."""
    import edgekit_runtime.sensors.nvml as nvml

    from edgekit.bench import compare, gpu

    def cpu_contenders(bundle, signature, feeds):
        runner = compare.host_runner(bundle, signature, 1)
        return {"bundle": lambda: runner.infer(feeds)}, [runner], []

    measure = gpu.energy_per_inference
    monkeypatch.setattr(nvml, "NvmlPowerSensor", _FakeNvml)
    monkeypatch.setattr(gpu, "cuda_contenders", cpu_contenders)
    monkeypatch.setattr(gpu, "energy_per_inference", lambda contenders, batch: measure(contenders, batch, window_s=0.2))
    assert main(["bench", str(tiny), "--device", "cuda", "-n", "5", "--warmup", "1", "--shape", "batch=8", "--json"]) == 0
    captured = capsys.readouterr()
    energy = json.loads(captured.out)["variants"]["bundle"]["energy"]
    assert energy["batch"] == 8 and energy["mj_per_inference"] == pytest.approx(energy["mj_per_call"] / 8, rel=1e-3)
    assert energy["mean_w"] == pytest.approx(100.0, rel=0.05)
    header = next(line for line in captured.err.splitlines() if "variant" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")][-3:] == ["mJ / call", "mJ / inference", "mean W"]
    row = next(line for line in captured.err.splitlines() if line.startswith("│ bundle"))
    per_call, per_inference = (float(cell) for cell in [cell.strip() for cell in row.strip("│ ").split("│")][-3:-1])
    assert per_call == pytest.approx(energy["mj_per_call"], rel=1e-3) and per_inference == pytest.approx(energy["mj_per_inference"], rel=1e-3)
    assert "energy: mJ / call is one call of batch 8; mJ / inference is per item (one sample)" in captured.err
