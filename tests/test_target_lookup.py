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
