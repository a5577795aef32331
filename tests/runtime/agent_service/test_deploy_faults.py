"""Deploys that meet a fault mid-way still end with one ``deploy_result`` and a device that serves a checked
bundle: a kill right after the switch, a full disk at the switch, a pipeline whose rollback meets a damaged
previous bundle, a bundle folder swapped while it is read, a damaged probation record, a hostile tar. Real
Deployer, BundleStore, ModelRepository and ONNX Runtime bundles; the full disk is an ENOSPC raised where the
write happens (a tmpfs sized to fail exactly there depends on block and inode counts)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent import fetch, probation
from edgekit_runtime.agent.config import parse_config
from edgekit_runtime.agent.config_types import BundlesConfig, HealthConfig
from edgekit_runtime.agent.ota import Deployer, DeployRequest
from edgekit_runtime.agent.repository import ModelRepository
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.store import BundleStore
from tests.runtime.agent_service.bundles import make_bundle

REPO = Path(__file__).resolve().parents[3]


def _deployer(root: Path, events: list[dict[str, Any]], window_s: float = 0.0) -> Deployer:
    deployer = Deployer(BundleStore(root), BundlesConfig(dir=root, allow_unsigned=True), HealthConfig(window_s=window_s),
                        InferenceServer(), events.append)  # fmt: skip
    deployer.store.prepare()
    return deployer


def _results(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["details"].get("outcome"), e["message"]) for e in events if e["kind"] == "deploy_result"]


def _enospc(*_: Any, **__: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


KILLED_AFTER_SWITCH = """
import os, signal, sys
from pathlib import Path
from edgekit_runtime.agent.config_types import BundlesConfig, HealthConfig
from edgekit_runtime.agent.ota import Deployer, DeployRequest
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.store import BundleStore
root = Path(sys.argv[1])
def sink(event):  # the process dies the moment the new bundle is served (OOM killer, kill -9, power cut)
    if event["kind"] == "deploy_progress" and event["details"].get("step") == "switched" and len(sys.argv) > 3:
        os.kill(os.getpid(), signal.SIGKILL)
deployer = Deployer(BundleStore(root), BundlesConfig(dir=root, allow_unsigned=True), HealthConfig(window_s=30.0),
                    InferenceServer(), sink)
