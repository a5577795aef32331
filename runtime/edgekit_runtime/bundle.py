"""Reading, verifying and self-checking edgekit bundles (layout: ``docs/bundle-format.md``).

``open_bundle(root)`` reads ``manifest.json``, checks the keys the runtime relies on and verifies the
SHA-256 of every file the manifest lists (and that nothing else lies in the bundle).
``self_check(bundle, runner)`` runs the golden inputs and compares the results with the golden
outputs under the manifest's tolerances.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit_runtime.errors import BundleError, InputSignatureError
from edgekit_runtime.golden import (
    GoldenTolerances,
    OutputCheck,
    StateCarrier,
    StatePair,
    compare_output,
    merge_checks,
    parse_golden_state,
    parse_tolerances,
)
from edgekit_runtime.hashing import sha256_file
from edgekit_runtime.signature import IOSignature

if TYPE_CHECKING:
    from edgekit_runtime.backends.base import Runner

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
#: The Ed25519 signature over manifest.json (``edgekit_runtime.signing``); the one file not in ``files``.
SIGNATURE_NAME = "manifest.sig"
SUPPORTED_SCHEMA_VERSIONS = (1,)
HASH_PREFIX_CHARS = 12
_SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
#: The largest manifest.json read (edgekit writes a few KB; ``archive.MANIFEST_MAX_BYTES`` is the same).
MAX_MANIFEST_BYTES = 16 << 20
#: The deepest nesting of arrays and objects in a manifest (edgekit writes about 6 levels).
MAX_MANIFEST_DEPTH = 32
#: A bundle name becomes a folder name (the packed tar's top folder, output folders): one safe path component.
BUNDLE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# -- manifest ---------------------------------------------------------------------------------------


def check_bundle_name(name: object, where: str) -> str:
    """``name`` if it is a safe bundle name (1-128 of letters, digits, '.', '_', '-', not starting with
    '.' or '-'), else :class:`BundleError`: no '/', '..', NUL or absolute path can reach a file name."""
    if not isinstance(name, str) or not BUNDLE_NAME_PATTERN.match(name):
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise BundleError(
            f"'{where}': name {shown} is not a safe bundle name (it becomes a folder and tar member name)",
            hint="a bundle name is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit; "
            "the manifest was tampered with or hand-edited: rebuild the bundle",
        )
    return name


def parse_manifest_json(data: bytes | str, where: str) -> dict[str, Any]:
    """Parse untrusted manifest JSON: at most :data:`MAX_MANIFEST_BYTES` and :data:`MAX_MANIFEST_DEPTH`
    levels of nesting, both checked before ``json.loads`` runs (never a ``RecursionError``), UTF-8,
    one JSON object. Anything else is a :class:`BundleError` naming ``where``."""
    from edgekit_runtime.agent.wire import JsonLimitError, loads_limited

    try:
        manifest = loads_limited(data, what=f"'{where}'", max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_MANIFEST_DEPTH)
    except JsonLimitError as err:
        raise BundleError(
            err.message,
            hint="the file is truncated, hand-edited or hostile: copy the bundle again or rebuild it with `edgekit build`",
        ) from None
    if not isinstance(manifest, dict):
        raise BundleError(f"'{where}' must hold a JSON object, got {type(manifest).__name__}")
    return manifest



def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Load ``<root>/manifest.json`` and check the keys the runtime relies on.

    A missing directory or file, invalid JSON, an unsupported ``schema_version`` or a malformed
    section raises :class:`BundleError` naming the file and the fix.
    """
    root = Path(root)
    manifest_path = root / MANIFEST_NAME
    if not root.is_dir():
        hint = "pass the bundle directory, which holds manifest.json"
        if root.is_file() and root.name.endswith((".tar", ".tar.gz", ".tgz")):
            hint = f"unpack the archive first: tar -xf {root}"
        raise BundleError(f"bundle directory '{root}' does not exist or is not a directory", hint=hint)
    if not manifest_path.is_file():
        raise BundleError(
            f"'{manifest_path}' is missing: '{root}' is not an edgekit bundle",
            hint="point at the directory `edgekit build` wrote (it holds manifest.json and model.onnx)",
        )
    size = manifest_path.stat().st_size
    if size > MAX_MANIFEST_BYTES:  # refused before it is read into memory
        raise BundleError(
            f"'{manifest_path}' is {size:,} bytes; a manifest is read up to {MAX_MANIFEST_BYTES:,} bytes",
            hint="this is not a manifest edgekit wrote: copy the bundle again or rebuild it",
        )
    manifest = parse_manifest_json(manifest_path.read_bytes(), str(manifest_path))
    _check_manifest(manifest, manifest_path)
    return manifest


