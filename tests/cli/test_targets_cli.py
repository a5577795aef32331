"""``edgekit targets`` and ``edgekit targets show``, run in-process through ``edgekit.cli.main.main``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from edgekit.cli import main as cli_main
from edgekit.cli import options
from edgekit.target import TARGETS_DIR, default_registry, get_target


class CliResult(NamedTuple):
    code: int
    out: str
    err: str

    def last_json(self):
        lines = self.out.strip().splitlines()
        assert lines, f"nothing on stdout; stderr was:\n{self.err}"
        return json.loads(lines[-1])


Run = Callable[..., CliResult]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``run(*argv, width=200)``: main() with only the commands under test registered, so these tests do not
    depend on the other command modules; the results are ``width`` columns wide (COLUMNS), or as wide as they
    need with ``width=None`` (stdout is a pipe here)."""
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("edgekit.cli.targets", "edgekit.cli.schema"))

    def invoke(*argv: str, width: int | None = 200) -> CliResult:
        if width is None:
            monkeypatch.delenv("COLUMNS", raising=False)
        else:
            monkeypatch.setenv("COLUMNS", str(width))
        capsys.readouterr()
        code = cli_main.main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


def test_targets_json_lists_every_profile_with_all_its_fields(run: Run):
    result = run("targets", "--json")
    assert result.code == 0
    listed = result.last_json()
    registry = default_registry()
    assert [entry["name"] for entry in listed] == registry.names()
    for entry, profile in zip(listed, registry.all()):
        assert entry == profile.to_json()
        assert {"cpu", "gpu", "dla_cores", "npu", "memory", "peak_throughput", "power_modes", "software",
                "backends", "build"} <= set(entry)  # fmt: skip
    orin = next(e for e in listed if e["name"] == "jetson-agx-orin-64gb")
    assert orin["gpu"]["compute_capability"] == "8.7" and orin["dla_cores"] == 2


def test_targets_table_on_a_wide_terminal(run: Run):
    result = run("targets", width=200)
    assert result.code == 0
    assert result.err == ""  # the table is the result: stdout, so `edgekit targets | less` shows it
    for profile in default_registry().all():
        assert profile.name in result.out
        assert profile.display_name in result.out
    assert "11.0" in result.out and "nvfp4" in result.out  # Thor's compute capability and FP4
    assert "OpenVINO" in result.out and "QNN" in result.out  # the NPU targets' providers
    assert "\x1b[" not in result.out  # no colour codes into a pipe


def test_targets_piped_is_never_cut(run: Run):
    """Piped with no COLUMNS, the table is as wide as it needs: whole names, display names and precisions."""
    result = run("targets", width=None)
    assert result.code == 0
    assert options.PIPED_WIDTH >= 200
    lines = result.out.splitlines()
    for profile in default_registry().all():
        (row,) = [line for line in lines if line.startswith(profile.name + " ")]
        assert " ".join(p.value for p in profile.precisions()) in row  # one line, nothing cut or wrapped
        assert profile.display_name in result.out
    assert "…" not in result.out


def test_targets_csv(run: Run):
    import csv
    import io

    result = run("targets", "--csv")
    assert result.code == 0 and result.err == ""
    rows = list(csv.DictReader(io.StringIO(result.out)))
    assert [row["name"] for row in rows] == default_registry().names()
    orin = next(row for row in rows if row["name"] == "jetson-agx-orin-64gb")
    assert orin["gpu_compute_capability"] == "8.7" and orin["dla_cores"] == "2"
    assert orin["display_name"] == "NVIDIA Jetson AGX Orin 64GB" and "int8" in orin["precisions"].split()
    pi = next(row for row in rows if row["name"] == "raspberry-pi-5")
    assert pi["gpu_compute_capability"] == "" and pi["npu_execution_provider"] == ""


