"""Getting a bundle into the staging directory: admit the URL, copy or download, hash-check, unpack safely.

``url`` is an ``http(s)://`` URL of a tar made by ``edgekit pack``, or a ``file://`` URL or absolute
path of such a tar or of a bundle directory. A deploy command may only name the agent's inbox
directory (``bundles.inbox``) or a prefix in ``bundles.allowed_sources`` (:class:`SourcePolicy`);
anything else is refused with the same text whether or not it exists, before it is opened or
fetched, and redirects are held to the same list.

``sha256`` is the hash of the tar file, or for a directory the hash of its ``manifest.json`` (whose
``files`` hashes cover the rest). Downloads are capped at ``max_bytes``; a tar is read with
:mod:`edgekit_runtime.archive` (regular files and folders only, no ``..``, links or devices, at
most ``max_bytes`` unpacked), and its manifest and signature are checked before its files are
written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgekit_runtime.agent.config_types import BundlesConfig
from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.archive import (
    MANIFEST_MAX_BYTES,
    SIGNATURE_MAX_BYTES,
    ArchiveLimits,
    UnsafeArchiveError,
    extract_bundle_archive,
    scan_bundle_archive,
)
from edgekit_runtime.bundle import MANIFEST_NAME, SIGNATURE_NAME
from edgekit_runtime.errors import DISK_FULL_ERRNOS

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


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


@dataclass
class _Writing:
    """What a fetch is writing now, and the bytes that needs (for the message when the disk is full)."""

    what: str
    needed_bytes: int | None = None


def disk_full_error(url: str, directory: Path, *, what: str, needed_bytes: int | None) -> DeployError:
    """The deploy of ``url`` found no room under ``directory`` for ``what`` (which needs ``needed_bytes``); the
    message leaves the URL to the deploy_result that quotes it."""
    free = _free_bytes(directory)
    needs = f"needs {needed_bytes:,} bytes" if needed_bytes is not None else "needs more room"
    return DeployError(
        f"no space left on the device: {what} {needs} under {directory}, "
        + (f"{free:,} bytes are free there" if free is not None else "the free space there is unknown")
        + " (the partial files were removed)",
        hint="free space on the file system of bundles.dir (or the agent's quota there), or deploy a smaller bundle; "
        "the bundle served now is unchanged",
    )


def write_error(err: OSError, url: str, directory: Path, *, what: str, needed_bytes: int | None = None) -> DeployError:
    """An ``OSError`` met while bringing a bundle onto the device, as the :class:`DeployError` a deploy reports:
    a full disk (``ENOSPC``, ``EDQUOT``) says how much ``what`` needed and how much is free."""
    if err.errno in DISK_FULL_ERRNOS:
        return disk_full_error(url, directory, what=what, needed_bytes=needed_bytes)
    where = f" ({err.filename})" if err.filename else ""
    return DeployError(f"cannot write bundle {url} on the device: {what} failed: {err.strerror or err}{where}",
                       hint="check the permissions and the file system of bundles.dir")  # fmt: skip


def _too_slow(url: str, max_seconds: float, size: int, declared: int | None) -> DeployError:
    of = f" of {declared:,}" if declared is not None else ""
    return DeployError(f"download of {url} did not finish within bundles.download_max_s = {max_seconds:g} s "
                       f"(got {size:,}{of} bytes); the deploy was stopped", hint="the server or the network is too slow: "
                       "check them, or raise bundles.download_max_s in the agent config for a bundle that really takes that long")  # fmt: skip


def _download(url: str, destination: Path, *, max_bytes: int, timeout_s: float, policy: SourcePolicy | None = None,
              declared_bytes: list[int] | None = None, max_seconds: float | None = None) -> tuple[int, str]:  # fmt: skip
    """Download ``url`` into ``destination``; a ``Content-Length`` the server sends is appended to ``declared_bytes``.
    ``timeout_s`` bounds each wait for data, ``max_seconds`` the whole download (``bundles.download_max_s``); a body
    shorter than its ``Content-Length`` fails."""
    digest = hashlib.sha256()
    size = 0
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    opener = urllib.request.build_opener(_CheckedRedirects(policy))
    try:
        with opener.open(url, timeout=timeout_s) as response, destination.open("wb") as out:
            header = response.headers.get("Content-Length")
            declared = int(header) if header is not None and header.isdigit() else None
            if declared is not None and declared_bytes is not None:
                declared_bytes.append(declared)
            if declared is not None and declared > max_bytes:
                raise _size_error(url, max_bytes)
            read = getattr(response, "read1", response.read)  # one recv at a time: a trickle still meets the deadline
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise _too_slow(url, max_seconds or 0.0, size, declared)
                chunk = read(_CHUNK_BYTES)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise _size_error(url, max_bytes)
                digest.update(chunk)
                out.write(chunk)
            if declared is not None and size != declared:
                raise DeployError(f"download of {url} was truncated: got {size:,} of {declared:,} bytes (its Content-Length)",
                                  hint="the connection or the server broke off the transfer: deploy again, or check the server")  # fmt: skip
    except urllib.error.HTTPError as err:
        raise DeployError(f"download of {url} failed: HTTP {err.code} {err.reason}", hint="check the URL and the server") from err
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
            raise  # not a network error: fetch_bundle says how much room the download needed
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
        if path.is_dir():  # only the folders of the files copied are made, as from a tar: an empty one is left out
            continue
        total += path.stat().st_size
        if total > max_bytes:
            raise _size_error(url, max_bytes)
        (destination / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination / relative)




# -- where a deploy may fetch from ----------------------------------------------------------------------


@dataclass(frozen=True)
class AllowedSource:
    """One entry of ``bundles.allowed_sources``: a local directory, or an ``http(s)://`` URL prefix."""

    text: str
    directory: Path | None = None
    scheme: str | None = None
    host: str | None = None
    port: int | None = None
    path_prefix: str = "/"

    def admits_url(self, parsed: urllib.parse.SplitResult) -> bool:
        if self.directory is not None or parsed.scheme != self.scheme:
            return False
        if (parsed.hostname or "").lower() != self.host or _port(parsed) != self.port:
            return False
        return _clean_url_path(parsed.path).startswith(self.path_prefix)

    def admits_path(self, path: Path) -> bool:
        return self.directory is not None and (path == self.directory or self.directory in path.parents)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _port(parsed: urllib.parse.SplitResult) -> int | None:
    try:
        return parsed.port or _DEFAULT_PORTS.get(parsed.scheme)
    except ValueError:
        return None


