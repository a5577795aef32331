"""A closed stdout (``edgekit inspect X >&-``) or one whose reader left early (``| head -1``): the command runs, with no
traceback, instead of ``AttributeError: 'NoneType' object has no attribute 'write'`` or ``BrokenPipeError``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.runtime.tiny_bundle import build_bundle

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def _edgekit(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from edgekit.cli.main import main; sys.exit(main())", *args]


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_inspect_with_stdout_closed_runs_without_a_traceback(tmp_path: Path, extra: list[str]) -> None:
    root = build_bundle(tmp_path / "bundle")
    done = subprocess.run(_edgekit("inspect", str(root), *extra), stdout=None, stderr=subprocess.PIPE, text=True, env=ENV,
                          preexec_fn=lambda: os.close(1), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "NoneType" not in done.stderr


def test_bench_with_stdout_closed_runs_without_a_traceback(tmp_path: Path) -> None:
    """bench sends what libraries print to stderr while it works (library_output_to_stderr): that too with no stdout."""
    root = build_bundle(tmp_path / "bundle")
    done = subprocess.run(_edgekit("bench", str(root), "-n", "3", "--warmup", "0"), stderr=subprocess.PIPE, text=True, env=ENV,
                          preexec_fn=lambda: os.close(1), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_a_reader_that_left_is_no_traceback(tmp_path: Path) -> None:
    """rich handles a broken pipe under its tables; --json and --csv write to stdout themselves (print_json, print_csv)."""
    root = build_bundle(tmp_path / "bundle")
    process = subprocess.Popen(_edgekit("inspect", str(root), "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the command writes a line
    err = process.stderr.read()
    assert process.wait(timeout=120) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err
