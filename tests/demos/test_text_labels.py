"""The string-tensor demo (recipes/text-labels.yaml): a string input and a string label output through recipe,
build (fp32 and int8), golden files and the device's self-check; string goldens compared exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.demos import text_labels
from edgekit.pipeline import build
from edgekit.quantize.calibration.cache import hash_calibration_data
from edgekit.recipe import load_recipe
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from edgekit_runtime.golden import compare_output

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "text-labels.yaml"


def test_the_shipped_model_is_what_the_demo_writes() -> None:
    assert text_labels.MODEL_PATH.read_bytes() == text_labels.build_model()


def test_recipe_declares_a_string_input_and_random_strings_are_numbers() -> None:
    from edgekit.data import random_tensor

    recipe = load_recipe(RECIPE)
    spec = recipe.inputs[0]
    assert spec.dtype == "string"
    values = random_tensor(spec, (5,), np.random.default_rng(0))
    assert values.dtype == object and all(isinstance(v, str) and 0 <= int(v) < 1000 for v in values)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_string_model_builds_and_self_checks(tmp_path: Path, precision: str) -> None:
    result = build(RECIPE, "x86-64-cpu", precision=precision, out=tmp_path / "bundle", force=True)
    root = tmp_path / "bundle"
    manifest = json.loads((root / "manifest.json").read_text())
    assert [(t["name"], t["dtype"]) for t in manifest["io"]["inputs"]] == [("text", "string")]
    assert [(t["name"], t["dtype"]) for t in manifest["io"]["outputs"]] == [("logits", "float32"), ("label", "string")]
    if precision == "int8":  # MatMul/Add quantized, the recipe keeps the embedding lookup float
        assert manifest["quantization"]["plan"]["excluded"] == {"lookup": "recipe quantization.exclude_nodes"}
    with np.load(root / manifest["golden"]["batches"][0]["outputs"], allow_pickle=False) as golden:  # no pickle needed
        assert golden["label"].dtype.kind == "U" and list(golden["label"]) == ["fruit"] * 4
    bundle = open_bundle(root)
    with create_runner(bundle) as runner:
        assert self_check(bundle, runner).passed
        answer = runner.infer({"text": np.array(["oak", "he\x00llo", "dog"], dtype=object)})
    assert list(answer["label"]) == ["tree", "fruit", "animal"]
    assert result is not None


def test_string_outputs_compare_exactly() -> None:
    expected = np.array(["fruit", "tree"])
    assert compare_output("label", expected, np.array(["fruit", "tree"], dtype=object), atol=1.0, rtol=1.0, min_cosine=0.0).passed
    check = compare_output("label", expected, np.array(["fruit", "animal"], dtype=object), atol=1.0, rtol=1.0, min_cosine=0.0)
    assert not check.passed and check.mismatched_elements == 1 and check.max_abs_diff == 1.0


def test_calibration_hash_takes_strings() -> None:
    first = hash_calibration_data([{"text": np.array(["a", "bc"], dtype=object)}])
    assert first != hash_calibration_data([{"text": np.array(["ab", "c"], dtype=object)}])
    assert first == hash_calibration_data([{"text": np.array(["a", "bc"], dtype=object)}])


def test_concurrent_string_requests_are_batched_and_split_back(tmp_path: Path) -> None:
    """Dynamic batching on a string model: requests queued behind a held call run as one call (object arrays
    concatenated), and each caller gets its own labels back."""
    import threading
    import time

    from edgekit_runtime.agent.config import BatchingConfig
    from edgekit_runtime.agent.serving import InferenceServer
    from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner

    from edgekit_runtime.backends.base import CompiledRun

    sizes: list[int] = []

    class HeldRunner(OnnxRuntimeRunner):
        """Records each call's batch size; the first call holds the runner so the others queue behind it."""

        def _held(self, feeds: Any, call: Any) -> Any:
            sizes.append(len(feeds["text"]))
            time.sleep(0.1 if len(sizes) == 1 else 0.0)
            return call()

        def _infer_impl(self, feeds: Any) -> dict[str, np.ndarray]:  # a batching worker's call
            return self._held(feeds, lambda: super(HeldRunner, self)._infer_impl(feeds))  # type: ignore[no-any-return]

        def compiled_run(self) -> CompiledRun:  # a request that finds the model idle
            run, names, recover = super().compiled_run()
            return CompiledRun(lambda output_names, feeds, options: self._held(feeds, lambda: run(output_names, feeds, options)), names, recover)

    build(RECIPE, "x86-64-cpu", precision="fp32", out=tmp_path / "bundle", force=True)
    runner = HeldRunner.from_bundle(open_bundle(tmp_path / "bundle"))
    words = list(text_labels.WORDS)[:8]
    results: dict[int, list[str]] = {}
    server = InferenceServer(runner.load(), model_name="text-labels", batching=BatchingConfig(max_delay_ms=50))
    barrier = threading.Barrier(len(words))

    def ask(index: int) -> None:
        barrier.wait()
        answer = server.infer({"text": np.array([words[index]], dtype=object)})
        results[index] = list(answer.outputs["label"])

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(words))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        server.close()
    assert results == {index: [text_labels.LABELS[text_labels.WORDS[word]]] for index, word in enumerate(words)}
    assert sum(sizes) == len(words) and len(sizes) < len(words) and max(sizes) > 1, sizes