def _has_dot_segments(path: str) -> bool:
    return any(part in (".", "..") for part in path.split("/"))


def _clean_url_path(path: str) -> str:
    """The URL path with ``%xx`` decoded; a path with ``.``/``..`` segments matches no prefix."""
    decoded = urllib.parse.unquote(path or "/")
    return "\x00" if _has_dot_segments(decoded) or "\\" in decoded else decoded


def parse_allowed_source(text: str) -> AllowedSource:
    """``https://bundles.example.com/fleet-a/``, ``file:///mnt/usb/bundles`` or ``/mnt/usb/bundles``.

    Raises ValueError with the problem, for the config loader to report with the file and key.
    """
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme in _DEFAULT_PORTS:
        if not parsed.hostname or parsed.username is not None or parsed.password is not None:
            raise ValueError(f"{text!r} needs a host name and no user:password@ part")
        if _port(parsed) is None:
            raise ValueError(f"{text!r} has an invalid port")
        prefix = urllib.parse.unquote(parsed.path or "/")
        if _has_dot_segments(prefix) or parsed.query or parsed.fragment:
            raise ValueError(f"{text!r} must be a plain URL prefix, without '..', query or fragment")
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        return AllowedSource(text, scheme=parsed.scheme, host=parsed.hostname.lower(), port=_port(parsed), path_prefix=prefix)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"{text!r}: file:// URLs name this device's files; use file:///ABSOLUTE/DIR")
        path_text = urllib.parse.unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:
        raise ValueError(f"{text!r} has an unsupported scheme '{parsed.scheme}'; use https://, http://, file:// or a path")
    else:
        path_text = text
    if not path_text.startswith("/") or _has_dot_segments(path_text):
        raise ValueError(f"{text!r} must be an absolute directory path without '.' or '..' parts")
    return AllowedSource(text, directory=Path(os.path.normpath(path_text)))


