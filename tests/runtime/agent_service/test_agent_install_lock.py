"""One process at a time on a bundle directory: ``edgekit-agent install`` refuses while an agent holds it
(before, install cleared the running agent's staging and moved its links under it), says which process
holds it and what to do, and works once that process is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.store import LOCK_NAME, BundleStore

REPO = Path(__file__).resolve().parents[3]
HOLDER = """
import sys, time
from edgekit_runtime.agent.store import BundleStore
BundleStore(sys.argv[1]).prepare()
print("held", flush=True)
time.sleep(120)
"""


def test_install_refuses_while_another_process_holds_the_bundle_dir(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = agent_config()
    bundle = signed_bundle("tiny-a")
    bundles = tmp_path / "bundles"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(bundles)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        (bundles / "staging" / "in-flight").mkdir()  # the other process's download in progress
        assert agent_main(["install", str(bundle), "--config", str(path)]) == 1
        err = capsys.readouterr().err
        assert f"bundle directory '{bundles}' is in use by another process (pid {holder.pid})" in err
        assert "edgekit fleet deploy" in err and "stop the agent" in err
        assert (bundles / "staging" / "in-flight").is_dir() and not (bundles / "current").exists()  # nothing touched
    finally:
        holder.kill()
        holder.wait()
    assert agent_main(["install", str(bundle), "--config", str(path)]) == 0
    assert (bundles / "current").is_symlink() and (bundles / LOCK_NAME).exists()


def test_stores_in_one_process_share_the_lock_until_the_last_lets_go(tmp_path: Path) -> None:
    first, second = BundleStore(tmp_path / "b"), BundleStore(tmp_path / "b")
    first.prepare()
    second.prepare()  # the same process (an agent restarting its repository, tests): no conflict
    first.release()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    probe = "import sys; from edgekit_runtime.agent.store import BundleStore; BundleStore(sys.argv[1]).prepare()"
    held = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "b")], capture_output=True, text=True, env=env)
    assert held.returncode != 0 and f"(pid {os.getpid()})" in held.stderr
    second.release()
    free = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "b")], capture_output=True, text=True, env=env)
    assert free.returncode == 0, free.stderr


def test_an_agent_that_fails_to_start_lets_go_of_the_bundle_dir(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    """The API's port taken: start() raises after the models took their bundle dirs' locks; before, the lock stayed
    with the process and `edgekit-agent install` was refused with no agent running."""
    import socket

    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.errors import AgentApiError
    from edgekit_runtime.agent.service import AgentService

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        path = agent_config(api={"address": f"127.0.0.1:{taken.getsockname()[1]}"})
        with pytest.raises(AgentApiError, match="cannot listen on"):
            AgentService(load_config(path)).run_forever()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    probe = "import sys; from edgekit_runtime.agent.store import BundleStore; BundleStore(sys.argv[1]).prepare()"
    free = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "bundles")], capture_output=True, text=True, env=env)
    assert free.returncode == 0, free.stderr


REPOSITORY_HOLDER = """
import sys, time
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.repository import ModelRepository
ModelRepository(load_config(sys.argv[1]), lambda event: None).hold()
print("held", flush=True)
time.sleep(120)
"""


def test_install_of_a_new_model_refuses_while_an_agent_serves_the_models_dir(
    agent_config: Callable[..., Path], signed_bundle: Callable[..., Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Each model folder has its own lock, so before, `install --model <a model the agent does not serve yet>` made
    the folder and switched its links under the running agent, which then never saw it."""
    path = agent_config(models={"default": "first"})
    bundle = signed_bundle("tiny-a")
    models_dir = tmp_path / "bundles" / "models"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    holder = subprocess.Popen([sys.executable, "-c", REPOSITORY_HOLDER, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert agent_main(["install", str(bundle), "--config", str(path), "--model", "brand-new"]) == 1
        err = capsys.readouterr().err
        assert f"models.dir '{models_dir}' is in use by another process (pid {holder.pid})" in err
        assert "one agent per models.dir" in err
        assert not (models_dir / "brand-new").exists()  # no folder made under the running agent
    finally:
        holder.kill()
        holder.wait()
    assert agent_main(["install", str(bundle), "--config", str(path), "--model", "brand-new"]) == 0
    assert (models_dir / "brand-new" / "current").is_symlink()
