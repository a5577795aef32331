"""Opening bundle tar files safely: one checker for the agent and for ``edgekit inspect``.

A tar from outside is hostile until proven otherwise. It is read member by member, as a stream,
in two passes:

1. :func:`scan_bundle_archive` reads only the member headers, plus ``manifest.json`` and
   ``manifest.sig`` into memory (small, capped). Every member must be a regular file or a
   directory with a relative path that stays inside the bundle (no ``/...``, no ``..``, no links,
   devices or FIFOs, no name twice, at most :data:`MAX_MEMBER_DEPTH` parts); the members, the
   unpacked bytes and the compression ratio are limited (:class:`ArchiveLimits`). The caller can
   now check the manifest's signature before anything large is written.
2. :func:`extract_bundle_archive` reads the tar again and writes only the members the manifest
   lists, hashing each on the way: a member that is unlisted, or whose bytes differ from its sha256
   in ``manifest.json``, stops the extraction at that member. Folder entries are never created: the
   only folders written are the parents of the files written (a signed tar with thousands of extra
   folders installs nothing the signature does not cover).

The uncompressed stream itself is bounded, not only the sizes the headers declare, so a gzip bomb
or a huge extended header stops at the limit instead of filling memory or disk. Every problem
raises :class:`UnsafeArchiveError` naming the archive, the member and the limit.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from edgekit_runtime.errors import BundleError

MANIFEST_MEMBER = "manifest.json"
SIGNATURE_MEMBER = "manifest.sig"
MANIFEST_MAX_BYTES = 16 << 20
SIGNATURE_MAX_BYTES = 4096
#: One read tarfile makes for a header (a pax header or GNU long name is read whole): above this it is hostile.
HEADER_MAX_BYTES = 1 << 20
#: The compression ratio is checked once this much has been decompressed (small archives compress well).
RATIO_FLOOR_BYTES = 4 << 20
#: The most path parts a member name may have (the top folder counts): deeper is hostile (a folder bomb).
MAX_MEMBER_DEPTH = 32
_CHUNK_BYTES = 1 << 20
_MEMBER_OVERHEAD_BYTES = 1536  # a header block plus padding, per member, in the uncompressed stream
_TRAILER_BYTES = 64 << 10  # end-of-archive blocks and record padding
_KINDS = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
    tarfile.GNUTYPE_SPARSE: "sparse file",
}


class UnsafeArchiveError(BundleError):
    """A bundle tar is unreadable, hostile (links, devices, paths outside it) or over a limit."""


@dataclass(frozen=True)
class ArchiveLimits:
    """What a bundle tar may hold: ``max_unpacked_bytes`` of file data in ``max_members`` members,
    compressed at most ``max_ratio`` : 1 (checked past :data:`RATIO_FLOOR_BYTES`)."""

    max_unpacked_bytes: int
    max_members: int = 10_000
    max_ratio: float = 50.0

    @property
    def max_stream_bytes(self) -> int:
        """The most uncompressed tar bytes (data, headers, padding) read before giving up."""
        return self.max_unpacked_bytes + self.max_members * _MEMBER_OVERHEAD_BYTES + _TRAILER_BYTES


@dataclass(frozen=True)
class ArchiveMember:
    """One member: ``path`` inside the bundle (``''`` for its top folder), its name in the tar, and size."""

    path: str
    tar_name: str
    size: int
    is_dir: bool


@dataclass(frozen=True)
class BundleArchive:
    """What :func:`scan_bundle_archive` found: the members, and the manifest and signature bytes."""

    path: Path
    where: str
    top: str | None
    members: tuple[ArchiveMember, ...]
    manifest_bytes: bytes
    signature_bytes: bytes | None
    unpacked_bytes: int
    compression: str

    def manifest(self) -> dict[str, Any]:
        """``manifest.json`` parsed (its keys are checked later by :func:`~edgekit_runtime.bundle.read_manifest`),
        with bounded nesting (:func:`~edgekit_runtime.bundle.parse_manifest_json`)."""
        from edgekit_runtime.bundle import parse_manifest_json

        try:
            return parse_manifest_json(self.manifest_bytes, f"{self.where}: {self._manifest_name}")
        except BundleError as err:
            raise UnsafeArchiveError(
                err.message, hint="the archive is damaged or was not made by `edgekit pack`; pack the bundle again"
            ) from err

    @property
    def _manifest_name(self) -> str:
        return f"{self.top}/{MANIFEST_MEMBER}" if self.top else MANIFEST_MEMBER


# -- the bounded stream --------------------------------------------------------------------------------


class _CountingReader(io.RawIOBase):
    """The archive file, counting the (compressed) bytes read from it."""

    def __init__(self, handle: io.BufferedIOBase) -> None:
        self._handle = handle
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:  # a decompressor rewinding (never in one pass)
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def readinto(self, buffer: Any) -> int:
        count = self._handle.readinto(buffer)
        self.consumed += count or 0
        return count or 0


class _BoundedStream(io.RawIOBase):
    """The uncompressed tar stream handed to :mod:`tarfile`; refuses to go past the limits.

    tarfile reads headers with one ``read`` each (a pax header or GNU long name whole), skips
    member data with ``seek`` and reads data through ``extractfile`` in chunks. Forward seeks in a
    compressed stream decompress through :meth:`read`, so nothing gets around the count.
    """

    def __init__(self, inner: io.BufferedIOBase, counter: _CountingReader | None, limits: ArchiveLimits, where: str) -> None:
        self._inner = inner
        self._counter = counter
        self._limits = limits
        self._where = where
        self._position = 0
        self.member = "(the first header)"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def _check(self, position: int) -> None:
        limit = self._limits.max_stream_bytes
        if position > limit:
            raise UnsafeArchiveError(
                f"{self._where}: the tar unpacks to more than {limit} bytes at member '{self.member}' "
                f"(limit {self._limits.max_unpacked_bytes} bytes of files, {self._limits.max_members} members)",
                hint="a bundle this large is refused; raise the unpacked-size limit only if the bundle really is that big",
            )

    def _check_ratio(self) -> None:
        """After a read: the bytes decompressed so far against the compressed bytes they came from."""
        if self._counter is not None and self._position > RATIO_FLOOR_BYTES:
            ratio = self._position / max(self._counter.consumed, 1)
            if ratio > self._limits.max_ratio:
                raise UnsafeArchiveError(
                    f"{self._where}: compression ratio {ratio:.0f}:1 at member '{self.member}' is above the limit of "
                    f"{self._limits.max_ratio:g}:1 (a decompression bomb?)",
                    hint="bundles of model weights compress little; ship the .tar `edgekit pack` writes",
                )

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > max(HEADER_MAX_BYTES, _CHUNK_BYTES):
            raise UnsafeArchiveError(
                f"{self._where}: a tar header of {size} bytes after member '{self.member}' is larger than "
                f"{HEADER_MAX_BYTES} bytes",
                hint="bundles have short member names and no large extended headers; the archive is hostile or damaged",
            )
        self._check(self._position + size)
        data = self._inner.read(size)
        self._position += len(data)
        self._check_ratio()
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._position + offset}.get(whence)
        if target is None or target < 0:
            raise UnsafeArchiveError(f"{self._where}: unsupported seek in the tar stream (whence {whence})")
        self._check(target)
        if target == self._position:
            return target
        if target < self._position or self._counter is None:  # plain tar, or going back: the file seeks itself
            self._inner.seek(target)
            self._position = target
            return target
        while self._position < target:
            if not self.read(min(_CHUNK_BYTES, target - self._position)):
                break  # past the end: tarfile reports "unexpected end of data" itself
        return self._position


def _open_stream(handle: io.BufferedIOBase, limits: ArchiveLimits, where: str) -> tuple[_BoundedStream, str]:
    magic = handle.read(6)
    handle.seek(0)
    counter = _CountingReader(handle)
    inner: io.BufferedIOBase
    if magic.startswith(b"\x1f\x8b"):
        kind, inner = "gzip", gzip.GzipFile(fileobj=io.BufferedReader(counter), mode="rb")
    elif magic.startswith(b"BZh"):
        kind, inner = "bzip2", bz2.BZ2File(io.BufferedReader(counter), mode="rb")
    elif magic.startswith(b"\xfd7zXZ\x00"):
        kind, inner = "xz", lzma.LZMAFile(io.BufferedReader(counter), mode="rb")
    else:
        return _BoundedStream(handle, None, limits, where), "none"
    return _BoundedStream(inner, counter, limits, where), kind


_READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError)


def _unreadable(where: str, err: BaseException, member: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"{where}: not a complete, readable tar (at member '{member}'): {err}",
        hint="the file is truncated or damaged; copy it again, or pack the bundle again with `edgekit pack`",
    )


# -- member checks -------------------------------------------------------------------------------------


def _member_path(info: tarfile.TarInfo, where: str) -> str:
    name = info.name
    if not name or "\x00" in name or "\\" in name or name.startswith("/") or PurePosixPath(name).is_absolute():
        raise UnsafeArchiveError(
            f"{where}: member '{name}' has an absolute or '..' path (it would be written outside the bundle)",
            hint="refusing the whole archive; bundle members are relative paths inside one folder",
        )
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(
            f"{where}: member '{name}' has an absolute or '..' path (it climbs out of the bundle)",
            hint="refusing the whole archive; bundle members are relative paths inside one folder",
        )
    if len(parts) > MAX_MEMBER_DEPTH:
        raise UnsafeArchiveError(
            f"{where}: member '{name if len(name) <= 120 else name[:120] + '...'}' is {len(parts)} folders deep, deeper than the limit of "
            f"{MAX_MEMBER_DEPTH} (MAX_MEMBER_DEPTH)",
            hint="refusing the whole archive; bundle files lie a few folders deep at most: pack it again with `edgekit pack`",
        )
    return "/".join(parts)


def _check_kind(info: tarfile.TarInfo, where: str) -> None:
    if info.isdir() or (info.isreg() and not info.issparse()):
        return
    kind = _KINDS.get(info.type, f"special member of type {info.type!r}")
    target = f" to '{info.linkname}'" if info.issym() or info.islnk() else ""
    raise UnsafeArchiveError(
        f"{where}: member '{info.name}' is a link or special file ({kind}{target})",
        hint="bundles hold only regular files and directories; pack the bundle directory with `edgekit pack`",
    )


class _Walk:
    """Member-by-member checks shared by both passes."""

    def __init__(self, limits: ArchiveLimits, where: str) -> None:
        self.limits = limits
        self.where = where
        self.seen: set[str] = set()
        self.total = 0
        self.count = 0

    def check(self, info: tarfile.TarInfo) -> str:
        self.count += 1
        if self.count > self.limits.max_members:
            raise UnsafeArchiveError(
                f"{self.where}: more than {self.limits.max_members} members (at member '{info.name}')",
                hint="a bundle holds a model, its golden files and a report: a few dozen files",
            )
        path = _member_path(info, self.where)
        _check_kind(info, self.where)
        if path in self.seen:
            raise UnsafeArchiveError(
                f"{self.where}: member '{info.name}' appears twice (a later copy would silently replace the first)",
                hint="pack the bundle directory again with `edgekit pack`",
            )
        self.seen.add(path)
        if info.isreg():
            self.total += info.size
            if self.total > self.limits.max_unpacked_bytes:
                raise UnsafeArchiveError(
                    f"{self.where}: member '{info.name}' ({info.size} bytes) makes the unpacked bundle "
                    f"larger than the limit of {self.limits.max_unpacked_bytes} bytes",
                    hint="a bundle this large is refused; raise the unpacked-size limit only if the bundle really is that big",
                )
        return path


def _read_small(tar: tarfile.TarFile, info: tarfile.TarInfo, cap: int, where: str) -> bytes:
    if info.size > cap:
        raise UnsafeArchiveError(f"{where}: member '{info.name}' is {info.size} bytes; at most {cap} are expected there")
    handle = tar.extractfile(info)
    if handle is None:
        return b""
    chunks = []
    while chunk := handle.read(_CHUNK_BYTES):
        chunks.append(chunk)
    return b"".join(chunks)


def _split_top(paths: list[str], where: str) -> tuple[str | None, str]:
    """The folder that holds manifest.json: the archive's top, or its single top folder."""
    manifests = [p for p in paths if p == MANIFEST_MEMBER or (p.count("/") == 1 and p.endswith("/" + MANIFEST_MEMBER))]
    hint = "ship the tar `edgekit pack` makes: one folder holding manifest.json and the files it lists"
    if not manifests:
        raise UnsafeArchiveError(f"{where} has no {MANIFEST_MEMBER} at its top or in a single top folder", hint=hint)
    if len(manifests) > 1:
        raise UnsafeArchiveError(f"{where} holds {len(manifests)} manifests ({', '.join(manifests)}); expected one bundle", hint=hint)
    top = None if manifests[0] == MANIFEST_MEMBER else manifests[0].split("/", 1)[0]
    if top is not None:
        outside = [p for p in paths if p != top and not p.startswith(top + "/")]
        if outside:
            raise UnsafeArchiveError(f"{where}: member '{outside[0]}' lies outside the bundle folder '{top}/'", hint=hint)
    return top, manifests[0]


