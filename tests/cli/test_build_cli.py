"""The CLI over the pipeline: build, inspect (and tamper detection), bench, pack, exit codes, --json."""

from __future__ import annotations

import json
import re
import tarfile

import pytest

from edgekit.cli.main import main


@pytest.fixture
def built(tiny_recipe, tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["build", str(tiny_recipe()), "--target", "x86-64-cpu", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out, summary


def test_build_json_summary_is_last_line(built):
    out, summary = built
    assert summary["bundle"] == str(out.resolve())
    assert summary["parity"]["passed"] is True
    assert summary["benchmark"]["p50_ms"] > 0
    assert summary["accuracy"]["metric"] == "top1"


def test_what_a_build_s_libraries_print_goes_to_stderr_and_json_is_all_stdout_holds(tiny_recipe, tmp_path, capfd):
    """NNCF's progress bars and ONNX Runtime's transformer optimizer print to stdout, from Python and from C;
    during the work that goes to stderr, so `edgekit build --json | jq` reads one document."""
    out = tmp_path / "bundle"
    assert main(["build", str(tiny_recipe(factory="chatty_tiny_net")), "--target", "x86-64-cpu", "--out", str(out), "--json"]) == 0
    captured = capfd.readouterr()
    assert json.loads(captured.out)["bundle"] == str(out.resolve())  # the whole of stdout is the JSON document
    assert "chatty factory: loading weights" in captured.err and "chatty factory: written to fd 1" in captured.err


def test_inspect_verifies_and_prints_manifest(built, capsys):
    out, _ = built
    assert main(["inspect", str(out), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["verified"] is True
    assert payload["manifest"]["name"] == "tiny-x86-64-cpu-fp32"
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr()
    assert "file hashes verified" in shown.out and shown.err == ""  # the result, on stdout
    assert re.search(r"model +│ [0-9.]+ (B|KB|MB), opset", shown.out), shown.out


def test_inspect_catches_a_modified_file(built, capsys):
    out, _ = built
    model = out / "model.onnx"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    assert main(["inspect", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model.onnx" in err and "error" in err


def test_inspect_catches_a_modified_golden_file(built, capsys):
    out, _ = built
    (out / "golden" / "outputs_000.npz").write_bytes(b"tampered")
    assert main(["inspect", str(out)]) == 2
    assert "golden/outputs_000.npz" in capsys.readouterr().err


def test_build_refuses_existing_bundle_with_exit_code(built, tiny_recipe, capsys):
    out, _ = built
    assert main(["build", str(tiny_recipe()), "--target", "x86-64-cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a bundle" in err and "--force" in err


def test_build_missing_recipe_exit_code(tmp_path, capsys):
    assert main(["build", str(tmp_path / "nope.yaml"), "--target", "x86-64-cpu"]) == 2
    assert "recipe not found" in capsys.readouterr().err


def test_build_unknown_target_exit_code(tiny_recipe, capsys):
    assert main(["build", str(tiny_recipe()), "--target", "jetson-orin-nano"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'jetson-orin-nano'" in err and "jetson-orin-nano-8gb" in err


def test_bench_vs_pytorch(built, capsys):
    out, _ = built
    assert main(["bench", str(out), "--iterations", "10", "--warmup", "2", "--shape", "batch=8", "--vs-pytorch", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["dims"] == {"batch": 8} and report["batch"] == 8
    assert set(report["variants"]) == {"bundle", "pytorch_eager"}
    assert report["variants"]["bundle"]["count"] == 10
    assert report["variants"]["bundle"]["ratio_vs_pytorch_p50"] > 0


def test_bench_bad_shape(built, capsys):
    out, _ = built
    assert main(["bench", str(out), "--shape", "batch:8"]) == 2
    assert "cannot read 'batch:8'" in capsys.readouterr().err
    assert main(["bench", str(out), "--shape", "height=8"]) == 2
    assert "unknown dims ['height']" in capsys.readouterr().err


def test_pack_makes_a_tar_that_inspect_reads(built, tmp_path, capsys):
    out, _ = built
    tar_path = tmp_path / "tiny.tar"
    assert main(["pack", str(out), "--out", str(tar_path)]) == 0
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
    assert "tiny-x86-64-cpu-fp32/manifest.json" in names and "tiny-x86-64-cpu-fp32/model.onnx" in names
    assert main(["inspect", str(tar_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["verified"] is True
    assert main(["pack", str(out), "--out", str(tar_path)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_signed_bundle_keeps_its_signature_when_packed(built, tmp_path, capsys):
    from edgekit_runtime.signing import verify_manifest_signature

    out, _ = built
    keys = tmp_path / "keys"
    assert main(["keygen", "--out", str(keys)]) == 0
    assert main(["sign", str(out), "--key", str(keys / "fleet.key.pem")]) == 0
    tar_path = tmp_path / "signed.tar"
    assert main(["pack", str(out), "--out", str(tar_path)]) == 0
    with tarfile.open(tar_path) as tar:
        assert "tiny-x86-64-cpu-fp32/manifest.sig" in tar.getnames()
        tar.extractall(tmp_path / "unpacked", filter="data")
    verify_manifest_signature(tmp_path / "unpacked" / "tiny-x86-64-cpu-fp32", keys / "fleet.pub.pem")


def test_build_summary_on_stdout_labels_host_numbers_for_another_target(tiny_recipe, tmp_path, capsys):
    """A Raspberry Pi bundle built here: accuracy and latency are this host's, and the summary says so,
    naming this host's CPU; the report does too."""
    from edgekit.bundle.manifest import host_description

    from tests.conftest import TINY_RECIPE

    text = TINY_RECIPE.format(factory="tiny_net").replace(
        "  evaluation: {callable", '  calibration: {callable: "tests.fixtures.tiny_models:tiny_batches"}\n  evaluation: {callable'
    ).replace("max_drop: 0.0", "max_drop: 1.0")
    out = tmp_path / "pi-int8"
    assert main(["build", str(tiny_recipe(text=text)), "--target", "raspberry-pi-5", "--precision", "int8", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    summary = " ".join(captured.out.split())
    cpu = host_description()["cpu"]
    where = f"on this host ({cpu}, {host_description()['cores']} cores), not on the Raspberry Pi 5 (8GB)"
    assert "bundle " + str(out.resolve()) in summary and "int8, onnxruntime" in summary
    assert re.search(r"model [0-9.]+ (B|KB|MB) \(int8", summary), summary  # a size with its unit, never 8e-06 MB
    assert re.search(r"accuracy top1 [0-9.]+ \(reference [0-9.]+, drop [0-9.+-]+\), measured " + re.escape(where), summary), summary
    assert re.search(r"latency p50 [0-9.]+ ms p99 [0-9.]+ ms at \{'batch': 4\}, measured " + re.escape(where), summary), summary
    assert re.search(r"vs FP32 int8 bundle on the golden inputs: max abs diff [0-9.e+-]+, cosine min", summary), summary
    assert "✓" in captured.err and "✓" not in captured.out  # stage progress on stderr
    report = " ".join((out / "report.html").read_text().split())
    assert f"Benchmark {where}" in report.replace("&#39;", "'")
    assert "Latency p50 / p99 (this host)" in report and "INT8 vs FP32 max |diff|" in report


def test_build_summary_for_the_host_target_has_no_other_device(built, capsys):
    out, summary = built
    assert summary["measured_on_target"] is True and summary["vs_fp32"] is not None
    report = (out / "report.html").read_text()
    assert "not on the" not in report and "(this host)</div>" not in report
