"""Downloads that never finish properly (review findings): a body shorter than its Content-Length fails at step
download, and a server that trickles the body cannot hold the deploy lock past ``bundles.download_max_s``. Real
HTTP servers on loopback, real bundle tars, the real Deployer."""

from __future__ import annotations

import http.server
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.config_types import BundlesConfig, HealthConfig
from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.agent.fetch import fetch_bundle
from edgekit_runtime.agent.ota import Deployer, DeployRequest
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.store import BundleStore
from edgekit_runtime.errors import EdgekitError
from tests.runtime.agent_service.bundles import make_bundle, pack_tar

REPO = Path(__file__).resolve().parents[3]


def _serve(handle: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            try:
                handle(self)
            except OSError:
                pass  # the agent hung up

        def log_message(self, *_: Any) -> None:
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/bundle.tar"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tar(tmp_path: Path) -> bytes:
    return pack_tar(make_bundle(tmp_path / "src", name="tiny-a", bundle_version=1000), tmp_path / "a.tar").read_bytes()


@pytest.fixture
def truncated_url(tar: bytes) -> Iterator[str]:
    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Length", str(len(tar)))
        request.end_headers()
        request.wfile.write(tar[: len(tar) - 10240])  # the last members' blocks never come
        request.close_connection = True

    yield from _serve(handle)


@pytest.fixture
def trickle_url() -> Iterator[str]:
    def handle(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Length", "1000000")
        request.end_headers()
        for _ in range(1000):  # a byte every 0.1 s: each read is within download_timeout_s
            request.wfile.write(b"x")
            request.wfile.flush()
            time.sleep(0.1)

    yield from _serve(handle)


def _deployer(root: Path, events: list[dict[str, Any]], **bundles: Any) -> Deployer:
    deployer = Deployer(BundleStore(root), BundlesConfig(dir=root, allow_unsigned=True, **bundles), HealthConfig(window_s=0.0),
                        InferenceServer(), events.append)  # fmt: skip
    deployer.store.prepare()
    return deployer


def _results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "deploy_result"]


def test_a_body_shorter_than_its_content_length_fails_at_download(tmp_path: Path, tar: bytes, truncated_url: str) -> None:
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events)
    assert deployer.deploy(DeployRequest(truncated_url, None), check_source=False) == "failed"
    (result,) = _results(events)
    assert result["details"]["step"] == "download"  # before: "not a complete, readable tar", no byte counts
    assert f"truncated: got {len(tar) - 10240:,} of {len(tar):,} bytes" in result["message"]
    assert deployer.served is None and not deployer.lock.locked()


def test_a_trickling_download_stops_at_download_max_s(tmp_path: Path, trickle_url: str) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    started = time.monotonic()
    with pytest.raises(DeployError) as caught:  # before: ran for 1000 s (each byte within timeout_s)
        fetch_bundle(trickle_url, staging, expected_sha256=None, max_bytes=10**9, timeout_s=2.0, max_seconds=1.0)
    assert time.monotonic() - started < 4.0
    assert "did not finish within bundles.download_max_s = 1 s" in caught.value.message
    assert "of 1,000,000 bytes" in caught.value.message and "bundles.download_max_s" in (caught.value.hint or "")


def test_a_trickling_deploy_lets_go_of_the_deploy_lock(tmp_path: Path, trickle_url: str) -> None:
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events, download_timeout_s=2.0, download_max_s=1.0)
    started = time.monotonic()
    assert deployer.deploy(DeployRequest(trickle_url, None), check_source=False) == "failed"
    assert time.monotonic() - started < 4.0 and not deployer.lock.locked()
    (result,) = _results(events)
    assert result["details"]["step"] == "download" and "bundles.download_max_s" in result["message"]


def _config(tmp_path: Path, **bundles: Any) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"device_id": "dev-1", "fleet": "lab", "api": {"address": "127.0.0.1:0"},
                                    "power": {"sensor": "none"}, "telemetry": {"spool": {"path": str(tmp_path / "spool.db")}},
                                    "bundles": {"dir": str(tmp_path / "b"), "allow_unsigned": True, **bundles}}),
                    encoding="utf-8")  # fmt: skip
    return path


def test_download_max_s_is_read_validated_and_documented(tmp_path: Path) -> None:
    assert load_config(_config(tmp_path)).bundles.download_max_s == 3600.0
    assert load_config(_config(tmp_path, download_max_s=90)).bundles.download_max_s == 90.0
    for bad in (0, -5, "soon"):
        with pytest.raises(EdgekitError) as caught:
            load_config(_config(tmp_path, download_max_s=bad))
        assert "bundles.download_max_s" in str(caught.value)
    example = (REPO / "runtime" / "agent.example.yaml").read_text(encoding="utf-8")
    assert "download_max_s: 3600" in example
