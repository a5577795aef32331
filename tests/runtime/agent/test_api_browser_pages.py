"""A hostile web page in a real headless Chromium against a real local API: a page at another origin
(``http://evil.test:PORT``, resolved to 127.0.0.1 by Chromium's host rules) POSTs 60 MB as ``no-cors``
``text/plain`` to ``/v1/infer`` and ``/v2``: refused with 403 ``forbidden_origin`` from the headers,
before the body is read (the reviewer's run: 105 -> 881 MB). And a rebound name
(``http://evil.test:AGENT_PORT``, what DNS rebinding gives) gets 421 ``unknown_host``."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.fleet.dashboard.browser import CHROMEDRIVER_CANDIDATES, CHROMIUM_CANDIDATES, CHROMIUM_FLAGS, chromium_missing
from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle
from tests.runtime.tiny_bundle import build_bundle

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))

MODEL = "tiny-linear-x86-64-cpu-fp32"

#: The attacker's page: two no-cors text/plain POSTs of 60 MB; resolves with what fetch saw (opaque or an error).
ATTACK = """const done = arguments[arguments.length - 1];
const body = "0,".repeat(30 * 1024 * 1024);
const send = (path) => fetch(arguments[0] + path, {method: "POST", mode: "no-cors", body: body,
                                                  headers: {"Content-Type": "text/plain"}})
  .then((r) => r.type).catch((e) => "error: " + e);
Promise.all([send("/v1/infer"), send("/v2/models/%s/infer")]).then(done);""" % MODEL


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[AgentApi]:
    bundle = open_bundle(build_bundle(tmp_path / "bundle"))
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
    with AgentApi(server, "127.0.0.1:0") as api:
        yield api
    server.close()


@pytest.fixture
def attacker_site() -> Iterator[int]:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"<!doctype html><title>cute cats</title><p>nothing to see</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = next(c for c in CHROMIUM_CANDIDATES if Path(c).is_file())
    for flag in (*CHROMIUM_FLAGS, "--host-resolver-rules=MAP evil.test 127.0.0.1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=next(c for c in CHROMEDRIVER_CANDIDATES if Path(c).is_file())),
                              options=options)  # fmt: skip
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def test_a_page_at_another_origin_cannot_post_text_plain_to_the_api(api: AgentApi, attacker_site: int, chromium: Any,
                                                                   caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    chromium.get(f"http://evil.test:{attacker_site}/")
    assert chromium.title == "cute cats"
    before = _rss_mb()
    with caplog.at_level(logging.INFO, logger="edgekit_runtime.agent.api"):
        outcomes = chromium.execute_async_script(ATTACK, f"http://127.0.0.1:{api.bound_address.rsplit(':', 1)[1]}")
    grown = _rss_mb() - before
    refusals = [r.getMessage() for r in caplog.records if "refused POST" in r.getMessage()]
    origin = f"'http://evil.test:{attacker_site}'"
    assert len(refusals) == 2, (outcomes, caplog.text)
    assert refusals[0].startswith("API: refused POST /v1/infer from 127.0.0.1: 403 forbidden_origin (requests from web pages at "
                                  f"{origin} are refused")  # fmt: skip
    assert refusals[1].startswith(f"API: refused POST /v2/models/{MODEL}/infer from 127.0.0.1: 403 forbidden_origin")
    assert api.server.totals().requests == 0  # nothing reached the model
    assert grown < 30, f"the agent's process grew {grown:.0f} MB while refusing two 60 MB bodies"


def test_a_rebound_host_name_gets_421_in_the_browser(api: AgentApi, chromium: Any) -> None:
    port = api.bound_address.rsplit(":", 1)[1]
    chromium.get(f"http://evil.test:{port}/v1/health")  # what the page's own name leads to once rebound to 127.0.0.1
    status = chromium.execute_script("return performance.getEntriesByType('navigation')[0].responseStatus")
    text = chromium.execute_script("return document.body.innerText")
    assert status == 421, text
    assert '"error": "unknown_host"' in text and f"Host 'evil.test:{port}' is not a name this server answers to" in text
    chromium.get(f"http://localhost:{port}/v1/health")
    assert chromium.execute_script("return performance.getEntriesByType('navigation')[0].responseStatus") == 200
