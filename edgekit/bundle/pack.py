"""``edgekit pack``: a bundle directory as one tar file for shipping, and opening such a tar again."""

from __future__ import annotations

import contextlib
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

from edgekit.errors import BundleError
from edgekit_runtime.bundle import SIGNATURE_NAME, check_bundle_name, open_bundle


def pack_bundle(bundle_dir: Path, out: Path | None = None, force: bool = False) -> Path:
    """Verify the bundle, then write ``<name>.tar`` with the bundle's files under one folder."""
    bundle = open_bundle(bundle_dir, verify=True)
    out = Path(out) if out else Path(bundle_dir).with_suffix(".tar")
    if out.exists() and not force:
        raise BundleError(f"{out} already exists", hint="pass --force to replace it, or choose another --out")
    partial = out.with_name(f".{out.name}.partial")
    with tarfile.open(partial, "w") as tar:
        members = [Path(bundle_dir) / "manifest.json", *(Path(bundle_dir) / rel for rel in bundle.manifest["files"])]
        signature = Path(bundle_dir) / SIGNATURE_NAME
        if signature.is_file():
            members.append(signature)
        for path in sorted(members):
            tar.add(path, arcname=member_name(bundle.manifest["name"], path.relative_to(bundle_dir).as_posix()), recursive=False)
    partial.replace(out)
    return out


def member_name(bundle_name: str, relative: str) -> str:
    """The tar member name of a bundle file: ``<name>/<relative>``, refused (BundleError) when it could
    land outside the folder it is unpacked into (absolute, '..', backslashes, an unsafe bundle name)."""
    check_bundle_name(bundle_name, "manifest.json")
    parts = relative.split("/")
    if not relative or relative.startswith("/") or "\\" in relative or "\x00" in relative or any(p in ("", ".", "..") for p in parts):
        raise BundleError(
            f"refusing to pack '{relative}' as a tar member: it is absolute or has an empty, '.' or '..' part",
            hint="bundle files are plain relative paths inside the bundle; rebuild the bundle",
        )
    return f"{bundle_name}/{relative}"


@contextlib.contextmanager
def opened_bundle_path(path: Path) -> Iterator[Path]:
    """Yield a bundle directory for ``path``: the directory itself, or a tar safely extracted to a temp dir."""
    path = Path(path)
    if path.is_dir() or not path.exists():
        yield path
        return
    if not tarfile.is_tarfile(path):
        raise BundleError(f"{path} is neither a bundle directory nor a tar file", hint="pass the folder `edgekit build` wrote, or the .tar from `edgekit pack`")
    with tempfile.TemporaryDirectory(prefix="edgekit-bundle-") as tmp, tarfile.open(path) as tar:
        tar.extractall(tmp, filter="data")  # refuses absolute paths, '..' and links out of the folder
        entries = [p for p in Path(tmp).iterdir() if p.is_dir()]
        if len(entries) != 1:
            raise BundleError(f"{path}: expected one bundle folder in the tar, found {len(entries)}")
        yield entries[0]
