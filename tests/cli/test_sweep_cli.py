"""``edgekit sweep``'s output: the table on stdout, ``--csv`` alone on stdout, the page titled with what was swept; each
variant's progress line as its row ends; a sweep that built nothing exits 2; a re-run needs --force."""

from __future__ import annotations

import csv
import io
import json
import re

from edgekit.cli.main import main
from tests.test_sweep import CALIBRATED


def test_sweep_csv_and_table(tiny_recipe, tmp_path, capsys):
    recipe = tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))
    out = tmp_path / "sweep"
    assert main(["sweep", str(recipe), "--target", "raspberry-pi-5", "--out", str(out), "--iterations", "3", "--csv"]) == 0
    captured = capsys.readouterr()
    rows = {row["variant"]: row for row in csv.DictReader(io.StringIO(captured.out))}  # stdout holds only the CSV
    assert {"fp32", "int8"} <= set(rows) and all(row["status"] == "built" for row in rows.values()), rows
    assert int(rows["int8"]["size_bytes"]) < int(rows["fp32"]["size_bytes"]) and float(rows["fp32"]["latency_vs_fp32"]) == 1.0
    assert rows["fp32"]["reason"] == "" and "n/a" not in captured.out
    err = " ".join(captured.err.split())  # the human table moved to stderr
    assert "sweep of tiny on Raspberry Pi 5 (8GB), batch 4" in err and "n/a" not in err
    assert re.search(r"fp32 │ built │ [0-9.]+ (B|KB) │", err), err
    page = (out / "sweep.html").read_text()
    assert "<h1>Sweep of tiny on Raspberry Pi 5 (8GB), batch 4</h1>" in page and "n/a" not in page
    capsys.readouterr()
    assert main(["sweep", str(recipe), "--target", "raspberry-pi-5", "--out", str(out), "--iterations", "3", "--force"]) == 0
    table = capsys.readouterr().out  # without --csv/--json the table is the result: stdout
    assert "sweep of tiny on Raspberry Pi 5 (8GB), batch 4" in table and "int8-dynamic" in table
    # another device's bundles: the latency measured here says so, beside the estimate on the device
    assert "p50 ms on this host" in table and "estimate p50 ms on raspberry-pi-5" in table
    assert f"report: {out / 'sweep.html'}" in table


def _three_variants(recipe, target, backend):
    from edgekit.precision import Precision

    return [("fp32", Precision.FP32, False, True), ("int8", Precision.INT8, False, True), ("bf16", Precision.BF16, False, False)]


def test_a_sweep_that_built_nothing_shows_each_failure_and_exits_2(tiny_recipe, tmp_path, monkeypatch, capsys):
    """Each variant's line says what its row says (✗ failed, - skipped, never a tick), and a sweep with no variant built
    exits 2 as a failed build does."""
    import edgekit.pipeline as pipeline
    import edgekit.sweep as sweep_module
    from edgekit.errors import BuildError

    def build(recipe_path, target_name, precision=None, **kwargs):
        raise BuildError(f"simulated {precision.value} failure\nsecond line")

    monkeypatch.setattr(pipeline, "build", build)
    monkeypatch.setattr(sweep_module, "_variants", _three_variants)
    out = tmp_path / "sweep"
    assert main(["sweep", str(tiny_recipe(text=CALIBRATED.format(factory="tiny_net"))), "--target", "x86-64-cpu", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert any(re.match(r"✗ fp32 +[0-9.]+ s  failed: simulated fp32 failure$", line) for line in lines), captured.err
    assert any(re.match(r"✗ int8 +[0-9.]+ s  failed: simulated int8 failure$", line) for line in lines), captured.err
    assert any(re.match(r"- bf16 +[0-9.]+ s  skipped: bf16 runs on x86-64-cpu's other backend", line) for line in lines), captured.err
    assert "✓" not in captured.err
    err = " ".join(captured.err.split())
    assert "error: no variant of the sweep built (2 of 3 failed; the first: simulated fp32 failure)" in err
    assert "run the sweep again with --force" in err
    assert re.search(r"fp32 +│ failed", captured.out), captured.out  # the table still shows every row, and sweep.json holds them
    assert [row["status"] for row in json.loads((out / "sweep.json").read_text())["variants"]] == ["failed", "failed", "skipped"]


def test_a_rerun_into_a_sweep_without_force_is_refused_and_leaves_it_alone(tiny_recipe, tmp_path, monkeypatch, capsys):
    import edgekit.pipeline as pipeline

    monkeypatch.setattr(pipeline, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("nothing is built")))
    recipe = str(tiny_recipe(text=CALIBRATED.format(factory="tiny_net")))
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text('{"good": true}\n')
    (out / "sweep.html").write_text("good")
    assert main(["sweep", recipe, "--target", "x86-64-cpu", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: --out {out} already holds a sweep (sweep.json) hint: pass --force to replace it, or choose another --out" in err
    assert (out / "sweep.json").read_text() == '{"good": true}\n' and (out / "sweep.html").read_text() == "good"
    (out / "sweep.json").unlink()  # a variant's bundle left by an interrupted sweep is a sweep too
    (out / "fp32").mkdir()
    (out / "fp32" / "manifest.json").write_text("{}")
    assert main(["sweep", recipe, "--target", "x86-64-cpu", "--out", str(out)]) == 2
    assert f"--out {out} already holds a sweep (fp32/manifest.json)" in " ".join(capsys.readouterr().err.split())


def test_bad_out_and_iterations_are_refused_naming_the_option(tiny_recipe, tmp_path, capsys):
    recipe = str(tiny_recipe(text=CALIBRATED.format(factory="tiny_net")))
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["sweep", recipe, "--target", "x86-64-cpu", "--out", str(afile)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert f"error: --out {afile} is a file, not a folder hint: choose another --out" in " ".join(captured.err.split())
    assert main(["sweep", recipe, "--target", "x86-64-cpu", "--out", str(afile / "sub")]) == 2
    assert f"error: --out {afile / 'sub'}: cannot create the folder (Not a directory)" in " ".join(capsys.readouterr().err.split())
    for count in ("0", "-3"):
        assert main(["sweep", recipe, "--target", "x86-64-cpu", "--out", str(tmp_path / "s"), "--iterations", count]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"error: --iterations must be 1 or more, not {count} hint: pass --iterations N with N >= 1" in err
    assert not (tmp_path / "s").exists()
