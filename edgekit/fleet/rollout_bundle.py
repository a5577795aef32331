"""What a deploy command says about a bundle (id, URL, sha256, size), and the checks made on the host
before any device sees it.

The agent's contract (``command.v1`` and :mod:`edgekit_runtime.agent.fetch`): ``sha256`` is the hash
of the tar made by ``edgekit pack`` or, for a bundle directory reached through a ``file://`` URL,
the hash of its ``manifest.json``. The bundle must be signed (``manifest.sig``, from ``edgekit
sign``); the signature travels inside the bundle, where the agent checks it against the fleet key.

:func:`prepare_bundle` checks what the agent will check, so that a bundle the devices would refuse
never goes out: a tar is read by the agent's own checker (:mod:`edgekit_runtime.archive`: member
kinds, paths and limits, only listed files, each against its sha256), a directory by
:func:`edgekit_runtime.bundle.verify_files` (modified, missing and unlisted files), and the
signature over ``manifest.json`` under the fleet key (required unless ``skip_signature_check``).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.fleet.errors import FleetError
from edgekit_runtime.agent.store import version_name
from edgekit_runtime.bundle import MANIFEST_NAME, SIGNATURE_NAME, check_bundle_name, parse_manifest_json, verify_files
from edgekit_runtime.errors import BundleError
from edgekit_runtime.signing import decode_signature


class RolloutError(FleetError):
    """A rollout cannot start or go on (see the subclasses)."""


class BundleNotSignedError(RolloutError):
    """The bundle has no ``manifest.sig``: agents refuse unsigned bundles."""


class BundleArtifactError(RolloutError):
    """The bundle path is not a bundle directory or a tar from ``edgekit pack``."""


class BundleVerificationError(RolloutError):
    """A file of the bundle does not match its sha256 in ``manifest.json`` (or is missing, unlisted, or
    the tar holds something a device would refuse): the bundle is not published."""


class SignatureKeyMissingError(RolloutError):
    """No fleet key to check the bundle's signature with, and the check was not skipped explicitly."""


@dataclass(frozen=True)
class BundleArtifact:
    """A signed, verified bundle ready to be named in deploy commands."""

    path: Path
    bundle_id: str
    name: str
    target: str | None
    url: str
    sha256: str
    size_bytes: int
    manifest_sha256: str
    signature_b64: str
    signed_by: str | None  # key fingerprint, when a key was given to check the signature
    bundle_version: int | None = None
    files_verified: int = 0  # how many files were checked against their sha256 here
    #: the URL is the file:// of the path given, neither --inbox nor --url-base nor --file-url: agents with default
    #: settings refuse it (:func:`refuse_file_url_for_agents` stops the rollout before it sends anything)
    own_file_url: bool = False

    def deploy_args(self, *, allow_downgrade: bool = False, allow_signature_change: bool = False) -> dict[str, Any]:
        """``args`` of a ``command.v1`` deploy (the signature is in the bundle). The two flags are sent
        only when set, so agents that predate them keep accepting the command."""
        args: dict[str, Any] = {"bundle_id": self.bundle_id, "url": self.url, "sha256": self.sha256, "size_bytes": self.size_bytes}
        if allow_downgrade:
            args["allow_downgrade"] = True
        if allow_signature_change:
            args["allow_signature_change"] = True
        return args


def _directory_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _verified_contents(path: Path) -> tuple[bytes, bytes | None, int]:
    """(manifest.json bytes, manifest.sig bytes or None, number of files checked) of a bundle directory
    or tar, after checking every file against its sha256 the way the agent does."""
    from edgekit.bundle.pack import opened_bundle_path

    what = "tar" if path.is_file() else "bundle directory"
    try:
        with opened_bundle_path(path) as root:
            manifest_file = root / MANIFEST_NAME
            if not manifest_file.is_file():
                raise BundleArtifactError(f"{path} has no {MANIFEST_NAME}: not a bundle directory",
                                          hint="pass the directory `edgekit build` wrote or the .tar from `edgekit pack`")  # fmt: skip
            manifest_bytes = manifest_file.read_bytes()
            signature_file = root / SIGNATURE_NAME
            signature_bytes = signature_file.read_bytes() if signature_file.is_file() else None
            try:  # bounded size and nesting, a JSON object
                manifest = parse_manifest_json(manifest_bytes, f"{path}: {MANIFEST_NAME}")
            except BundleError as err:
                raise BundleArtifactError(err.message, hint=err.hint or "rebuild the bundle") from err
            verify_files(root, manifest)
            return manifest_bytes, signature_bytes, len(manifest.get("files") or {})
    except BundleArtifactError:
        raise
    except BundleError as err:  # UnsafeArchiveError (a tar member), or verify_files (a directory)
        raise BundleVerificationError(
            f"refusing to publish {what} {path}: {err.message}",
            hint="nothing was sent to any device. Rebuild the bundle (or restore the changed files), sign it with "
            "`edgekit sign`, pack it with `edgekit pack` and deploy the new tar",
        ) from err


