"""``TargetRegistry.get``: a ``--target`` value is a registered name or an explicit ``.yaml`` path, never a name
joined to the registry's folder to climb out of it (``../x``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.errors import TargetError
from edgekit.target import TARGETS_DIR, TargetRegistry

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def registry(tmp_path: Path) -> TargetRegistry:
    """A registry of two profiles in tmp/targets, and a valid profile one folder up (tmp/x86-64-cpu.yaml)."""
    folder = tmp_path / "targets"
    folder.mkdir()
    for name in ("arm64-cpu", "raspberry-pi-5"):
        (folder / f"{name}.yaml").write_text((TARGETS_DIR / f"{name}.yaml").read_text())
    (tmp_path / "x86-64-cpu.yaml").write_text((TARGETS_DIR / "x86-64-cpu.yaml").read_text())
    return TargetRegistry(folder)


def test_a_name_with_separators_is_not_joined_to_the_registry_folder(registry: TargetRegistry, tmp_path: Path):
    assert (registry.directory / "../x86-64-cpu.yaml").is_file()  # what the old lookup loaded for '../x86-64-cpu'
    for name in ("../x86-64-cpu", "sub/arm64-cpu", "..\\x86-64-cpu", "..", "."):
        with pytest.raises(TargetError) as info:
            registry.get(name)
        assert info.value.message.startswith(f"target '{name}' is neither a known target name nor an existing .yaml file")
        assert info.value.hint == ("pass a name from `edgekit targets` or the path of a profile file ending in .yaml; "
                                   "known: arm64-cpu, raspberry-pi-5")  # fmt: skip


def test_a_missing_yaml_path_or_a_folder_is_named_as_such(registry: TargetRegistry, tmp_path: Path):
    with pytest.raises(TargetError, match=r"^target 'nowhere.yaml' is neither a known target name nor an existing "):
        registry.get("nowhere.yaml")
    with pytest.raises(TargetError) as info:
        registry.get(str(tmp_path))
    assert info.value.message.endswith("nor an existing .yaml file (it is a directory)")


def test_registered_names_and_explicit_yaml_paths_still_load(registry: TargetRegistry, tmp_path: Path):
    assert registry.get("arm64-cpu").name == "arm64-cpu"
    assert registry.get(str(tmp_path / "x86-64-cpu.yaml")).name == "x86-64-cpu"  # an explicit path is the user's choice
    with pytest.raises(TargetError, match=r"^unknown target 'arm64'.*did you mean 'arm64-cpu'"):
        registry.get("arm64")


def test_the_cli_refuses_a_climbing_target_with_the_known_names(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "edgekit.cli.main", "targets", "show", "../README"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert "error: target '../README' is neither a known target name nor an existing .yaml file" in result.stderr
    assert "known: arm64-cpu, intel-core-ultra-igpu, intel-core-ultra-npu," in result.stderr and "Traceback" not in result.stderr


def test_a_profile_named_yml_is_registered_too(registry: TargetRegistry):
    text = (TARGETS_DIR / "x86-64-cpu.yaml").read_text().replace("name: x86-64-cpu", "name: myboard")
    (registry.directory / "myboard.yml").write_text(text)
    assert registry.names() == ["arm64-cpu", "myboard", "raspberry-pi-5"]
    assert registry.get("myboard").name == "myboard"
    (registry.directory / "myboard.yaml").write_text(text)
    with pytest.raises(TargetError) as info:
        registry.get("myboard")
    assert info.value.message == f"target 'myboard' has two profiles in {registry.directory}: myboard.yaml, myboard.yml"
    assert info.value.hint == "keep one of them"


@pytest.fixture
def fresh_registry():
    """The default registry is cached per folder: clear it before and after a test that sets EDGEKIT_TARGETS_DIR."""
    from edgekit.target import _registry_of

    _registry_of.cache_clear()
    yield
    _registry_of.cache_clear()


def test_edgekit_targets_dir_replaces_the_shipped_folder(tmp_path: Path, monkeypatch, fresh_registry):
    from edgekit.target import default_registry, get_target

    text = (TARGETS_DIR / "x86-64-cpu.yaml").read_text().replace("name: x86-64-cpu", "name: my-board")
    (tmp_path / "my-board.yaml").write_text(text)
    monkeypatch.setenv("EDGEKIT_TARGETS_DIR", str(tmp_path))
    assert default_registry().directory == tmp_path
    assert default_registry().names() == ["my-board"]  # instead of targets/, not in addition to it
    assert get_target("my-board").name == "my-board"
    with pytest.raises(TargetError, match=r"^unknown target 'x86-64-cpu'") as info:
        get_target("x86-64-cpu")
    assert info.value.hint.endswith("known: my-board")
    monkeypatch.delenv("EDGEKIT_TARGETS_DIR")
    assert default_registry().directory == TARGETS_DIR and "x86-64-cpu" in default_registry().names()
    monkeypatch.setenv("EDGEKIT_TARGETS_DIR", "")  # empty is unset
    assert default_registry().directory == TARGETS_DIR


def test_a_bad_edgekit_targets_dir_is_a_target_error_naming_the_variable(tmp_path: Path, monkeypatch, fresh_registry):
    from edgekit.target import default_registry

    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "a-file").write_text("x")
    for value, why in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "a-file", "is not a folder"),
                       (empty, "the folder has no target profiles (*.yaml, *.yml)")):  # fmt: skip
        monkeypatch.setenv("EDGEKIT_TARGETS_DIR", str(value))
        with pytest.raises(TargetError) as info:
            default_registry()
        assert info.value.message == f"EDGEKIT_TARGETS_DIR={value}: {why}"
        assert info.value.hint.startswith("point EDGEKIT_TARGETS_DIR at a folder of NAME.yaml target profiles")


def test_an_unreadable_edgekit_targets_dir_is_named(tmp_path: Path, monkeypatch, fresh_registry):
    import os

    from edgekit.target import default_registry

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root: a mode-0 folder is still readable")
        monkeypatch.setenv("EDGEKIT_TARGETS_DIR", str(locked))
        with pytest.raises(TargetError, match=r"^EDGEKIT_TARGETS_DIR=.*locked: cannot read the folder"):
            default_registry()
    finally:
        locked.chmod(0o755)


def test_the_cli_lists_the_profiles_of_edgekit_targets_dir_and_names_a_missing_one(tmp_path: Path):
    import os

    text = (TARGETS_DIR / "raspberry-pi-5.yaml").read_text().replace("name: raspberry-pi-5", "name: my-pi")
    (tmp_path / "my-pi.yaml").write_text(text)
    env = {**os.environ, "EDGEKIT_TARGETS_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "edgekit.cli.main", "targets", "show", "my-pi"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "my-pi" in result.stdout
    env["EDGEKIT_TARGETS_DIR"] = str(tmp_path / "nowhere")
    result = subprocess.run([sys.executable, "-m", "edgekit.cli.main", "targets"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: EDGEKIT_TARGETS_DIR={tmp_path / 'nowhere'}: does not exist" in result.stderr
