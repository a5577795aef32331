"""Runner calls from several threads at once, as the agent makes them with ``batching.instances`` > 1: every answer
must be the caller's own. ONNX Runtime's ``session.run`` and OpenVINO's pool of infer requests run calls at once; an
IOBinding's buffers serve one call at a time, and the server serves such a runner on one instance. Real ONNX Runtime
and OpenVINO on the CPU, answers checked against numpy."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgekit_runtime.agent.config_types import BatchingConfig
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.backends.base import Runner
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.signature import IOSignature
from tests.runtime.tiny_bundle import io_section, reference_logits

SIGNATURE = IOSignature.from_manifest(io_section())
THREADS, CALLS = 8, 150


def _ort_plain(path: Path) -> Runner:
    return OnnxRuntimeRunner(path, SIGNATURE)


def _ort_io_binding(path: Path) -> Runner:
    return OnnxRuntimeRunner(path, SIGNATURE, io_binding=True)  # as on the CUDA and TensorRT providers by default


def _openvino(shapes: str) -> Callable[[Path], Runner]:
    def make(path: Path) -> Runner:
        pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit-runtime[openvino]')")
        from edgekit_runtime.backends.openvino import OpenVinoRunner

        return OpenVinoRunner(path, SIGNATURE, device="CPU", shapes=shapes)

    return make


RUNNERS = {"onnxruntime": (_ort_plain, True), "onnxruntime-io-binding": (_ort_io_binding, False),
           "openvino": (_openvino("dynamic"), True), "openvino-per-shape": (_openvino("per-shape"), True)}  # fmt: skip


def _hammer(call: Callable[[np.ndarray], np.ndarray], batch: int = 1) -> tuple[int, list[str]]:
    """THREADS threads, CALLS calls each, each checking its own answer: (wrong answers, errors)."""
    wrong, errors = [0], []

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(CALLS):
            image = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
            try:
                logits = call(image)
            except Exception as err:  # noqa: BLE001 - counted, and the test names them
                errors.append(f"{type(err).__name__}: {err}")
                continue
            if not np.allclose(logits, reference_logits(image), atol=1e-4, rtol=1e-4):
                wrong[0] += 1

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return wrong[0], sorted(set(errors))[:3]


@pytest.mark.parametrize("kind", list(RUNNERS))
def test_a_runner_called_from_many_threads_answers_each_its_own(model_path: Path, kind: str) -> None:
    make, safe = RUNNERS[kind]
    with make(model_path) as runner:
        assert runner.concurrent_calls_safe is safe
        assert _hammer(lambda image: runner.infer({"image": image})["logits"], batch=4) == (0, [])


@pytest.mark.parametrize("kind", ["onnxruntime-io-binding", "openvino"])
def test_two_instances_serve_eight_clients_each_its_own_answer(model_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    make, safe = RUNNERS[kind]
    caplog.set_level(logging.WARNING, logger="edgekit_runtime.agent.serving")
    server = InferenceServer(make(model_path).load(), model_name="tiny", batching=BatchingConfig(max_delay_ms=0.0, instances=2))
    try:
        assert _hammer(lambda image: server.infer({"image": image}).outputs["logits"]) == (0, [])
        assert server.instances == (2 if safe else 1)
    finally:
        server.close()
    clamped = [r.getMessage() for r in caplog.records if "must not run at once" in r.getMessage()]
    if safe:
        assert clamped == []
    else:  # said once, naming the setting and what runs the model
        assert clamped == ["tiny: batching.instances is 2, but the calls of its runner (CPUExecutionProvider) share state "
                           "and must not run at once: serving it on one instance"]  # fmt: skip


def test_a_swap_between_safe_and_unsafe_runners_changes_the_instances(model_path: Path) -> None:
    server = InferenceServer(_ort_plain(model_path).load(), model_name="a", batching=BatchingConfig(max_delay_ms=0.0, instances=3))
    try:
        assert server.instances == 3
        server.swap(_ort_io_binding(model_path).load(), model_name="b").close()  # type: ignore[union-attr]
        assert server.instances == 1
        assert _hammer(lambda image: server.infer({"image": image}).outputs["logits"]) == (0, [])
        server.swap(_ort_plain(model_path).load(), model_name="c").close()  # type: ignore[union-attr]
        assert server.instances == 3
        assert _hammer(lambda image: server.infer({"image": image}).outputs["logits"]) == (0, [])
        # every slot is free again: a caller that takes the runner to itself gets all three
        assert server.call_runner(lambda runner: runner.concurrent_calls_safe) is True
        assert server._run_slots._value == 3  # noqa: SLF001 - the slots' count is the contract under test
    finally:
        server.close()


def test_requests_queued_while_the_one_instance_runs_go_in_one_call(tmp_path: Path) -> None:
    """A runner served on one instance although batching.instances is 4: before, the other three batching workers each
    took a request or two and waited for the slot with them, so the requests that came while the runner ran went in
    small calls (0.65x the throughput of instances: 1). Now a worker waits for a free slot before it gathers."""
    from tests.runtime.tiny_bundle import write_linear_model

    gate, entered, calls = threading.Event(), threading.Event(), []

    class Gated(OnnxRuntimeRunner):
        def _bound_run(self, names, feeds, run_options):  # type: ignore[no-untyped-def]
            calls.append(next(iter(feeds.values())).shape[0])
            if len(calls) == 1:
                entered.set()
                assert gate.wait(30)
            return super()._bound_run(names, feeds, run_options)

    runner = Gated(write_linear_model(tmp_path / "linear.onnx"), SIGNATURE, io_binding=True).load()
    server = InferenceServer(runner, model_name="m", batching=BatchingConfig(max_delay_ms=0.5, instances=4))
    image = np.zeros((1, 1, 8, 8), np.float32)
    threads = [threading.Thread(target=server.infer, args=({"image": image},)) for _ in range(7)]
    try:
        threads[0].start()
        assert entered.wait(10)  # the first request runs, alone, and holds the one slot
        for thread in threads[1:]:
            thread.start()
        threading.Event().wait(0.3)  # the six reach the queue (no timing is asserted)
        gate.set()
        for thread in threads:
            thread.join(30)
    finally:
        gate.set()
        server.close()
    assert calls == [1, 6]
