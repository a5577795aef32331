"""scripts/check_gpu.sh where there is no GPU: its usage errors and its no-GPU exit are the documented
ones, and it is shellcheck-clean. The GPU run itself is recorded in docs/engine-portability.md."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check_gpu.sh"


def _run(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(CHECK), *args], capture_output=True, text=True, env=env, timeout=60, check=False)


def test_help_lists_every_option_and_exit_status() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    for option in ("--out DIR", "--wheels DIR", "--python PY", "--cuda-root DIR", "--jobs N"):
        assert option in result.stdout
    assert "Exit status: 0 when" in result.stdout and "3 when this" in result.stdout


def test_unknown_argument_and_missing_wheel_folder_are_usage_errors(tmp_path: Path) -> None:
    unknown = _run("--gpu", "0")
    assert unknown.returncode == 2 and "check_gpu: unknown argument '--gpu' (see --help)" in unknown.stderr
    missing = _run("--wheels", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and f"--wheels {tmp_path / 'nowhere'} is not a folder" in missing.stderr


def test_without_nvidia_smi_it_exits_3_and_says_why(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # the tools the script needs before its GPU check, and no nvidia-smi
    bin_dir.mkdir()
    for tool in ("dirname", "nproc", "mkdir", "date", "tee"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    result = _run("--out", str(tmp_path / "out"), path=str(bin_dir))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "check_gpu: nvidia-smi is not on PATH: no NVIDIA driver here, nothing to check" in result.stdout
    assert (tmp_path / "out" / "check_gpu.log").read_text().startswith("check_gpu: nvidia-smi is not on PATH")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)")
def test_check_gpu_is_shellcheck_clean() -> None:
    result = subprocess.run(["shellcheck", str(CHECK)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