deployer.store.prepare()
deployer.deploy(DeployRequest(sys.argv[2], None), watch=len(sys.argv) > 3)
"""


def test_a_kill_right_after_the_switch_leaves_the_watch_to_the_next_start(tmp_path: Path) -> None:
    root = tmp_path / "store"
    make_bundle(root / "inbox" / "a", name="tiny-a", bundle_version=1000)
    make_bundle(root / "inbox" / "b", name="tiny-b", bundle_version=2000)
    script = tmp_path / "deploy.py"
    script.write_text(KILLED_AFTER_SWITCH, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    subprocess.run([sys.executable, str(script), str(root), str(root / "inbox" / "a")], check=True, env=env, timeout=120)
    killed = subprocess.run([sys.executable, str(script), str(root), str(root / "inbox" / "b"), "watch"], env=env, timeout=120)
    assert killed.returncode == -9
    events: list[dict[str, Any]] = []
    deployer = _deployer(root, events, window_s=30.0)
    served = deployer.start()
    assert served is not None and served.name == "tiny-b"
    assert deployer.watch_pending  # before, the probation was written after the switch: a kill between them meant none
    record = json.loads((root / probation.PROBATION_NAME).read_text())
    assert (record["bundle"], record["crashes"], record["state"]) == ("tiny-b", 1, "watching")
    ledger = json.loads((root / "accepted_versions.json").read_text())
    assert ledger["slot"]["bundle_version"] == 1000  # tiny-b's version is not accepted before its watch ends


@pytest.mark.parametrize("failing", ["probation", "current link"])
def test_a_full_disk_at_the_switch_keeps_the_old_bundle_and_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   failing: str) -> None:  # fmt: skip
    inbox = tmp_path / "store" / "inbox"
    for name, version in (("a", 1000), ("b", 2000), ("c", 3000)):
        make_bundle(inbox / name, name=f"tiny-{name}", bundle_version=version)
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events, window_s=5.0)
    for name in ("a", "b"):
        assert deployer.deploy(DeployRequest(str(inbox / name), None), watch=False) == "succeeded"
    before = (deployer.store.current, deployer.store.previous)
    versions = sorted(p.name for p in deployer.store.versions_dir.iterdir())
    if failing == "probation":
        monkeypatch.setattr(probation.os, "fsync", _enospc)
    else:  # no inode for the new `current` link, after `previous` moved
        real_symlink = os.symlink
        monkeypatch.setattr("edgekit_runtime.agent.store.os.symlink",
                            lambda src, dst: _enospc() if ".current.tmp-" in str(dst) else real_symlink(src, dst))  # fmt: skip
    events.clear()
    assert deployer.deploy(DeployRequest(str(inbox / "c"), None)) == "failed"
    ((outcome, message),) = _results(events)
    assert outcome == "failed" and "failed at switch" in message and "no space left" in message.lower()
    assert (deployer.store.current, deployer.store.previous) == before  # both links as they were
    assert deployer.served is not None and deployer.served.name == "tiny-b"
    assert sorted(p.name for p in deployer.store.versions_dir.iterdir()) == versions  # tiny-c's copy is gone
    assert not (deployer.store.root / probation.PROBATION_NAME).exists()
    assert not list(deployer.store.root.glob(".*partial")) and not list(deployer.store.root.glob(".*.tmp-*"))


def _repository(base: Path, window_s: float) -> tuple[ModelRepository, list[dict[str, Any]]]:
    config = parse_config({"device_id": "dev-1", "fleet": "lab", "models": {"names": ["m1", "m2"], "default": "m1"},
                           "bundles": {"dir": str(base / "bundles"), "allow_unsigned": True},
                           "health": {"window_s": window_s, "min_requests": 1},
                           "telemetry": {"spool": {"path": str(base / "spool.db")}}}, file=base / "agent.yaml")  # fmt: skip
    events: list[dict[str, Any]] = []
    repository = ModelRepository(config, events.append)
    repository.start()
    return repository, events


def test_a_pipeline_rollback_past_a_damaged_previous_bundle_rolls_the_others_back(tmp_path: Path) -> None:
    inbox = tmp_path / "bundles" / "inbox"
    for name, version, model in (("m1-old", 1000, None), ("m2-old", 1000, None), ("m1-new", 2000, "even_batches"),
                                 ("m2-new", 2000, None)):  # fmt: skip
        make_bundle(inbox / name, name=name, bundle_version=version, **({"model": model} if model else {}))
    repository, events = _repository(tmp_path, window_s=2.0)
    for model in ("m1", "m2"):
        repository.get(model).deployer.deploy(DeployRequest(str(inbox / f"{model}-old"), None, model=model), watch=False)
    model_file = repository.get("m1").store.current / "model.onnx"  # m1's previous-to-be, damaged on disk
    model_file.write_bytes(model_file.read_bytes()[:-1] + bytes([model_file.read_bytes()[-1] ^ 1]))

    def odd_batches() -> None:  # live traffic that m1-new fails
        time.sleep(0.8)
        for _ in range(5):
            try:
                repository.get("m1").server.infer({"image": np.zeros((3, 1, 8, 8), np.float32)})
            except Exception:  # noqa: BLE001 - the failures are the point
                pass

    threading.Thread(target=odd_batches, daemon=True).start()
    events.clear()
    outcome = repository.deploy_pipeline([DeployRequest(str(inbox / "m1-new"), None, model="m1"),
                                          DeployRequest(str(inbox / "m2-new"), None, model="m2")], command_id="cmd-1")  # fmt: skip
    assert outcome == "rolled_back"
    (result,) = [e for e in events if e["kind"] == "deploy_result"]
    assert result["details"]["restored"] == ["m2"] and "m1" in result["details"]["rollback_failed"]
    assert "hash" in result["details"]["rollback_failed"]["m1"] or "sha256" in result["details"]["rollback_failed"]["m1"]
    assert repository.get("m2").served.name == "m2-old"  # before, the BundleError escaped: m2 kept the new bundle
    for model in ("m1", "m2"):  # every watch ended: the next start counts no crash
        assert not (repository.get(model).store.root / probation.PROBATION_NAME).exists()


def test_a_pipeline_with_a_model_already_current_answers_once(tmp_path: Path) -> None:
    inbox = tmp_path / "bundles" / "inbox"
    make_bundle(inbox / "m1", name="m1", bundle_version=1000)
    make_bundle(inbox / "m2", name="m2", bundle_version=1000)
    make_bundle(inbox / "m2-bad", name="m2", bundle_version=2000, corrupt_golden=True)
    repository, events = _repository(tmp_path, window_s=0.0)
    repository.get("m1").deployer.deploy(DeployRequest(str(inbox / "m1"), None, model="m1"), watch=False)
    for bundle, expected in (("m2-bad", "failed"), ("m2", "succeeded")):
        events.clear()
        requests = [DeployRequest(str(inbox / "m1"), None, model="m1"), DeployRequest(str(inbox / bundle), None, model="m2")]
        assert repository.deploy_pipeline(requests, command_id="cmd-2") == expected
        # before, m1 (unchanged) sent its own "succeeded" under the command first: a rollout took that for the answer
        (result,) = [e for e in events if e["kind"] == "deploy_result"]
        assert result["details"]["outcome"] == expected and result["details"]["pipeline"] is True
    assert result["details"]["unchanged"] == ["m1"]


def test_a_bundle_folder_swapped_while_it_is_read_is_checked_as_copied(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    inbox = tmp_path / "store" / "inbox"
    make_bundle(tmp_path / "old", name="tiny", bundle_version=1000)
    make_bundle(inbox / "new", name="tiny", bundle_version=2000)
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events)
    assert deployer.deploy(DeployRequest(str(inbox / "new"), None)) == "succeeded"
    shutil.copytree(inbox / "new", inbox / "x")
    old_sha = hashlib.sha256((tmp_path / "old" / "manifest.json").read_bytes()).hexdigest()
    real_copy = fetch._copy_directory

    def swapped_then_copied(source: Path, destination: Path, **options: Any) -> None:  # another writer of the folder
        shutil.rmtree(source)
        shutil.copytree(tmp_path / "old", source)
        real_copy(source, destination, **options)

    monkeypatch.setattr(fetch, "_copy_directory", swapped_then_copied)
    events.clear()
    assert deployer.deploy(DeployRequest(str(inbox / "x"), old_sha)) == "failed"
    ((_, message),) = _results(events)
    assert "refusing a downgrade" in message  # the copy is what was checked: the old version, refused
    assert deployer.served is not None and deployer.served.version == "2000"


@pytest.mark.parametrize("started_at_s", [[1], {"a": 1}, "soon", True])
def test_a_damaged_probation_record_does_not_stop_the_agent_starting(tmp_path: Path, started_at_s: Any) -> None:
    make_bundle(tmp_path / "store" / "inbox" / "a", name="tiny-a", bundle_version=1000)
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events)
    assert deployer.deploy(DeployRequest(str(tmp_path / "store" / "inbox" / "a"), None), watch=False) == "succeeded"
    record = {"version": deployer.store.current.name, "bundle": "tiny-a", "previous": None, "url": "x", "command_id": None,
              "window_s": 5.0, "state": "watching", "crashes": 0, "started_at_s": started_at_s}  # fmt: skip
    (deployer.store.root / probation.PROBATION_NAME).write_text(json.dumps(record), encoding="utf-8")
    events.clear()
    restarted = _deployer(tmp_path / "store", events)
    served = restarted.start()
    assert served is not None and served.name == "tiny-a"
    (unreadable,) = [e for e in events if e["kind"] == "probation_unreadable"]
    assert "started_at_s must be a time in seconds" in unreadable["message"]


def test_a_tar_whose_manifest_is_a_folder_is_refused_with_an_answer(tmp_path: Path) -> None:
    evil = tmp_path / "store" / "inbox" / "evil.tar"
    evil.parent.mkdir(parents=True)
    with tarfile.open(evil, "w") as tar:
        for name, kind in (("bundle", tarfile.DIRTYPE), ("bundle/manifest.json", tarfile.DIRTYPE), ("bundle/x", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, 0o755
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events)
    assert deployer.deploy(DeployRequest(str(evil), None)) == "failed"  # before: KeyError, and no answer at all
    ((_, message),) = _results(events)
    assert "member 'bundle/manifest.json' is not a regular file" in message
    assert not deployer.lock.locked()


def test_an_unforeseen_failure_still_answers_the_deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events)

    def broken(*_: Any, **__: Any) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(deployer, "stage", broken)
    assert deployer.deploy(DeployRequest(str(tmp_path / "store" / "inbox" / "a"), None, command_id="cmd-3")) == "failed"
    (result,) = [e for e in events if e["kind"] == "deploy_result"]
    assert result["command_id"] == "cmd-3" and result["details"]["step"] == "internal"
    assert "KeyError" in result["message"] and "serving nothing" in result["message"]


def test_an_install_over_an_old_copy_never_leaves_the_version_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installing a version again moves the old copy aside with a rename (before: deleted it first, so a kill
    or a failing rename in between left ``previous`` pointing at nothing); the next start puts an old copy
    back where no new one arrived and deletes it where one did."""
    store = BundleStore(tmp_path / "store")
    store.prepare()
    old = store.versions_dir / "tiny-a-0123456789ab"
    for staged_name, text in (("s1", "old"), ("s2", "new")):
        staged = store.new_staging_dir() / staged_name
        staged.mkdir()
        (staged / "model.onnx").write_text(text)
        if staged_name == "s1":
            assert store.install(staged, old.name) == old
    real_replace = os.replace
    monkeypatch.setattr("edgekit_runtime.agent.store.os.replace",
                        lambda src, dst: _enospc() if "staging" in str(src) else real_replace(src, dst))  # fmt: skip
    with pytest.raises(Exception, match="cannot move"):
        store.install(staged, old.name)
    assert (old / "model.onnx").read_text() == "old"  # the failed move put the old copy back
    monkeypatch.setattr("edgekit_runtime.agent.store.os.replace", real_replace)
    assert (store.install(staged, old.name) / "model.onnx").read_text() == "new"
    assert [p.name for p in store.versions_dir.iterdir()] == [old.name]  # nothing left aside

    # a kill between the two renames: the old copy aside, no new copy yet
    aside = store.versions_dir / f".{old.name}.replaced-deadbeef"
    real_replace(old, aside)
    store.prepare()
    assert (old / "model.onnx").read_text() == "new" and not aside.exists()
    # a kill after both renames, before the delete: the new copy stays, the old one goes
    shutil.copytree(old, aside)
    (aside / "model.onnx").write_text("older")
    store.prepare()
    assert (old / "model.onnx").read_text() == "new" and not aside.exists()
    assert store.prune(keep=0) == [old]  # the hidden names are never taken for versions


