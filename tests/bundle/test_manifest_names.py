"""Host side of hostile manifests: safe names when writing, packing and preparing a rollout; pack
never writes a tar member with '..' or an absolute path."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from edgekit.bundle.manifest import write_manifest
from edgekit.bundle.pack import member_name, pack_bundle
from edgekit.errors import BundleError
from edgekit.fleet.rollout_bundle import BundleArtifactError, prepare_bundle
from edgekit.pipeline import build
from edgekit_runtime.bundle import MAX_MANIFEST_DEPTH
from tests.runtime.tiny_bundle import build_bundle, load_manifest, write_manifest as rehash_manifest


def manifest_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((manifest_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((manifest_depth(v) for v in value), default=0)
    return 0


def test_a_built_bundle_packs_into_members_under_its_name(tiny_recipe, tmp_path: Path) -> None:
    result = build(tiny_recipe(), "x86-64-cpu", out=tmp_path / "bundle")
    manifest = json.loads((result.bundle_dir / "manifest.json").read_text())
    assert manifest_depth(manifest) <= MAX_MANIFEST_DEPTH // 2  # the nesting limit leaves room for growth
    tar_path = pack_bundle(result.bundle_dir, tmp_path / "bundle.tar")
    with tarfile.open(tar_path) as tar:
        names = tar.getnames()
    assert names and all(name.startswith(f"{manifest['name']}/") for name in names)
    assert not [name for name in names if ".." in name.split("/") or name.startswith("/")]


def test_pack_refuses_a_manifest_named_to_climb_out(tmp_path: Path) -> None:
    root = build_bundle(tmp_path / "bundle")
    manifest = load_manifest(root)
    manifest["name"] = "../../x"
    rehash_manifest(root, manifest)  # every hash still matches: only the name is hostile
    out = tmp_path / "out.tar"
    with pytest.raises(BundleError, match=r"name '\.\./\.\./x' is not a safe bundle name"):
        pack_bundle(root, out)
    assert not out.exists() and not list(tmp_path.glob(".out.tar*"))


@pytest.mark.parametrize("relative", ["../x", "/etc/passwd", "golden/../../x", "a\\b", "", "a//b", "./a"])
def test_member_name_refuses_paths_that_leave_the_folder(relative: str) -> None:
    with pytest.raises(BundleError, match="refusing to pack"):
        member_name("tiny", relative)


def test_member_name_refuses_an_unsafe_bundle_name() -> None:
    assert member_name("tiny", "golden/inputs_000.npz") == "tiny/golden/inputs_000.npz"
    with pytest.raises(BundleError, match=r"name '\.\.' is not a safe bundle name"):
        member_name("..", "model.onnx")


def test_write_manifest_refuses_an_unsafe_name(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(BundleError, match=r"name 'a/b' is not a safe bundle name"):
        write_manifest(tmp_path, {"name": "a/b", "model": {"path": "model.onnx"}})
    assert not (tmp_path / "manifest.json").exists()
    written = write_manifest(tmp_path, {"name": "tiny-x86-64-cpu-fp32", "model": {"path": "model.onnx"}})
    assert written["files"] == {"model.onnx": written["model"]["sha256"]}


def test_prepare_bundle_refuses_hostile_names_and_nesting(tmp_path: Path) -> None:
    root = build_bundle(tmp_path / "bundle")
    manifest = load_manifest(root)
    manifest["name"] = "../../x"
    rehash_manifest(root, manifest)
    with pytest.raises(BundleArtifactError, match=r"name '\.\./\.\./x' is not a safe bundle name"):
        prepare_bundle(root)
    (root / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BundleArtifactError, match=rf"nests arrays and objects 100000 levels deep, more than the limit of {MAX_MANIFEST_DEPTH}"):
        prepare_bundle(root)
