"""Numbers measured on the build host say so beside another device's target and precision: ``edgekit inspect``'s latency
and accuracy, ``edgekit bench``'s heading (and what it timed for a TensorRT bundle), and ``edgekit estimate``'s host
figure, which is "not comparable" when the estimate is at another shape or precision than the one measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgekit.cli.main import main
from tests.runtime.tiny_bundle import build_bundle, load_manifest, write_manifest

HOST = {"machine": "x86_64", "cpu": "Test CPU 9000", "cores": 2}
PI = {"name": "raspberry-pi-5", "display_name": "Raspberry Pi 5 (8GB)", "cpu": {"cores": 4, "isa": None}}
JETSON = {"name": "jetson-orin-nano-8gb", "display_name": "NVIDIA Jetson Orin Nano 8GB", "cpu": {"cores": 6, "isa": None}}
HERE = {"name": "x86-64-cpu", "display_name": "Generic x86-64 CPU (this host)", "cpu": {"cores": 2, "isa": "host"}}


def bundle(root: Path, target: dict[str, Any], precision: str = "fp32", tensorrt: bool = False) -> Path:
    """The tiny linear bundle, as a build for ``target`` at ``precision`` left it: benchmark and accuracy from the build host."""
    build_bundle(root)
    manifest = load_manifest(root)
    manifest.update(target=target, precision=precision,
                    benchmark={"host": HOST, "shape": {"batch": 64}, "batch": 64, "p50_ms": 0.72, "p99_ms": 4.82},
                    accuracy={"metric": "top1", "value": 0.98, "reference": 0.99, "passed": True})  # fmt: skip
    if tensorrt:  # what edgekit.engines.tensorrt records when the device builds the engine from the FP32 graph
        (root / "tensorrt").mkdir()
        (root / "tensorrt" / "plan.json").write_text("{}")
        manifest["backend"].update(name="tensorrt", tensorrt={"engine_built_on": "device", "onnx_precision": "as-exported",
                                                              "plan": "tensorrt/plan.json"})  # fmt: skip
    write_manifest(root, manifest)
    return root


def inspect_rows(capsys: pytest.CaptureFixture[str], root: Path) -> dict[str, str]:
    assert main(["inspect", str(root)]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_inspect_says_where_latency_and_accuracy_were_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = inspect_rows(capsys, bundle(tmp_path / "pi", PI, "int8"))
    where = "measured on the build host (Test CPU 9000, 2 cores), not on the Raspberry Pi 5 (8GB)"
    assert rows["latency"] == f"p50 0.72 ms, p99 4.82 ms at {{'batch': 64}}, {where}"
    assert rows["accuracy"] == f"top1 0.9800 (reference 0.9900), passed True, {where}"
    rows = inspect_rows(capsys, bundle(tmp_path / "jetson", JETSON, "fp16", tensorrt=True))
    assert rows["latency"] == ("p50 0.72 ms, p99 4.82 ms at {'batch': 64}, measured on the build host (Test CPU 9000, 2 cores), "
                               "not on the NVIDIA Jetson Orin Nano 8GB; FP32 graph on ONNX Runtime CPU; the device applies fp16 "
                               "(TensorRT builder flags), so its latency differs")  # fmt: skip
    assert rows["accuracy"].endswith("not on the NVIDIA Jetson Orin Nano 8GB")
    rows = inspect_rows(capsys, bundle(tmp_path / "here", HERE))  # the host's own profile: its numbers are the target's
    assert rows["latency"] == "p50 0.72 ms, p99 4.82 ms at {'batch': 64}, measured on the build host (Test CPU 9000, 2 cores)"


def test_bench_heading_says_this_host_and_what_it_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgekit.bundle.manifest import host_description

    cpu = host_description()["cpu"]
    assert main(["bench", str(bundle(tmp_path / "jetson", JETSON, "fp16", tensorrt=True)), "-n", "3", "--warmup", "0", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (f"{tmp_path / 'jetson'} at {{'batch': 4}} on this host (CPU {cpu}, 1 threads), "
                                   "not on the NVIDIA Jetson Orin Nano 8GB, 3 runs each")  # fmt: skip
    assert "timed: FP32 graph on ONNX Runtime CPU; the device applies fp16 (TensorRT builder flags), so its latency differs" in out
    assert main(["bench", str(bundle(tmp_path / "here", HERE)), "-n", "3", "--warmup", "0", "--threads", "1", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["host_cpu"], report["measured_on_target"], report["target"]) == (cpu, True, None) and "graph_note" not in report
    heading = captured.err.splitlines()[0]
    assert heading == f"{tmp_path / 'here'} at {{'batch': 4}} on this host (CPU {cpu}, 1 threads), 3 runs each"


def test_estimate_says_the_host_figure_is_not_comparable_at_another_shape_or_precision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = bundle(tmp_path / "here", HERE)
    measured = "host measured 0.720 ms p50 at {'batch': 64}, fp32, on the build host (Test CPU 9000)"
    for extra, verdict, comparable in (
        ([], "for comparison", True),
        (["--shape", "batch=64", "--precision", "fp32"], "for comparison", True),
        (["--shape", "batch=1"], "not comparable: the estimate is at --shape batch=1", False),
        (["--precision", "int8"], "not comparable: the estimate is at --precision int8", False),
        (["--shape", "batch=2", "--precision", "fp16"], "not comparable: the estimate is at --shape batch=2 and --precision fp16", False),
    ):
        assert main(["estimate", str(root), "--target", "raspberry-pi-5", *extra]) == 0
        assert f"{measured}, {verdict}" in " ".join(capsys.readouterr().out.split()), extra
        assert main(["estimate", str(root), "--target", "raspberry-pi-5", "--json", *extra]) == 0
        source = json.loads(capsys.readouterr().out)["source"]
        assert source == {**source, "measured_dims": {"batch": 64}, "measured_precision": "fp32", "measured_comparable": comparable}