# -- the two passes ------------------------------------------------------------------------------------


def scan_bundle_archive(path: str | os.PathLike[str], limits: ArchiveLimits, *, where: str | None = None) -> BundleArchive:
    """Check every member header of the bundle tar at ``path`` and read its manifest and signature."""
    path = Path(path)
    where = where or str(path)
    walk = _Walk(limits, where)
    members: list[tuple[str, tarfile.TarInfo]] = []
    small: dict[str, bytes] = {}
    try:
        with path.open("rb") as handle:
            stream, compression = _open_stream(handle, limits, where)
            with tarfile.open(fileobj=stream, mode="r:") as tar:
                while True:
                    info = tar.next()
                    if info is None:
                        break
                    stream.member = info.name
                    member_path = walk.check(info)
                    members.append((member_path, info))
                    base = member_path.rsplit("/", 1)[-1]
                    if info.isreg() and base in (MANIFEST_MEMBER, SIGNATURE_MEMBER) and member_path.count("/") <= 1:
                        cap = MANIFEST_MAX_BYTES if base == MANIFEST_MEMBER else SIGNATURE_MAX_BYTES
                        small[member_path] = _read_small(tar, info, cap, where)
    except UnsafeArchiveError:
        raise
    except _READ_ERRORS as err:
        raise _unreadable(where, err, members[-1][1].name if members else "(the first header)") from err
    paths = [member_path for member_path, _ in members]
    top, manifest_path = _split_top(paths, where)
    if manifest_path not in small:  # a folder, link or device named manifest.json
        raise UnsafeArchiveError(f"{where}: member '{manifest_path}' is not a regular file",
                                 hint="ship the tar `edgekit pack` makes: its manifest.json is a plain file")  # fmt: skip
    prefix = "" if top is None else top + "/"
    signature_path = prefix + SIGNATURE_MEMBER
    listed = tuple(
        ArchiveMember(path=p[len(prefix):] if p != top else "", tar_name=info.name, size=info.size, is_dir=info.isdir())
        for p, info in members
    )  # fmt: skip
    return BundleArchive(
        path=path, where=where, top=top, members=listed, manifest_bytes=small[manifest_path],
        signature_bytes=small.get(signature_path), unpacked_bytes=walk.total, compression=compression,
    )  # fmt: skip


