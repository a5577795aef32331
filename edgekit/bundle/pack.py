"""``edgekit pack``: a bundle directory as one tar file for shipping, and opening such a tar again."""

from __future__ import annotations

import contextlib
import hashlib
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from edgekit.bundle.disk_full import Place, disk_full_as_error
from edgekit.errors import BundleError
from edgekit_runtime.archive import MANIFEST_MEMBER, ArchiveLimits, extract_bundle_archive, scan_bundle_archive
from edgekit_runtime.bundle import SIGNATURE_NAME, check_bundle_name, open_bundle


def pack_bundle(bundle_dir: Path, out: Path | None = None, force: bool = False) -> Path:
    """Verify the bundle, then write ``<name>.tar`` with the bundle's files under one folder."""
    bundle = open_bundle(bundle_dir, verify=True)
    resolved = Path(bundle_dir).resolve()  # resolved: "." has no name; the whole name, so v1.2 and v1.3 stay apart
    out = Path(out) if out else resolved.with_name(resolved.name + ".tar")
    if not out.resolve().parent.is_dir():
        raise BundleError(f"cannot write {out}: folder {out.resolve().parent} does not exist", hint="create it, or choose another --out")
    if out.is_dir():  # --force replaces a tar, never a folder
        raise BundleError(f"cannot write {out}: --out names a folder; it must name the tar file to write",
                          hint=f"pass a tar file path, e.g. --out {out / (bundle.manifest['name'] + '.tar')}")  # fmt: skip
    if out.exists() and not force:
        raise BundleError(f"{out} already exists", hint="pass --force to replace it, or choose another --out")
    partial = out.with_name(f".{out.name}.partial")
    try:
        with disk_full_as_error("edgekit pack", [Place("output folder", out.resolve().parent)]):
            with tarfile.open(partial, "w", dereference=True) as tar:  # files, never links: the reader refuses links
                members = [Path(bundle_dir) / "manifest.json", *(Path(bundle_dir) / rel for rel in bundle.manifest["files"])]
                signature = Path(bundle_dir) / SIGNATURE_NAME
                if signature.is_file():
                    members.append(signature)
                for path in sorted(members):
                    tar.add(path, arcname=member_name(bundle.manifest["name"], path.relative_to(bundle_dir).as_posix()), recursive=False)
            partial.replace(out)
    except BaseException:
        partial.unlink(missing_ok=True)  # a full disk, a failed rename or an interrupt leaves no half-written tar behind
        raise
    return out


def bundle_id(bundle_dir: Path) -> str:
    """The bundle's id, content-addressed: its name plus 12 hex of the sha256 of its ``manifest.json``. ``edgekit
    pack`` prints it, ``edgekit fleet deploy`` sends it, and agents, simulated devices and the fleet store report
    it (:func:`edgekit_runtime.agent.store.version_name`)."""
    from edgekit_runtime.agent.store import version_name

    manifest_bytes = (Path(bundle_dir) / "manifest.json").read_bytes()
    bundle = open_bundle(bundle_dir, verify=False)
    return version_name(bundle.manifest["name"], hashlib.sha256(manifest_bytes).hexdigest())


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


#: What ``edgekit inspect`` unpacks at most (``--max-unpacked-mb``); the agent has its own, smaller limit.
DEFAULT_UNPACK_LIMITS = ArchiveLimits(max_unpacked_bytes=4 << 30)

#: Receives manifest.json's bytes and manifest.sig's (or ``None``) before a tar's files are written.
ManifestCheck = Callable[[bytes, "bytes | None"], None]


@contextlib.contextmanager
def opened_bundle_path(
    path: Path, *, limits: ArchiveLimits | None = None, check_manifest: ManifestCheck | None = None
) -> Iterator[Path]:
    """Yield a bundle directory for ``path``: the directory itself, or a tar unpacked into a temporary
    directory by :mod:`edgekit_runtime.archive` (every member checked, at most ``limits``, only the
    files the manifest lists, each against its hash). ``check_manifest`` runs on the manifest and
    signature first: for a tar, before any of its files is written."""
    path = Path(path)
    if path.is_dir() or not path.exists():
        manifest = path / MANIFEST_MEMBER
        if check_manifest is not None and manifest.is_file():
            signature = path / SIGNATURE_NAME
            check_manifest(manifest.read_bytes(), signature.read_bytes() if signature.is_file() else None)
        yield path
        return
    limits = limits or DEFAULT_UNPACK_LIMITS
    archive = scan_bundle_archive(path, limits)
    if check_manifest is not None:
        check_manifest(archive.manifest_bytes, archive.signature_bytes)
    with tempfile.TemporaryDirectory(prefix="edgekit-bundle-") as tmp:
        yield extract_bundle_archive(archive, tmp, limits)