def prepare_bundle(path: str | Path, *, url_base: str | None = None, key: str | Path | None = None,
                   bundle_id: str | None = None, skip_signature_check: bool = False,
                   inbox: str | Path | None = None, file_url: bool = False) -> BundleArtifact:  # fmt: skip
    """Read a bundle directory or packed tar, verify it, and work out what its deploy commands carry.

    Every file is checked against its sha256 in ``manifest.json`` (a tar by the agent's own archive
    checker), and the signature over ``manifest.json`` with ``key``, the fleet's private or public PEM
    key. Without a key the deploy is refused (:class:`SignatureKeyMissingError`) unless
    ``skip_signature_check``; the devices check the signature again in any case.

    The URL: ``<url_base>/<tar name>`` with ``url_base`` (``https://host/bundles``; needs a tar); with
    ``inbox``, a directory the agents accept deploys from (their ``bundles.inbox`` or a directory in
    ``bundles.allowed_sources``), the tar is copied there and its ``file://`` URL is used; otherwise the
    ``file://`` URL of ``path`` itself, which agents accept only when its directory is an allowed
    source (simulated devices accept any; ``file_url`` says the agents' ``bundles.allowed_sources`` list it, else
    :func:`refuse_file_url_for_agents` keeps it from real agents). ``bundle_id`` defaults to ``<manifest name>-<12
    hex of its sha256>``.
    """
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise BundleArtifactError(f"bundle {path} does not exist", hint="pass the directory `edgekit build` wrote or the .tar from `edgekit pack`")
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            raise BundleArtifactError(f"{path} has no {MANIFEST_NAME}: not a bundle directory", hint="pass the directory `edgekit build` wrote")
        for option, value in (("--url-base", url_base), ("--inbox", inbox)):
            if value:
                raise BundleArtifactError(f"{option} needs a packed bundle, but {path} is a directory",
                                          hint=f"run `edgekit pack {path}` and deploy the .tar it writes")  # fmt: skip
    if url_base and inbox:
        raise BundleArtifactError("give either --url-base or --inbox, not both",
                                  hint="--url-base for devices that download over HTTP(S), --inbox for a directory they read")  # fmt: skip
    manifest_bytes, signature_bytes, files_verified = _verified_contents(path)
    try:  # a safe name: it becomes the bundle id devices store
        manifest = parse_manifest_json(manifest_bytes, f"{path}: {MANIFEST_NAME}")
        name = check_bundle_name(manifest.get("name"), f"{path}: {MANIFEST_NAME}")
    except BundleError as err:
        raise BundleArtifactError(err.message, hint=err.hint or "rebuild the bundle") from err
    if signature_bytes is None:
        raise BundleNotSignedError(
            f"bundle {path} is not signed (no {SIGNATURE_NAME}); agents accept only bundles signed with the fleet key",
            hint="sign it with `edgekit sign BUNDLE_DIR --key fleet.key.pem` (then `edgekit pack` it again) before deploying",
        )
    if key is None and not skip_signature_check:
        raise SignatureKeyMissingError(
            f"no fleet key to check the signature of {path} with before it is published",
            hint="pass --key fleet.pub.pem (the fleet's public key; the private one works too, and so does "
            "--sign-commands fleet.key.pem); --skip-signature-check leaves the check to the devices alone",
        )
    signature = decode_signature(signature_bytes, where=f"{path}: {SIGNATURE_NAME}")
    signed_by = _check_signature(path, manifest_bytes, signature, key) if key is not None else None
    if path.is_dir():
        sha256, size_bytes = hashlib.sha256(manifest_bytes).hexdigest(), _directory_size(path)
    else:
        sha256, size_bytes = _sha256_file(path), path.stat().st_size
    published = _copy_to_inbox(path, Path(inbox), sha256) if inbox else path
    url = f"{url_base.rstrip('/')}/{path.name}" if url_base else published.as_uri()
    manifest_sha256 = hashlib.sha256(manifest_bytes).hexdigest()
    target = manifest.get("target", {}).get("name") if isinstance(manifest.get("target"), dict) else None
    version = manifest.get("bundle_version")
    return BundleArtifact(path=published, bundle_id=bundle_id or version_name(name, manifest_sha256), name=name,
                          target=target if isinstance(target, str) else None, url=url, sha256=sha256,
                          size_bytes=max(1, size_bytes), manifest_sha256=manifest_sha256,
                          signature_b64=base64.b64encode(signature).decode("ascii"), signed_by=signed_by,
                          bundle_version=version if isinstance(version, int) and not isinstance(version, bool) else None,
                          files_verified=files_verified, own_file_url=not (url_base or inbox or file_url))  # fmt: skip


