"""Getting a bundle into the staging directory: copy or download, hash-check, unpack safely.

``url`` is an ``http(s)://`` URL of a tar made by ``edgekit pack``, or a ``file://`` URL or plain path
of such a tar or of a bundle directory. ``sha256`` is the hash of the tar file, or for a directory
the hash of its ``manifest.json`` (whose ``files`` hashes cover the rest). Downloads are capped at
``max_bytes``; tar members that are links, devices, absolute or climb out with ``..`` are refused.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.bundle import MANIFEST_NAME

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class FetchedBundle:
    """A bundle directory in staging, and what was checked on the way."""

    path: Path
    source_kind: str  # "tar" or "directory"
    size_bytes: int
    sha256: str
    seconds: float


def _size_error(url: str, max_bytes: int) -> DeployError:
    return DeployError(
        f"bundle at {url} is larger than the limit of {max_bytes} bytes",
        hint="raise bundles.max_download_mb in the agent config if the bundle really is that large",
    )


def _check_sha256(actual: str, expected: str | None, *, what: str) -> None:
    if expected is not None and actual != expected.lower():
        raise DeployError(
            f"sha256 of {what} is {actual}, but the deploy command expects {expected.lower()}",
            hint="the download is corrupt or is not the bundle the command meant; check url and sha256",
        )


def _download(url: str, destination: Path, *, max_bytes: int, timeout_s: float) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, destination.open("wb") as out:  # noqa: S310
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise _size_error(url, max_bytes)
            while chunk := response.read(_CHUNK_BYTES):
                size += len(chunk)
                if size > max_bytes:
                    raise _size_error(url, max_bytes)
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as err:
        raise DeployError(f"download of {url} failed: HTTP {err.code} {err.reason}", hint="check the URL and the server") from err
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", None) or err
        raise DeployError(f"download of {url} failed: {reason}", hint="check the network, the URL and bundles.download_timeout_s") from err
    return size, digest.hexdigest()


def _copy_file(source: Path, destination: Path, *, url: str, max_bytes: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with source.open("rb") as handle, destination.open("wb") as out:
        while chunk := handle.read(_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise _size_error(url, max_bytes)
            digest.update(chunk)
            out.write(chunk)
    return size, digest.hexdigest()


def _check_member(member: tarfile.TarInfo, archive: str) -> None:
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\\" in name:
        raise DeployError(f"{archive}: member '{name}' has an absolute or '..' path", hint="refusing a tar that writes outside its folder")
    if not (member.isfile() or member.isdir()):
        raise DeployError(f"{archive}: member '{name}' is a link or special file", hint="bundles hold only plain files and folders")


def _unpack(archive: Path, destination: Path, *, url: str, max_bytes: int) -> Path:
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            total = 0
            for member in members:
                _check_member(member, url)
                total += member.size
            if total > max_bytes:
                raise _size_error(url, max_bytes)
            extract_kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(destination, members=members, **extract_kwargs)  # noqa: S202 - members checked above
    except (tarfile.TarError, EOFError) as err:
        raise DeployError(f"bundle at {url} is not a readable tar: {err}", hint="make it with `edgekit pack`") from err
    return _bundle_root(destination, url)


def _bundle_root(directory: Path, url: str) -> Path:
    """The folder holding manifest.json: the directory itself, or its single subfolder (edgekit pack)."""
    if (directory / MANIFEST_NAME).is_file():
        return directory
    entries = list(directory.iterdir())
    if len(entries) == 1 and (entries[0] / MANIFEST_NAME).is_file():
        return entries[0]
    raise DeployError(
        f"bundle at {url} has no {MANIFEST_NAME} at its top or in a single top folder",
        hint="ship the tar `edgekit pack` makes, or the bundle directory itself",
    )


def _copy_directory(source: Path, destination: Path, *, url: str, max_bytes: int) -> None:
    total = 0
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise DeployError(f"bundle directory {url}: '{relative}' is a link or special file", hint="bundles hold only plain files")
        if path.is_dir():
            (destination / relative).mkdir(parents=True, exist_ok=True)
            continue
        total += path.stat().st_size
        if total > max_bytes:
            raise _size_error(url, max_bytes)
        (destination / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination / relative)


def _local_path(url: str) -> Path | None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise DeployError(f"bundle url {url!r} has an unsupported scheme '{parsed.scheme}'", hint="use http(s)://, file:// or a path")
    return Path(url)


def fetch_bundle(url: str, staging: Path, *, expected_sha256: str | None, max_bytes: int, timeout_s: float = 60.0) -> FetchedBundle:
    """Bring the bundle at ``url`` into ``staging`` (an empty directory) and check its sha256."""
    started = time.monotonic()
    local = _local_path(url)
    if local is not None and local.is_dir():
        bundle_dir = staging / "bundle"
        bundle_dir.mkdir()
        _copy_directory(_bundle_root(local, url), bundle_dir, url=url, max_bytes=max_bytes)
        manifest = bundle_dir / MANIFEST_NAME
        sha256 = hashlib.sha256(manifest.read_bytes()).hexdigest()
        _check_sha256(sha256, expected_sha256, what=f"{MANIFEST_NAME} of {url}")
        size = sum(p.stat().st_size for p in bundle_dir.rglob("*") if p.is_file())
        return FetchedBundle(bundle_dir, "directory", size, sha256, time.monotonic() - started)
    archive = staging / "bundle.tar"
    if local is not None:
        if not local.is_file():
            raise DeployError(f"bundle {url} does not exist on this device", hint="check the deploy command's url")
        size, sha256 = _copy_file(local, archive, url=url, max_bytes=max_bytes)
    else:
        size, sha256 = _download(url, archive, max_bytes=max_bytes, timeout_s=timeout_s)
    _check_sha256(sha256, expected_sha256, what=url)
    unpacked = staging / "unpacked"
    unpacked.mkdir()
    bundle_dir = _unpack(archive, unpacked, url=url, max_bytes=max_bytes)
    archive.unlink()
    logger.info("fetched %s (%d bytes) into %s", url, size, bundle_dir)
    return FetchedBundle(bundle_dir, "tar", size, sha256, time.monotonic() - started)
