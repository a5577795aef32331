"""Hostile 60 MB JSON bodies against a real ``edgekit-agent run`` process, its resident memory read from
``/proc/<pid>/status`` (VmRSS before, VmHWM, the peak, after ``clear_refs`` reset it): a body larger than
the model can need is refused before it is read; one that fits is counted before it is parsed, and its
arrays of numbers are read straight into numpy (no Python object per value); four at once stay within
twice ``api.max_inflight_body_mb`` (the others get 503 and are served when they send again).
The reviewer's run: 113 -> 876 MB for one body, 1.8 GB for four. Measured here (2026-11-28, 2-core host):
compact 67 MB, padded (parsed) 82 MB, four padded at once 166 MB of peak growth for 60 MB bodies (348 MB
without the in-flight bound)."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from edgekit_runtime.agent.body_budget import DEFAULT_AGENT_MEMORY_MB, DEFAULT_INFLIGHT_BODY_BYTES, RETRY_AFTER_S
from edgekit_runtime.agent.cli import EXIT_OK, main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.errors import AgentApiError
from tests.runtime.agent.mosquitto import free_port
from tests.runtime.agent.wide_bundle import write_wide_bundle
from tests.runtime.agent_service.bundles import make_bundle

MB = 1024 * 1024
AGENT_SCRIPT = Path(sys.executable).parent / "edgekit-agent"
BODY_BYTES = 60 * MB
#: what the reviewer's four bodies must stay under: a small device's whole budget for the agent
FOUR_AT_ONCE_LIMIT_MB = DEFAULT_AGENT_MEMORY_MB
#: the bodies the agent holds at once by default (api.max_inflight_body_mb): a quarter of that budget
INFLIGHT_BODY_MB = DEFAULT_INFLIGHT_BODY_BYTES / MB


@dataclass
class RunningAgent:
    process: subprocess.Popen[str]
    port: int

    def status_mb(self, field: str) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise AssertionError(f"no {field} in /proc/{self.process.pid}/status")

    def reset_peak(self) -> float:
        """Reset VmHWM to the current RSS and return that RSS in MB."""
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        return self.status_mb("VmRSS")


def _start(tmp_path: Path, bundle: Path, **api_settings: object) -> Iterator[RunningAgent]:
    port = free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "device_id": "dev-1", "fleet": "lab",
        "bundles": {"dir": str(tmp_path / "bundles"), "allow_unsigned": True, "allowed_sources": [str(tmp_path)]},
        "api": {"address": f"127.0.0.1:{port}", **api_settings},
        "telemetry": {"interval_s": 60, "spool": {"path": str(tmp_path / "spool.db")}},
        "power": {"sensor": "none"}, "health": {"window_s": 0, "max_error_rate": 0.1, "min_requests": 1},
    }), encoding="utf-8")  # fmt: skip
    assert main(["install", str(bundle), "--config", str(config)]) == EXIT_OK
    process = subprocess.Popen([str(AGENT_SCRIPT), "run", "--config", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        client = AgentClient(f"127.0.0.1:{port}", timeout_s=2)
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.health()["status"] == "ok":
                    break
            except AgentApiError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read() if process.stderr else ""
            time.sleep(0.2)
        yield RunningAgent(process, port)
    finally:
        process.kill()
        process.communicate(timeout=30)


@pytest.fixture
def wide_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    yield from _start(tmp_path, write_wide_bundle(tmp_path / "src" / "wide-mean"))


@pytest.fixture
def tiny_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    yield from _start(tmp_path, make_bundle(tmp_path / "src" / "tiny-a"))


def hostile_body(value: bytes) -> bytes:
    """About 60 MB of ``{"inputs": {"image": {"dtype": "float32", "data": [value, value, ...]}}}``."""
    head, tail = b'{"inputs": {"image": {"dtype": "float32", "data": [', b"0]}}}"
    count = (BODY_BYTES - len(head) - len(tail)) // (len(value) + 1)
    return head + (value + b",") * count + tail


def post(agent: RunningAgent, body: bytes, content_type: str = "application/json") -> tuple[int, dict]:
    """POST ``body`` to /v1/infer over a raw socket; the reply, also when it comes before the whole body went."""
    with socket.create_connection(("127.0.0.1", agent.port), timeout=120) as sock:
        sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                     % (content_type.encode(), len(body)))  # fmt: skip
        try:
            sock.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused from its Content-Length: the reply is already there
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def test_a_60_mb_body_larger_than_the_model_can_need_costs_no_memory(tiny_agent: RunningAgent) -> None:
    before = tiny_agent.reset_peak()
    status, payload = post(tiny_agent, hostile_body(b"0.0"))
    grown = tiny_agent.status_mb("VmHWM") - before
    assert status == 413 and "is more than model 'tiny-a' can need (327680 bytes at most" in payload["message"], payload
    assert grown < 8, f"RSS peak grew {grown:.1f} MB for a body refused from its Content-Length"


def test_60_mb_hostile_bodies_cost_at_most_twice_their_size(wide_agent: RunningAgent, record_property) -> None:  # type: ignore[no-untyped-def]
    # 15.7 million values where the model takes 2.46 million: counted and refused before json.loads
    compact = hostile_body(b"0.0")
    before = wide_agent.reset_peak()
    status, payload = post(wide_agent, compact)
    compact_mb = wide_agent.status_mb("VmHWM") - before
    assert status == 400 and payload["error"] == "input_signature"
    assert payload["message"].startswith("request body holds 15728627 commas, more than the inputs of model 'wide-mean' can take")
    # 2.42 million long values (what the model can take): parsed, then refused for its shape
    padded = hostile_body(b"0.10000000000000000000001")
    del compact
    before = wide_agent.reset_peak()
    status, payload = post(wide_agent, padded)
    padded_mb = wide_agent.status_mb("VmHWM") - before
    assert status == 400 and payload["error"] == "input_signature", payload
    assert payload["message"] == (f"input 'image': expected float32[batch, 3, 640, 640] (batch in 1..2), got float32"
                                  f"[{padded.count(b',')}] (rank 1, expected rank 4)")  # fmt: skip  (one comma is the header's)
    # four of them at once, and a page's no-cors text/plain POST beside them: the bodies in flight are
    # bounded by api.max_inflight_body_mb (default 128 MiB, a quarter of the 512 MiB budget), the others get
    # 503 with Retry-After and are served when they send again
    before = wide_agent.reset_peak()
    answers: list[list[int]] = []

    def post_until_served() -> None:
        statuses = [post(wide_agent, padded)[0]]
        while statuses[-1] == 503 and len(statuses) < 20:
            time.sleep(RETRY_AFTER_S)
            statuses.append(post(wide_agent, padded)[0])
        answers.append(statuses)

    threads = [threading.Thread(target=post_until_served) for _ in range(4)]
    threads.append(threading.Thread(target=lambda: answers.append([post(wide_agent, padded, "text/plain")[0]])))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    four_mb = wide_agent.status_mb("VmHWM") - before
    body_mb = len(padded) / MB
    refused = sum(statuses.count(503) for statuses in answers)
    assert sorted(statuses[-1] for statuses in answers) == [400, 400, 400, 400, 415], answers
    record_property("rss_growth_mb", {"compact": round(compact_mb, 1), "padded": round(padded_mb, 1), "four_padded": round(four_mb, 1),
                                      "busy_503": refused})  # fmt: skip
    print(f"RSS peak growth for {body_mb:.0f} MB bodies: compact {compact_mb:.0f} MB, padded {padded_mb:.0f} MB, "
          f"4 padded {four_mb:.0f} MB ({refused} answers 503 busy_bodies before they fit)")  # fmt: skip
    assert compact_mb <= 2 * body_mb and padded_mb <= 2 * body_mb, (compact_mb, padded_mb)
    assert refused >= 1, "four 60 MB bodies all fit in a 128 MiB budget at once?"
    assert four_mb <= 2 * INFLIGHT_BODY_MB < FOUR_AT_ONCE_LIMIT_MB, four_mb