#: The agent_version simulated devices report (edgekit.fleet.sim.device.SIM_AGENT_VERSION is ``sim-1``).
SIMULATED_AGENT_PREFIX = "sim-"


def refuse_file_url_for_agents(artifacts: list[BundleArtifact] | tuple[BundleArtifact, ...], devices: list[tuple[str, str]],
                               agent_versions: dict[tuple[str, str], str | None]) -> None:  # fmt: skip
    """Raise :class:`BundleSourceError` before anything is sent when a bundle would go by its own ``file://`` URL to
    (fleet, device)s that are not simulated: an agent with default settings takes bundles only from its inbox and
    ``bundles.allowed_sources``, so it would refuse the deploy (issue 32 item 6)."""
    local = [a for a in artifacts if a.own_file_url]
    agents = [d for d in devices if not str(agent_versions.get(d) or "").startswith(SIMULATED_AGENT_PREFIX)]
    if not local or not agents:
        return
    named = ", ".join(f"{device} (agent {agent_versions.get((fleet, device)) or 'version unknown'})" for fleet, device in agents[:5])
    more = f" and {len(agents) - 5} more" if len(agents) > 5 else ""
    folder = local[0].path.parent if local[0].path.is_file() else local[0].path
    raise BundleSourceError(
        f"{len(agents)} selected device(s) run a real agent: {named}{more}. An agent takes bundles only from its inbox "
        f"and bundles.allowed_sources, so it would refuse {local[0].url}; nothing was sent",
        hint="pass --inbox DIR to copy the tar where the agents read it (their bundles.inbox, default <bundles.dir>/inbox, "
        "on this host or a shared mount), --url-base URL for an HTTP(S) server listed in their bundles.allowed_sources, "
        f"or --file-url if their bundles.allowed_sources list {folder}",
    )


class BundleSourceError(RolloutError):
    """The deploy's URL is one the selected agents would refuse (their inbox and allowed sources do not hold it)."""


def _copy_to_inbox(tar: Path, inbox: Path, sha256: str) -> Path:
    """Copy ``tar`` into ``inbox`` (atomically, by rename) and return the copy, checked against ``sha256``."""
    inbox = inbox.expanduser().resolve()
    if not inbox.is_dir():
        raise BundleArtifactError(f"--inbox {inbox} is not a directory",
                                  hint="create it, or pass the directory the agents' bundles.inbox / allowed_sources name")  # fmt: skip
    destination = inbox / tar.name
    if destination == tar:
        return tar
    with tempfile.NamedTemporaryFile(dir=inbox, prefix=f".{tar.name}.", suffix=".partial", delete=False) as handle:
        partial = Path(handle.name)
        with tar.open("rb") as source:
            shutil.copyfileobj(source, handle, 1 << 20)
    if _sha256_file(partial) != sha256:
        partial.unlink(missing_ok=True)
        raise BundleArtifactError(f"the copy of {tar} in {inbox} does not match the original",
                                  hint="check the disk and try again")  # fmt: skip
    partial.chmod(0o644)
    partial.replace(destination)
    return destination


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_signature(path: Path, manifest_bytes: bytes, signature: bytes, key: str | Path) -> str:
    """Verify ``signature`` over the manifest with the fleet key (a private key's public half works too)."""
    from cryptography.exceptions import InvalidSignature

    from edgekit_runtime.signing import BundleSignatureError, SigningKeyError, load_private_key, load_public_key, public_key_fingerprint

    try:
        public_key = load_public_key(key)
    except SigningKeyError:
        public_key = load_private_key(key).public_key()
    fingerprint = public_key_fingerprint(public_key)
    try:
        public_key.verify(signature, manifest_bytes)
    except InvalidSignature as err:
        raise BundleSignatureError(
            f"bundle {path}: {SIGNATURE_NAME} does not match {MANIFEST_NAME} under key {fingerprint} ({key})",
            hint="the bundle was signed with another key or changed after signing; sign it again with the fleet key",
        ) from err
    return fingerprint
