"""open_bundle / read_manifest / verify_files on real bundle directories in tmp_path."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from edgekit_runtime.bundle import Bundle, open_bundle, read_manifest, verify_files
from edgekit_runtime.errors import BundleError
from edgekit_runtime.hashing import sha256_file
from tests.runtime.tiny_bundle import load_manifest, save_manifest, sha256_of


def test_sha256_file_matches_hashlib_for_any_chunk_size(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 5000)  # 1.28 MB: more than one 1 MiB chunk
    assert sha256_file(path) == sha256_of(path)
    assert sha256_file(path, chunk_bytes=7) == sha256_of(path)
    with pytest.raises(ValueError, match="chunk_bytes must be positive"):
        sha256_file(path, chunk_bytes=0)


def test_intact_bundle_opens_with_its_helpers(bundle_dir: Path) -> None:
    bundle = open_bundle(bundle_dir)
    assert isinstance(bundle, Bundle)
    assert bundle.root == bundle_dir
    assert bundle.name == "tiny-linear-x86-64-cpu-fp32"
    assert bundle.model_path == bundle_dir / "model.onnx"
    assert bundle.external_data_path is None
    assert bundle.precision == "fp32"
    assert bundle.backend["name"] == "onnxruntime"
    assert bundle.io.input_names == ("image",)
    assert bundle.io.dims["batch"].max == 128
    assert [b.inputs_path.name for b in bundle.golden_batches] == ["inputs_000.npz", "inputs_001.npz"]
    assert bundle.golden_tolerances == (1e-4, 1e-3, 0.999)
    assert set(bundle.files) == {"model.onnx", "report.html", *(f"golden/{k}_00{i}.npz" for k in ("inputs", "outputs") for i in (0, 1))}


def test_modified_file_names_file_and_both_hash_prefixes(bundle_dir: Path) -> None:
    expected = load_manifest(bundle_dir)["files"]["report.html"]
    (bundle_dir / "report.html").write_text("<html>changed</html>", encoding="utf-8")
    actual = sha256_of(bundle_dir / "report.html")
    with pytest.raises(BundleError) as caught:
        open_bundle(bundle_dir)
    message = str(caught.value)
    assert f"bundle '{bundle_dir}' failed verification (1 problem(s))" in message
    assert f"modified: report.html (expected sha256 {expected[:12]}..., got {actual[:12]}...)" in message
    assert "copy it again" in message


def test_missing_file_is_reported(bundle_dir: Path) -> None:
    (bundle_dir / "golden" / "outputs_001.npz").unlink()
    with pytest.raises(BundleError, match="missing: golden/outputs_001.npz"):
        open_bundle(bundle_dir)


def test_unlisted_extra_file_is_reported(bundle_dir: Path) -> None:
    (bundle_dir / "golden" / "notes.txt").write_text("not part of the bundle", encoding="utf-8")
    with pytest.raises(BundleError) as caught:
        open_bundle(bundle_dir)
    assert "unlisted: golden/notes.txt (not in manifest.json files)" in str(caught.value)
    assert "remove files that are not part of the bundle" in str(caught.value)


def test_all_problems_are_reported_together(bundle_dir: Path) -> None:
    (bundle_dir / "report.html").write_text("x", encoding="utf-8")
    (bundle_dir / "golden" / "inputs_000.npz").unlink()
    (bundle_dir / "extra.bin").write_bytes(b"\0")
    with pytest.raises(BundleError) as caught:
        open_bundle(bundle_dir)
    message = str(caught.value)
    assert "(3 problem(s))" in message
    for line in ("missing: golden/inputs_000.npz", "modified: report.html", "unlisted: extra.bin"):
        assert line in message


def test_verify_false_skips_the_hashes(bundle_dir: Path) -> None:
    (bundle_dir / "report.html").write_text("changed", encoding="utf-8")
    assert open_bundle(bundle_dir, verify=False).name == "tiny-linear-x86-64-cpu-fp32"


@pytest.mark.parametrize(("entry", "text"), [
    ("../outside.txt", "files entry '../outside.txt' climbs out of the bundle with '..' (path traversal)"),
    ("golden/../../outside.txt", "climbs out of the bundle with '..' (path traversal)"),
    ("/etc/passwd", "files entry '/etc/passwd' is an absolute path"),
    ("C:/Windows/win.ini", "is an absolute path"),
    ("golden\\inputs_000.npz", "is an absolute path"),
    ("./report.html", "files entry './report.html' is not a normalized path; write it as 'report.html'"),
    ("manifest.json", "files lists manifest.json, which cannot hold its own hash"),
])  # fmt: skip
def test_unsafe_paths_in_files_are_rejected_before_reading(bundle_dir: Path, entry: str, text: str) -> None:
    (bundle_dir.parent / "outside.txt").write_text("secret", encoding="utf-8")
    manifest = load_manifest(bundle_dir)
    manifest["files"][entry] = "0" * 64
    with pytest.raises(BundleError) as caught:
        verify_files(bundle_dir, manifest)
    assert text in str(caught.value)
    assert str(bundle_dir / "manifest.json") in str(caught.value)


def test_symlink_out_of_the_bundle_is_rejected(bundle_dir: Path) -> None:
    outside = bundle_dir.parent / "outside.txt"
    outside.write_text("secret", encoding="utf-8")
    (bundle_dir / "link.txt").symlink_to(outside)
    manifest = load_manifest(bundle_dir)
    manifest["files"]["link.txt"] = sha256_of(outside)
    with pytest.raises(BundleError, match=r"files entry 'link.txt' resolves to .*outside.txt', outside the bundle"):
        verify_files(bundle_dir, manifest)


def test_missing_directory_and_tar_archive(tmp_path: Path, bundle_dir: Path) -> None:
    with pytest.raises(BundleError, match=f"bundle directory '{tmp_path / 'nope'}' does not exist"):
        read_manifest(tmp_path / "nope")
    archive = tmp_path / "bundle.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(bundle_dir, arcname="bundle")
    with pytest.raises(BundleError, match=f"unpack the archive first: tar -xf {archive}"):
        open_bundle(archive)


def test_missing_manifest(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError) as caught:
        read_manifest(tmp_path / "empty")
    assert f"'{tmp_path / 'empty' / 'manifest.json'}' is missing" in str(caught.value)
    assert "not an edgekit bundle" in str(caught.value)


def test_invalid_json(bundle_dir: Path) -> None:
    (bundle_dir / "manifest.json").write_text('{"schema_version": 1,', encoding="utf-8")
    with pytest.raises(BundleError) as caught:
        read_manifest(bundle_dir)
    assert f"'{bundle_dir / 'manifest.json'}' is not valid JSON" in str(caught.value)
    assert "truncated" in str(caught.value)


def test_manifest_must_be_an_object(bundle_dir: Path) -> None:
    (bundle_dir / "manifest.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(BundleError, match="must hold a JSON object, got list"):
        read_manifest(bundle_dir)


@pytest.mark.parametrize(("version", "text", "hint"), [
    (2, "schema_version 2 is not supported (this edgekit-runtime reads 1)", "upgrade edgekit-runtime"),
    (None, "schema_version None is not supported", "rebuild the bundle"),
    ("1", "schema_version '1' is not supported", "rebuild the bundle"),
])  # fmt: skip
def test_unsupported_schema_version(bundle_dir: Path, version: object, text: str, hint: str) -> None:
    manifest = load_manifest(bundle_dir)
    manifest["schema_version"] = version
    save_manifest(bundle_dir, manifest)
    with pytest.raises(BundleError) as caught:
        read_manifest(bundle_dir)
    assert text in str(caught.value)
    assert hint in str(caught.value)
    assert "manifest.json" in str(caught.value)


def _edit(bundle_dir: Path, edit) -> None:  # type: ignore[no-untyped-def]
    manifest = load_manifest(bundle_dir)
    edit(manifest)
    save_manifest(bundle_dir, manifest)


@pytest.mark.parametrize(("edit", "text"), [
    (lambda m: m.pop("io"), "key 'io' is missing or not a JSON object"),
    (lambda m: m.update(precision=16), "key 'precision' is missing or not a string"),
    (lambda m: m["files"].update({"model.onnx": "ABC"}), "files['model.onnx'] must be a lowercase hex sha256"),
    (lambda m: m["files"].pop("golden/outputs_001.npz"),
     "golden.batches[1].outputs 'golden/outputs_001.npz' is not listed in files"),
    (lambda m: m["model"].update(external_data="model.onnx.data"), "model.external_data 'model.onnx.data' is not listed"),
    (lambda m: m["model"].update(sha256="f" * 64), "model.sha256 differs from files['model.onnx']"),
    (lambda m: m["backend"].pop("name"), "backend.name must name a backend"),
    (lambda m: m["golden"].update(batches=[]), "golden.batches must be a non-empty list"),
    (lambda m: m["golden"].update(min_cosine=1.5), "golden.min_cosine must be a number in -1.0..1.0, got 1.5"),
    (lambda m: m["golden"].update(atol=-1), "golden.atol must be a number >= 0.0, got -1"),
    (lambda m: m["io"]["inputs"][0].update(dtype="float"), "dtype 'float' is not a canonical numpy dtype name"),
])  # fmt: skip
def test_malformed_manifest_sections(bundle_dir: Path, edit, text: str) -> None:  # type: ignore[no-untyped-def]
    _edit(bundle_dir, edit)
    with pytest.raises(BundleError) as caught:
        open_bundle(bundle_dir, verify=False)
    assert text in str(caught.value)
    assert "manifest.json" in str(caught.value)


def test_read_manifest_returns_the_json(bundle_dir: Path) -> None:
    assert read_manifest(bundle_dir) == json.loads((bundle_dir / "manifest.json").read_text())


def _with_tensorrt_section(bundle_dir: Path, section: object) -> Path:
    """The bundle with a ``backend.tensorrt`` section (the plan file written and hashed when it names the default)."""
    (bundle_dir / "tensorrt").mkdir(exist_ok=True)
    (bundle_dir / "tensorrt" / "plan.json").write_text("{}")
    manifest = load_manifest(bundle_dir)
    manifest["files"]["tensorrt/plan.json"] = sha256_of(bundle_dir / "tensorrt" / "plan.json")
    manifest["backend"] = {"name": "tensorrt", "tensorrt": section}
    save_manifest(bundle_dir, manifest)
    return bundle_dir


@pytest.mark.parametrize(("section", "text"), [
    ({"plan": "../outside_plan.json"}, "backend.tensorrt.plan '../outside_plan.json' is not listed in files"),
    ({"plan": "/etc/hostname"}, "backend.tensorrt.plan '/etc/hostname' is not listed in files"),
    ({"plan": "tensorrt/other.json"}, "backend.tensorrt.plan 'tensorrt/other.json' is not listed in files"),
    ({"plan": 5}, "backend.tensorrt.plan must name the build plan file, e.g. 'tensorrt/plan.json', got int"),
    ({"engine": {"path": "/etc/hostname", "key": {}}}, "backend.tensorrt.engine.path '/etc/hostname' is not listed in files"),
    ({"engine": {"path": "../model.engine"}}, "backend.tensorrt.engine.path '../model.engine' is not listed in files"),
    ({"engine": {"key": {}}}, "backend.tensorrt.engine must be null or an object whose path names the engine file"),
    ({"engine": "tensorrt/model.engine"}, "backend.tensorrt.engine must be null or an object whose path names"),
    (["plan.json"], "backend.tensorrt must be a JSON object, got list"),
])  # fmt: skip
def test_tensorrt_files_must_be_listed_in_files(bundle_dir: Path, section: object, text: str) -> None:
    """The runner reads backend.tensorrt.plan and .engine.path from the bundle: unlisted (or outside it), refused."""
    _with_tensorrt_section(bundle_dir, section)
    for verify in (True, False):
        with pytest.raises(BundleError) as caught:
            open_bundle(bundle_dir, verify=verify)
        assert f"{bundle_dir / 'manifest.json'}': {text}" in str(caught.value)
        assert "rebuild the bundle" in str(caught.value)


def test_listed_tensorrt_files_open(bundle_dir: Path) -> None:
    _with_tensorrt_section(bundle_dir, {"plan": "tensorrt/plan.json", "engine": None})
    assert open_bundle(bundle_dir).backend["tensorrt"]["plan"] == "tensorrt/plan.json"
    (bundle_dir / "tensorrt" / "model.engine").write_bytes(b"engine")
    manifest = load_manifest(bundle_dir)
    manifest["files"]["tensorrt/model.engine"] = sha256_of(bundle_dir / "tensorrt" / "model.engine")
    manifest["backend"]["tensorrt"] = {"engine": {"path": "tensorrt/model.engine", "key": {}}}  # plan: the default path
    save_manifest(bundle_dir, manifest)
    assert open_bundle(bundle_dir).backend["tensorrt"]["engine"]["path"] == "tensorrt/model.engine"