@dataclass(frozen=True)
class SourcePolicy:
    """Where deploys may fetch bundles from: the inbox directory plus ``bundles.allowed_sources``.

    A refused URL gets one text that depends only on the URL and the config, never on the device's
    files or network: nothing is opened, resolved or fetched before the URL is admitted.
    """

    inbox: Path
    sources: tuple[AllowedSource, ...] = ()

    @classmethod
    def from_config(cls, config: BundlesConfig) -> SourcePolicy:
        return cls(config.inbox_dir, tuple(parse_allowed_source(text) for text in config.allowed_sources))

    def _directories(self) -> list[Path]:
        return [Path(os.path.normpath(self.inbox)), *(s.directory for s in self.sources if s.directory is not None)]

    def refused(self, url: str) -> DeployError:
        servers = [s.text for s in self.sources if s.directory is None]
        return DeployError(
            f"deploy source refused: {url!r} is not under the agent's inbox '{self.inbox}' or a prefix in "
            "bundles.allowed_sources; nothing was read or fetched",
            hint="copy the bundle into the inbox, or add its directory or server to bundles.allowed_sources "
            "in the agent config" + (f" (allowed servers: {', '.join(servers)})" if servers else ""),
        )

    def admit(self, url: str) -> Path | str:
        """The local path or the URL to fetch, or :meth:`refused` when ``url`` is not allowed."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme in _DEFAULT_PORTS:
            if parsed.username is not None or parsed.password is not None or parsed.fragment:
                raise self.refused(url)
            if any(source.admits_url(parsed) for source in self.sources):
                return url
            raise self.refused(url)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise self.refused(url)
            path_text = urllib.parse.unquote(parsed.path)
        elif parsed.scheme and len(parsed.scheme) > 1:
            raise self.refused(url)
        else:
            path_text = url
        if not path_text.startswith("/") or _has_dot_segments(path_text) or "\x00" in path_text:
            raise self.refused(url)
        path = Path(os.path.normpath(path_text))
        for directory in self._directories():
            if path == directory or directory in path.parents:
                real_directory = directory.resolve()
                real = path.resolve()  # a link inside an allowed directory must not lead out of it
                if real == real_directory or real_directory in real.parents:
                    return real
        raise self.refused(url)


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL the policy admits (an allowed server cannot bounce us elsewhere)."""

    def __init__(self, policy: SourcePolicy | None) -> None:
        self._policy = policy

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN201
        if self._policy is not None and not isinstance(self._policy.admit(newurl), str):
            raise self._policy.refused(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# -- fetching -----------------------------------------------------------------------------------------

#: Called with manifest.json's bytes and manifest.sig's (or ``None``) before the bundle is written
#: out: it verifies the signature and whatever else the caller decides from the signed manifest.
ManifestCheck = Callable[[bytes, "bytes | None"], None]


def _read_capped(path: Path, cap: int, *, what: str) -> bytes:
    with path.open("rb") as handle:
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise DeployError(f"{what} is larger than {cap} bytes", hint="this is not a bundle edgekit wrote")
    return data


def fetch_bundle(
    url: str,
    staging: Path,
    *,
    expected_sha256: str | None,
    max_bytes: int,
    timeout_s: float = 60.0,
    policy: SourcePolicy | None = None,
    check_manifest: ManifestCheck | None = None,
    max_seconds: float | None = None,
) -> FetchedBundle:
    """Bring the bundle at ``url`` into ``staging`` (an empty directory) and check its sha256.

    With a ``policy``, a URL it does not admit is refused before anything is touched. A tar is
    scanned (every member checked, :mod:`edgekit_runtime.archive`), ``check_manifest`` runs on its
    manifest and signature, and only then are the files the manifest lists written, each against
    its hash, with at most ``max_bytes`` unpacked. A download taking longer than ``max_seconds`` in all fails.
    """
    started = time.monotonic()
    target = policy.admit(url) if policy is not None else _unchecked_target(url)
    step = _Writing("copying the bundle")
    try:
        return _fetch_into(url, target, staging, expected_sha256=expected_sha256, max_bytes=max_bytes,
                           timeout_s=timeout_s, policy=policy, check_manifest=check_manifest, step=step,
                           started=started, max_seconds=max_seconds)  # fmt: skip
    except OSError as err:
        for partial in list(staging.iterdir()) if staging.is_dir() else []:  # so the message's free figure is true
            if partial.is_dir() and not partial.is_symlink():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
        raise write_error(err, url, staging.parent, what=step.what, needed_bytes=step.needed_bytes) from err


def _fetch_into(url: str, target: Path | str, staging: Path, *, expected_sha256: str | None, max_bytes: int,
                timeout_s: float, policy: SourcePolicy | None, check_manifest: ManifestCheck | None,
                step: _Writing, started: float, max_seconds: float | None = None) -> FetchedBundle:  # fmt: skip
    """:func:`fetch_bundle` once the URL is admitted; ``step`` says what is written (for a full disk)."""
    if isinstance(target, Path) and target.is_dir():
        root = _bundle_root(target, url)
        bundle_dir = staging / "bundle"
        step.what = "copying the bundle directory"
        step.needed_bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        bundle_dir.mkdir()
        _copy_directory(root, bundle_dir, url=url, max_bytes=max_bytes)
        manifest = bundle_dir / MANIFEST_NAME
        if check_manifest is not None:  # on the copy: the source folder may change after it was read
            signature = bundle_dir / SIGNATURE_NAME
            check_manifest(_read_capped(manifest, MANIFEST_MAX_BYTES, what=f"{MANIFEST_NAME} of {url}"),
                           _read_capped(signature, SIGNATURE_MAX_BYTES, what=f"{SIGNATURE_NAME} of {url}") if signature.is_file() else None)  # fmt: skip
        sha256 = hashlib.sha256(manifest.read_bytes()).hexdigest()
        _check_sha256(sha256, expected_sha256, what=f"{MANIFEST_NAME} of {url}")
        size = sum(p.stat().st_size for p in bundle_dir.rglob("*") if p.is_file())
        return FetchedBundle(bundle_dir, "directory", size, sha256, time.monotonic() - started)
    archive_path = staging / "bundle.tar"
    if isinstance(target, Path):
        if not target.is_file():
            raise DeployError(f"bundle {url} does not exist on this device", hint="check the deploy command's url")
        step.what, step.needed_bytes = "copying the bundle tar", target.stat().st_size
        size, sha256 = _copy_file(target, archive_path, url=url, max_bytes=max_bytes)
    else:
        declared: list[int] = []
        step.what = "downloading the bundle tar"
        try:
            size, sha256 = _download(target, archive_path, max_bytes=max_bytes, timeout_s=timeout_s, policy=policy,
                                     declared_bytes=declared, max_seconds=max_seconds)  # fmt: skip
        finally:
            step.needed_bytes = declared[0] if declared else None
    _check_sha256(sha256, expected_sha256, what=url)
    limits = ArchiveLimits(max_unpacked_bytes=max_bytes)
    archive = scan_bundle_archive(archive_path, limits, where=url)
    if check_manifest is not None:
        check_manifest(archive.manifest_bytes, archive.signature_bytes)
    what = f"unpacking the bundle beside its {size:,}-byte tar"
    free = _free_bytes(staging)
    if free is not None and archive.unpacked_bytes > free:  # refused before a byte of it is written
        error = disk_full_error(url, staging.parent, what=what, needed_bytes=archive.unpacked_bytes)  # free beside the tar
        archive_path.unlink()
        raise error
    step.what, step.needed_bytes = what, archive.unpacked_bytes
    unpacked = staging / "unpacked"
    unpacked.mkdir()
    try:
        bundle_dir = extract_bundle_archive(archive, unpacked, limits)
    except UnsafeArchiveError as err:  # the archive reader reports every OSError as an unreadable tar
        cause = err.__cause__
        if isinstance(cause, OSError) and cause.errno in DISK_FULL_ERRNOS:
            raise cause from None  # the disk filled as the files were written (blocks round sizes up): say so
        raise
    archive_path.unlink()
    logger.info("fetched %s (%d bytes) into %s", url, size, bundle_dir)
    return FetchedBundle(bundle_dir, "tar", size, sha256, time.monotonic() - started)


def _unchecked_target(url: str) -> Path | str:
    """Without a policy (``edgekit-agent install`` by the device's operator): any path or URL."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in _DEFAULT_PORTS:
        return url
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:
        raise DeployError(f"bundle url {url!r} has an unsupported scheme '{parsed.scheme}'", hint="use http(s)://, file:// or a path")
    return Path(url)
