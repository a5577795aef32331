"""``edgekit fleet up`` on a host where the default ports are taken (issue 32 item 6): a real Mosquitto on the broker
port and a listening socket on the dashboard port. Left to their defaults, both move to free ports and the command says
so; an explicit --broker-port that is taken is a short error, with no amqtt traceback. The dashboard's empty-state
banner suggests a command that runs as printed."""

from __future__ import annotations

import html
import json
import logging
import re
import shlex
import socket
from pathlib import Path

import pytest

from edgekit.cli.main import main as edgekit_main
from edgekit.fleet import local_stack
from edgekit.fleet.embedded_broker import EmbeddedBrokerError
from edgekit.fleet.store import open_store
from tests.runtime.agent.mosquitto import MosquittoBroker, mosquitto, mosquitto_factory  # noqa: F401 (pytest fixtures)

INDEX = Path(local_stack.__file__).parent / "dashboard" / "static" / "index.html"

pytest.importorskip("amqtt", reason="the embedded broker needs amqtt (pip install amqtt)")


def _banner_command(store_url: str) -> list[str]:
    """The `edgekit fleet up` line of the dashboard's empty state, with the store URL the page fills in."""
    page = INDEX.read_text(encoding="utf-8")
    empty = page[page.index('id="empty"'):page.index("</section>", page.index('id="empty"'))]
    (code,) = [c for c in re.findall(r"<code>(.*?)</code>", empty) if "fleet up" in c]
    text = html.unescape(re.sub(r'<span class="store-url"></span>', store_url, code))
    assert "<" not in text, text
    return shlex.split(text)


def test_the_banner_command_runs_where_broker_and_dashboard_ports_are_taken(
    mosquitto: MosquittoBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setattr(local_stack, "DEFAULT_BROKER_PORT", mosquitto.port)  # stands for 1883 with Mosquitto on it
    monkeypatch.setattr(local_stack, "DEFAULT_DASHBOARD_PORT", taken.getsockname()[1])  # for the dashboard showing the banner
    store_url = f"sqlite:///{tmp_path}/fleet.db"
    argv = _banner_command(store_url)
    assert argv[:3] == ["edgekit", "fleet", "up"] and "--simulate" in argv, argv
    try:
        assert edgekit_main([*argv[1:], "--rate", "2", "--duration", "4", "--json"]) == 0
    finally:
        taken.close()
    captured = capsys.readouterr()
    started = json.loads(captured.out.strip().splitlines()[-1])
    assert not started["broker"].endswith(f":{mosquitto.port}") and started["broker"].startswith("mqtt://127.0.0.1:")
    broker_note, dashboard_note = started["notes"]
    assert f"port {mosquitto.port} on 127.0.0.1 is taken" in broker_note and f"--broker mqtt://127.0.0.1:{mosquitto.port}" in broker_note
    assert f"the embedded broker listens on {started['broker'].rsplit(':', 1)[1]} instead" in broker_note
    assert "the dashboard listens on" in dashboard_note and started["dashboard"] not in (None, "")
    assert "note: port" in captured.err and "Traceback" not in captured.err and "amqtt" not in captured.err.replace("embedded amqtt", "")
    with open_store(store_url) as store:
        assert len(store.device_summaries("sim")) == 20  # the simulated devices reached the store through the moved broker


def test_an_explicit_broker_port_that_is_taken_is_a_short_error(mosquitto: MosquittoBroker, tmp_path: Path,  # noqa: F811
                                                                 caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    config = local_stack.LocalStackConfig(broker_port=mosquitto.port, store_url=f"sqlite:///{tmp_path}/fleet.db", dashboard_port=0)
    with caplog.at_level(logging.DEBUG), pytest.raises(EmbeddedBrokerError) as info:
        local_stack.LocalStack(config).start()
    assert f"cannot listen on 127.0.0.1:{mosquitto.port}: something listens there already" in info.value.message
    assert f"--broker mqtt://127.0.0.1:{mosquitto.port}" in (info.value.hint or "") and "--broker-port 0" in (info.value.hint or "")
    assert not [r for r in caplog.records if r.name.startswith("amqtt")], "amqtt was started (and logged) although the port was taken"
