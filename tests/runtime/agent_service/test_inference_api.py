"""The in-process inference server and the local HTTP API, with a real ONNX Runtime session."""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import ApiAddress, BatchingConfig
from edgekit_runtime.agent.errors import AgentApiError, AgentConfigError, NoModelError
from edgekit_runtime.agent.serving import InferenceResult, InferenceServer, RequestTiming, ServingTotals, ServingWindow
from edgekit_runtime.agent.wire import BINARY_CONTENT_TYPE, decode_binary, encode_binary
from edgekit_runtime.backends import OnnxRuntimeRunner, create_runner
from edgekit_runtime.backends.base import CompiledRun, Runner
from edgekit_runtime.bundle import Bundle, open_bundle
from edgekit_runtime.errors import BackendError, InputSignatureError
from edgekit_runtime.signature import IOSignature
from tests.runtime.tiny_bundle import build_bundle, reference_logits


class CountingRunner(OnnxRuntimeRunner):
    """Counts real runner calls, to see how many requests one batched call served."""

    calls = 0
    batch_sizes: list[int]
    #: seconds each compiled call sleeps first (holding the runner, so that concurrent requests queue up)
    delay_s = 0.0

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        self.batch_sizes.append(int(feeds["image"].shape[0]))
        return super()._infer_impl(feeds)

    def compiled_run(self) -> CompiledRun:
        """The compiled call (a batching server's request that finds the runner idle runs it) counted too."""
        run, names, recover = super().compiled_run()

        def counted(output_names: list[str], feeds: dict[str, np.ndarray], run_options: Any) -> Any:
            self.calls += 1
            self.batch_sizes.append(int(feeds["image"].shape[0]))
            time.sleep(self.delay_s)
            return run(output_names, feeds, run_options)

        return CompiledRun(counted, names, recover)


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return open_bundle(build_bundle(tmp_path / "bundle"))


@pytest.fixture
def served(bundle: Bundle) -> Iterator[tuple[InferenceServer, AgentClient, AgentApi]]:
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    with AgentApi(server, "127.0.0.1:0") as api:
        yield server, AgentClient(api.bound_address), api
    server.close()


def images(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 1, 8, 8)).astype(np.float32)


def post(address: str, body: bytes, content_type: str, path: str = "/v1/infer") -> tuple[int, dict]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_json_and_binary_match_a_plain_onnxruntime_session(bundle: Bundle, served: tuple) -> None:
    server, client, _ = served
    x = images(3)
    session = onnxruntime.InferenceSession(str(bundle.model_path), providers=["CPUExecutionProvider"])
    (expected,) = session.run(["logits"], {"image": x})
    binary = client.infer({"image": x})["logits"]
    assert binary.dtype == np.float32 and binary.shape == (3, 10)
    np.testing.assert_array_equal(binary, expected)
    as_json = client.infer({"image": x}, encoding="json")["logits"]
    assert as_json.dtype == np.float32
    np.testing.assert_array_equal(as_json, expected)  # JSON floats round-trip float32 exactly
    assert client.last_timing["compute_ms"] > 0 and client.last_timing["queue_ms"] >= 0


@pytest.mark.parametrize(
    ("feeds", "fragments"),
    [
        ({"imag": images(1)}, ["unexpected input 'imag'", "did you mean 'image'?"]),
        ({"image": images(1).astype(np.float64)}, ["input 'image': expected float32[batch, 1, 8, 8] (batch in 1..128)", "got float64[1, 1, 8, 8]"]),
        ({"image": np.zeros((2, 1, 8, 7), np.float32)}, ["input 'image'", "dimension 3 is 7, expected 8"]),
        ({"image": np.zeros((129, 1, 8, 8), np.float32)}, ["dimension 0 'batch' is 129, outside 1..128"]),
    ],
)
def test_wrong_inputs_answer_400_naming_them(served: tuple, feeds: dict, fragments: list[str]) -> None:
    server, client, api = served
    status, payload = post(api.bound_address, encode_binary(feeds), BINARY_CONTENT_TYPE)
    assert status == 400 and payload["error"] == "input_signature"
    for fragment in fragments:
        assert fragment in payload["message"] + str(payload["hint"])
    assert payload["signature"]["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
    with pytest.raises(InputSignatureError, match=re.escape(fragments[0])):
        client.infer(feeds, encoding="json")
    assert server.totals().rejected == 2 and server.totals().requests == 0


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "request body is not valid JSON"),
        (json.dumps({"inputs": {"image": {"dtype": "float32", "shape": [1, 2], "data": [[1.0, 2.0, 3.0]]}}}).encode(), "data has shape [1, 3] but shape says [1, 2]"),
        (json.dumps({"inputs": {"image": {"dtype": "int64", "data": [1.5]}}}).encode(), "do not fit dtype int64 without rounding"),
        (json.dumps({"inputs": {"image": {"dtype": "float", "data": [1.0]}}}).encode(), "dtype 'float' cannot be sent over the API"),
        (json.dumps({"feeds": {}}).encode(), "'inputs' must be a non-empty object"),
    ],
)
def test_malformed_json_bodies_answer_400(served: tuple, body: bytes, fragment: str) -> None:
    _, _, api = served
    status, payload = post(api.bound_address, body, "application/json")
    assert status == 400 and fragment in payload["message"], payload


