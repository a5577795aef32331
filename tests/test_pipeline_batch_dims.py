"""The pipeline's batch dim, whatever its name: the benchmark counts items along it, and a target's build.max_batch
bounds it; stages with nothing to do end as skipped with the reason, not with a tick."""

from __future__ import annotations

import json

import pytest
import torch

from edgekit.errors import BuildError
from edgekit.pipeline import build
from edgekit.progress import StageReporter
from edgekit.target import TARGETS_DIR
from tests.conftest import TINY_RECIPE
from tests.fixtures.tiny_models import tiny_net

TINY = TINY_RECIPE.format(factory="tiny_net")


class Recorder(StageReporter):
    """The stages that ended, as ('done' | 'skipped: reason', name)."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[tuple[str, str]] = []

    def finished(self, name: str, seconds: float) -> None:
        self.ends.append(("done", name))

    def skipped(self, name: str, seconds: float, reason: str) -> None:
        self.ends.append((f"skipped: {reason}", name))


def test_throughput_counts_items_along_a_batch_dim_not_named_batch(tiny_recipe, tmp_path):
    text = TINY.replace("[batch, 1, 4, 4]", "[N, 1, 4, 4]").replace("  batch: {min: 1, opt: 4, max: 8}", "  N: {min: 1, opt: 4, max: 8}")
    result = build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "bundle")
    bench = result.manifest["benchmark"]
    assert bench["shape"] == {"N": 4} and bench["batch"] == 4
    assert bench["throughput_per_s"] == pytest.approx(4 * 1000 / bench["mean_ms"], rel=0.01)  # items per second at the mean latency


def test_a_batch_dim_above_the_target_s_max_batch_is_refused_at_load(tiny_recipe, tmp_path):
    profile = tmp_path / "targets" / "x86-64-cpu.yaml"
    profile.parent.mkdir()
    profile.write_text((TARGETS_DIR / "x86-64-cpu.yaml").read_text().replace("\nbuild:\n", "\nbuild:\n  max_batch: 4\n"))
    path = tiny_recipe()
    with pytest.raises(BuildError) as info:
        build(path, str(profile), out=tmp_path / "bundle")
    assert str(info.value).splitlines() == [
        f"{path.resolve()}: dims.batch.max is 8, above target 'x86-64-cpu' build.max_batch 4",
        "  hint: lower dims.batch.max (and opt) to 4 or less, or raise build.max_batch in the target profile",
    ]
    assert not (tmp_path / "bundle").exists()
    fits = tiny_recipe(text=TINY.replace("{min: 1, opt: 4, max: 8}", "{min: 1, opt: 4, max: 4}"), name="fits.yaml")
    assert build(fits, str(profile), out=tmp_path / "bundle").manifest["io"]["dims"]["batch"]["max"] == 4


def test_parity_and_evaluate_with_nothing_to_do_end_as_skipped(tiny_recipe, tmp_path):
    model = tmp_path / "tiny.onnx"
    torch.onnx.export(tiny_net(), (torch.zeros(2, 1, 4, 4),), str(model), input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17, dynamo=False)
    text = TINY.replace("  kind: factory\n  factory: tests.fixtures.tiny_models:tiny_net\n", "  kind: onnx\n  path: tiny.onnx\n")
    text = text.split("evaluation:\n  metric")[0].replace("  evaluation: {callable", "  calibration: {callable")
    text += "build:\n  benchmark: {warmup: 1, iterations: 5}\n"
    progress = Recorder()
    result = build(tiny_recipe(text=text), "x86-64-cpu", out=tmp_path / "bundle", progress=progress)
    assert ("skipped: the source is an ONNX file, with no PyTorch reference to compare it with", "parity") in progress.ends
    assert ("skipped: the recipe has no evaluation section (metric and budget)", "evaluate") in progress.ends
    assert ("done", "golden") in progress.ends and ("done", "parity") not in progress.ends
    assert [entry["name"] for entry in result.manifest["stages"]][3:5] == ["parity", "build"]
    assert json.loads((result.bundle_dir / "manifest.json").read_text())["export"]["parity"]["passed"] is None