def _listed_files(archive: BundleArchive, manifest: Mapping[str, Any]) -> dict[str, str]:
    files = manifest.get("files")
    if not isinstance(files, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise UnsafeArchiveError(
            f"{archive.where}: {archive._manifest_name} has no 'files' object mapping paths to sha256 hashes",
            hint="see docs/bundle-format.md; rebuild the bundle",
        )
    return {str(k): str(v).lower() for k, v in files.items()}


def _write_member(tar: tarfile.TarFile, info: tarfile.TarInfo, target: Path, expected: str | None, where: str) -> None:
    source = tar.extractfile(info)
    if source is None:
        raise UnsafeArchiveError(f"{where}: member '{info.name}' cannot be read")
    digest = hashlib.sha256()
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(descriptor, "wb") as out:
        while chunk := source.read(_CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
    if expected is not None and digest.hexdigest() != expected:
        target.unlink(missing_ok=True)
        raise UnsafeArchiveError(
            f"{where}: member '{info.name}' does not match its sha256 in manifest.json "
            f"(expected {expected[:12]}..., got {digest.hexdigest()[:12]}...)",
            hint="the bundle was changed after it was built, or the archive is damaged: pack it again",
        )


def extract_bundle_archive(
    archive: BundleArchive, destination: str | os.PathLike[str], limits: ArchiveLimits, *, only_listed: bool = True
) -> Path:
    """Write the bundle of a scanned ``archive`` into ``destination`` (an empty directory); returns
    the bundle directory. With ``only_listed`` (the default) only ``manifest.json``, ``manifest.sig``
    and the files ``manifest.json`` lists are written, each checked against its sha256 as it is
    written; anything else in the tar refuses the archive. Folder entries are skipped: a folder is
    made only to hold a file that is written."""
    destination = Path(destination)
    where = archive.where
    files = _listed_files(archive, archive.manifest()) if only_listed else None
    expected_manifest = hashlib.sha256(archive.manifest_bytes).digest()
    root = destination / archive.top if archive.top else destination
    root.mkdir(parents=True, exist_ok=True)
    prefix = "" if archive.top is None else archive.top + "/"
    walk = _Walk(limits, where)
    last = "(the first header)"
    try:
        with archive.path.open("rb") as handle:
            stream, _ = _open_stream(handle, limits, where)
            with tarfile.open(fileobj=stream, mode="r:") as tar:
                while True:
                    info = tar.next()
                    if info is None:
                        break
                    stream.member = last = info.name
                    member_path = walk.check(info)
                    if member_path == archive.top:
                        continue
                    if prefix and not member_path.startswith(prefix):
                        raise UnsafeArchiveError(f"{where}: member '{info.name}' lies outside the bundle folder '{prefix}'")
                    relative = member_path[len(prefix):]
                    target = root.joinpath(*relative.split("/"))
                    if info.isdir():  # never made from the tar: only the folders that hold written files exist
                        continue
                    if relative == MANIFEST_MEMBER:
                        data = _read_small(tar, info, MANIFEST_MAX_BYTES, where)
                        if hashlib.sha256(data).digest() != expected_manifest:
                            raise UnsafeArchiveError(f"{where}: '{info.name}' changed while the archive was being read")
                        target.write_bytes(data)
                        continue
                    if relative == SIGNATURE_MEMBER:
                        target.write_bytes(_read_small(tar, info, SIGNATURE_MAX_BYTES, where))
                        continue
                    if files is not None and relative not in files:
                        raise UnsafeArchiveError(
                            f"{where}: member '{info.name}' is not listed in manifest.json files",
                            hint="a bundle holds only the files its manifest lists with their hashes; pack it again with `edgekit pack`",
                        )
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _write_member(tar, info, target, None if files is None else files[relative], where)
    except UnsafeArchiveError:
        raise
    except _READ_ERRORS as err:
        raise _unreadable(where, err, last) from err
    return root
