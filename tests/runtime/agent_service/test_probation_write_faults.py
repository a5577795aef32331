"""A restart during a health watch never accepts the watched bundle unwatched (review finding): when the counted
probation cannot be written back (a full disk) the watch resumes from memory and the record stays; when
``probation.json`` cannot be read, ``current`` is watched again. Real Deployer, BundleStore and ONNX Runtime
bundles; the full disk is an ENOSPC raised where probation.json is written."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from edgekit_runtime.agent import probation
from edgekit_runtime.agent.config_types import BundlesConfig, HealthConfig
from edgekit_runtime.agent.ota import Deployer, DeployRequest
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.store import BundleStore
from tests.runtime.agent_service.bundles import make_bundle


def _deployer(root: Path, events: list[dict[str, Any]]) -> Deployer:
    deployer = Deployer(BundleStore(root), BundlesConfig(dir=root, allow_unsigned=True), HealthConfig(window_s=0.0),
                        InferenceServer(), events.append)  # fmt: skip
    deployer.store.prepare()
    return deployer


def _killed_during_the_watch_of_b(tmp_path: Path) -> tuple[Path, str]:
    """a accepted, then b switched to and put on probation: what ``kill -9`` during b's watch leaves."""
    root = tmp_path / "store"
    make_bundle(root / "inbox" / "a", name="tiny-a", bundle_version=1000)
    make_bundle(root / "inbox" / "b", name="tiny-b", bundle_version=2000)
    deployer = _deployer(root, [])
    deployer.start()
    assert deployer.deploy(DeployRequest(str(root / "inbox" / "a"), None), watch=False) == "succeeded"
    staged = deployer.stage(DeployRequest(str(root / "inbox" / "b"), None))
    deployer.begin_probation(staged, command_id="c-b", window_s=0.0)
    deployer.switch(staged)
    deployer.server.close()
    deployer.store.release()
    return root, (root / probation.PROBATION_NAME).read_text(encoding="utf-8")


def _accepted_version(deployer: Deployer) -> int | None:
    return deployer.ledger.highest()


def _enospc(*_: Any, **__: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_restart_on_a_full_disk_keeps_watching_and_keeps_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, record = _killed_during_the_watch_of_b(tmp_path)
    events: list[dict[str, Any]] = []
    with monkeypatch.context() as patch:
        patch.setattr(probation.ProbationFile, "write", _enospc)
        restarted = _deployer(root, events)
        served = restarted.start()
    assert served is not None and served.name == "tiny-b"
    assert restarted.watch_pending  # before: no watch, and b recorded as accepted
    assert _accepted_version(restarted) == 1000
    assert (root / probation.PROBATION_NAME).read_text(encoding="utf-8") == record  # before: deleted
    (unsaved,) = [e for e in events if e["kind"] == "probation_not_saved"]
    assert "No space left on device" in unsaved["message"] and unsaved["details"]["crashes"] == 1
    assert not [e for e in events if e["kind"] == "deploy_result"]
    assert restarted.resume_watch() == "succeeded"  # the watch, from memory, decides
    assert _accepted_version(restarted) == 2000
    assert not (root / probation.PROBATION_NAME).exists()
    restarted.server.close()
    restarted.store.release()


def test_a_full_disk_does_not_reset_the_crash_count_towards_rollback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = _killed_during_the_watch_of_b(tmp_path)
    record = json.loads((root / probation.PROBATION_NAME).read_text(encoding="utf-8"))
    (root / probation.PROBATION_NAME).write_text(json.dumps({**record, "crashes": 1}), encoding="utf-8")  # one crash so far
    events: list[dict[str, Any]] = []
    with monkeypatch.context() as patch:
        patch.setattr(probation.ProbationFile, "write", _enospc)
        restarted = _deployer(root, events)
        served = restarted.start()
    assert served is not None and served.name == "tiny-a"  # the second crash rolls back, full disk or not
    (result,) = [e for e in events if e["kind"] == "deploy_result"]
    assert result["details"]["outcome"] == "rolled_back" and result["details"]["crashes"] == 2
    assert _accepted_version(restarted) == 1000
    restarted.server.close()
    restarted.store.release()


@pytest.mark.parametrize("damage", [b"\x00\xff garbage", b'{"version": 7}'])
def test_an_unreadable_record_is_watched_again_not_accepted(tmp_path: Path, damage: bytes) -> None:
    root, _ = _killed_during_the_watch_of_b(tmp_path)
    (root / probation.PROBATION_NAME).write_bytes(damage)
    events: list[dict[str, Any]] = []
    restarted = _deployer(root, events)
    served = restarted.start()
    assert served is not None and served.name == "tiny-b"
    assert restarted.watch_pending  # before: accepted without a watch
    assert _accepted_version(restarted) == 1000
    (unreadable,) = [e for e in events if e["kind"] == "probation_unreadable"]
    assert "cannot be read" in unreadable["message"] and "before it counts as accepted" in unreadable["message"]
    rewritten = json.loads((root / probation.PROBATION_NAME).read_text(encoding="utf-8"))
    assert rewritten["version"] == restarted.store.current.name and rewritten["crashes"] == 1
    assert rewritten["previous"] == restarted.store.previous.name
    assert restarted.resume_watch() == "succeeded"
    assert _accepted_version(restarted) == 2000
    restarted.server.close()
    restarted.store.release()
