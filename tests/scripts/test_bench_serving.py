"""scripts/bench_serving.py: the agent as a server beside a bare loop, with the host's CPU bound and the agent's own
compute time per request (the parts that run without perf_analyzer; perf_analyzer itself is not in CI)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit_runtime.bundle import open_bundle
from tests.runtime.agent_service.model_bundles import make_model_bundle

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def bench_serving():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench_serving as module
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


@pytest.fixture(scope="module")
def slow_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_bundle(tmp_path_factory.mktemp("bench-serving") / "slow", "slow", repeats=4)


def test_the_model_cpu_an_item_is_timed_on_the_agents_session_options(bench_serving, slow_bundle: Path) -> None:
    bundle = open_bundle(slow_bundle, verify=True)
    feeds = bench_serving.request_feeds(bundle, 0, {})
    assert feeds["x"].shape == (1, 256)
    one = bench_serving.batched_compute_cpu_us(bundle, feeds, 1, {"intra_op_spinning": False, "intra_op_threads": 1}, seconds=0.2)
    eight = bench_serving.batched_compute_cpu_us(bundle, feeds, 8, {"intra_op_spinning": None}, seconds=0.2)
    for value in (one, eight):
        assert math.isfinite(value) and value > 0


def test_a_run_records_the_agents_compute_and_overhead_beyond_it(slow_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / "bench_serving.py"), "--bundle", str(slow_bundle), "--load-generator",
                           "tritonclient", "--protocols", "http", "--concurrency", "2", "--rounds", "1", "--seconds", "0.4",
                           "--out", str(out), "--key", "slow"],
                          capture_output=True, text=True, timeout=300, cwd=SCRIPTS.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(out.read_text())["runs"]["slow"]
    (row,) = run["rows"]
    for kind in ("plain", "batched_0.5"):
        assert row[f"{kind}_per_s"] > 0
        assert row[f"{kind}_compute_us_mean"] > 0  # from the agent's own statistics (compute_infer)
        assert row[f"{kind}_overhead_beyond_compute_p50_us"] == pytest.approx(row[f"{kind}_p50_us"] - row[f"{kind}_compute_us_mean"])
        assert f"{kind}_bound_ratio" not in row  # the bound needs perf_analyzer's own CPU, which only perf_analyzer runs report
    assert run["load_generator"] == "tritonclient threads"


@pytest.mark.parametrize(("value", "options"), [
    ("off", {"intra_op_spinning": False}),
    ("on", {"intra_op_spinning": True, "intra_op_spin_us": None}),
    ("bundle", {"intra_op_spinning": None, "intra_op_spin_us": None}),
    ("spin10", {"intra_op_spinning": True, "intra_op_spin_us": 10}),
    ("spin0", None), ("spin100001", None), ("spin", None), ("fast", None),
])  # fmt: skip
def test_spinning_values_name_the_runner_options(bench_serving, value: str, options: dict | None) -> None:
    assert bench_serving.spinning_options(value) == options


def test_a_bad_spinning_or_analyzer_mode_is_refused_before_any_agent_starts(slow_bundle: Path) -> None:
    for flag, value, message in (("--spinning", "spin10,fast", "--spinning fast: use off, on, bundle or spin<microseconds>"),
                                 ("--analyzer-modes", "sync,burst", "--analyzer-modes sync,burst: a comma list of sync and async")):  # fmt: skip
        done = subprocess.run([sys.executable, str(SCRIPTS / "bench_serving.py"), "--bundle", str(slow_bundle), flag, value],
                              capture_output=True, text=True, timeout=60, cwd=SCRIPTS.parent)  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, done.stderr[-1000:]
