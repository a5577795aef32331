"""scripts/check_arm64.sh and its helpers, checked without running the emulation (that is .ci/run's job):
the aarch64 wheel list covers edgekit-runtime's dependencies at the versions tested here, the bundles
it builds name real targets, and the shell scripts are shellcheck-clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check_arm64.sh"
ARM64 = REPO / "scripts" / "arm64"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ARM64 / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"scripts/arm64/requirements.txt: {line!r} is not pinned with =="
            pins[_name(name)] = pinned.strip()
    return pins


def test_wheel_list_is_exactly_the_runtime_dependencies() -> None:
    project = tomllib.loads((REPO / "runtime" / "pyproject.toml").read_text())["project"]
    wanted = {_name(requirement) for requirement in project["dependencies"]}
    assert set(_pins()) == wanted, "scripts/arm64/requirements.txt must list each runtime dependency once"


def test_wheel_list_pins_versions_the_runtime_accepts() -> None:
    project = tomllib.loads((REPO / "runtime" / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = _name(requirement.name)
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside runtime's {text!r}"


def test_bundles_are_built_for_existing_targets_and_precisions() -> None:
    text = CHECK.read_text()
    bundles = re.search(r"^bundles=\((.*)\)$", text, re.MULTILINE)
    assert bundles is not None
    names = bundles.group(1).split()
    assert {name.rsplit("-", 1)[1] for name in names} == {"fp32", "int8"}
    targets = {name.rsplit("-", 1)[0] for name in names}
    assert targets == {"raspberry-pi-5", "arm64-cpu"}
    for target in targets:
        assert (REPO / "targets" / f"{target}.yaml").is_file()
    served = re.search(r"^served=(\S+)$", text, re.MULTILINE)
    assert served is not None and served.group(1) in names


def test_ci_runs_the_check_before_the_tests() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert "./scripts/check_arm64.sh" in ci
    assert ci.index("./scripts/check_arm64.sh") < ci.index("exec ./scripts/test.sh")
    assert ci.index("./scripts/check_arm64.sh") < ci.index("./scripts/check_py310.sh") < ci.index("exec ./scripts/test.sh")
    for package in ("debootstrap", "proot", "qemu-user-static"):
        assert package in ci


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)")
def test_scripts_are_shellcheck_clean() -> None:
    scripts = [CHECK, REPO / "scripts" / "check_py310.sh", *sorted(ARM64.glob("*.sh"))]
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
