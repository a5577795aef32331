"""Over-the-air updates: deploy a signed bundle, watch it, roll back; and the power-cut-safe start.

A deploy (:meth:`Deployer.deploy`) goes through these steps, each reported as a ``deploy_progress``
event with ``details.step``, and ends with one ``deploy_result`` event (``details.outcome``
``succeeded``, ``failed``, ``rolled_back``, or ``interrupted`` when the agent stops during the health watch,
which then starts again at the next start: :mod:`~edgekit_runtime.agent.health_watch`):

``started`` -> ``downloaded`` (the URL admitted by ``bundles.inbox`` / ``bundles.allowed_sources``,
copy or HTTP into staging, size limit, sha256 of the tar or of the directory's manifest; then,
before a tar's files are written, its manifest's signature, its ``bundle_version`` against the
versions this device accepted and its inputs/outputs against the served ones: see
:mod:`~edgekit_runtime.agent.deploy_checks`) -> ``signature_verified`` (Ed25519 over manifest.json,
fleet key; or ``signature_skipped`` for an unsigned bundle under ``allow_unsigned``) -> ``files_verified`` ->
``self_check_passed`` (golden outputs) -> ``switched`` (``current`` link renamed into place,
``previous`` kept) -> ``watching`` (``health.window_s``: error rate of live requests, where a request
rejected for not matching the new inputs counts as an error when the deploy changed them; then the
self-check again on the live runner) -> ``deploy_result``. A failure before the switch leaves the
device untouched; a failure while watching switches back to ``previous`` (``rolling_back``).

At start (:meth:`Deployer.start`) the agent serves whatever ``current`` names if it passes every
check, else ``previous`` (and points ``current`` there), else nothing until a deploy arrives.

Events are dicts ``{kind, level, message, command_id, details}``; the service adds the envelope of
``event.v1`` (ids, device, time) and publishes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.config import BundlesConfig, HealthConfig
from edgekit_runtime.agent.deploy_checks import LEDGER_NAME, VersionLedger, bundle_version, signature_changes
from edgekit_runtime.agent.deploy_request import DeployRequest as DeployRequest  # re-exported: callers import it from here
from edgekit_runtime.agent.deploy_state import ServedBundle as ServedBundle  # re-exported: callers import it from here
from edgekit_runtime.agent.deploy_state import AlreadyCurrent
from edgekit_runtime.agent.deploy_state import StagedDeploy as StagedDeploy
from edgekit_runtime.agent.errors import DeployError, MemoryBudgetError
from edgekit_runtime.agent.fetch import SourcePolicy, fetch_bundle, write_error
from edgekit_runtime.agent.health_watch import HealthWatch
from edgekit_runtime.agent.loading import LoadedBundle, check_signature_bytes, load_bundle
from edgekit_runtime.agent.probation import PROBATION_NAME, Probation, ProbationFile, begin
from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.store import BundleStore, version_name
from edgekit_runtime.bundle import MANIFEST_NAME, SIGNATURE_NAME, parse_manifest_json, self_check
from edgekit_runtime.errors import BundleError, EdgekitError
from edgekit_runtime.signature import IOSignature
from edgekit_runtime.signing import decode_signature, encode_signature
from edgekit_runtime.timing import rss_mb

logger = logging.getLogger(__name__)

EventSink = Callable[[dict[str, Any]], None]


#: ``guard(model, megabytes, measured)``: raises :class:`DeployError` when loading (``measured`` False: the
#: model file's size, before loading) or keeping (True: the RSS growth the load caused) a model of that size
#: would take the loaded models past the memory budget.
MemoryGuard = Callable[[str | None, float, bool], None]


class _StageFailed(Exception):
    """A deploy failed before its switch, at ``step``; the device is as it was."""

    def __init__(self, step: str, error: EdgekitError) -> None:
        super().__init__(error.message)
        self.step, self.error = step, error


class Deployer(HealthWatch):
    """Owns the bundle store and what the :class:`InferenceServer` serves. One operation at a time.

    ``model`` names the model of the repository this deployer serves (``None`` for the single model of
    the one-bundle layout); it is added to every event's details. ``memory_guard`` is asked before and
    after each load (see :data:`MemoryGuard`); ``held_mb`` is what loading the served bundle added to
    the process's RSS.
    """

    def __init__(
        self,
        store: BundleStore,
        bundles: BundlesConfig,
        health: HealthConfig,
        server: InferenceServer,
        emit: EventSink,
        *,
        stop: threading.Event | None = None,
        runner_options: dict[str, dict[str, Any]] | None = None,
        on_change: Callable[[ServedBundle | None], None] | None = None,
        model: str | None = None,
        memory_guard: MemoryGuard | None = None,
    ) -> None:
        self.model = model
        self._memory_guard = memory_guard
        self.held_mb: float | None = None
        self._loaded_mb: float | None = None  # the last load's RSS growth, until _serve takes it
        self.store = store
        self.bundles = bundles
        self.health = health
        self.server = server
        self._emit = emit
        self._stop = stop or threading.Event()
        self._runner_options = runner_options
        self._on_change = on_change
        self._lock = threading.Lock()
        self._served: ServedBundle | None = None
        self.last_self_check_passed: bool | None = None
        self.ledger = VersionLedger(store.root / LEDGER_NAME, slot=model)
        self.probation = ProbationFile(store.root / PROBATION_NAME)
        self._resume: tuple[Probation, LoadedBundle] | None = None  # a health watch to start again (resume_watch)
        self._pending_crash_result: Probation | None = None  # rolled back at start: its deploy_result once served
        self._sources = SourcePolicy.from_config(bundles)

    @property
    def served(self) -> ServedBundle | None:
        return self._served

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def _event(self, kind: str, message: str, *, level: str = "info", command_id: str | None = None, **details: Any) -> None:
        log = {"info": logger.info, "warning": logger.warning, "error": logger.error}[level]
        log("%s: %s", kind, message)
        if self.model is not None:
            details = {"model": self.model, **details}
        self._emit({"kind": kind, "level": level, "message": message, "command_id": command_id, "details": details})

    # -- serving ------------------------------------------------------------------------------------

    def _load(self, path: Path, on_step: Callable[[str, dict[str, Any]], None] | None = None) -> LoadedBundle:
        """Every check and the load, inside the memory budget: the model file's size is checked against it
        before loading, the RSS growth the load caused after (over the budget: the runner is closed again)."""
        guard = self._memory_guard
        if guard is not None:
            model_file = self._model_file(path)
            guard(self.model, model_file.stat().st_size / 2**20 if model_file is not None else 0.0, False)
        before_mb = rss_mb()
        loaded = load_bundle(path, self.bundles, on_step=on_step, runner_options=self._runner_options)
        after_mb = rss_mb()
        held_mb = None if before_mb is None or after_mb is None else round(max(after_mb - before_mb, 0.0), 1)
        if guard is not None and held_mb is not None:
            try:
                guard(self.model, held_mb, True)
            except BaseException:
                loaded.runner.close()
                raise
        self._loaded_mb = held_mb
        return loaded

    @staticmethod
    def _model_file(path: Path) -> Path | None:
        try:
            model = parse_manifest_json((path / MANIFEST_NAME).read_bytes(), str(path / MANIFEST_NAME)).get("model") or {}
            candidate = (path / str(model.get("path"))).resolve()
        except (OSError, ValueError, AttributeError, BundleError):
            return None  # load_bundle says what is wrong with the manifest
        return candidate if candidate.is_file() and candidate.is_relative_to(path.resolve()) else None

    def _serve(self, loaded: LoadedBundle, path: Path) -> ServedBundle:
        manifest_sha256 = hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()
        old_runner = self.server.swap(loaded.runner, model_name=loaded.name)
        if old_runner is not None and old_runner is not loaded.runner:
            old_runner.close()
        self._served = ServedBundle(
            name=loaded.name,
            bundle_id=self.store.bundle_id(path),
            manifest_sha256=manifest_sha256,
            path=path,
            signed_by=loaded.signed_by,
            version=self._served_version(loaded, manifest_sha256),
        )
        self.last_self_check_passed = loaded.check.passed
        self.held_mb = self._loaded_mb
        if self._on_change is not None:
            self._on_change(self._served)
        return self._served

    @staticmethod
    def _served_version(loaded: LoadedBundle, manifest_sha256: str) -> str:
        try:
            version = bundle_version(loaded.bundle.manifest, where=str(loaded.bundle.manifest_path))
        except EdgekitError:
            version = None
        return str(version) if version is not None else manifest_sha256[:12]

    def start(self) -> ServedBundle | None:
        """Serve ``current`` if it passes every check, else ``previous``; returns what is served."""
        with self._lock:
            self.store.prepare()
            probation = self._probation_at_start()
            for link in ("current", "previous"):
                path = self.store.target(link)
                if path is None:
                    continue
                try:
                    loaded = self._load(path)
                except Exception as err:  # noqa: BLE001 - whatever breaks one link, the next may still serve
                    if isinstance(err, EdgekitError):
                        problem, error = err.message, str(err)
                    else:  # a failure nothing foresaw: logged with its traceback, reported like any other
                        logger.exception("loading the %s bundle at %s failed unexpectedly", link, path)
                        problem = error = f"{type(err).__name__}: {err}"
                    self._event("startup_check_failed", f"the {link} bundle at {path} fails its checks: {problem}",
                                level="error", link=link, path=str(path), error=error)  # fmt: skip
                    continue
                if link == "previous":
                    self.store.point_current(path)
                    self._event("startup_fallback", f"current bundle failed its checks; serving previous {loaded.name}",
                                level="warning", path=str(path))  # fmt: skip
                self._serve(loaded, path)
                self._event("serving", f"serving bundle {loaded.name}", **loaded.summary())
                if probation is not None and probation.version == path.name:
                    self._resume = (probation, loaded)  # watched again before its version counts as accepted
                else:
                    self._remember_version(loaded)
                    self._end_probation(probation, f"{probation.bundle if probation else ''} failed its checks at start")
                return self._served
            self._event("no_bundle", f"no working bundle in {self.store.root}; waiting for a deploy", level="warning")
            return None

    # -- deploy -------------------------------------------------------------------------------------

    def deploy(self, request: DeployRequest, *, watch: bool = True, check_source: bool = True) -> str:
        """Carry out a deploy; returns the outcome: ``succeeded``, ``failed`` or ``rolled_back``.

        ``check_source=False`` skips the allowed-sources check, for ``edgekit-agent install`` run by
        the device's operator; every other check still applies.
        """
        if not self._lock.acquire(blocking=False):
            self._event("deploy_result", "another deploy or rollback is in progress; try again later",
                        level="error", command_id=request.command_id, outcome="failed", step="queued", url=request.url)  # fmt: skip
            return "failed"
        try:
            return self._deploy_locked(request, watch=watch, check_source=check_source)
        except Exception as err:  # noqa: BLE001 - a failure nothing foresaw: the fleet still gets its answer
            logger.exception("deploy of %s failed unexpectedly", request.url)
            serving = self._served.name if self._served else None
            self._event("deploy_result", f"deploy of {request.url} failed: {type(err).__name__}: {err}; serving "
                        f"{serving or 'nothing'}", level="error", command_id=request.command_id, outcome="failed",
                        step="internal", error=f"{type(err).__name__}: {err}", serving=serving)  # fmt: skip
            return "failed"
        finally:
            self._lock.release()

    def _remember_version(self, loaded: LoadedBundle) -> None:
        manifest_sha256 = hashlib.sha256(loaded.bundle.manifest_path.read_bytes()).hexdigest()
        try:
            version = bundle_version(loaded.bundle.manifest, where=str(loaded.bundle.manifest_path))
            self.ledger.record(loaded.name, version, manifest_sha256=manifest_sha256)
        except (EdgekitError, OSError) as err:
            problem = err.message if isinstance(err, EdgekitError) else (err.strerror or str(err))
            self._event("version_not_recorded", f"the version of {loaded.name} was not recorded: {problem}",
                        level="warning", bundle=loaded.name, error=str(err))  # fmt: skip

    def _vet_manifest(self, request: DeployRequest, manifest_bytes: bytes, signature_bytes: bytes | None, on_step: Callable[[str], None]) -> None:
        """The checks on the signed manifest, before any of the bundle's files is written."""
        on_step("signature")
        signature = request.signature
        if signature is None and signature_bytes is not None:
            signature = decode_signature(signature_bytes, where=f"{request.url}: {SIGNATURE_NAME}")
        check_signature_bytes(manifest_bytes, signature, self.bundles, where=request.url)
        try:  # depth- and size-limited before json.loads runs: a hostile manifest is an error, never a RecursionError
            manifest = parse_manifest_json(manifest_bytes, f"{request.url}: {MANIFEST_NAME}")
        except BundleError as err:
            raise DeployError(err.message, hint=err.hint or "rebuild the bundle") from None
        name = manifest.get("name")
        if not isinstance(name, str):
            raise DeployError(f"{request.url}: {MANIFEST_NAME} has no name", hint="see docs/bundle-format.md; rebuild the bundle")
        on_step("version")
        version = bundle_version(manifest, where=f"{request.url}: {MANIFEST_NAME}")
        self.ledger.check(name, version, allow_downgrade=request.allow_downgrade, where=request.url)
        downgrade = self.ledger.downgrade(version) if request.allow_downgrade else None
        if downgrade is not None:  # honoured, and never silently
            self._event("downgrade_allowed", f"deploy of {request.url}: bundle '{name}' version {version} is older than "
                        f"version {downgrade[0]} ('{downgrade[1]}') this {self.ledger.slot_label} accepted; going back "
                        "because the deploy says allow_downgrade", level="warning", command_id=request.command_id,
                        bundle=name, bundle_version=version, highest_accepted=downgrade[0],
                        highest_accepted_bundle=downgrade[1], url=request.url)  # fmt: skip
        on_step("io_signature")
        served = self.server.signature
        if served is None or request.allow_signature_change:
            on_step("download")
            return
        changes = signature_changes(served, IOSignature.from_manifest(manifest.get("io"), where=f"{request.url}: {MANIFEST_NAME}"))
        if changes:
            raise DeployError(
                f"{request.url}: bundle '{name}' changes the served inputs/outputs ({'; '.join(changes)}); clients of "
                f"{self.server.model_name} would have their requests rejected",
                hint="update the clients, then send the deploy again with allow_signature_change: true",
            )
        on_step("download")  # what follows is writing out the files

    def _deploy_locked(self, request: DeployRequest, *, watch: bool, check_source: bool = True) -> str:
        try:
            staged = self.stage(request, check_source=check_source)
        except _StageFailed as failure:
            self._event("deploy_result", f"deploy of {request.url} failed at {failure.step}: {failure.error.message}",
                        level="error", command_id=request.command_id, outcome="failed", step=failure.step,
                        error=str(failure.error))  # fmt: skip
            return "failed"
        if isinstance(staged, AlreadyCurrent):
            self._event("deploy_result", f"{staged.bundle} is already the current bundle", command_id=request.command_id,
                        outcome="succeeded", bundle=staged.bundle, unchanged=True)  # fmt: skip
            return "succeeded"
        watching = watch and self.health.window_s > 0
        try:  # the probation goes on disk before the links move: an agent killed after the switch finds its watch
            probation = self.begin_probation(staged, command_id=request.command_id, window_s=self.health.window_s) if watching else None
            previous_served = self.switch(staged)
        except (EdgekitError, OSError) as err:
            return self._switch_failed(staged, err)
        if probation is not None:
            self._event("deploy_progress", f"watching {staged.loaded.name} for {self.health.window_s:g} s",
                        command_id=request.command_id, step="watching", window_s=self.health.window_s,
                        max_error_rate=self.health.max_error_rate)  # fmt: skip
            signature_changed = staged.old_signature is not None and bool(signature_changes(staged.old_signature, staged.loaded.bundle.io))
            return self._watch(request, staged.loaded, probation, can_roll_back=previous_served is not None,
                               window_s=self.health.window_s, signature_changed=signature_changed)
        self.finish(staged)
        served_as = f" as {self._served.bundle_id}" if self._served else ""  # the id pack printed, the fleet sees
        self._event("deploy_result", f"deployed {staged.loaded.name}{served_as}", command_id=request.command_id,
                    outcome="succeeded", bundle=staged.loaded.name, bundle_id=self._served.bundle_id if self._served else None)  # fmt: skip
        return "succeeded"

    def _switch_failed(self, staged: StagedDeploy, err: EdgekitError | OSError) -> str:
        """The probation or the links could not be written (a full disk): the old bundle stays, the new one goes."""
        request = staged.request
        if not isinstance(err, EdgekitError):
            err = write_error(err, request.url, self.store.root, what="switching to it")
        if self.store.current != staged.version_dir:  # nothing switched: the old bundle is served, as before
            with contextlib.suppress(OSError):
                self.probation.clear()
            self.discard(staged)
        self._event("deploy_result", f"deploy of {request.url} failed at switch: {err.message}", level="error",
                    command_id=request.command_id, outcome="failed", step="switch", error=str(err))  # fmt: skip
        return "failed"

    @property
    def lock(self) -> threading.Lock:
        """Held during a deploy or rollback (a pipeline deploy holds the locks of all its models)."""
        return self._lock

    def stage(self, request: DeployRequest, *, check_source: bool = True) -> StagedDeploy | AlreadyCurrent:
        """Steps 1 to 4 (download, signature, files, self-check) and the install under ``versions/``; the
        caller holds :attr:`lock` and sends the ``deploy_result``. Returns :class:`AlreadyCurrent` when the bundle
        is already current; raises :class:`_StageFailed` with the failed step, the device left as it was."""

        def progress(step: str, message: str, **details: Any) -> None:
            self._event("deploy_progress", message, command_id=request.command_id, step=step, **details)

        step = "started"
        progress(step, f"deploying {request.url}", url=request.url, bundle_id=request.bundle_id)
        try:
            staging = self.store.new_staging_dir()
        except OSError as err:
            raise _StageFailed(step, write_error(err, request.url, self.store.root, what="making its staging folder")) from err
        loaded: LoadedBundle | None = None
        version_dir: Path | None = None
        old_signature = self.server.signature
        try:
            step = "download"

            def vet_step(name: str) -> None:
                nonlocal step
                step = name

            fetched = fetch_bundle(request.url, staging, expected_sha256=request.sha256,
                                   max_bytes=self.bundles.max_download_bytes, timeout_s=self.bundles.download_timeout_s,
                                   max_seconds=self.bundles.download_max_s,
                                   policy=self._sources if check_source else None,
                                   check_manifest=lambda manifest, sig: self._vet_manifest(request, manifest, sig, vet_step))  # fmt: skip
            step = "download"
            progress("downloaded", f"fetched {fetched.size_bytes} bytes, sha256 verified" if request.sha256 else f"fetched {fetched.size_bytes} bytes",
                     size_bytes=fetched.size_bytes, sha256=fetched.sha256, sha256_verified=request.sha256 is not None,
                     seconds=round(fetched.seconds, 3))  # fmt: skip
            if request.signature is not None:
                (fetched.path / SIGNATURE_NAME).write_text(encode_signature(request.signature) + "\n", encoding="ascii")
            step = "signature"
            next_step = {"signature_verified": "files", "signature_skipped": "files", "files_verified": "self_check",
                         "self_check_passed": "switch"}  # fmt: skip

            def on_step(name: str, details: dict[str, Any]) -> None:
                nonlocal step
                step = next_step.get(name, step)
                progress(name, name.replace("_", " "), **details)

            loaded = self._load(fetched.path, on_step)
            held_mb = self._loaded_mb
            step = "switch"
            manifest_sha256 = hashlib.sha256((fetched.path / MANIFEST_NAME).read_bytes()).hexdigest()
            name = version_name(loaded.name, manifest_sha256)
            old_current = self.store.current
            if old_current is not None and old_current.name == name and self._served is not None:
                loaded.runner.close()
                return AlreadyCurrent(loaded.name)
            version_dir = self.store.install(fetched.path, name)
            loaded.bundle = type(loaded.bundle)(root=version_dir, manifest=loaded.bundle.manifest)
            self.store.write_meta(version_dir, bundle_id=request.bundle_id or name, sha256=fetched.sha256,
                                  url=request.url, command_id=request.command_id)  # fmt: skip
        except EdgekitError as err:
            if loaded is not None:
                loaded.runner.close()
            if isinstance(err, MemoryBudgetError):
                step = "memory"
            raise _StageFailed(step, err) from err
        except OSError as err:  # a full disk (or a failing one) while writing: a failed deploy, the old bundle served
            if loaded is not None:
                loaded.runner.close()
            if version_dir is not None:
                self._remove_version(version_dir)
            raise _StageFailed(step, write_error(err, request.url, self.store.root, what=f"the {step} step")) from err
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return StagedDeploy(request, loaded, version_dir, old_current, old_signature, held_mb)

    def _remove_version(self, version_dir: Path) -> None:
        """Delete an installed version (and its meta files) unless ``current`` or ``previous`` names it."""
        if version_dir in (self.store.current, self.store.previous):
            return
        shutil.rmtree(version_dir, ignore_errors=True)
        meta = self.store.meta_path(version_dir)
        meta.unlink(missing_ok=True)
        meta.with_name(meta.name + ".partial").unlink(missing_ok=True)

    def discard(self, staged: StagedDeploy) -> None:
        """Give up a staged deploy (a pipeline deploy whose other model failed): close its runner and delete
        the installed version unless a link names it."""
        staged.loaded.runner.close()
        if staged.version_dir not in (self.store.current, self.store.previous):
            shutil.rmtree(staged.version_dir, ignore_errors=True)
            self.store.meta_path(staged.version_dir).unlink(missing_ok=True)

    def switch(self, staged: StagedDeploy) -> ServedBundle | None:
        """Step 5: point ``current`` at the staged version and serve it; returns what was served before."""
        previous_served = self._served
        self._loaded_mb = staged.held_mb
        self.store.switch_to(staged.version_dir)
        self._serve(staged.loaded, staged.version_dir)
        self._event("deploy_progress", f"now serving {staged.loaded.name}", command_id=staged.request.command_id,
                    step="switched", bundle=staged.loaded.name, to=staged.version_dir.name,
                    previous=None if staged.old_current is None else staged.old_current.name)  # fmt: skip
        return previous_served

    def finish(self, staged: StagedDeploy) -> None:
        """A deploy that stays: record its version and prune old versions; its probation ends."""
        self._remember_version(staged.loaded)
        self.store.prune()
        self.probation.clear()

    def begin_probation(self, staged: StagedDeploy, *, command_id: str | None, window_s: float) -> Probation:
        """Put a switched deploy on probation (on disk) for its health watch (a pipeline deploy's watch)."""
        return begin(self.probation, version_dir=staged.version_dir, bundle=staged.loaded.name, previous=staged.old_current,
                     url=staged.request.url, command_id=command_id, window_s=window_s)  # fmt: skip

    # -- rollback -----------------------------------------------------------------------------------

    def rollback(self, *, command_id: str | None = None, bundle_id: str | None = None) -> bool:
        """Serve the previous bundle again (after checking it); ``current`` and ``previous`` trade places.

        ``bundle_id``, when given, must be the previous bundle's id (only one step back is kept).
        """
        if not self._lock.acquire(blocking=False):
            self._event("rollback_result", "a deploy or rollback is in progress; try again later", level="error",
                        command_id=command_id, outcome="failed")  # fmt: skip
            return False
        try:
            from_name = self._served.name if self._served else None
            try:
                previous = self.store.previous
                previous_id = None if previous is None else self.store.bundle_id(previous)
                if bundle_id is not None and bundle_id != previous_id:
                    raise DeployError(
                        f"cannot roll back to bundle {bundle_id!r}: the previous bundle is {previous_id!r}",
                        hint="the device keeps one previous bundle; deploy the wanted bundle instead",
                    )
                restored = self._rollback_locked()
            except EdgekitError as err:
                self._event("rollback_result", f"rollback failed: {err.message}", level="error", command_id=command_id,
                            outcome="failed", error=str(err))  # fmt: skip
                return False
            self._event("rollback_result", f"rolled back from {from_name} to {restored.name}", command_id=command_id,
                        outcome="succeeded", bundle=restored.name, previous_bundle=from_name)  # fmt: skip
            return True
        finally:
            self._lock.release()

    def restore_previous(self) -> ServedBundle:
        """Serve ``previous`` again, the caller holding :attr:`lock` (a pipeline deploy that rolls back)."""
        return self._rollback_locked()

    def _rollback_locked(self) -> ServedBundle:
        target = self.store.previous
        if target is None:
            raise DeployError(f"no previous bundle in '{self.store.root}' to roll back to", hint="deploy the wanted bundle instead")
        loaded = self._load(target)  # checked before the links move: a broken previous changes nothing
        self.store.swap_current_and_previous()
        return self._serve(loaded, target)
