"""``bundle_version`` in the manifest: written by the host, checked by the runtime's reader."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from edgekit.bundle.manifest import default_bundle_version, write_manifest
from edgekit_runtime.bundle import read_manifest
from edgekit_runtime.errors import BundleError
from tests.runtime.tiny_bundle import build_bundle, load_manifest, save_manifest


def test_write_manifest_adds_the_build_time_in_milliseconds(tmp_path: Path) -> None:
    root = build_bundle(tmp_path / "b")
    manifest = load_manifest(root)
    manifest.pop("files")
    written = write_manifest(root, {**manifest, "created": "2026-03-01T12:00:00+00:00"})
    assert written["bundle_version"] == 1_772_366_400_000 == json.loads((root / "manifest.json").read_text())["bundle_version"]
    assert write_manifest(root, {**manifest, "bundle_version": 7})["bundle_version"] == 7  # an explicit one is kept
    before = int(time.time() * 1000)
    assert before <= write_manifest(root, {**manifest, "created": None})["bundle_version"] <= int(time.time() * 1000)
    assert default_bundle_version("2026-03-01T12:00:00") == default_bundle_version("2026-03-01T12:00:00+00:00")  # naive is UTC
    assert default_bundle_version("2026-03-01T13:00:00+01:00") == 1_772_366_400_000
    assert dt.datetime.fromtimestamp(default_bundle_version("yesterday") / 1000, dt.timezone.utc).year >= 2026


@pytest.mark.parametrize("value", [-1, 1.5, "17", True])
def test_the_reader_refuses_a_malformed_bundle_version(tmp_path: Path, value: object) -> None:
    root = build_bundle(tmp_path / "b")
    save_manifest(root, {**load_manifest(root), "bundle_version": value})
    with pytest.raises(BundleError, match=rf"manifest.json': bundle_version must be a non-negative integer \(the build time in milliseconds\), got {value!r}"):
        read_manifest(root)
