"""The install commands docs/agent.md gives for edgekit-runtime, which is on no package index (issue 32 item 8): in a
checkout, ``pip wheel --no-deps -w out/wheels ./runtime``; on the device, ``pip install --find-links out/wheels
'edgekit-runtime[grpc]'``. Both are read from the doc and run as written in a fresh venv (no system site packages):
the wheel builds, the documented install takes it with the gRPC extra, and the agent's gRPC module imports there.
scripts/build_runtime_wheel.sh builds the same wheel (CI runs it). Dependencies come from the package index; without
one reachable the test skips, as tests/runtime/test_bare_environment.py does."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_bare_environment import NO_INDEX_MARKERS, PIP_TIMEOUT_S, BareVenv, _index_reachable

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _documented(pattern: str) -> list[str]:
    """The inline command of docs/agent.md that matches ``pattern``, split as a shell would."""
    text = (REPO / "docs" / "agent.md").read_text(encoding="utf-8").replace("\n", " ")
    found = re.findall(r"`(pip [^`]+)`", text)
    matching = [command for command in found if re.search(pattern, command)]
    assert matching, f"docs/agent.md names no command matching {pattern!r} (it has: {found})"
    return shlex.split(matching[0])


def test_the_documented_wheel_commands_install_the_runtime_with_grpc(tmp_path: Path) -> None:
    build, install = _documented(r"^pip wheel .*\./runtime"), _documented(r"^pip install --find-links .*edgekit-runtime\[grpc\]")
    venv = BareVenv(tmp_path / "venv")
    created = subprocess.run([sys.executable, "-m", "venv", str(venv.root)], capture_output=True, text=True, check=False)
    if created.returncode != 0:
        pytest.skip(f"cannot create a venv with pip here: {created.stderr.strip()[-300:]}")
    checkout = tmp_path / "checkout"  # a copy, so that the build leaves no build/ or egg-info in runtime/
    shutil.copytree(REPO / "runtime", checkout / "runtime", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    if not _index_reachable(venv, checkout):
        pytest.skip("no package index reachable (the wheel's dependencies and setuptools come from it)")

    built = venv.run([venv.python, "-m", *build], cwd=checkout, timeout_s=PIP_TIMEOUT_S)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheels = sorted((checkout / "out" / "wheels").glob("edgekit_runtime-*-py3-none-any.whl"))
    assert len(wheels) == 1, wheels

    device = tmp_path / "device"  # the wheel folder copied to the device, the install run there
    shutil.copytree(checkout / "out", device / "out")
    installed = venv.run([venv.python, "-m", *install, "--disable-pip-version-check", "-q"], cwd=device, timeout_s=PIP_TIMEOUT_S)
    output = installed.stdout + installed.stderr
    if installed.returncode != 0 and any(marker in output for marker in NO_INDEX_MARKERS):
        pytest.skip(f"the package index stopped answering: {output.strip()[-300:]}")
    assert installed.returncode == 0, output[-3000:]

    probe = venv.python_json(
        "import json, grpc, importlib.metadata as m, edgekit_runtime, edgekit_runtime.agent.oip_grpc as g\n"
        "d = m.distribution('edgekit-runtime')\n"
        "print(json.dumps({'version': d.version, 'file': edgekit_runtime.__file__, 'grpc': grpc.__version__,"
        " 'installer': (d.read_text('INSTALLER') or '').strip(), 'direct_url': d.read_text('direct_url.json')}))",
        cwd=device,
    )
    assert probe["file"].startswith(str(venv.root)) and probe["installer"] == "pip" and probe["grpc"]
    assert probe["version"] in wheels[0].name and probe["direct_url"] is None  # found by --find-links, not a path install
    agent = venv.run([venv.agent, "--help"], cwd=device)
    assert agent.returncode == 0 and "check" in agent.stdout, agent.stderr


def test_the_wheel_script_builds_into_an_ignored_folder(tmp_path: Path) -> None:
    """scripts/build_runtime_wheel.sh (run by .ci/run) writes the wheel where it says, under out/ by default."""
    out = tmp_path / "wheels"
    built = subprocess.run([str(REPO / "scripts" / "build_runtime_wheel.sh"), str(out)], capture_output=True, text=True,
                           timeout=PIP_TIMEOUT_S, check=False, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = out.glob("edgekit_runtime-*-py3-none-any.whl")
    assert built.stdout.strip() == str(wheel)
    ignored = subprocess.run(["git", "check-ignore", "-q", "out/wheels/x.whl"], cwd=REPO, check=False)
    assert ignored.returncode == 0, "out/ must stay ignored: the default folder of the script"