def test_malformed_binary_bodies_are_explained() -> None:
    with pytest.raises(InputSignatureError, match="expected b'EKT1'"):
        decode_binary(b"XXXX\x00\x00\x00\x00")
    good = bytearray(encode_binary({"image": images(1)}))
    with pytest.raises(InputSignatureError, match="runs past the data section"):
        decode_binary(good[:-8])
    with pytest.raises(InputSignatureError, match="too short"):
        decode_binary(b"EK")


def test_binary_encoding_round_trips_every_wire_dtype() -> None:
    tensors = {
        "f16": np.arange(6, dtype=np.float16).reshape(2, 3),
        "i64": np.array([[-1, 2**40]], dtype=np.int64),
        "u8": np.array([1, 255], dtype=np.uint8),
        "flag": np.array([True, False, True]),
        "empty": np.zeros((0, 4), np.float32),
        "strided": np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2],
    }
    decoded = decode_binary(bytearray(encode_binary(tensors)))
    for name, array in tensors.items():
        assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape
        np.testing.assert_array_equal(decoded[name], array)


def test_other_endpoints_and_http_errors(served: tuple) -> None:
    server, client, api = served
    assert client.health()["status"] == "ok" and client.health()["model"] == server.model_name
    signature = client.signature()
    assert signature["model"] == server.model_name and signature["dims"]["batch"]["max"] == 128
    status, payload = post(api.bound_address, b"{}", "text/plain")
    assert status == 415 and "application/x-edgekit-tensors" in payload["hint"]
    status, payload = post(api.bound_address, b"{}", "application/json", path="/v1/nothing")
    assert status == 404 and "/v1/infer" in payload["hint"]
    status, payload = post(api.bound_address, b"{}", "application/json", path="/v1/health")
    assert status == 405


def test_request_body_limit(bundle: Bundle) -> None:
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    with AgentApi(server, "127.0.0.1:0", max_request_bytes=1024) as api:
        status, payload = post(api.bound_address, encode_binary({"image": images(8)}), BINARY_CONTENT_TYPE)
    server.close()
    assert status == 413 and "over the limit of 1024" in payload["message"] and "api.max_request_mb" in payload["hint"]


