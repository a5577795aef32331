"""A batching model's failures stay with the request that caused them, and a model swapped during a pass
never wedges it: the real InferenceServer, ONNX Runtime runners, bundles from the tests' makers.

* One request the model cannot run (a token id past the embedder's table) batched with good ones: before,
  every request of the runner call got its error (500) and counted as one, so one hostile client failed the
  others and pushed the health watch's error rate towards a rollback. Now the call is retried per request.
* A deploy or repository load landing while the event loop's pass validates its requests: before, the pass
  held the only run slot while re-running them through the queue that needs it: both threads waited forever.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from edgekit_runtime.agent.config_types import BatchingConfig
from edgekit_runtime.agent.serving import InferenceResult, InferenceServer
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle
from tests.runtime.agent_service.model_bundles import embedder_inputs, make_model_bundle, reference_embedding
from tests.runtime.tiny_bundle import build_bundle


def _embedder(tmp_path: Path, max_delay_ms: float) -> InferenceServer:
    runner = create_runner(open_bundle(make_model_bundle(tmp_path / "embedder", "embedder"))).load()
    return InferenceServer(runner, model_name="embedder", batching=BatchingConfig(max_delay_ms=max_delay_ms))


def _good_and_bad() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    good = embedder_inputs(1, seed=3)
    bad = {name: array.copy() for name, array in good.items()}
    bad["input_ids"][0, -1] = 999  # past the table: ONNX Runtime's Gather fails on this request only
    return good, bad


def test_one_failing_request_in_a_pass_fails_alone(tmp_path: Path) -> None:
    server = _embedder(tmp_path, 0.0)
    try:
        good, bad = _good_and_bad()
        results = server.infer_together([(good, 0), (bad, 0), (good, 0), (good, 0)])
        assert isinstance(results[1], Exception) and "999" in str(results[1])
        assert all(isinstance(results[index], InferenceResult) for index in (0, 2, 3)), results
        for index in (0, 2, 3):
            np.testing.assert_allclose(results[index].outputs["sentence_embedding"], reference_embedding(**good), atol=1e-5)
        totals = server.totals()
        assert totals.errors == 1 and totals.requests >= 3  # before: 4 errors, 0 answers
    finally:
        server.close()


def test_one_failing_request_among_queued_ones_fails_alone(tmp_path: Path) -> None:
    """The threaded path (the batching worker): concurrent callers whose requests form one batch."""
    server = _embedder(tmp_path, 20.0)
    try:
        good, bad = _good_and_bad()
        start = threading.Barrier(8)

        def call(feeds: dict[str, np.ndarray]) -> object:
            start.wait()
            try:
                return server.infer(feeds)
            except Exception as err:  # noqa: BLE001 - the bad one's own error
                return err

        for _ in range(5):
            with ThreadPoolExecutor(8) as pool:
                outcomes = list(pool.map(call, [bad, *[good] * 7]))
            assert isinstance(outcomes[0], Exception)
            assert all(isinstance(o, InferenceResult) for o in outcomes[1:]), [type(o).__name__ for o in outcomes]
        assert server.totals().errors == 5
    finally:
        server.close()


def test_a_swap_during_a_pass_does_not_wedge_the_model(tmp_path: Path) -> None:
    bundle = open_bundle(build_bundle(tmp_path / "b"))
    first, second = create_runner(bundle).load(), create_runner(bundle).load()
    server = InferenceServer(first, model_name="m", batching=BatchingConfig(max_delay_ms=0.0))
    validate = first.signature.feed_validator

    def validate_then_swap(feeds: dict[str, np.ndarray]) -> dict[str, int]:  # a deploy lands while the pass validates
        if server._runner is first:
            server.swap(second, model_name="m")
        return validate(feeds)

    first.signature.__dict__["feed_validator"] = validate_then_swap
    x = np.zeros((1, 1, 8, 8), np.float32)
    done: list[list[object]] = []
    worker = threading.Thread(target=lambda: done.append(server.infer_together([({"image": x}, 0), ({"image": x}, 0)])), daemon=True)
    worker.start()
    worker.join(20)
    try:
        assert done, "the pass hung: a run slot held while re-running through the batching queue"
        assert all(isinstance(r, InferenceResult) for r in done[0])
        assert isinstance(server.infer({"image": x}), InferenceResult)  # and the model still serves
    finally:
        server.close()


def test_requests_past_the_sample_list_still_add_their_times_to_the_protocols_statistics(tmp_path: Path) -> None:
    """Past max_window_samples between two drains (a busy device's telemetry interval), requests were counted
    but their times and their runner calls' batch sizes were not: the statistics' averages fell, and
    batch_stats no longer summed to execution_count."""
    server = InferenceServer(create_runner(open_bundle(build_bundle(tmp_path / "b"))).load(), model_name="m", max_window_samples=10)
    try:
        x = np.zeros((1, 1, 8, 8), np.float32)
        for _ in range(30):
            server.infer({"image": x})
        stats = server.protocol_statistics("m", "1")
        success = stats["inference_stats"]["success"]
        assert success["count"] == 30 and stats["execution_count"] == 30
        assert sum(entry["compute_infer"]["count"] for entry in stats["batch_stats"]) == 30  # before: 10
        assert success["ns"] >= stats["inference_stats"]["compute_infer"]["ns"] > 0
    finally:
        server.close()


def test_queued_requests_of_a_model_unloaded_before_their_batch_ran_all_get_the_error(tmp_path: Path) -> None:
    """Requests queue while the run slots are held; the model is unloaded (an OIP repository unload) before the
    batching worker runs them: every caller gets NoModelError (a review of the per-request retry found only
    the first answered and the others waiting forever)."""
    from edgekit_runtime.agent.errors import NoModelError

    server = InferenceServer(create_runner(open_bundle(build_bundle(tmp_path / "b"))).load(), model_name="m",
                             batching=BatchingConfig(max_delay_ms=300.0))  # fmt: skip
    x = np.zeros((1, 1, 8, 8), np.float32)
    outcomes: dict[int, object] = {}
    queued = threading.Event()

    def hold_then_unload(_: object) -> None:  # under the same exclusive hold a swap(None) takes
        assert queued.wait(10)
        time.sleep(0.3)  # the callers are in the queue by now (they cannot take a slot)
        server._runner = None
        server._replan()

    def call(index: int) -> None:
        try:
            outcomes[index] = server.infer({"image": x})
        except Exception as err:  # noqa: BLE001 - the outcome under test
            outcomes[index] = err

    holder = threading.Thread(target=lambda: server.call_runner(hold_then_unload))
    holder.start()
    callers = [threading.Thread(target=call, args=(index,), daemon=True) for index in range(4)]
    for caller in callers:
        caller.start()
    queued.set()
    holder.join(10)
    for caller in callers:
        caller.join(10)
    assert not any(caller.is_alive() for caller in callers), "a caller still waits for its batch"
    assert all(isinstance(outcomes[index], NoModelError) for index in range(4)), outcomes
    assert server.totals().errors == 4