def test_targets_json_and_csv_exclude_each_other(run: Run, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        run("targets", "--json", "--csv")
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_targets_table_on_a_narrow_terminal_keeps_whole_names_and_precisions(run: Run):
    result = run("targets", width=80)
    assert result.code == 0
    lines = result.out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    for profile in default_registry().all():
        (row,) = [line for line in lines if line.startswith(profile.name + " ")]
        assert profile.precisions()[0].value in row  # the precisions column is not cut off
    assert "NVIDIA Jetson AGX Orin 64GB" not in result.out  # display names wait for a wider terminal


def test_show_prints_every_section(run: Run):
    result = run("targets", "show", "jetson-agx-orin-64gb")
    assert result.code == 0
    err = result.out
    for text in (
        "jetson-agx-orin-64gb", "NVIDIA Jetson AGX Orin 64GB", "compute_capability: 8.7", "dla_cores: 2",
        "bandwidth_gbps: 204.8", "int8: 275 TOPS (total, sparse, at MAXN)", "MODE_15W: 15", "jetpack: 6.2",
        "tensorrt_major: 10", "TensorrtExecutionProvider", "trt_fp16_enable: no", "CUDAExecutionProvider",
        "precisions: fp32, fp16, int8, int4", "workspace_mb: 4096", "opset: 18",
    ):  # fmt: skip
        assert text in err, f"{text!r} missing from `targets show`"


def test_show_npu_target(run: Run):
    result = run("targets", "show", "qualcomm-qcs6490")
    assert result.code == 0
    assert "architecture: Hexagon HTP v68" in result.out
    assert "backend_path: libQnnHtp.so" in result.out
    assert "power_modes: none" in result.out


@pytest.mark.parametrize("argv", [("targets", "show", "jetson-agx-thor", "--json"),
                                  ("targets", "--json", "show", "jetson-agx-thor")])  # fmt: skip
def test_show_json(run: Run, argv: tuple[str, ...]):
    result = run(*argv)
    assert result.code == 0
    shown = result.last_json()
    assert shown == get_target("jetson-agx-thor").to_json()
    assert shown["gpu"]["compute_capability"] == "11.0" and shown["dla_cores"] == 0


def test_show_unknown_name_fails_cleanly(run: Run):
    result = run("targets", "show", "jetson-orin-nano", "--json")
    assert result.code == 2
    assert result.out == ""  # no half-written JSON
    assert "error: unknown target 'jetson-orin-nano'" in result.err
    assert "did you mean 'jetson-orin-nano-8gb' or 'jetson-orin-nano-super'" in result.err
    assert "hint:" in result.err and "Traceback" not in result.err


def test_show_a_yaml_path(run: Run, tmp_path: Path):
    copy = tmp_path / "raspberry-pi-5.yaml"
    copy.write_text((TARGETS_DIR / "raspberry-pi-5.yaml").read_text())
    result = run("targets", "show", str(copy), "--json")
    assert result.code == 0
    assert result.last_json() == get_target("raspberry-pi-5").to_json()


def test_show_a_broken_yaml_path_names_file_and_line(run: Run, tmp_path: Path):
    text = (TARGETS_DIR / "raspberry-pi-5.yaml").read_text().replace("  cores: 4 ", "  corse: 4 ")
    broken = tmp_path / "raspberry-pi-5.yaml"
    broken.write_text(text)
    line = text[: text.index("  corse:")].count("\n") + 1
    result = run("targets", "show", str(broken))
    assert result.code == 2
    assert f"{broken}:{line}:3: unknown key 'corse' in cpu (did you mean 'cores'?)" in result.err.replace("\n", "")


def test_show_needs_a_name(run: Run):
    with pytest.raises(SystemExit) as info:
        run("targets", "show")
    assert info.value.code == 2


def test_piped_lines_carry_no_padding(run: Run):
    result = run("targets", width=None)
    lines = result.out.splitlines()
    assert len(lines) > 10 and all(line == line.rstrip(" ") for line in lines)
