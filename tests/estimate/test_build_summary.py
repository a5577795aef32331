"""The build summary shows the estimate beside the host measurement when the target is another device."""

from __future__ import annotations

import json

import pytest

from edgekit.cli.main import main
from edgekit.estimate.inputs import estimate_path
from edgekit.estimate.summary import estimate_for_bundle


def test_build_for_a_jetson_shows_its_estimate_beside_the_host_latency(tiny_recipe, tmp_path, capsys) -> None:
    out = tmp_path / "jetson"
    assert main(["build", str(tiny_recipe()), "--target", "jetson-orin-nano-8gb", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    latency = next(line for line in text.splitlines() if line.strip().startswith("latency"))
    estimate_line = next(line for line in text.splitlines() if line.strip().startswith("estimate"))
    assert "measured on this host" in latency
    assert "on jetson-orin-nano-8gb at 15W: ESTIMATE" in estimate_line and "default factors" in estimate_line
    manifest = json.loads((out / "manifest.json").read_text())
    result, reason = estimate_for_bundle(manifest, out)
    assert reason is None and result is not None
    assert f"p50 {result.p50_ms:.2f} ms" in estimate_line
    # the same numbers as `edgekit estimate BUNDLE` (the bundle's benchmark shape)
    same, source = estimate_path(out, "jetson-orin-nano-8gb")
    assert same.p50_ms == pytest.approx(result.p50_ms) and source.dims == manifest["benchmark"]["shape"]
    page = (out / "report.html").read_text()
    section = page[page.index('<section id="estimate">'):page.index('<section id="device">')]
    assert "Estimate on the target" in section and "An ESTIMATE, not a measurement" in section
    assert "Estimated time per node class" in section and "<svg" in section  # the per-class plot
    assert f"{result.p50_ms:.3f} ms" in section and "15W" in section and "7W" in section


def test_build_for_this_host_shows_no_estimate(tiny_recipe, tmp_path, capsys) -> None:
    out = tmp_path / "host"
    assert main(["build", str(tiny_recipe()), "--target", "x86-64-cpu", "--out", str(out)]) == 0
    assert not any(line.strip().startswith("estimate") for line in capsys.readouterr().out.splitlines())
    result, reason = estimate_for_bundle(json.loads((out / "manifest.json").read_text()), out)
    assert result is None and "measured, not estimated" in reason
    assert '<section id="estimate">' not in (out / "report.html").read_text()
