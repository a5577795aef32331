"""mypy over the TensorRT modules against the published TensorRT 10 API (tensorrt-stubs), with the
configuration in pyproject.toml ([tool.mypy]); and proof that the check bites on a misspelled
``trt.Builder`` method and a wrong argument type.

TensorRT itself cannot be installed here, so this is how every TensorRT call is checked in CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.engines.tensorrt_stubs import INSTALL_HINT, StubsMissing, prepare_stubs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: `pip install -e '.[dev]'` (the dev extra lists it)")
    destination = tmp_path_factory.mktemp("tensorrt-stubs")
    try:
        repaired = prepare_stubs(destination)
    except StubsMissing as err:
        pytest.fail(f"{err} -- scripts/setup.sh installs them with: {INSTALL_HINT}")
    assert "tensorrt_bindings/tensorrt.pyi" in repaired and "tensorrt/__init__.pyi" in repaired
    return destination


def run_mypy(stub_dir: Path, cache_dir: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(stub_dir)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(cache_dir), *paths],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


def test_tensorrt_modules_typecheck(stub_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    result = run_mypy(stub_dir, tmp_path_factory.mktemp("mypy-cache"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found in" in result.stdout


def test_the_check_bites(stub_dir: Path, tmp_path: Path) -> None:
    """A misspelled TensorRT method and a wrong argument type, in a module checked with the same settings."""
    probe = tmp_path / "misspelled_tensorrt.py"
    probe.write_text(textwrap.dedent("""\
        from __future__ import annotations

        import tensorrt as trt


        def build(logger: trt.ILogger) -> None:
            builder = trt.Builder(logger)
            builder.create_netwrk(0)
            config = builder.create_builder_config()
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, "1 GiB")
            config.set_flag(trt.BuilderFlag.FP17)
    """))
    result = run_mypy(stub_dir, tmp_path / "cache", str(probe))
    assert result.returncode == 1, result.stdout + result.stderr
    assert '"Builder" has no attribute "create_netwrk"; maybe "create_network"?' in result.stdout
    assert 'Argument 2 to "set_memory_pool_limit" of "IBuilderConfig" has incompatible type "str"; expected "int"' in result.stdout
    assert 'type[BuilderFlag]" has no attribute "FP17"' in result.stdout
    assert "Found 3 errors in 1 file" in result.stdout


def test_stub_repairs_are_mechanical() -> None:
    from tests.engines.tensorrt_stubs import repair_def_line, repair_stub_text, unshadow_bool

    assert repair_def_line("    def f(self, in: list[int], out: list[int]) -> int:\n") == "    def f(self, in_: list[int], out: list[int]) -> int:\n"
    assert repair_def_line("    def g(self, a: int = 1, b: int) -> None:") == "    def g(self, a: int = 1, b: int = ...) -> None:"
    text, changed = unshadow_bool("from __future__ import annotations\nbool: DataType\nclass A:\n    x: bool\n    def f(self) -> bool:\n        '''bool'''\n")
    assert changed == 2 and "import builtins\n" in text and "    x: builtins.bool\n" in text and "-> builtins.bool:" in text
    assert "bool: DataType" in text and "'''bool'''" in text
    fixed, count = repair_stub_text("def h(in: int) -> None:\n    ...\n")
    assert (fixed, count) == ("def h(in_: int) -> None:\n    ...\n", 1)