def test_concurrent_requests_from_threads(served: tuple) -> None:
    server, client, _ = served
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for round_ in range(5):
                x = images(1 + (worker + round_) % 3, seed=worker * 10 + round_)
                np.testing.assert_allclose(client.infer({"image": x})["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    totals = server.totals()
    assert totals.requests == 40 and totals.errors == 0 and totals.runner_calls == 40


def test_dynamic_batching_batches_and_splits_correctly(bundle: Bundle) -> None:
    runner = CountingRunner.from_bundle(bundle)
    runner.batch_sizes, runner.delay_s = [], 0.05  # the first request runs at once and holds the runner: the rest queue
    server = InferenceServer(runner.load(), model_name=bundle.name, batching=BatchingConfig(max_batch=32, max_delay_ms=200))
    assert server.batching_active
    barrier = threading.Barrier(12)
    results: dict[int, np.ndarray] = {}
    inputs = {n: images(1 + n % 3, seed=n) for n in range(12)}

    def work(n: int) -> None:
        barrier.wait()
        results[n] = server.infer({"image": inputs[n]}).outputs["logits"]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.close()
    assert runner.calls < 12, runner.batch_sizes
    assert sum(runner.batch_sizes) == sum(x.shape[0] for x in inputs.values())
    for n, x in inputs.items():
        np.testing.assert_allclose(results[n], reference_logits(x), atol=1e-4, rtol=1e-4)
    window = server.current_window()
    assert window.requests == 12 and window.runner_calls == runner.calls and window.items == sum(x.shape[0] for x in inputs.values())


def test_batching_respects_max_batch(bundle: Bundle) -> None:
    runner = CountingRunner.from_bundle(bundle)
    runner.batch_sizes = []
    server = InferenceServer(runner.load(), model_name=bundle.name, batching=BatchingConfig(max_batch=4, max_delay_ms=100))
    barrier = threading.Barrier(10)

    def work(n: int) -> None:
        barrier.wait()
        server.infer({"image": images(1, seed=n)})

    threads = [threading.Thread(target=work, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.close()
    assert max(runner.batch_sizes) <= 4 and sum(runner.batch_sizes) == 10 and runner.calls >= 3


def test_stats_windows_count_requests_errors_and_rejections(served: tuple) -> None:
    server, client, _ = served
    server.take_window()
    for n in range(5):
        client.infer({"image": images(2, seed=n)})
    for _ in range(2):
        with pytest.raises(InputSignatureError):
            client.infer({"image": np.zeros((1, 2), np.float32)})
    stats = client.stats()
    window = stats["window"]
    assert window["requests"] == 5 and window["rejected"] == 2 and window["errors"] == 0 and window["items"] == 10
    assert window["latency"]["count"] == 5 and window["queue"]["count"] == 5 and window["compute"]["count"] == 5
    assert window["latency"]["p50_ms"] <= window["latency"]["p99_ms"] <= window["latency"]["max_ms"]
    assert window["error_rate"] == 0.0 and window["throughput_per_s"] > 0
    closed = server.take_window()
    assert closed.requests == 5 and closed.latency is not None and closed.latency.count == 5
    after = server.current_window()
    assert after.requests == 0 and after.latency is None and after.error_rate is None
    assert server.totals().requests == 5 and server.totals().rejected == 2


def test_no_model_answers_503(tmp_path: Path) -> None:
    server = InferenceServer()
    with AgentApi(server, "127.0.0.1:0") as api:
        client = AgentClient(api.bound_address)
        assert client.health()["status"] == "no_model"
        with pytest.raises(NoModelError, match="no bundle is loaded"):
            client.infer({"image": images(1)})
        with pytest.raises(NoModelError):
            client.signature()


def test_api_refuses_non_loopback_binds(bundle: Bundle) -> None:
    server = InferenceServer()
    for address in ("0.0.0.0:0", "10.1.2.3:8470", ApiAddress(host="0.0.0.0", port=0)):
        with pytest.raises(AgentConfigError, match="not a loopback address"):
            AgentApi(server, address)


def test_unix_socket_api(bundle: Bundle, tmp_path: Path) -> None:
    socket_path = tmp_path / "run" / "agent.sock"
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    with AgentApi(server, f"unix:{socket_path}") as api:
        assert socket_path.is_socket() and api.bound_address == f"unix:{socket_path}"
        client = AgentClient(api.bound_address)
        x = images(2)
        np.testing.assert_allclose(client.infer({"image": x})["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
        assert client.health()["status"] == "ok"
    assert not socket_path.exists()
    server.close()
    with pytest.raises(AgentApiError, match="cannot reach the edgekit agent"):
        AgentClient(f"unix:{socket_path}", timeout_s=1).health()


def wait_until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_client_keeps_one_connection_per_thread_and_closes_them(served: tuple) -> None:
    server, client, api = served
    x = images(2)
    for _ in range(5):
        np.testing.assert_allclose(client.infer({"image": x})["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
    client.health()
    assert api.open_connections == 1

    def work() -> None:
        for _ in range(3):
            client.infer({"image": x})

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert api.open_connections == 4
    assert server.totals().requests == 5 + 9
    client.close()
    assert wait_until(lambda: api.open_connections == 0)
    client.infer({"image": x})  # a closed client opens a new connection on its next call
    assert api.open_connections == 1


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_client_reconnects_after_the_agent_restarts(bundle: Bundle, tmp_path: Path, transport: str) -> None:
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    address = f"unix:{tmp_path / 'agent.sock'}" if transport == "unix" else "127.0.0.1:0"
    x = images(1)
    with AgentApi(server, address) as api:
        address = api.bound_address
        client = AgentClient(address, timeout_s=5)
        client.infer({"image": x})
    # stop() ends kept-alive connections too: nothing answers on the old one
    with pytest.raises(AgentApiError, match="cannot reach the edgekit agent"):
        client.infer({"image": x})
    with AgentApi(server, address) as restarted:
        np.testing.assert_allclose(client.infer({"image": x})["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
        client.infer({"image": x})
        assert restarted.open_connections == 1
    server.close()


def test_idle_connections_are_closed_and_the_client_reopens(bundle: Bundle) -> None:
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    with AgentApi(server, "127.0.0.1:0", idle_timeout_s=0.2) as api, AgentClient(api.bound_address) as client:
        client.health()
        assert api.open_connections == 1
        assert wait_until(lambda: api.open_connections == 0)
        x = images(3)  # the client's connection is stale now: it must reconnect, not fail
        np.testing.assert_allclose(client.infer({"image": x})["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
        assert server.totals().requests == 1 and server.totals().errors == 0
    server.close()


# -- the in-process serving path: results, statistics, swaps ----------------------------------------


def test_windows_taken_while_requests_run_lose_and_repeat_none(bundle: Bundle) -> None:
    """Requests append their stamps without the stats lock; windows taken meanwhile must still see each once."""
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    threads, per_thread = 4, 150
    windows: list[ServingWindow] = []
    done = threading.Event()

    def client(seed: int) -> None:
        for n in range(per_thread):
            server.infer({"image": images(1 + n % 3, seed=seed)})

    def telemetry() -> None:
        while not done.is_set():
            windows.append(server.take_window())

    watcher = threading.Thread(target=telemetry)
    watcher.start()
    clients = [threading.Thread(target=client, args=(seed,)) for seed in range(threads)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(60)
    done.set()
    watcher.join(10)
    windows.append(server.take_window())
    expected_items = threads * sum(1 + n % 3 for n in range(per_thread))
    assert sum(w.requests for w in windows) == threads * per_thread == server.totals().requests
    assert sum(w.items for w in windows) == expected_items == server.totals().items
    assert sum(w.latency.count for w in windows if w.latency is not None) == threads * per_thread
    assert len(windows) > 2  # the watcher really took windows while requests ran
    server.close()


class FailingRunner(OnnxRuntimeRunner):
    """A real session whose every run fails inside ONNX Runtime's compiled call."""

    def _load_impl(self) -> None:
        super()._load_impl()

        def device_lost(names: list[str], feeds: dict[str, np.ndarray], run_options: object) -> list[np.ndarray]:
            raise RuntimeError("the device went away")

        self._run = device_lost


def test_in_process_results_are_immutable_named_tuples(bundle: Bundle) -> None:
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    x = images(3)
    result = server.infer({"image": x})
    np.testing.assert_allclose(result.outputs["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
    timing = result.timing
    assert type(result) is InferenceResult and type(timing) is RequestTiming
    assert timing.queue_ms >= 0 and timing.compute_ms > 0 and timing.items == timing.runner_items == 3
    # the stamps are perf_counter_ns readings; the milliseconds derive from them
    assert timing.submitted_ns <= timing.started_ns < timing.finished_ns <= time.perf_counter_ns()
    assert timing.compute_ms == (timing.finished_ns - timing.started_ns) / 1e6
    assert timing.queue_ms == (timing.started_ns - timing.submitted_ns) / 1e6
    assert timing.total_ms == timing.queue_ms + timing.compute_ms
    same = RequestTiming(timing.submitted_ns, timing.started_ns, timing.finished_ns, 3, 3)
    assert timing == same and hash(timing) == hash(same) and repr(timing) == repr(same)
    assert result == InferenceResult(result.outputs, same) and timing._asdict() == same._asdict()
    assert timing.to_dict() == {"queue_ms": same.queue_ms, "compute_ms": same.compute_ms, "total_ms": same.total_ms,
                                "items": 3, "runner_items": 3}
    with pytest.raises(AttributeError):
        timing.items = 4  # type: ignore[misc]
    with pytest.raises(AttributeError):
        result.timing = same  # type: ignore[misc]
    server.close()


def test_totals_add_up_across_windows_and_samples_stay_bounded(bundle: Bundle) -> None:
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name, max_window_samples=3)
    server.take_window()
    for n in range(5):
        server.infer({"image": images(1 + n % 2, seed=n)})
    with pytest.raises(InputSignatureError):
        server.infer({"image": np.zeros((1, 2), np.float32)})
    first = server.take_window()
    assert (first.requests, first.rejected, first.items, first.runner_calls) == (5, 1, 7, 5)
    assert first.latency is not None and first.latency.count == 3  # the first samples only; the counts stay exact
    assert first.queue is not None and first.compute is not None and first.queue.count == first.compute.count == 3
    server.infer({"image": images(4)})
    failing = FailingRunner(bundle.model_path, bundle.io).load()
    server.swap(failing, model_name="failing").close()
    with pytest.raises(BackendError, match="the device went away"):
        server.infer({"image": images(1)})
    second = server.current_window()
    assert (second.requests, second.errors, second.items, second.runner_calls) == (1, 1, 4, 2)
    assert server.totals() == ServingTotals(requests=6, errors=1, rejected=1, runner_calls=7, items=11)
    server.close()


class FallbackRunner(OnnxRuntimeRunner):
    """A real session whose compiled call fails with EPFail until ``session.run`` falls back (here: simply
    runs), after which the runner's compiled call is the session's own again, as after a real fallback."""

    def _load_impl(self) -> None:
        super()._load_impl()
        self.lost_calls = 0

        def provider_lost(names: list[str], feeds: dict[str, np.ndarray], run_options: object) -> list[np.ndarray]:
            self.lost_calls += 1
            raise EPFail("CUDA error: device lost")

        self._run = provider_lost


def test_an_execution_provider_fallback_is_served_and_the_direct_path_follows_it(bundle: Bundle) -> None:
    runner = FallbackRunner(bundle.model_path, bundle.io).load()
    server = InferenceServer(runner, model_name=bundle.name)
    x = images(2)
    for _ in range(3):  # the first request falls back; the next ones run on the new compiled call directly
        np.testing.assert_allclose(server.infer({"image": x}).outputs["logits"], reference_logits(x), atol=1e-4, rtol=1e-4)
    assert runner.lost_calls == 1
    assert server._direct is not None and server._direct[1] == runner.session._sess.run
    assert server.totals() == ServingTotals(requests=3, errors=0, rejected=0, runner_calls=3, items=6)
    server.close()


class PlainRunner(Runner):
    """A backend without a compiled call of its own: the server runs it through the default compiled_run."""

    backend_name = "plain"

    def _load_impl(self) -> None: ...

    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if feeds["image"].shape[0] == 3:
            raise BackendError("plain backend: three is not served")
        return {"logits": reference_logits(feeds["image"])}

    def _close_impl(self) -> None: ...

    def _providers_impl(self) -> tuple[str, ...]:
        return ("plain",)

    @classmethod
    def from_bundle(cls, bundle: Any, **overrides: Any) -> Runner:
        return cls(bundle.io)


def test_a_backend_without_a_compiled_call_is_served_through_the_default(bundle: Bundle) -> None:
    server = InferenceServer(PlainRunner(bundle.io).load(), model_name="plain")
    x = images(2)
    result = server.infer({"image": x})
    assert list(result.outputs) == ["logits"] and result.timing.items == 2
    np.testing.assert_array_equal(result.outputs["logits"], reference_logits(x))
    with pytest.raises(BackendError, match="three is not served"):
        server.infer({"image": images(3)})
    assert server.totals() == ServingTotals(requests=1, errors=1, rejected=0, runner_calls=2, items=2)
    server.close()


class OtherSignatureRunner(OnnxRuntimeRunner):
    """A model that takes 3-channel images; never run, only checked against."""

    def __init__(self, bundle: Bundle) -> None:
        io = bundle.io.to_dict()
        io["inputs"][0]["shape"] = ["batch", 3, 8, 8]
        super().__init__(bundle.model_path, IOSignature.from_manifest(io))
        self._loaded = True  # counts as loaded for swap(); the test never runs it
        self._run = self._never_run

    def _never_run(self, output_names: list[str], feeds: dict, run_options: object) -> list:
        raise AssertionError("a model the feeds were rejected by ran them")


class SignallingLock:
    """A lock that tells when someone asks for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked = threading.Event()

    def acquire(self) -> bool:
        self.asked.set()
        return self.lock.acquire()

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_feeds_are_checked_again_when_a_swap_happened_while_they_waited(bundle: Bundle) -> None:
    """The request passes the check against the old model, then waits for the runner lock; a deploy
    replaces the model meanwhile: the request is checked against the new one, which rejects it."""
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    served_runner = server._runner
    lock = server._run_lock = SignallingLock()  # type: ignore[assignment]
    server._replan()  # the direct path carries the run lock
    outcome: list[BaseException] = []

    def request() -> None:
        try:
            server.infer({"image": images(1)})
        except BaseException as err:  # noqa: BLE001 - looked at in the main thread
            outcome.append(err)

    for replacement, error in ((OtherSignatureRunner(bundle), InputSignatureError), (None, NoModelError)):
        lock.asked.clear()
        with lock.lock:  # the runner is busy
            waiting = threading.Thread(target=request)
            waiting.start()
            assert lock.asked.wait(10)  # checked against the served model, now waiting for the runner
            server._runner = replacement  # what swap() does once it has the lock
            server._replan()
        waiting.join(10)
        assert len(outcome) == 1 and isinstance(outcome.pop(), error)
        server._runner = served_runner
        server._replan()
    assert server.totals().rejected == 1 and server.totals().requests == 0
    assert server.infer({"image": images(2)}).timing.items == 2
    server.close()
