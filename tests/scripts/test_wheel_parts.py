"""scripts/wheel_parts.py: a wheel cut into parts and rebuilt, with every part and the whole checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "wheel_parts.py"


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    path.write_bytes(os.urandom(2_500_000))
    return path


def test_split_then_join_gives_the_same_bytes(wheel: Path, tmp_path: Path) -> None:
    split = run("split", wheel, tmp_path / "parts", "--part-mb", "1")
    assert split.returncode == 0, split.stderr
    record = json.loads((tmp_path / "parts" / "parts.json").read_text())
    assert [part["bytes"] for part in record["parts"]] == [1_000_000, 1_000_000, 500_000]
    assert all((tmp_path / "parts" / part["folder"] / "parts.json").is_file() for part in record["parts"])
    # the parts travel separately: each folder on its own, found one level down
    moved = tmp_path / "arrived"
    moved.mkdir()
    for part in record["parts"]:
        (tmp_path / "parts" / part["folder"]).rename(moved / part["folder"])
    joined = run("join", moved / "part-01" / "parts.json", moved, "--out", tmp_path / "out")
    assert joined.returncode == 0, joined.stderr
    assert (tmp_path / "out" / wheel.name).read_bytes() == wheel.read_bytes()
    assert "sha256 matches parts.json" in joined.stdout


def test_a_missing_short_or_altered_part_is_named(wheel: Path, tmp_path: Path) -> None:
    assert run("split", wheel, tmp_path / "parts", "--part-mb", "1").returncode == 0
    parts = tmp_path / "parts"
    first, second, third = sorted(parts.glob("part-*/*.part*"))
    first.write_bytes(first.read_bytes()[:-10])
    data = bytearray(second.read_bytes())
    data[5] ^= 0xFF
    second.write_bytes(bytes(data))
    third.unlink()
    joined = run("join", parts / "parts.json", parts, "--out", tmp_path / "out")
    assert joined.returncode == 1
    assert f"{first.name}: 999990 bytes, expected 1000000 (cut short in transfer?)" in joined.stderr
    assert f"{second.name}: sha256 differs from parts.json (altered in transfer)" in joined.stderr
    assert f"{third.name}: not found in {parts}" in joined.stderr
    assert not (tmp_path / "out" / wheel.name).exists()


def test_split_refuses_a_wheel_with_another_hash(wheel: Path, tmp_path: Path) -> None:
    refused = run("split", wheel, tmp_path / "parts", "--expect-sha256", "0" * 64)
    assert refused.returncode == 1 and "not the expected 000" in refused.stderr
    assert not (tmp_path / "parts").exists()
