"""A slow model's requests never hold up another model's (docs/agent.md), on both event loops, the real agent:

* HTTP: the API's event loop ran every kept-alive connection's inference itself, one model after another; a
  model whose pass took longer than ``SLOW_ON_LOOP_S`` now has its requests served on threads for a while.
* gRPC: one runner thread ran every model's passes in turn; now each model has its own.

The slow model is made deterministic: its server's calls wait on an event the test holds, so the test needs
no timing: the other model's answer must come while the slow model's request is still held."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.runtime.agent_service.model_bundles import serving_models
from tests.runtime.agent_service.test_api_event_loop import images, raw_request
from tests.runtime.agent_service.test_api_event_loop_hostile import on_the_loop, read_reply


@pytest.fixture
def agent(agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[Any]:
    api = {"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}}
    with serving_models(agent_config, tmp_path, fleet_keys[0], ["digits", "slow"], api=api) as service:
        yield service


class Held:
    """Wraps the slow model's server: while ``holding`` is false each call takes 20 ms more (so a loop learns the
    model is slow); once it is set, each call waits until :meth:`release` (the test checks the other model then)."""

    def __init__(self, server: Any) -> None:
        self.server, self.gate, self.entered = server, threading.Event(), threading.Event()
        self.holding = False
        real_together, real_infer = server.infer_together, server.infer

        def together(requests: Any) -> Any:
            self._wait()
            return real_together(requests)

        def infer(feeds: Any, submitted_ns: int = 0) -> Any:
            self._wait()
            return real_infer(feeds, submitted_ns)

        server.infer_together, server.infer = together, infer

    def _wait(self) -> None:
        if not self.holding:
            time.sleep(0.02)
            return
        self.entered.set()
        assert self.gate.wait(30), "the test never released the slow model"

    def release(self) -> None:
        self.gate.set()


def _slow_request() -> bytes:
    x = np.ones((2, 256), np.float32)
    header = json.dumps({"inputs": [{"name": "x", "shape": [2, 256], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
    body = header + x.tobytes()
    return (f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def test_http_a_slow_models_request_does_not_hold_up_the_loops_other_connections(agent: Any) -> None:
    held = Held(agent.models.find("slow").server)
    host, port = agent.api_address.rsplit(":", 1)
    with on_the_loop(agent) as digits, socket.create_connection((host, int(port)), timeout=30) as slow:
        with slow.makefile("rb") as slow_stream:
            for _ in range(3):  # the first on a thread, then two on the loop: 20 ms each there, so the loop marks it slow
                slow.sendall(_slow_request())
                assert read_reply(slow_stream)[0] == 200
            held.holding = True  # from now on every call of the slow model waits for the test
            slow.sendall(_slow_request())
            assert held.entered.wait(10)
            with digits.makefile("rb") as stream:
                digits.settimeout(10)
                digits.sendall(raw_request(images(1, 7)))
                status, _, _ = read_reply(stream)  # before: the loop itself waited in the slow model's call
            assert status == 200 and not held.gate.is_set()
            held.release()
            assert read_reply(slow_stream)[0] == 200


def test_grpc_a_slow_models_pass_does_not_hold_up_another_models_calls(agent: Any) -> None:
    import tritonclient.grpc as grpcclient

    held = Held(agent.models.find("slow").server)
    client = grpcclient.InferenceServerClient(url=agent.grpc.bound_address)
    try:
        def infer(model: str, name: str, array: np.ndarray) -> Any:
            tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            return client.infer(model, [tensor], client_timeout=30)

        x = np.ones((2, 256), np.float32)
        infer("slow", "x", x)  # 20 ms on the loop: the loop learns the model is slow
        held.holding = True
        answers: list[Any] = []
        slow = threading.Thread(target=lambda: answers.append(infer("slow", "x", x)), daemon=True)
        slow.start()
        assert held.entered.wait(10)
        result = infer("digits", "image", images(1, 8))  # before: queued behind the slow model's pass on one thread
        assert result.as_numpy("logits").shape == (1, 10) and not held.gate.is_set()
        held.release()
        slow.join(30)
        assert answers and answers[0].as_numpy("y").shape == (2, 256)
    finally:
        client.close()


def test_http_a_lone_model_stays_on_the_loop_however_slow_its_passes(agent_config: Callable[..., Path], tmp_path: Path,
                                                                     fleet_keys: tuple[Path, Path]) -> None:  # fmt: skip
    """With one model there is no other model to hold up: before, one pass over 2 ms (a batch of 16, or a preemption
    on a busy host) sent it to threads for 10 s, where 16 clients got 931-1,187/s against 11,555/s on the loop."""
    from tests.runtime.agent_service.test_api_event_loop import wait_for

    with serving_models(agent_config, tmp_path, fleet_keys[0], ["slow"]) as service:
        Held(service.models.find("slow").server)  # every call 20 ms: each pass on the loop is over SLOW_ON_LOOP_S
        host, port = service.api_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as slow, slow.makefile("rb") as stream:
            for _ in range(6):
                slow.sendall(_slow_request())
                assert read_reply(stream)[0] == 200
            assert wait_for(lambda: service.api.loop_connections == 1)  # still the loop's, not handed to a thread
            loop = service.api._httpd.infer_loop
            assert not loop._slow_until
