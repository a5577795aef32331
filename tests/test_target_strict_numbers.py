"""Numbers and booleans in a target profile are taken as written, as its JSON Schema says (`cores: true` is not 1 core,
`gb: '16'` not 16 GB), and a value of the wrong kind is one line naming file, line, field and fix, without pydantic's
names for the members of a union."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.errors import TargetError
from edgekit.target import TARGETS_DIR, load_target_file

NX = "jetson-orin-nx-16gb"
UNQUOTE = "write {} as a number, without quotes"
A_BOOLEAN = "YAML reads true/false (and yes/no, on/off) as booleans: write the number itself"


def edited(tmp_path: Path, name: str, old: str, new: str) -> tuple[Path, int]:
    """A copy of a shipped profile with one edit; returns (path, 1-based line of the edit)."""
    text = (TARGETS_DIR / f"{name}.yaml").read_text()
    assert text.count(old) == 1, f"{old!r} should occur once in {name}.yaml"
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace(old, new))
    return path, text[: text.index(old)].count("\n") + 1


@pytest.mark.parametrize(("name", "old", "new", "message", "hint"), [
    (NX, "cores: 8 ", "cores: true ", "3: field 'cpu.cores': Input should be a valid integer (got True)", A_BOOLEAN),
    (NX, "cores: 8 ", "cores: '8' ", "3: field 'cpu.cores': Input should be a valid integer (got '8')", UNQUOTE.format(8)),
    (NX, "cores: 8 ", "cores: 8.0 ", "3: field 'cpu.cores': Input should be a valid integer (got 8.0)", None),
    (NX, "dla_cores: 2 ", "dla_cores: true ", "1: field 'dla_cores': Input should be a valid integer (got True)", A_BOOLEAN),
    (NX, "gb: 16 ", "gb: true ", "3: field 'memory.gb': Input should be a valid number (got True)", A_BOOLEAN),
    (NX, "gb: 16 ", "gb: '16' ", "3: field 'memory.gb': Input should be a valid number (got '16')", UNQUOTE.format(16)),
    (NX, "10W: 10 ", "10W: true ", "3: field 'power_modes.10W': Input should be a valid number (got True)", A_BOOLEAN),
    (NX, "10W: 10 ", "10W: '10' ", "3: field 'power_modes.10W': Input should be a valid number (got '10')", UNQUOTE.format(10)),
    (NX, "shared_with_gpu: true", "shared_with_gpu: 1", "3: field 'memory.shared_with_gpu': Input should be a valid boolean (got 1)",
     "write true or false"),
    (NX, "10W: 10 ", "10: 10 ", "3: field 'power_modes': the name 10 is read as a number, not text",
     "quote the name ('10': ...) so YAML reads it as text"),
    ("x86-64-cpu", "isa: host ", "isa: hots ", "3: field 'cpu.isa': Input should be a valid list; or: Input should be 'host' (got 'hots')",
     "did you mean 'host'?"),
])  # fmt: skip
def test_a_value_of_the_wrong_kind_names_file_line_field_and_fix(tmp_path: Path, name, old, new, message, hint):
    path, line = edited(tmp_path, name, old, new)
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert info.value.message == f"invalid target profile:\n{path}:{line}:{message}"
    assert info.value.hint == hint


def test_ints_for_floats_enums_tuples_and_paths_still_load(tmp_path: Path):
    path, _ = edited(tmp_path, NX, "bandwidth_gbps: 102.4", "bandwidth_gbps: 102")
    profile = load_target_file(path)
    assert profile.memory.bandwidth_gbps == 102.0 and isinstance(profile.memory.bandwidth_gbps, float)
    assert profile.memory.gb == 16.0 and profile.power_modes["10W"] == 10.0
    assert isinstance(profile.backends, tuple) and profile.backends[0].precisions[0].value == "fp32"
