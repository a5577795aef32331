"""Issue 21's Done-when: `edgekit estimate` runs for every shipped target on the demo models, at every precision
the target allows, and each result is a finite, positive ESTIMATE that lists its factors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from edgekit.estimate import estimate, graph_costs
from edgekit.estimate.estimate import ASSUMED_BYTE_SCALE
from edgekit.estimate.inputs import export_recipe, needs_measured_peak
from edgekit.target import default_registry

REPO = Path(__file__).resolve().parents[2]
DEMOS = ("digits-cnn", "minilm")
#: The x86-64-cpu target is timed from this host's measured peak; fixed figures keep the test fast and deterministic.
HOST_PEAK = {"peak_ops": {"fp32": 100e9, "int8": 400e9}, "bandwidth_bytes_s": 10e9, "cache_bytes": 2**21,
             "cache_bandwidth_bytes_s": 80e9, "method": "test figures"}  # fmt: skip


@pytest.fixture(scope="module")
def demo_graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, int]]]:
    """Each demo recipe exported once to ONNX (FP32), with its benchmark shape."""
    graphs = {}
    for name in DEMOS:
        source = export_recipe(REPO / "recipes" / f"{name}.yaml", default_registry().get("x86-64-cpu"), tmp_path_factory.mktemp(name))
        graphs[name] = (source.model_path, source.dims)
    return graphs


@pytest.mark.parametrize("target_name", default_registry().names())
def test_every_shipped_target_estimates_both_demos_at_every_precision_it_allows(target_name: str, demo_graphs) -> None:
    target = default_registry().get(target_name)
    measured = HOST_PEAK if needs_measured_peak(target) else None
    allowed = sorted({p.value for backend in target.backends for p in backend.precisions})
    assert set(allowed) <= set(ASSUMED_BYTE_SCALE), f"{target_name}: no byte scale for {set(allowed) - set(ASSUMED_BYTE_SCALE)}"
    for demo, (path, dims) in demo_graphs.items():
        cost = graph_costs(path, dims)
        for precision in [None, *allowed]:
            result = estimate(path, target, dims=dims, cost=cost, measured_peak=measured,
                              assume_precision=None if precision in (None, "fp32") else precision)  # fmt: skip
            where = f"{demo} on {target_name} as {precision or 'stored'}"
            for value in (result.p50_ms, result.throughput_per_s, result.peak_memory_mb):
                assert math.isfinite(value) and value > 0, where
            assert all(math.isfinite(e.energy_per_inference_mj) and e.energy_per_inference_mj > 0 for e in result.energy), where
            doc = result.to_json()
            assert doc["kind"] == "estimate" and doc["factors"][0].startswith("ESTIMATE, not a measurement"), where
            assert any(f.startswith("efficiency factors") for f in doc["factors"]), where
            assert doc["calibration"]["efficiency"] and doc["hardware"]["sources"], where
            assert result.engine in ("gpu", "npu", "dla", "total", "cpu") or "+" in result.engine, where