def _check_manifest(manifest: Mapping[str, Any], manifest_path: Path) -> None:
    where = str(manifest_path)
    version = manifest.get("schema_version")
    if version not in SUPPORTED_SCHEMA_VERSIONS or isinstance(version, bool):
        supported = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
        newer = isinstance(version, int) and version > max(SUPPORTED_SCHEMA_VERSIONS)
        raise BundleError(
            f"'{where}': schema_version {version!r} is not supported (this edgekit-runtime reads {supported})",
            hint="upgrade edgekit-runtime on the device to the host's version"
            if newer
            else "rebuild the bundle with `edgekit build`",
        )
    required: tuple[tuple[str, type], ...] = (
        ("name", str),
        ("precision", str),
        ("files", dict),
        ("model", dict),
        ("io", dict),
        ("backend", dict),
        ("golden", dict),
    )
    bundle_version = manifest.get("bundle_version")
    if bundle_version is not None and (isinstance(bundle_version, bool) or not isinstance(bundle_version, int) or bundle_version < 0):
        raise BundleError(
            f"'{where}': bundle_version must be a non-negative integer (the build time in milliseconds), got {bundle_version!r}",
            hint="rebuild the bundle with `edgekit build`",
        )
    for key, kind in required:
        if not isinstance(manifest.get(key), kind):
            raise BundleError(
                f"'{where}': key '{key}' is missing or not a {'string' if kind is str else 'JSON object'}",
                hint="see docs/bundle-format.md for the manifest keys; rebuild the bundle",
            )
    check_bundle_name(manifest["name"], where)
    files: Mapping[str, Any] = manifest["files"]
    root_resolved = manifest_path.parent.resolve()
    for rel, digest in files.items():
        _check_listed_path(rel, root_resolved, where)  # no absolute or '..' path, even with verify=False
        if not isinstance(digest, str) or not _SHA256_PATTERN.match(digest):
            raise BundleError(f"'{where}': files['{rel}'] must be a lowercase hex sha256, got {digest!r}")
    model = manifest["model"]
    if not isinstance(model.get("path"), str):
        raise BundleError(f"'{where}': model.path must name the model file, e.g. 'model.onnx'")
    listed = [("model.path", model["path"])]
    if model.get("external_data") is not None:
        if not isinstance(model["external_data"], str):
            raise BundleError(f"'{where}': model.external_data must name the weights file or be null, got {model['external_data']!r}"[:300])
        listed.append(("model.external_data", model["external_data"]))
    if model.get("sha256") is not None and files.get(model["path"]) not in (None, model["sha256"]):
        raise BundleError(f"'{where}': model.sha256 differs from files['{model['path']}']")
    if not isinstance(manifest["backend"].get("name"), str):
        raise BundleError(f"'{where}': backend.name must name a backend, e.g. 'onnxruntime'")
    listed.extend(_tensorrt_files(manifest["backend"], where))
    golden = manifest["golden"]
    batches = golden.get("batches")
    if not isinstance(batches, list) or not batches:
        raise BundleError(f"'{where}': golden.batches must be a non-empty list of {{inputs, outputs}}")
    for index, batch in enumerate(batches):
        for key in ("inputs", "outputs"):
            value = batch.get(key) if isinstance(batch, dict) else None
            if not isinstance(value, str):
                raise BundleError(f"'{where}': golden.batches[{index}].{key} must be a file path")
            listed.append((f"golden.batches[{index}].{key}", value))
    parse_tolerances(golden, where=where)  # golden.atol/rtol/min_cosine, and per output golden.outputs
    parse_golden_state(golden, where=where)  # a stateful model's sequences: state pairs, ordered steps
    for field_name, rel in listed:
        if rel not in files:
            raise BundleError(
                f"'{where}': {field_name} '{rel}' is not listed in files, so its hash cannot be checked",
                hint="every bundle file must appear in files with its sha256; rebuild the bundle",
            )


