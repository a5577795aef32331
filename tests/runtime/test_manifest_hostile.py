"""manifest.json as hostile input on the device: unsafe names, pathological nesting, oversized files,
bytes that are not UTF-8. Each is a BundleError naming the file, never a RecursionError or a write."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgekit_runtime.archive import ArchiveLimits, UnsafeArchiveError, scan_bundle_archive
from edgekit_runtime.bundle import MAX_MANIFEST_BYTES, MAX_MANIFEST_DEPTH, check_bundle_name, open_bundle, read_manifest
from edgekit_runtime.errors import BundleError, InputSignatureError
from tests.runtime.tiny_bundle import load_manifest, save_manifest


@pytest.mark.parametrize(
    "name",
    ["../../x", "..", ".", "/etc/cron.d/x", "a/b", "a\\b", "", ".hidden", "-rf", "a\x00b", "tiny bundle", "x" * 129, "ünïcode"],
)
def test_unsafe_manifest_names_are_refused(bundle_dir: Path, name: str) -> None:
    manifest = load_manifest(bundle_dir)
    manifest["name"] = name
    save_manifest(bundle_dir, manifest)
    with pytest.raises(BundleError) as caught:
        read_manifest(bundle_dir)
    assert f"'{bundle_dir / 'manifest.json'}': name {name!r}"[:60] in str(caught.value)
    assert "is not a safe bundle name" in str(caught.value) and "rebuild the bundle" in str(caught.value)


@pytest.mark.parametrize("name", ["tiny-linear-x86-64-cpu-fp32", "ResNet50_v1.5", "a", "x" * 128])
def test_safe_names_pass(name: str) -> None:
    assert check_bundle_name(name, "manifest.json") == name


def test_a_100000_deep_manifest_is_a_named_error_not_a_recursion_error(bundle_dir: Path) -> None:
    depth = 100_000
    (bundle_dir / "manifest.json").write_text('{"a": ' + "[" * depth + "]" * depth + "}", encoding="utf-8")
    start = time.perf_counter()
    with pytest.raises(BundleError) as caught:
        read_manifest(bundle_dir)
    assert time.perf_counter() - start < 2
    assert f"nests arrays and objects {depth + 1} levels deep, more than the limit of {MAX_MANIFEST_DEPTH}" in str(caught.value)
    assert str(bundle_dir / "manifest.json") in str(caught.value)


def test_brackets_inside_strings_do_not_count_as_nesting(bundle_dir: Path) -> None:
    manifest = load_manifest(bundle_dir)
    manifest["notes"] = "[" * 10_000 + "{" * 10_000
    save_manifest(bundle_dir, manifest)
    assert read_manifest(bundle_dir)["notes"].startswith("[[[")


def test_an_oversized_manifest_is_refused_before_it_is_read(bundle_dir: Path) -> None:
    with (bundle_dir / "manifest.json").open("r+b") as handle:
        handle.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: reading it would take 16 MB of memory
    with pytest.raises(BundleError, match=rf"is {MAX_MANIFEST_BYTES + 1:,} bytes; a manifest is read up to {MAX_MANIFEST_BYTES:,} bytes"):
        read_manifest(bundle_dir)


def test_a_manifest_that_is_not_utf8_names_the_byte(bundle_dir: Path) -> None:
    text = (bundle_dir / "manifest.json").read_bytes()
    (bundle_dir / "manifest.json").write_bytes(text.replace(b'"fp32"', b'"fp\xff32"', 1))
    with pytest.raises(BundleError, match=r"manifest\.json' is not UTF-8: byte \d+ \(invalid start byte\)"):
        open_bundle(bundle_dir)


def test_a_tar_with_a_deep_manifest_is_refused_while_scanning(tmp_path: Path) -> None:
    data = ("[" * 5000 + "]" * 5000).encode()
    archive = tmp_path / "deep.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("tiny/manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    scanned = scan_bundle_archive(archive, ArchiveLimits(max_unpacked_bytes=1 << 20))
    with pytest.raises(UnsafeArchiveError, match=r"tiny/manifest\.json' nests arrays and objects 5000 levels deep"):
        scanned.manifest()


def test_every_manifest_edgekit_writes_is_well_inside_the_depth_limit(bundle_dir: Path) -> None:
    def depth(value: object) -> int:
        if isinstance(value, dict):
            return 1 + max((depth(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        return 0

    assert depth(json.loads((bundle_dir / "manifest.json").read_text())) <= MAX_MANIFEST_DEPTH // 4


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
PRISTINE: dict[Path, bytes] = {}
MANIFEST_PATHS = st.sampled_from(
    ["name", "schema_version", "precision", "files", "model", "model.path", "model.sha256", "model.external_data", "io",
     "io.inputs", "io.inputs.0", "io.inputs.0.shape", "io.dims", "backend", "backend.name", "backend.execution_providers",
     "golden", "golden.batches", "golden.batches.0", "golden.batches.0.inputs", "golden.atol", "golden.min_cosine",
     "golden.outputs", "golden.state", "bundle_version", "target"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=MANIFEST_PATHS, value=JSON_VALUES)
def test_fuzzed_manifests_open_or_raise_a_bundle_error(bundle_dir: Path, where: str, value: object) -> None:
    pristine = PRISTINE.setdefault(bundle_dir, (bundle_dir / "manifest.json").read_bytes())  # the fixture is shared by examples
    (bundle_dir / "manifest.json").write_bytes(pristine)
    manifest = load_manifest(bundle_dir)
    holder: object = manifest
    *parents, last = where.split(".")
    for part in parents:
        holder = holder[int(part)] if isinstance(holder, list) else holder.setdefault(part, {})  # type: ignore[index,union-attr]
    if isinstance(holder, list):
        holder[int(last)] = value
    else:
        holder[last] = value  # type: ignore[index]
    save_manifest(bundle_dir, manifest)
    try:
        bundle = open_bundle(bundle_dir, verify=False)
        bundle.golden_batches, bundle.golden_tolerances, bundle.output_tolerances, bundle.golden_state  # noqa: B018
        bundle.io, bundle.external_data_path  # noqa: B018
        assert bundle.model_path.resolve().is_relative_to(bundle_dir.resolve())
    except (BundleError, InputSignatureError) as err:
        assert "manifest.json" in str(err) or "io" in str(err) or str(bundle_dir) in str(err), err


@pytest.mark.parametrize(("rel", "fragment"), [("../../etc/passwd", "climbs out of the bundle"), ("/etc/passwd", "is an absolute path"),
                                              ("model\x00.onnx", "holds a NUL character")])
def test_file_paths_are_checked_when_the_manifest_is_read_even_without_verify(bundle_dir: Path, rel: str, fragment: str) -> None:
    manifest = load_manifest(bundle_dir)
    manifest["files"][rel] = manifest["files"]["model.onnx"]
    manifest["model"]["path"] = rel
    manifest["model"].pop("sha256")
    save_manifest(bundle_dir, manifest)
    with pytest.raises(BundleError, match=fragment):
        open_bundle(bundle_dir, verify=False)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("intra_op_spinning", "yes", "intra_op_spinning must be true, false or null, got 'yes'"),
    ("intra_op_spin_us", "abc", "intra_op_spin_us must be an int from 1 to 100000 or null, got 'abc'"),
    ("intra_op_spin_us", 0, "intra_op_spin_us must be an int from 1 to 100000 or null, got 0"),
    ("intra_op_threads", -2, "intra_op_threads must be an int >= 0 or null, got -2"),
])  # fmt: skip
def test_bad_backend_options_in_a_manifest_name_the_bundle_and_section(bundle_dir: Path, key: str, value: object, message: str) -> None:
    from edgekit_runtime.backends import create_runner
    from edgekit_runtime.errors import BackendError

    manifest = load_manifest(bundle_dir)
    manifest["backend"][key] = value
    save_manifest(bundle_dir, manifest)
    bundle = open_bundle(bundle_dir, verify=False)
    with pytest.raises(BackendError) as caught:
        create_runner(bundle)
    assert str(caught.value).startswith(f"bundle '{bundle_dir}' (manifest.json backend): {message}")
    with pytest.raises(BackendError) as caught:  # the options a caller gave are named as well: they may be the cause
        create_runner(bundle, io_binding=False)
    assert f"(manifest.json backend, with io_binding from the runner options): {message}" in str(caught.value)