def test_an_unforeseen_failure_loading_current_at_start_falls_back_to_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Any exception loading ``current`` (here a TypeError from the runner factory, as a wrongly typed manifest
    field gave before the runner checked it) is that link failing: the agent comes up serving ``previous``."""
    from edgekit_runtime.agent import loading

    root = tmp_path / "store"
    make_bundle(root / "inbox" / "a", name="tiny-a", bundle_version=1000)
    make_bundle(root / "inbox" / "b", name="tiny-b", bundle_version=2000)
    deployer = _deployer(root, [])
    for name in ("a", "b"):
        assert deployer.deploy(DeployRequest(str(root / "inbox" / name), None), watch=False) == "succeeded"
    broken, working = deployer.store.current, deployer.store.previous
    assert broken is not None and working is not None
    real_create_runner = loading.create_runner

    def create_runner(bundle: Any, **options: Any) -> Any:
        if bundle.root == broken:
            raise TypeError("'int' object is not iterable")
        return real_create_runner(bundle, **options)

    monkeypatch.setattr(loading, "create_runner", create_runner)
    events: list[dict[str, Any]] = []
    restarted = _deployer(root, events)
    served = restarted.start()
    assert served is not None and served.name == "tiny-a" and restarted.store.current == working
    assert [e["kind"] for e in events] == ["startup_check_failed", "startup_fallback", "serving"]
    failed = events[0]
    assert failed["message"] == f"the current bundle at {broken} fails its checks: TypeError: 'int' object is not iterable"
    assert failed["level"] == "error" and failed["details"]["error"] == "TypeError: 'int' object is not iterable"
    (logged,) = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert logged.exc_info is not None and logged.exc_info[0] is TypeError  # the traceback is in the log
    assert restarted.server.model_name == "tiny-a" and restarted.server.infer({"image": np.zeros((1, 1, 8, 8), np.float32)}) is not None


def test_a_deeply_nested_manifest_in_a_tar_is_a_named_refusal(tmp_path: Path) -> None:
    """The manifest is vetted before any file is written with the depth-limited parser: a named error at the
    signature step, never a RecursionError reported as step 'internal'."""
    from tests.runtime.agent_service.bundles import pack_tar

    source = make_bundle(tmp_path / "src" / "deep", name="tiny-a", bundle_version=1000)
    manifest = (source / "manifest.json").read_text(encoding="utf-8").rstrip().rstrip("}")
    (source / "manifest.json").write_text(manifest + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    (tmp_path / "store" / "inbox").mkdir(parents=True)
    tar = pack_tar(source, tmp_path / "store" / "inbox" / "deep.tar")
    events: list[dict[str, Any]] = []
    deployer = _deployer(tmp_path / "store", events)
    assert deployer.deploy(DeployRequest(str(tar), None, command_id="cmd-7")) == "failed"
    (result,) = [e for e in events if e["kind"] == "deploy_result"]
    assert result["details"]["step"] == "signature" and result["command_id"] == "cmd-7"
    assert (f"deploy of {tar} failed at signature: '{tar}: manifest.json' nests arrays and objects 100001 levels deep, "
            "more than the limit of 32") == result["message"]
    assert "hint: the file is truncated, hand-edited or hostile" in result["details"]["error"]
    assert deployer.served is None and not list(deployer.store.versions_dir.iterdir())