def _tensorrt_files(backend: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    """The files a ``backend.tensorrt`` section names (its build plan, the engine built on the host), each of
    which must be listed in ``files``: the runner reads them from the bundle, so their hashes must be checked."""
    section = backend.get("tensorrt")
    if section is None:
        return []
    from edgekit_runtime.tensorrt_engines.plan import PLAN_PATH  # only for bundles with a tensorrt section

    if not isinstance(section, Mapping):
        raise BundleError(f"'{where}': backend.tensorrt must be a JSON object, got {type(section).__name__}",
                          hint="rebuild the bundle with `edgekit build --backend tensorrt`")  # fmt: skip
    plan = section.get("plan")
    if plan is not None and not isinstance(plan, str):
        raise BundleError(f"'{where}': backend.tensorrt.plan must name the build plan file, e.g. '{PLAN_PATH}', got "
                          f"{type(plan).__name__}", hint="rebuild the bundle with `edgekit build --backend tensorrt`")  # fmt: skip
    files = [("backend.tensorrt.plan", plan or PLAN_PATH)]
    engine = section.get("engine")
    if engine is not None:
        path = engine.get("path") if isinstance(engine, Mapping) else None
        if not isinstance(path, str):
            raise BundleError(f"'{where}': backend.tensorrt.engine must be null or an object whose path names the engine "
                              "file, e.g. 'tensorrt/model.engine'", hint="rebuild the bundle with `edgekit build --backend tensorrt`")  # fmt: skip
        files.append(("backend.tensorrt.engine.path", path))
    return files


# -- file verification -----------------------------------------------------------------------------


def _check_listed_path(rel: object, root_resolved: Path, where: str) -> None:
    if not isinstance(rel, str) or not rel:
        raise BundleError(f"'{where}': files has an empty or non-string path {rel!r}")
    if rel.startswith("/") or "\\" in rel or PureWindowsPath(rel).drive or PurePosixPath(rel).is_absolute():
        raise BundleError(
            f"'{where}': files entry '{rel}' is an absolute path",
            hint="bundle paths are relative to the bundle directory, with '/' separators",
        )
    if ".." in rel.split("/"):
        raise BundleError(
            f"'{where}': files entry '{rel}' climbs out of the bundle with '..' (path traversal)",
            hint="refusing to read files outside the bundle; the manifest was tampered with or is broken",
        )
    normalized = PurePosixPath(rel).as_posix()
    if normalized != rel:
        raise BundleError(f"'{where}': files entry '{rel}' is not a normalized path; write it as '{normalized}'")
    if rel in (MANIFEST_NAME, SIGNATURE_NAME):
        raise BundleError(f"'{where}': files lists {rel}, which cannot hold its own hash")
    if "\x00" in rel or len(rel) > 4096:
        raise BundleError(f"'{where}': files entry {rel[:80]!r} holds a NUL character or is longer than 4096 characters")
    try:
        if any(len(os.fsencode(part)) > 255 for part in rel.split("/")):
            raise BundleError(f"'{where}': files entry {rel[:80]!r} has a name longer than 255 bytes, more than file systems take")
        resolved = (root_resolved / rel).resolve()
    except UnicodeEncodeError:
        raise BundleError(f"'{where}': files entry {rel[:80]!r} cannot be a file name (an unpaired surrogate)") from None
    except (RuntimeError, OSError) as err:  # a loop of symlinks (RuntimeError before Python 3.13)
        raise BundleError(f"'{where}': files entry {rel[:80]!r} cannot be followed: {err}",
                          hint="bundles must hold real files, not links") from None  # fmt: skip
    if resolved != root_resolved and root_resolved not in resolved.parents:
        raise BundleError(
            f"'{where}': files entry '{rel}' resolves to '{resolved}', outside the bundle (a symlink?)",
            hint="bundles must hold real files, not links that point elsewhere",
        )


def _files_on_disk(root: Path, listed: Iterable[str] = ()) -> list[str]:
    """Every file under ``root``, and every folder that holds no ``listed`` file (reported as ``<folder>/``,
    not descended into: an unlisted folder tree costs one line, whatever its depth)."""
    holders = {"/".join(parts[:i]) for parts in (rel.split("/") for rel in listed) for i in range(1, len(parts))}
    found: list[str] = []
    for directory, dirnames, filenames in os.walk(root):
        base = Path(directory)
        for name in list(dirnames):
            relative = (base / name).relative_to(root).as_posix()
            if (base / name).is_symlink():  # os.walk does not descend into it; report it
                found.append(relative)
            elif relative not in holders:
                found.append(relative + "/")
                dirnames.remove(name)
        found.extend((base / name).relative_to(root).as_posix() for name in filenames)
    return sorted(found)


def verify_files(root: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Check every file in ``manifest['files']`` against its sha256, and that no other file, and no folder
    that holds none of them, is there.

    Path entries that are absolute, contain ``..`` or resolve outside ``root`` are rejected before any
    file is read. All modified, missing and unlisted files are reported together in one
    :class:`BundleError`.
    """
    root = Path(root)
    where = str(root / MANIFEST_NAME)
    files = manifest.get("files")
    if not isinstance(files, Mapping):
        raise BundleError(f"'{where}': 'files' must map relative paths to sha256 hashes")
    root_resolved = root.resolve()
    for rel in files:
        _check_listed_path(rel, root_resolved, where)

    problems: list[str] = []
    damaged = False
    for rel in sorted(files):
        expected = str(files[rel]).lower()
        path = root / rel
        if not path.is_file():
            damaged = True
            problems.append(f"missing: {rel}" + (" (a directory, expected a file)" if path.is_dir() else ""))
            continue
        try:
            actual = sha256_file(path)
        except OSError as err:
            damaged = True
            problems.append(f"unreadable: {rel} ({err.strerror or err})")
            continue
        if actual != expected:
            damaged = True
            problems.append(
                f"modified: {rel} (expected sha256 {expected[:HASH_PREFIX_CHARS]}..., "
                f"got {actual[:HASH_PREFIX_CHARS]}...)"
            )
    problems.extend(
        f"unlisted: {rel} (" + ("a folder that holds no file manifest.json lists" if rel.endswith("/") else "not in manifest.json files") + ")"
        for rel in _files_on_disk(root, [str(k) for k in files])
        if rel.rstrip("/") not in (MANIFEST_NAME, SIGNATURE_NAME) and rel not in files  # a folder there: its reader says so
    )
    if problems:
        hints = []
        if damaged:
            hints.append("the bundle changed or was copied incompletely since it was built: copy it again")
        if any(problem.startswith("unlisted") for problem in problems):
            hints.append("remove files that are not part of the bundle, and folders that hold none of its files "
                         "(write logs and caches elsewhere)")
        raise BundleError(
            f"bundle '{root}' failed verification ({len(problems)} problem(s)):\n  - " + "\n  - ".join(problems),
            hint="; ".join(hints),
        )
    logger.debug("verified %d files in bundle %s", len(files), root)


# -- the bundle --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldenBatch:
    """One pair of golden files: inputs keyed by input name, FP32 reference outputs by output name."""

    index: int
    inputs_path: Path
    outputs_path: Path
    sequence: int | None = None  # stateful models: which golden sequence, and the call's step in it
    step: int | None = None

    def load(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return _load_npz(self.inputs_path), _load_npz(self.outputs_path)


def _as_objects(array: np.ndarray) -> np.ndarray:
    """A unicode array as an object array of ``str`` (ONNX Runtime cuts a ``<U`` element at its first NUL)."""
    return array.astype(object) if array.dtype.kind == "U" else array


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:  # string tensors are unicode arrays: as str objects,
            return {name: _as_objects(archive[name]) for name in archive.files}  # which ONNX Runtime feeds whole
    except (OSError, ValueError) as err:
        raise BundleError(
            f"golden file '{path}' cannot be read as a .npz archive: {err}",
            hint="copy the bundle again; open_bundle(root, verify=True) checks every file's hash",
        ) from err


@dataclass(frozen=True)
class Bundle:
    """An opened bundle directory and its manifest (see ``docs/bundle-format.md``)."""

    root: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_NAME

    @property
    def model_path(self) -> Path:
        return self.root / self.manifest["model"]["path"]

    @property
    def external_data_path(self) -> Path | None:
        external = self.manifest["model"].get("external_data")
        return None if external is None else self.root / external

    @property
    def precision(self) -> str:
        return str(self.manifest["precision"])

    @property
    def backend(self) -> dict[str, Any]:
        """The manifest's ``backend`` section: name, execution_providers, graph_optimization, ..."""
        return dict(self.manifest["backend"])

    @property
    def files(self) -> dict[str, str]:
        return dict(self.manifest["files"])

    @cached_property
    def io(self) -> IOSignature:
        return IOSignature.from_manifest(self.manifest["io"], where=f"'{self.manifest_path}'")

    @property
    def golden_batches(self) -> tuple[GoldenBatch, ...]:
        return tuple(
            GoldenBatch(index, self.root / batch["inputs"], self.root / batch["outputs"], batch.get("sequence"), batch.get("step"))
            for index, batch in enumerate(self.manifest["golden"]["batches"])
        )

    @property
    def golden_state(self) -> tuple[StatePair, ...]:
        """State input/output pairs of a recurrent model (empty when stateless): the self-check replays sequences."""
        return parse_golden_state(self.manifest["golden"], where=str(self.manifest_path))

    @property
    def golden_tolerances(self) -> tuple[float, float, float]:
        """``(atol, rtol, min_cosine)`` for the self-check of outputs without their own (``output_tolerances``)."""
        golden = self.manifest["golden"]
        return float(golden["atol"]), float(golden["rtol"]), float(golden["min_cosine"])

    @property
    def output_tolerances(self) -> GoldenTolerances:
        """The self-check's tolerances per output (``golden.outputs``), the defaults for the rest."""
        return parse_tolerances(self.manifest["golden"], where=str(self.manifest_path))


def open_bundle(root: str | os.PathLike[str], verify: bool = True) -> Bundle:
    """Read and check a bundle directory; with ``verify`` (the default) also check every file's hash."""
    root = Path(root)
    manifest = read_manifest(root)
    if verify:
        verify_files(root, manifest)
    bundle = Bundle(root=root, manifest=manifest)
    _ = bundle.io  # parse the io section now, so a malformed one fails here and not at the first call
    return bundle


# -- self-check --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SelfCheckResult:
    """The golden outputs compared with what this device computes, per output over all batches."""

    passed: bool
    outputs: tuple[OutputCheck, ...]
    batches: int
    atol: float
    rtol: float
    min_cosine: float
    providers: tuple[str, ...]

    def output(self, name: str) -> OutputCheck:
        for check in self.outputs:
            if check.name == name:
                return check
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "batches": self.batches,
            "atol": self.atol,
            "rtol": self.rtol,
            "min_cosine": self.min_cosine,
            "providers": list(self.providers),
            "outputs": [check.to_dict() for check in self.outputs],
        }


def self_check(bundle: Bundle, runner: Runner, *, raise_on_failure: bool = True) -> SelfCheckResult:
    """Run every golden batch through ``runner`` and compare with the golden outputs.

    A stateful model's golden sequences are replayed call by call: each call after the first of its
    sequence gets the state outputs this runner computed on the previous call (``golden.state``).

    A runner that is not loaded yet is loaded for the check and closed afterwards. A failed check
    raises :class:`BundleError` with the numbers, unless ``raise_on_failure=False``.
    """
    atol, rtol, min_cosine = bundle.golden_tolerances
    tolerances = bundle.output_tolerances
    checks: dict[str, list[OutputCheck]] = {}
    loaded_here = not runner.is_loaded
    runner.load()
    carrier = StateCarrier(bundle.golden_state)
    try:
        for batch in bundle.golden_batches:
            inputs, expected = batch.load()
            inputs = carrier.feeds(batch.step, inputs, where=f"bundle '{bundle.root}'")
            try:
                actual = runner.infer(inputs)
                carrier.remember(actual)
            except InputSignatureError as err:
                raise BundleError(
                    f"golden inputs '{batch.inputs_path}' do not match the model signature: {err.message}",
                    hint="the golden files and the manifest's io section disagree; rebuild the bundle",
                ) from err
            for name, reference in expected.items():
                if name not in actual:
                    raise BundleError(
                        f"golden outputs '{batch.outputs_path}' hold '{name}', which the model does not "
                        f"produce (its outputs: {', '.join(actual)})",
                        hint="the golden files and the manifest's io section disagree; rebuild the bundle",
                    )
                check = compare_output(name, reference, actual[name], **tolerances.for_output(name).to_dict(), batch=batch.index)
                checks.setdefault(name, []).append(check)
        providers = runner.providers
    finally:
        if loaded_here:
            runner.close()
    if not checks:
        raise BundleError(f"bundle '{bundle.root}': the golden output files hold no arrays to compare")
    outputs = tuple(merge_checks(per_batch) for per_batch in checks.values())
    result = SelfCheckResult(
        passed=all(check.passed for check in outputs),
        outputs=outputs,
        batches=len(bundle.golden_batches),
        atol=atol,
        rtol=rtol,
        min_cosine=min_cosine,
        providers=providers,
    )
    if not result.passed and raise_on_failure:
        failures = "; ".join(
            check.describe(**tolerances.for_output(check.name).to_dict())
            for check in outputs
            if not check.passed
        )
        raise BundleError(
            f"self-check of bundle '{bundle.name}' at '{bundle.root}' failed on {', '.join(providers)}: {failures}",
            hint="the model or golden files differ from what the host built (run open_bundle with "
            "verify=True), or this device computes differently: rebuild the bundle for this target, "
            "or loosen the golden tolerances in the recipe",
        )
    logger.info("self-check of bundle %s passed=%s over %d batch(es)", bundle.name, result.passed, result.batches)
    return result
