"""The model repository: several bundles served at once, per-model deploys, rollback, memory budget,
pipeline deploys (all or none), and per-model serving state. Real ONNX Runtime bundles throughout."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.config_types import MAX_MODELS
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.schemas import validate_message
from tests.runtime.agent_service.model_bundles import embedder_inputs, make_model_bundle, reference_embedding, reference_slow
from tests.runtime.tiny_bundle import reference_logits

MODELS = ["digits", "embedder", "flat"]


@pytest.fixture
def model_bundle(tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Callable[..., Path]:
    """``model_bundle(kind, name=..., **options)`` -> a signed bundle directory."""

    def make(kind: str, *, name: str | None = None, **options: Any) -> Path:
        root = make_model_bundle(tmp_path / "src" / f"{name or kind}-{len(list((tmp_path).glob('src/*')))}", kind,
                                 name=name, **options)  # fmt: skip
        sign_bundle(root, fleet_keys[0])
        return root

    return make


def manifest_sha(bundle: Path) -> str:
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def wait_event(service: AgentService, kind: str, command_id: str, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in list(service.recent_events):
            if event["kind"] == kind and event.get("command_id") == command_id:
                return event
        time.sleep(0.02)
    raise AssertionError(f"no {kind} for {command_id}; saw {[(e['kind'], e.get('command_id')) for e in service.recent_events]}")


def deploy_args(bundle: Path, **extra: Any) -> dict[str, Any]:
    return {"bundle_id": bundle.name, "url": bundle.as_uri(), "sha256": manifest_sha(bundle), **extra}


@pytest.fixture
def repository(agent_config: Callable[..., Path], model_bundle: Callable[..., Path]) -> Iterator[AgentService]:
    """An agent with three models installed (digits, embedder, flat), each under its own name."""
    path = agent_config(models={"names": MODELS, "default": "digits"})
    for kind in MODELS:
        assert agent_main(["install", str(model_bundle(kind)), "--config", str(path), "--model", kind]) == 0
    agent = AgentService(load_config(path)).start()
    yield agent
    agent.stop()


def test_three_models_are_served_at_once_each_by_name(repository: AgentService) -> None:
    models = {slot.name: slot for slot in repository.models.slots()}
    assert sorted(models) == sorted(MODELS)
    image = np.random.default_rng(1).standard_normal((3, 1, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(models["digits"].server.infer({"image": image}).outputs["logits"], reference_logits(image), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(models["flat"].server.infer({"image": image.reshape(3, 64)}).outputs["logits"],
                               reference_logits(image), rtol=1e-4, atol=1e-4)  # fmt: skip
    feeds = embedder_inputs(4)
    np.testing.assert_allclose(models["embedder"].server.infer(feeds).outputs["sentence_embedding"],
                               reference_embedding(**feeds), rtol=1e-4, atol=1e-5)  # fmt: skip
    health = repository.health()
    assert health["model"] == "digits" and health["status"] == "ok"  # the default model's fields, as before
    by_name = {entry["model"]: entry for entry in health["models"]}
    assert set(by_name) == set(MODELS) and all(entry["ready"] and entry["self_check_passed"] for entry in by_name.values())
    assert by_name["embedder"]["bundle"] == "embedder" and by_name["embedder"]["version"] == "1735689600000"
    assert all(isinstance(entry["memory_mb"], float) and entry["memory_mb"] >= 0 for entry in by_name.values())
    # each model has its own store, with its own current link
    for name in MODELS:
        assert models[name].store.root == repository.config.models.dir / name
        assert models[name].store.current is not None and models[name].store.current.name.startswith(name)


def test_deploy_and_rollback_name_the_model_and_leave_the_others_alone(repository: AgentService, model_bundle: Callable[..., Path]) -> None:
    embedder_v2 = model_bundle("embedder", name="embedder-v2", bundle_version=1_800_000_000_000)
    command = {"id": "d1", "command": "deploy", "args": deploy_args(embedder_v2, model="embedder")}
    repository.dispatch_command(command)
    result = wait_event(repository, "deploy_result", "d1")
    assert result["details"]["outcome"] == "succeeded" and result["details"]["model"] == "embedder"
    served = {slot.name: slot.served.name for slot in repository.models.slots()}
    assert served == {"digits": "digits", "embedder": "embedder-v2", "flat": "flat"}
    repository.dispatch_command({"id": "r1", "command": "rollback", "args": {"model": "embedder"}})
    rollback = wait_event(repository, "rollback_result", "r1")
    assert rollback["details"]["outcome"] == "succeeded" and rollback["details"]["model"] == "embedder"
    assert repository.models.get("embedder").served.name == "embedder"
    # a rollback of a model that has no previous version fails, naming it; the others are untouched
    repository.dispatch_command({"id": "r2", "command": "rollback", "args": {"model": "flat"}})
    failed = wait_event(repository, "rollback_result", "r2")
    assert failed["details"]["outcome"] == "failed" and "no previous bundle" in failed["message"]
    assert failed["details"]["model"] == "flat"
    for event in repository.recent_events:
        validate_message(event, "event.v1")


def test_a_command_naming_an_unknown_model_is_rejected_with_the_known_ones(repository: AgentService, model_bundle: Callable[..., Path]) -> None:
    bundle = model_bundle("digits", name="digits-x")
    repository.dispatch_command({"id": "u1", "command": "deploy", "args": deploy_args(bundle, model="detector")})
    rejected = wait_event(repository, "command_rejected", "u1")
    assert "unknown model 'detector'; this agent serves: digits, embedder, flat" in rejected["message"]
    assert "add 'detector' to models.names" in rejected["details"]["hint"]


def test_the_one_bundle_layout_is_one_model_named_after_its_bundle(agent_config: Callable[..., Path], model_bundle: Callable[..., Path]) -> None:
    path = agent_config()
    assert agent_main(["install", str(model_bundle("digits", name="tiny-a")), "--config", str(path)]) == 0
    with AgentService(load_config(path)) as agent:
        assert [slot.name for slot in agent.models.slots()] == ["tiny-a"]
        assert agent.store.root == agent.config.bundles.dir  # the old layout, unchanged
        assert agent.health()["models"][0]["model"] == "tiny-a"
        # the model may be named (its bundle's name) or left out; another name is refused
        assert agent.models.get("tiny-a") is agent.models.get(None)
        bundle = model_bundle("digits", name="tiny-b")
        agent.dispatch_command({"id": "n1", "command": "deploy", "args": deploy_args(bundle, model="other")})
        rejected = wait_event(agent, "command_rejected", "n1")
        assert "model 'other': this agent serves one model (tiny-a) from bundles.dir" in rejected["message"]
        agent.dispatch_command({"id": "n2", "command": "deploy", "args": deploy_args(bundle, model="tiny-a")})
        assert wait_event(agent, "deploy_result", "n2")["details"]["outcome"] == "succeeded"
        assert [slot.name for slot in agent.models.slots()] == ["tiny-b"]


def test_a_model_past_the_memory_budget_is_refused_and_nothing_changes(agent_config: Callable[..., Path], model_bundle: Callable[..., Path]) -> None:
    # The slow model's file is 256 KiB; a budget of 0.2 MiB refuses it before loading (the file size check).
    path = agent_config(models={"names": ["digits", "slow"], "default": "digits", "memory_budget_mb": 0.2})
    assert agent_main(["install", str(model_bundle("digits")), "--config", str(path), "--model", "digits"]) == 0
    with AgentService(load_config(path)) as agent:
        bundle = model_bundle("slow")
        agent.dispatch_command({"id": "m1", "command": "deploy", "args": deploy_args(bundle, model="slow")})
        result = wait_event(agent, "deploy_result", "m1")
        assert result["details"]["outcome"] == "failed" and result["details"]["step"] == "memory"
        assert "model 'slow' does not fit in models.memory_budget_mb (0.2 MiB): its model file alone is 0.3 MiB" in result["message"]
        assert "raise models.memory_budget_mb" in result["details"]["error"]
        assert agent.models.get("slow").served is None and agent.models.get("slow").store.current is None
        assert agent.health()["memory"]["budget_mb"] == 0.2


def test_pipeline_deploy_switches_all_models_together(repository: AgentService, model_bundle: Callable[..., Path]) -> None:
    digits_v2 = model_bundle("digits", name="digits-v2")
    embedder_v2 = model_bundle("embedder", name="embedder-v2")
    command = {"schema": "edgekit.command/1", "id": "p1", "command": "deploy_pipeline",
               "args": {"deploys": [deploy_args(digits_v2, model="digits"), deploy_args(embedder_v2, model="embedder")]}}
    validate_message(command, "command.v1")
    repository.dispatch_command(command)
    result = wait_event(repository, "deploy_result", "p1")
    assert result["details"]["outcome"] == "succeeded" and result["details"]["pipeline"] is True
    assert result["details"]["switched"] == [{"model": "digits", "bundle": "digits-v2"}, {"model": "embedder", "bundle": "embedder-v2"}]
    assert repository.models.get("digits").served.name == "digits-v2"
    assert repository.models.get("embedder").served.name == "embedder-v2"
    assert repository.models.get("flat").served.name == "flat"


def test_pipeline_deploy_switches_none_when_the_second_self_check_fails(repository: AgentService, model_bundle: Callable[..., Path]) -> None:
    digits_v2 = model_bundle("digits", name="digits-v2")
    broken = model_bundle("embedder", name="embedder-broken", corrupt_golden=True)
    before = {name: repository.models.get(name).store.current for name in MODELS}
    repository.dispatch_command({"id": "p2", "command": "deploy_pipeline",
                                 "args": {"deploys": [deploy_args(digits_v2, model="digits"), deploy_args(broken, model="embedder")]}})
    result = wait_event(repository, "deploy_result", "p2")
    details = result["details"]
    assert details["outcome"] == "failed" and details["step"] == "self_check" and details["model"] == "embedder"
    assert "model embedder failed at self_check" in result["message"] and "no model was switched" in result["message"]
    # neither switched: the same bundles serve, the links did not move, the staged digits-v2 was removed
    assert repository.models.get("digits").served.name == "digits"
    assert repository.models.get("embedder").served.name == "embedder"
    assert {name: repository.models.get(name).store.current for name in MODELS} == before
    assert not any(p.name.startswith("digits-v2") for p in repository.models.get("digits").store.versions_dir.iterdir())
    image = np.zeros((1, 1, 8, 8), np.float32)
    np.testing.assert_allclose(repository.models.get("digits").server.infer({"image": image}).outputs["logits"], reference_logits(image), atol=1e-5)


def test_pipeline_deploy_refuses_a_model_it_does_not_have(repository: AgentService, model_bundle: Callable[..., Path]) -> None:
    bundle = model_bundle("digits", name="digits-v3")
    repository.dispatch_command({"id": "p3", "command": "deploy_pipeline", "args": {"deploys": [deploy_args(bundle, model="nope")]}})
    result = wait_event(repository, "deploy_result", "p3")
    assert result["details"]["outcome"] == "failed" and "unknown model 'nope'" in result["message"]
    repository.dispatch_command({"id": "p4", "command": "deploy_pipeline", "args": {"deploys": [{"url": "/x"}]}})
    assert "deploys[0] must be an object naming its model" in wait_event(repository, "command_rejected", "p4")["message"]


def test_a_slow_model_does_not_hold_up_a_fast_one(agent_config: Callable[..., Path], model_bundle: Callable[..., Path]) -> None:
    path = agent_config(models={"names": ["digits", "slow"], "default": "digits"})
    for kind in ("digits", "slow"):
        bundle = model_bundle(kind, repeats=192) if kind == "slow" else model_bundle(kind)
        assert agent_main(["install", str(bundle), "--config", str(path), "--model", kind]) == 0
    with AgentService(load_config(path)) as agent:
        slow, fast = agent.models.get("slow").server, agent.models.get("digits").server
        x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
        np.testing.assert_allclose(slow.infer({"x": x[:2]}).outputs["y"], reference_slow(x[:2], 192), rtol=1e-3, atol=0.05)
        slow_compute_ms: list[float] = []
        stop = threading.Event()

        def hammer() -> None:
            try:
                while not stop.is_set():
                    slow_compute_ms.append(slow.infer({"x": x}).timing.compute_ms)
            finally:
                stop.set()  # a failed request ends the test's loop too

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            image = np.zeros((1, 1, 8, 8), np.float32)
            fast_queue_ms = []
            deadline = time.monotonic() + 1.0
            while not stop.is_set() and (time.monotonic() < deadline or len(slow_compute_ms) < 4):
                fast_queue_ms.append(fast.infer({"image": image}).timing.queue_ms)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert len(slow_compute_ms) >= 4
        # the fast model's requests never wait for the slow one's (its own run lock): with one lock for both, a
        # fast request arriving during a slow one would wait for the rest of it, and the slow model runs nearly all
        # the time here, so the median wait would be a large part of a slow request (medians: the machine is shared)
        fast_wait_ms, slow_ms = float(np.median(fast_queue_ms)), float(np.median(slow_compute_ms))
        assert fast_wait_ms < 0.05 * slow_ms, (fast_wait_ms, slow_ms)


@pytest.mark.parametrize(
    ("models", "fragment"),
    [
        ({"names": ["a", "a"]}, "models.names: lists a more than once"),
        ({"names": ["a b"]}, "models.names[0]: 'a b' is not a model name"),
        ({"names": ["a"], "default": "b"}, "models.default: 'b' is not one of models.names (a)"),
        ({"dir": "/tmp/m"}, "models.default: is required when models.names is not given"),
        ({"names": ["a"], "memory_budget_mb": 0}, "models.memory_budget_mb: expected a number > 0, got 0"),
        ({"names": ["a"], "budget": 1}, "models.budget: is not a known key"),
        ({"names": [f"m{i}" for i in range(65)]}, "models.names: lists 65 models; an agent serves at most 64"),
    ],
)
def test_bad_models_sections_are_errors_that_say_where(agent_config: Callable[..., Path], models: dict, fragment: str) -> None:
    with pytest.raises(AgentConfigError, match="agent.yaml") as info:
        load_config(agent_config(models=models))
    assert fragment in str(info.value)


def test_a_models_dir_serves_each_folder_and_takes_deploys_to_new_models(agent_config: Callable[..., Path], model_bundle: Callable[..., Path],
                                                                        tmp_path: Path) -> None:  # fmt: skip
    path = agent_config(models={"dir": str(tmp_path / "models"), "default": "digits"})
    assert agent_main(["install", str(model_bundle("digits")), "--config", str(path), "--model", "digits"]) == 0
    assert agent_main(["install", str(model_bundle("flat")), "--config", str(path), "--model", "flat"]) == 0
    with AgentService(load_config(path)) as agent:
        assert sorted(slot.name for slot in agent.models.slots()) == ["digits", "flat"]
        bundle = model_bundle("embedder")
        agent.dispatch_command({"id": "k1", "command": "deploy", "args": deploy_args(bundle, model="embedder")})
        assert wait_event(agent, "deploy_result", "k1")["details"]["outcome"] == "succeeded"
        assert (tmp_path / "models" / "embedder" / "current").is_symlink()
    with AgentService(load_config(path)) as agent:  # and after a restart
        assert sorted(slot.name for slot in agent.models.slots() if slot.ready) == ["digits", "embedder", "flat"]


def test_an_agent_serves_at_most_64_models_and_a_window_carries_every_one(agent_config: Callable[..., Path], model_bundle: Callable[..., Path],
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """telemetry.v1 holds 64 model windows: at 65 every window failed its check and none was published. Now a deploy
    that would make a 65th model is refused, and so is a models.dir with more folders than that."""
    models_dir = tmp_path / "models"
    path = agent_config(models={"dir": str(models_dir), "default": "digits"})
    assert agent_main(["install", str(model_bundle("digits")), "--config", str(path), "--model", "digits"]) == 0
    for index in range(MAX_MODELS - 1):
        (models_dir / f"m{index:02d}").mkdir()
    with AgentService(load_config(path)) as agent:
        assert len(agent.models.slots()) == MAX_MODELS
        message = agent.build_telemetry_window()
        validate_message(message, "telemetry.v1")
        assert len(message["models"]) == MAX_MODELS
        agent.dispatch_command({"id": "k65", "command": "deploy", "args": deploy_args(model_bundle("flat"), model="flat")})
        rejected = wait_event(agent, "command_rejected", "k65")
        assert "model 'flat' would be a new model, and this agent serves 64, the most one agent serves" in rejected["message"]
        assert not (models_dir / "flat").exists() and len(agent.models.slots()) == MAX_MODELS
    (models_dir / "m99").mkdir()  # a 65th folder, made by hand
    with pytest.raises(AgentConfigError, match=r"holds model folders for 65 models; an agent serves at most 64"):
        AgentService(load_config(path))


def test_telemetry_windows_carry_each_model_and_the_collector_stores_them(repository: AgentService) -> None:
    from edgekit.fleet.ingest import parse_message
    from edgekit.fleet.store.sqlite import SqliteStore

    repository.build_telemetry_window()  # a fresh window
    image = np.zeros((2, 1, 8, 8), np.float32)
    for _ in range(3):
        repository.models.get("digits").server.infer({"image": image})
    repository.models.get("embedder").server.infer(embedder_inputs(2))
    message = repository.build_telemetry_window()
    validate_message(message, "telemetry.v1")
    assert message["model"] == "digits" and message["latency"]["count"] == 3  # the default model's, as before
    by_name = {entry["model"]: entry for entry in message["models"]}
    assert {name: entry["count"] for name, entry in by_name.items()} == {"digits": 3, "embedder": 1, "flat": 0}
    assert by_name["flat"]["p50_ms"] is None and by_name["embedder"]["p50_ms"] > 0
    embedder_ref = by_name["embedder"]["bundle"]  # installed without an id: its content id (issue 32 item 5)
    assert len(embedder_ref["sha256"]) == 64 and embedder_ref["id"] == f"embedder-{embedder_ref['sha256'][:12]}"
    # the next window starts from zero for every model
    assert all(entry["count"] == 0 for entry in repository.build_telemetry_window()["models"])
    # the fleet collector accepts the optional fields and keeps them
    message["seq"] = 1
    window = parse_message("edgekit/v1/lab/dev-1/telemetry", json.dumps(message))
    assert not hasattr(window, "reason"), window
    with SqliteStore(":memory:") as store:
        assert store.add_windows([window]) == 1
        (stored,) = store.windows(fleet="lab", device="dev-1")
        assert stored.payload["model"] == "digits" and len(stored.payload["models"]) == 3


def test_check_reports_each_model_of_the_repository(agent_config: Callable[..., Path], model_bundle: Callable[..., Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = agent_config(models={"names": ["digits", "flat"], "default": "digits"})
    assert agent_main(["install", str(model_bundle("digits")), "--config", str(path), "--model", "digits"]) == 0
    capsys.readouterr()
    assert agent_main(["check", "--config", str(path)]) == 1  # flat has no bundle yet
    out = capsys.readouterr().out
    assert "ok    model digits: current bundle digits: signed by" in out
    assert "FAIL  model flat: no current bundle in" in out and "edgekit-agent install --config CONFIG --model flat BUNDLE" in out


def test_pipeline_deploy_rolls_every_model_back_when_one_is_unhealthy(agent_config: Callable[..., Path], model_bundle: Callable[..., Path]) -> None:
    path = agent_config(models={"names": ["digits", "embedder"], "default": "digits"},
                        health={"window_s": 1.5, "max_error_rate": 0.1, "min_requests": 1})  # fmt: skip
    for kind in ("digits", "embedder"):
        assert agent_main(["install", str(model_bundle(kind)), "--config", str(path), "--model", kind]) == 0
    with AgentService(load_config(path)) as agent:
        even = model_bundle("even", name="digits-even")  # passes its self-check, fails live requests of odd batches
        embedder_v2 = model_bundle("embedder", name="embedder-v2")
        agent.dispatch_command({"id": "w1", "command": "deploy_pipeline",
                                "args": {"deploys": [deploy_args(even, model="digits"), deploy_args(embedder_v2, model="embedder")]}})
        digits = agent.models.get("digits")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the pipeline's watch has begun: both models switched
            watching = [e for e in list(agent.recent_events) if e.get("command_id") == "w1" and (e.get("details") or {}).get("step") == "watching"]
            if watching:
                break
            time.sleep(0.01)
        assert watching and watching[0]["details"]["models"] == ["digits", "embedder"] and watching[0]["details"]["pipeline"]
        assert digits.served.name == "digits-even"
        failures = 0
        for _ in range(5):  # odd batches during the watch
            try:
                digits.server.infer({"image": np.zeros((3, 1, 8, 8), np.float32)})
            except Exception:
                failures += 1
        result = wait_event(agent, "deploy_result", "w1")
        assert failures == 5
        details = result["details"]
        assert details["outcome"] == "rolled_back" and details["unhealthy"] == ["digits"]
        assert details["restored"] == ["digits", "embedder"] and details["health"]["digits"]["errors"] == 5
        assert agent.models.get("digits").served.name == "digits" and agent.models.get("embedder").served.name == "embedder"


def test_the_probe_reaches_every_model(agent_config: Callable[..., Path], model_bundle: Callable[..., Path]) -> None:
    path = agent_config(models={"names": ["digits", "embedder"], "default": "digits"}, probe={"interval_s": 0.1, "dims": {"batch": 1}})
    for kind in ("digits", "embedder"):
        assert agent_main(["install", str(model_bundle(kind)), "--config", str(path), "--model", kind]) == 0
    with AgentService(load_config(path)) as agent:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(slot.server.totals().requests for slot in agent.models.slots()):
            time.sleep(0.05)
        assert {slot.name: slot.server.totals().requests > 0 for slot in agent.models.slots()} == {"digits": True, "embedder": True}
        assert all(slot.server.totals().errors == 0 for slot in agent.models.slots())


def test_check_passes_with_a_models_dir_and_no_bundles_dir(agent_config: Callable[..., Path], model_bundle: Callable[..., Path],
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """With a models: repository the bundles live in models.dir; a missing bundles.dir is no problem (issue 32 item 8)."""
    models_dir = tmp_path / "repository"
    path = agent_config(models={"names": ["digits"], "default": "digits", "dir": str(models_dir)},
                        bundles={"dir": str(tmp_path / "never-created"), "allow_unsigned": True})  # fmt: skip
    assert agent_main(["install", str(model_bundle("digits")), "--config", str(path), "--model", "digits"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "never-created").exists()
    assert agent_main(["check", "--config", str(path)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "ok    model digits: current bundle digits" in out and "bundles.dir" not in out, out
    models_dir.rename(tmp_path / "moved")  # a missing models.dir is a problem, named by its key
    assert agent_main(["check", "--config", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  models.dir '{models_dir}' does not exist" in out, out
