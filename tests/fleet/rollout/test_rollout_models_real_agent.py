"""The fleet per model (issue 20) against a real agent serving two models (AgentService with models:, real ONNX
Runtime bundles) through a real Mosquitto and collector into SQLite: its telemetry lands per model in the store and
on /metrics, `edgekit fleet deploy --model` switches one model, `--pipeline` switches both in one deploy_pipeline
command, and the rollout records name the models."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from edgekit.bundle.pack import pack_bundle
from tests.fleet.prometheus_text import parse_exposition
from tests.fleet.simulate.test_fleet_cli import _parser
from tests.runtime.agent.mosquitto import MosquittoBroker


def _wait(predicate, timeout_s: float = 20.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def two_model_agent(mosquitto: MosquittoBroker, tmp_path: Path, fleet_keys: tuple[Path, Path], signed_bundle):  # noqa: F811
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.metrics import IngestMetrics, MetricsServer
    from edgekit.fleet.store import open_store
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.service import AgentService

    fleet, device = "lab", f"cam-{uuid.uuid4().hex[:6]}"
    config_path = tmp_path / "agent.yaml"
    config_path.write_text(yaml.safe_dump({
        "device_id": device, "fleet": fleet, "broker": {"url": mosquitto.url, "keepalive_s": 10},
        "bundles": {"dir": str(tmp_path / "device" / "bundles"), "public_key": str(fleet_keys[1])},
        "models": {"names": ["detector", "classifier"], "default": "detector"},
        "api": {"address": "127.0.0.1:0"},
        "telemetry": {"interval_s": 0.3, "spool": {"path": str(tmp_path / "device" / "spool.db")}},
        "power": {"sensor": "none"}, "health": {"window_s": 0.3, "max_error_rate": 0.5, "min_requests": 1},
        "probe": {"interval_s": 0.1, "dims": {"batch": 2}},
    }), encoding="utf-8")  # fmt: skip
    for model, name in (("detector", "det-a"), ("classifier", "cls-a")):
        assert agent_main(["install", str(signed_bundle(name)), "--config", str(config_path), "--model", model]) == 0
    store_url = f"sqlite:///{tmp_path}/fleet.db"
    store = open_store(store_url)
    metrics = IngestMetrics()
    server = MetricsServer(metrics, port=0).start()
    collector = Collector(mosquitto.url, store, client_id=f"collector-{device}", flush_interval_s=0.05, metrics=metrics).start()
    config = load_config(config_path)
    service = AgentService(config).start()
    try:
        _wait(lambda: {r.model for r in store.model_aggregate(("device", "model"), devices=[(fleet, device)])}
              >= {"detector", "classifier"} and any(s.device == device and s.state == "online" for s in store.device_summaries(fleet)),
              what="both models' telemetry in the store")  # fmt: skip
        yield {"store": store, "store_url": store_url, "broker": mosquitto.url, "fleet": fleet, "device": device,
               "service": service, "config": config, "metrics_url": server.url}  # fmt: skip
    finally:
        service.stop()
        collector.stop()
        server.stop()
        store.close()


def _tar(signed_bundle, tmp_path: Path, name: str, inbox: Path) -> Path:  # type: ignore[no-untyped-def]
    (tmp_path / "out").mkdir(exist_ok=True)
    return pack_bundle(signed_bundle(name), tmp_path / "out" / f"{name}.tar")


def test_the_agents_models_reach_the_store_and_metrics(two_model_agent) -> None:  # type: ignore[no-untyped-def]
    store, device = two_model_agent["store"], two_model_agent["device"]
    rows = {r.model: r for r in store.model_aggregate(("device", "model", "bundle_id"), devices=[("lab", device)])}
    assert set(rows) == {"detector", "classifier"}
    assert rows["detector"].bundle_id.startswith("det-a") and rows["classifier"].bundle_id.startswith("cls-a")
    assert rows["detector"].inferences > 0  # the probe runs the default model
    (newest,) = list(store.windows(device=device))[-1:]
    assert newest.model == "detector"
    with urllib.request.urlopen(two_model_agent["metrics_url"], timeout=5) as response:
        families = parse_exposition(response.read().decode("utf-8"))
    for model, prefix in (("detector", "det-a"), ("classifier", "cls-a")):
        labels = {"fleet": "lab", "device": device, "model": model}
        info = [s for s in families["edgekit_model_info"].samples if s[0].items() >= labels.items()]  # type: ignore[attr-defined]
        assert len(info) == 1 and info[0][0]["bundle"].startswith(prefix), info
        assert families["edgekit_model_throughput_per_second"].value(labels) >= 0


def test_fleet_deploy_model_switches_one_model(two_model_agent, signed_bundle, fleet_keys, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    agent, service = two_model_agent, two_model_agent["service"]
    inbox = agent["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    tar = _tar(signed_bundle, tmp_path, "cls-b", inbox)
    args = _parser().parse_args(["deploy", str(tar), "--model", "classifier", "--broker", agent["broker"], "--store",
                                 agent["store_url"], "--devices", agent["device"], "--inbox", str(inbox), "--force",
                                 "--deploy-timeout-s", "30", "--key", str(fleet_keys[1]), "--json"])  # fmt: skip
    assert args.func(args) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["options"]["model"] == "classifier", record
    assert f"completed model classifier: {record['bundle_id']}" in " ".join(captured.err.split())
    assert record["options"]["models"][0]["bundle_id"] == record["bundle_id"]
    assert service.models.get("classifier").served.bundle_id == record["bundle_id"]
    assert service.models.get("detector").served.bundle_id.startswith("det-a")  # untouched
    store = agent["store"]
    _wait(lambda: any(r.model == "classifier" and r.bundle_id == record["bundle_id"]
                      for r in store.model_aggregate(("model", "bundle_id"), devices=[("lab", agent["device"])])),
          what="classifier telemetry on the new bundle")  # fmt: skip
    (stored,) = store.rollouts("lab", rollout_id=record["rollout_id"])
    assert stored["options"]["model"] == "classifier"


def test_fleet_deploy_pipeline_switches_both_models_in_one_command(two_model_agent, signed_bundle, fleet_keys,
                                                                   tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    agent, service = two_model_agent, two_model_agent["service"]
    inbox = agent["config"].bundles.inbox_dir
    inbox.mkdir(parents=True, exist_ok=True)
    det, cls = _tar(signed_bundle, tmp_path, "det-c", inbox), _tar(signed_bundle, tmp_path, "cls-c", inbox)
    pipeline = tmp_path / "out" / "pipeline.yaml"
    pipeline.write_text(f"models:\n  detector: {det.name}\n  classifier: {cls.name}\n", encoding="utf-8")
    args = _parser().parse_args(["deploy", "--pipeline", str(pipeline), "--broker", agent["broker"], "--store",
                                 agent["store_url"], "--devices", agent["device"], "--inbox", str(inbox), "--force",
                                 "--deploy-timeout-s", "30", "--key", str(fleet_keys[1]), "--json"])  # fmt: skip
    assert args.func(args) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    record = json.loads(captured.out.strip().splitlines()[-1])
    assert record["state"] == "completed" and record["options"]["pipeline"] is True, record
    assert f"completed pipeline {record['bundle_id']}" in " ".join(captured.err.split())
    deployed = {m["model"]: m["bundle_id"] for m in record["options"]["models"]}
    assert record["bundle_id"] == f"detector={deployed['detector']},classifier={deployed['classifier']}"
    assert {name: service.models.get(name).served.bundle_id for name in deployed} == deployed
    answer = [e for e in service.recent_events if e.get("command_id") == record["device_results"][agent["device"]]["command_id"]]
    assert answer and answer[-1]["details"]["pipeline"] is True


def test_a_failed_gate_rolls_every_model_of_the_switched_devices_back(mosquitto: MosquittoBroker, tmp_path: Path,  # noqa: F811
                                                                      fleet_keys, signed_bundle, capsys) -> None:  # type: ignore[no-untyped-def]
    """Two real two-model agents, waves 1,100%: the pipeline reaches the first, the gate (a p99 limit no device
    meets) fails, and both models of that device go back to their bundles; the second is never touched."""
    from edgekit.fleet.collector import Collector
    from edgekit.fleet.store import open_store
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.service import AgentService

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    installed = {"detector": signed_bundle("det-a"), "classifier": signed_bundle("cls-a")}
    services = {}
    store_url = f"sqlite:///{tmp_path}/fleet.db"
    store = open_store(store_url)
    collector = Collector(mosquitto.url, store, client_id=f"collector-{uuid.uuid4().hex[:6]}", flush_interval_s=0.05).start()
    try:
        for device in ("cam-a", "cam-b"):
            config_path = tmp_path / device / "agent.yaml"
            config_path.parent.mkdir()
            config_path.write_text(yaml.safe_dump({
                "device_id": device, "fleet": "gate", "broker": {"url": mosquitto.url, "keepalive_s": 10},
                "bundles": {"dir": str(tmp_path / device / "bundles"), "public_key": str(fleet_keys[1]), "inbox": str(inbox)},
                "models": {"names": ["detector", "classifier"], "default": "detector"}, "api": {"address": "127.0.0.1:0"},
                "telemetry": {"interval_s": 0.3, "spool": {"path": str(tmp_path / device / "spool.db")}},
                "power": {"sensor": "none"}, "health": {"window_s": 0.3, "max_error_rate": 0.5, "min_requests": 1},
                "probe": {"interval_s": 0.1, "dims": {"batch": 2}},
            }), encoding="utf-8")  # fmt: skip
            for model, bundle in installed.items():
                assert agent_main(["install", str(bundle), "--config", str(config_path), "--model", model]) == 0
            services[device] = AgentService(load_config(config_path)).start()
        _wait(lambda: len({(r.device, r.model) for r in store.model_aggregate(("device", "model"), fleet="gate")
                           if r.inferences > 0}) == 4, what="both agents' models reporting inferences")  # fmt: skip
        before = {d: {m: s.models.get(m).served.bundle_id for m in installed} for d, s in services.items()}
        det, cls = _tar(signed_bundle, tmp_path, "det-d", inbox), _tar(signed_bundle, tmp_path, "cls-d", inbox)
        args = _parser().parse_args(["deploy", "--pipeline", f"detector={det},classifier={cls}", "--broker", mosquitto.url,
                                     "--store", store_url, "--fleet", "gate", "--devices", "cam-a,cam-b", "--inbox",
                                     str(inbox), "--force", "--waves", "1,100%", "--health-window-s", "2",
                                     "--max-p99-ratio", "0.001", "--deploy-timeout-s", "30", "--key", str(fleet_keys[1]),
                                     "--json"])  # fmt: skip
        assert args.func(args) == 1
        record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert record["state"] == "rolled_back" and "p99 grew" in record["reason"], record["reason"]
        assert record["outcomes"] == {"cam-a": "rolled_back", "cam-b": "not_started"}
        assert [w["state"] for w in record["waves"]] == ["failed", "not_started"]
        assert record["waves"][0]["health"]["windows"] > 0  # the gate read the deployed models' own windows
        after = {d: {m: s.models.get(m).served.bundle_id for m in installed} for d, s in services.items()}
        assert after == before  # cam-a's two models back on their bundles, cam-b never switched
    finally:
        for service in services.values():
            service.stop()
        collector.stop()
        store.close()
