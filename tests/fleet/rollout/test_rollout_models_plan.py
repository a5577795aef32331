"""`fleet deploy --pipeline` parsing and the per-model health gate's figures (issue 20), on a real SQLite store
filled through the collector's parser."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from edgekit_runtime.agent.telemetry import encode_message

from edgekit.fleet.ingest import parse_message
from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError
from edgekit.fleet.rollout_models import ModelDeploy, model_health_rows, parse_pipeline, pipeline_bundle_id
from edgekit.fleet.store import TelemetryWindow, open_store
from tests.fleet.messages import T0
from tests.fleet.model_messages import model_entry, model_telemetry


def test_pipeline_pairs_and_files(tmp_path: Path) -> None:
    assert parse_pipeline("detector=out/a.tar, classifier=out/b") == [("detector", Path("out/a.tar")), ("classifier", Path("out/b"))]
    (tmp_path / "pipe.yaml").write_text("models:\n  detector: a.tar\n  classifier: sub/b.tar\n", encoding="utf-8")
    assert parse_pipeline(str(tmp_path / "pipe.yaml")) == [("detector", tmp_path / "a.tar"), ("classifier", tmp_path / "sub/b.tar")]
    for text, message in (("detector", "is not MODEL=BUNDLE"), ("a=x,a=y", "names model\\(s\\) a twice"),
                          ("bad name=x", "is not a model name"), (",", "names no model")):  # fmt: skip
        with pytest.raises(RolloutError, match=message):
            parse_pipeline(text)
    (tmp_path / "bad.yaml").write_text("detector: a.tar\n", encoding="utf-8")
    with pytest.raises(RolloutError, match="must hold one key, models:"):
        parse_pipeline(str(tmp_path / "bad.yaml"))


def _artifact(bundle_id: str) -> BundleArtifact:
    return BundleArtifact(path=Path("/x"), bundle_id=bundle_id, name=bundle_id, target="x86-64-cpu",
                          url=f"file:///x/{bundle_id}.tar", sha256="d" * 64, size_bytes=1, manifest_sha256="e" * 64,
                          signature_b64="", signed_by=None)  # fmt: skip


def test_the_gate_reads_the_deployed_models_windows_on_their_new_bundles(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    started = T0 + dt.timedelta(seconds=100)
    windows = []
    for device, classifier_after in (("cam-1", "cls-new"), ("cam-2", "cls-old")):  # cam-2's classifier did not switch yet
        for seq in range(1, 21):
            after = seq > 10
            entries = [model_entry("detector", "det-new" if after else "det-old", [20.0] * 4 if after else [10.0] * 4, errors=1 if after else 0),
                       model_entry("classifier", classifier_after if after else "cls-old", [2.0] * 2)]  # fmt: skip
            message = model_telemetry(seq, entries, device=device)
            record = parse_message(f"edgekit/v1/lab/{device}/telemetry", encode_message(message), received_at=started)
            assert isinstance(record, TelemetryWindow)
            windows.append(record)
    models = [ModelDeploy("detector", _artifact("det-new")), ModelDeploy("classifier", _artifact("cls-new"))]
    assert pipeline_bundle_id(models) == "detector=det-new,classifier=cls-new"
    with open_store(url) as store:
        store.add_windows(windows)
        after, before = model_health_rows(store, models, [("lab", "cam-1"), ("lab", "cam-2")], since=started,
                                          baseline_since=T0)  # fmt: skip
    assert [a.device for a in after] == ["cam-1"]  # cam-2 has not reported the classifier on its new bundle
    (cam_1,) = after
    assert (cam_1.windows, cam_1.inferences, cam_1.errors) == (20, 60, 10)
    assert cam_1.p99_ms == pytest.approx((20.0 * 40 + 2.0 * 20) / 60, rel=0.01)
    assert [b.device for b in before] == ["cam-1", "cam-2"] and before[0].p99_ms == pytest.approx((10.0 * 40 + 2.0 * 20) / 60, rel=0.01)
