"""The bundle manifest: toolchain versions, file hashes, writing ``manifest.json`` last."""

from __future__ import annotations

import datetime as dt
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from edgekit_runtime.bundle import check_bundle_name
from edgekit_runtime.hashing import sha256_file

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
TOOLCHAIN_PACKAGES = ("edgekit", "edgekit-runtime", "torch", "onnx", "onnxruntime", "onnxscript", "numpy", "optimum", "optimum-onnx", "transformers")


def toolchain_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in TOOLCHAIN_PACKAGES:
        try:
            versions[name.replace("-", "_")] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name.replace("-", "_")] = None
    return versions


def host_description() -> dict[str, Any]:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from edgekit.quantize.cpu_isa import read_host_isa

    # cpu_isa: the flags that pick int8 kernels (VNNI or not changes int8 speed and weight range)
    return {"machine": platform.machine(), "cpu": cpu, "cpu_isa": list(read_host_isa()), "cores": os.cpu_count(),
            "os": f"{platform.system()} {platform.release()}", "python": sys.version.split()[0]}


def model_opset(path: Path) -> int | None:
    """The default-domain opset of the ONNX model at ``path`` (None if it has none or is not there)."""
    import onnx

    if not path.is_file():
        return None
    model = onnx.load(str(path), load_external_data=False)
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)


def model_constant_args(recipe: Any) -> dict[str, Any]:
    """The manifest model section's ``constant_args``: the non-tensor forward() arguments a PyTorch or
    TorchScript source was bound to before export (``{"sr": 16000}``), as JSON values (tuples as lists);
    empty (no key) when the source pins none, as ONNX files never do."""
    constants = getattr(recipe.model, "constant_args", None) or {}
    if not constants:
        return {}
    return {"constant_args": {name: list(value) if isinstance(value, tuple) else value for name, value in constants.items()}}


def file_hashes(root: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """sha256 of every file under ``root`` except the manifest, keyed by POSIX relative path;
    files already in ``known`` (hashed earlier in the same build) are not read again."""
    known = known or {}
    hashes = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and relative != MANIFEST:
            hashes[relative] = known.get(relative) or sha256_file(path)
    return hashes


def default_bundle_version(created: object = None) -> int:
    """A bundle's version: its build time in milliseconds since the Unix epoch (UTC), from the
    manifest's ``created`` when that is an ISO time, else now. Devices refuse a lower version of a
    bundle name than they already accepted."""
    moment = None
    if isinstance(created, str):
        try:
            moment = dt.datetime.fromisoformat(created)
        except ValueError:
            moment = None
    if moment is None:
        moment = dt.datetime.now(dt.timezone.utc)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


def write_manifest(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Fill in ``files`` (and the model's sha256) and write ``manifest.json``; returns the manifest written.
    The name must be a safe bundle name (it becomes the packed tar's folder): the reader refuses others."""
    manifest = dict(manifest)
    if manifest.get("bundle_version") is None:  # the device's anti-rollback compares it (edgekit_runtime.agent.deploy_checks)
        manifest["bundle_version"] = default_bundle_version(manifest.get("created"))
    check_bundle_name(manifest.get("name"), str(root / MANIFEST))
    manifest["files"] = file_hashes(root, manifest.get("files"))
    model = manifest.get("model")
    if isinstance(model, dict) and model.get("path") in manifest["files"]:
        manifest["model"] = {**model, "sha256": manifest["files"][model["path"]]}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n", encoding="utf-8")
    return manifest
