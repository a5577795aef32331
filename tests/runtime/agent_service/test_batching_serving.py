"""Dynamic batching as the agent runs it: per-model settings in the agent config (queue delay, instances, the
bundle's max batch), a request that finds its model idle running at once, the batch sizes and queue times that
telemetry reports, and ``api.model_control: false`` refusing Triton's load/unload. Real ONNX Runtime runners,
a real agent and Triton's own clients (``tritonclient``)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import BatchingConfig, load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.backends.base import CompiledRun
from edgekit_runtime.backends.onnxruntime import OnnxRuntimeRunner
from edgekit_runtime.bundle import Bundle, open_bundle
from tests.runtime.agent_service.model_bundles import make_model_bundle, serving_models
from tests.runtime.tiny_bundle import build_bundle, reference_logits

grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra (scripts/setup.sh)")
from tritonclient.utils import InferenceServerException  # noqa: E402


class HeldRunner(OnnxRuntimeRunner):
    """Each compiled call sleeps ``hold_s`` first (ONNX Runtime's own call is too short to overlap), and the
    runner records how many calls ran at once and the size of each."""

    hold_s = 0.0

    def load(self) -> HeldRunner:
        self.sizes: list[int] = []
        self.running = self.most_running = 0
        self._held_lock = threading.Lock()
        super().load()
        return self

    def _held(self, feeds: Mapping[str, np.ndarray], call: Callable[[], Any]) -> Any:
        with self._held_lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.sizes.append(int(feeds["image"].shape[0]))
        try:
            time.sleep(self.hold_s)
            return call()
        finally:
            with self._held_lock:
                self.running -= 1

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # a batching worker's call
        return self._held(feeds, lambda: super(HeldRunner, self)._infer_impl(feeds))  # type: ignore[no-any-return]

    def compiled_run(self) -> CompiledRun:  # a request that finds the model idle
        run, names, recover = super().compiled_run()

        def held(output_names: list[str], feeds: dict[str, np.ndarray], run_options: Any) -> Any:
            return self._held(feeds, lambda: run(output_names, feeds, run_options))

        return CompiledRun(held, names, recover)


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return open_bundle(build_bundle(tmp_path / "bundle"))


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def concurrently(count: int, work: Callable[[int], None]) -> float:
    """Run ``work(0..count-1)`` on as many threads, started together; the seconds they took."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        barrier.wait()
        try:
            work(index)
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return time.perf_counter() - started


def test_an_idle_model_runs_a_request_at_once(bundle: Bundle) -> None:
    """A lone request does not wait for the queue delay, nor for a batching worker to take it."""
    runner = HeldRunner.from_bundle(bundle)
    server = InferenceServer(runner.load(), model_name=bundle.name, batching=BatchingConfig(max_delay_ms=500))
    try:
        x = images(2)
        started = time.perf_counter()
        result = server.infer({"image": x})
        elapsed_s = time.perf_counter() - started
        np.testing.assert_allclose(result.outputs["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
        assert elapsed_s < 0.25, f"{elapsed_s:.3f} s: the request waited for the 500 ms queue delay"
        assert result.timing.runner_items == 2 and result.timing.queue_ms < 50
        assert server.batching_active and server.max_batch_items == 128  # the bundle's bound: no max_batch in the config
        window = server.current_window()
        assert (window.requests, window.runner_calls, window.batch_sizes) == (1, 1, {2: 1})
    finally:
        server.close()


def test_requests_that_find_the_runner_busy_are_batched_and_the_window_says_so(bundle: Bundle) -> None:
    runner = HeldRunner.from_bundle(bundle)
    runner.hold_s = 0.1  # the first request holds the runner; the other seven queue and run as one call
    server = InferenceServer(runner.load(), model_name=bundle.name, batching=BatchingConfig(max_delay_ms=50))
    inputs = {index: images(1, seed=index) for index in range(8)}
    results: dict[int, np.ndarray] = {}
    try:
        concurrently(8, lambda index: results.__setitem__(index, server.infer({"image": inputs[index]}).outputs["logits"]))
        for index, x in inputs.items():
            np.testing.assert_allclose(results[index], reference_logits(x), atol=1e-4, rtol=1e-4)
        window = server.take_window()
    finally:
        server.close()
    assert sum(runner.sizes) == 8 and len(runner.sizes) < 8 and max(runner.sizes) > 1, runner.sizes
    assert window.batch_sizes == {size: runner.sizes.count(size) for size in set(runner.sizes)}
    assert window.runner_calls == len(runner.sizes) and window.mean_batch == pytest.approx(8 / len(runner.sizes))
    assert window.queue is not None and window.queue.p99_ms >= 50  # the queued ones waited for the first call
    assert window.to_dict()["batch_sizes"] == {str(size): count for size, count in sorted(window.batch_sizes.items())}


@pytest.mark.parametrize("instances", [1, 2])
def test_instances_bound_the_runner_calls_at_once(bundle: Bundle, instances: int) -> None:
    runner = HeldRunner.from_bundle(bundle)
    runner.hold_s = 0.05
    config = BatchingConfig(max_batch=1, max_delay_ms=0, instances=instances)  # max_batch 1: one request per call
    server = InferenceServer(runner.load(), model_name=bundle.name, batching=config)
    try:
        concurrently(6, lambda index: server.infer({"image": images(1, seed=index)}))
    finally:
        server.close()
    assert len(runner.sizes) == 6 and runner.most_running == instances


def test_per_model_batching_from_the_agent_config_over_both_protocols(
    agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]
) -> None:
    batching = {"max_delay_ms": 2.5, "models": {"slow": {"max_delay_ms": 20, "instances": 2}}}
    path = agent_config(models={"names": ["digits", "slow"], "default": "digits"}, batching=batching,
                        api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}})  # fmt: skip
    for kind in ("digits", "slow"):  # slow: 1,500 chained MatMuls, so that clients find both instances busy
        bundle = make_model_bundle(tmp_path / "src" / kind, kind, repeats=1500)
        sign_bundle(bundle, fleet_keys[0])
        assert agent_main(["install", str(bundle), "--config", str(path), "--model", kind]) == 0
    with AgentService(load_config(path)) as agent:
        http = httpclient.InferenceServerClient(url=agent.api_address)
        rpc = grpcclient.InferenceServerClient(url=agent.grpc.bound_address)
        try:
            digits, slow = http.get_model_config("digits"), rpc.get_model_config("slow").config
            assert digits["dynamic_batching"] == {"max_queue_delay_microseconds": 2500}
            assert digits["max_batch_size"] == 128 and digits["instance_group"][0]["count"] == 1  # the bundle's bound
            assert slow.dynamic_batching.max_queue_delay_microseconds == 20_000
            assert (slow.max_batch_size, slow.instance_group[0].count) == (64, 2)
            agent.build_telemetry_window()  # a fresh window
            x = np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)

            def infer(index: int) -> None:
                client = grpcclient.InferenceServerClient(url=agent.grpc.bound_address)
                try:
                    item = grpcclient.InferInput("x", [1, 256], "FP32")
                    item.set_data_from_numpy(x)
                    for _ in range(4):
                        client.infer("slow", [item])
                finally:
                    client.close()

            concurrently(12, infer)
            message = agent.build_telemetry_window()
            stats = http.get_inference_statistics("slow")["model_stats"][0]
        finally:
            http.close()
            rpc.close()
    validate_message(message, "telemetry.v1", what="the window")
    entry = next(entry for entry in message["models"] if entry["model"] == "slow")
    batches = entry["batches"]
    assert entry["count"] == 48 and sum(int(size) * calls for size, calls in batches["sizes"].items()) == 48
    assert batches["calls"] < 48 and batches["mean_items"] > 1, batches  # 12 clients, at most 2 calls at once
    assert entry["queue_p50_ms"] is not None and entry["queue_p99_ms"] >= entry["queue_p50_ms"]
    assert message["batches"] == {"calls": 0, "mean_items": None, "sizes": {}}  # the default model, digits, was idle
    assert {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]} == \
        {int(size): calls for size, calls in batches["sizes"].items()}  # fmt: skip


@pytest.fixture
def locked_agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    api = {"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}, "model_control": False}
    with serving_models(agent_config, tmp_path, fleet_keys[0], ["digits"], api=api) as agent:
        yield agent


def test_model_control_off_refuses_load_and_unload(locked_agent: Any) -> None:
    http = httpclient.InferenceServerClient(url=locked_agent.api_address)
    rpc = grpcclient.InferenceServerClient(url=locked_agent.grpc.bound_address)
    try:
        with pytest.raises(InferenceServerException, match=r"model control is off in the agent config \(api.model_control: false\)"):
            http.unload_model("digits")
        with pytest.raises(InferenceServerException, match="PERMISSION_DENIED") as refused:
            rpc.load_model("digits")
        assert "api.model_control" in str(refused.value)
        assert http.is_model_ready("digits") and rpc.is_model_ready("digits")  # still served
        assert [entry["state"] for entry in http.get_model_repository_index()] == ["READY"]  # the index stays
        x = np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32)
        item = httpclient.InferInput("image", [2, 1, 8, 8], "FP32")
        item.set_data_from_numpy(x)
        assert http.infer("digits", [item]).as_numpy("logits").shape == (2, 10)
    finally:
        http.close()
        rpc.close()


@pytest.mark.parametrize(
    ("batching", "models", "problem"),
    [
        ({"models": {"embeder": {"instances": 2}}}, {"dir": "m", "names": ["embedder"]},
         "batching.models.embeder: names a model the agent does not serve: models.names lists embedder"),
        ({"models": {"embedder": {"instances": 2}}}, None, "the agent serves one model (no models section)"),
        ({"models": {"embedder": {"max_delay": 2}}}, {"dir": "m", "names": ["embedder"]},
         "batching.models.embedder.max_delay: is not a known key"),
        ({"instances": 0}, None, "batching.instances: expected an integer >= 1 and <= 64, got 0"),
    ],
)
def test_batching_config_errors_name_the_field(agent_config: Callable[..., Path], batching: dict[str, Any],
                                               models: dict[str, Any] | None, problem: str) -> None:  # fmt: skip
    from edgekit_runtime.agent.errors import AgentConfigError

    path = agent_config(batching=batching, **({"models": models} if models else {}))
    with pytest.raises(AgentConfigError, match=re.escape(problem)):
        load_config(path)


def test_per_model_settings_override_the_agent_wide_ones(agent_config: Callable[..., Path]) -> None:
    config = load_config(agent_config(models={"dir": "m", "names": ["a", "b"]},
                                      batching={"max_batch": 8, "models": {"b": {"max_delay_ms": 3, "instances": 2}}}))  # fmt: skip
    assert config.batching is not None and config.batching.for_model("a") == BatchingConfig(max_batch=8)
    assert config.batching.for_model("b") == BatchingConfig(max_batch=8, max_delay_ms=3, instances=2)
