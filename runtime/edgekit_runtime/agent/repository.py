"""The model repository: the bundles the agent serves at once, each under a model name.

::

    <models.dir>/                 (default <bundles.dir>/models)
      detector/                   one bundle store per model (see :mod:`~edgekit_runtime.agent.store`):
        versions/ staging/        its versions, and its own current/previous links,
        current -> ...            its own version ledger (anti-rollback per model)
        previous -> ...
      keywords/ ...

Each model (a :class:`ModelSlot`) has its own :class:`~edgekit_runtime.agent.serving.InferenceServer`
(its own run lock, batching queue and statistics, so a slow model never holds a fast one's requests)
and its own :class:`~edgekit_runtime.agent.ota.Deployer` (self-check, health watch and rollback).
Without a ``models`` section the agent serves one model from ``bundles.dir`` itself, named after
its bundle: the one-bundle layout of earlier agents, unchanged.

``models.memory_budget_mb`` caps what the loaded models hold together: before a load the model
file's size, after it the RSS growth the load caused (``held_mb``), are added to what the other models
hold; past the budget the load is refused (:class:`~edgekit_runtime.agent.errors.MemoryBudgetError`,
the deploy fails at step ``memory`` and nothing changes).

:meth:`ModelRepository.deploy_pipeline` switches several models together, all or none.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.config import MODEL_NAME_PATTERN, AgentConfig
from edgekit_runtime.agent.config_types import MAX_MODELS
from edgekit_runtime.agent.errors import AgentConfigError, DeployError, MemoryBudgetError, ModelNotFoundError
from edgekit_runtime.agent.ota import Deployer, DeployRequest, EventSink, ServedBundle, StagedDeploy, _StageFailed
from edgekit_runtime.agent.probation import mark_stopped
from edgekit_runtime.agent.serving import InferenceServer, ServingTotals
from edgekit_runtime.agent.store import BundleStore, drop_process_lock, take_process_lock
from edgekit_runtime.errors import EdgekitError

logger = logging.getLogger(__name__)


class ModelSlot:
    """One model of the repository: its name, its server, its store and its deployer."""

    def __init__(self, key: str | None, server: InferenceServer, store: BundleStore, deployer: Deployer) -> None:
        self.key = key
        self.server = server
        self.store = store
        self.deployer = deployer
        #: stopped by an Open Inference Protocol ``unload`` (its bundle is on disk)
        self.unloaded = False

    @property
    def name(self) -> str | None:
        """The model's name: configured, or (one-bundle layout) its bundle's name; ``None`` when that serves nothing."""
        if self.key is not None:
            return self.key
        served = self.deployer.served
        return served.name if served is not None else None

    @property
    def served(self) -> ServedBundle | None:
        return self.deployer.served

    @property
    def version(self) -> str | None:
        served = self.deployer.served
        return served.version if served is not None else None

    @property
    def ready(self) -> bool:
        return self.server.signature is not None

    def unload(self) -> None:
        """Stop serving the model (the Open Inference Protocol's repository ``unload``); its bundles stay on
        disk, ``current`` and ``previous`` unchanged, and :meth:`load` serves it again. Refused while a
        deploy or rollback of it runs."""
        if not self.deployer.lock.acquire(blocking=False):
            raise DeployError(f"model {self.name!r} has a deploy or rollback in progress", hint="unload it once that ends")
        try:
            runner = self.server.swap(None, model_name=None)
            if runner is not None:
                runner.close()
            self.deployer.held_mb = None  # its memory is free for other models' loads
            self.unloaded = True
        finally:
            self.deployer.lock.release()
        logger.info("model %s unloaded; its bundle stays in %s", self.name, self.store.root)

    def load(self) -> None:
        """Verify the model's ``current`` bundle again (else ``previous``) and serve it, as at start; raises
        :class:`DeployError` when no bundle of it passes its checks (the model then serves nothing)."""
        if self.deployer.busy:
            raise DeployError(f"model {self.name!r} has a deploy or rollback in progress", hint="load it once that ends")
        served = self.deployer.start()
        if served is None:
            raise DeployError(f"no bundle of model {self.name!r} in {self.store.root} passes its checks",
                              hint="deploy a bundle to it; the agent's log says why each failed")  # fmt: skip
        self.unloaded = False

    def info(self) -> dict[str, Any]:
        """What health and stats say about the model."""
        served = self.deployer.served
        return {
            "model": self.name,
            "ready": self.ready,
            "bundle": served.name if served else None,
            "bundle_id": served.bundle_id if served else None,
            "version": served.version if served else None,
            "manifest_sha256": served.manifest_sha256 if served else None,
            "self_check_passed": self.deployer.last_self_check_passed,
            "deploying": self.deployer.busy,
            "memory_mb": self.deployer.held_mb,
            "batching": self.server.batching_active,
        }


class ModelRepository:
    """The agent's models, by name; one default for ``/v1`` and for commands that name none."""

    def __init__(
        self,
        config: AgentConfig,
        emit: EventSink,
        *,
        stop: threading.Event | None = None,
        on_change: Callable[[ServedBundle | None], None] | None = None,
        runner_options: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.config = config
        self._emit = emit
        self._stop = stop or threading.Event()
        self._on_change = on_change
        self._runner_options = runner_options
        self._lock = threading.Lock()
        self._slots: dict[str | None, ModelSlot] = {}
        self._pending_mb: dict[str | None, float] = {}  # staged in a pipeline deploy, loaded but not yet served
        self._holds_models_dir = False
        models = config.models
        self.budget_mb = models.memory_budget_mb if models is not None else None
        if models is None:
            self._add(None, config.bundles.dir)
            self.default_key: str | None = None
        else:
            names = list(dict.fromkeys([models.default_name, *(models.names or self._folders(models.dir))]))
            if len(names) > MAX_MODELS:  # only folders made by hand: deploys stop at the limit
                raise AgentConfigError(f"{models.dir} holds model folders for {len(names)} models; an agent serves at most "
                                       f"{MAX_MODELS} (each telemetry window carries one entry a model, and telemetry.v1 "
                                       f"holds {MAX_MODELS})",
                                       hint="move the others to another agent's models.dir, or list the ones to serve in models.names")  # fmt: skip
            for name in names:
                self._add(name, models.dir / name)
            self.default_key = models.default_name

    @staticmethod
    def _folders(directory: Path) -> list[str]:
        if not directory.is_dir():
            return []
        return sorted(path.name for path in directory.iterdir() if path.is_dir() and MODEL_NAME_PATTERN.match(path.name))

    def _add(self, key: str | None, directory: Path) -> ModelSlot:
        batching = self.config.batching
        server = InferenceServer(batching=None if batching is None else batching.for_model(key))
        store = BundleStore(directory)
        runner_options = self.config.runner.backend_options(key) if self._runner_options is None else self._runner_options
        deployer = Deployer(store, self.config.bundles, self.config.health, server, self._emit, stop=self._stop,
                            runner_options=runner_options, on_change=self._on_change, model=key,
                            memory_guard=lambda _model, mb, measured: self._guard(key, mb, measured))  # fmt: skip
        slot = ModelSlot(key, server, store, deployer)
        self._slots[key] = slot
        return slot

    # -- looking models up --------------------------------------------------------------------------

    @property
    def default(self) -> ModelSlot:
        return self._slots[self.default_key]

    def slots(self) -> list[ModelSlot]:
        with self._lock:
            return list(self._slots.values())

    def find(self, name: str) -> ModelSlot | None:
        """The model called ``name`` (in the one-bundle layout: the served bundle's name), else ``None``."""
        slot = self._slots.get(name)
        if slot is not None:
            return slot
        default = self._slots.get(None)
        if default is not None and default.name == name:
            return default
        return None

    def get(self, name: str | None, *, create: bool = False) -> ModelSlot:
        """The model a command names (``None``: the default). ``create``: a deploy to a new model of a
        ``models.dir`` without ``names`` makes its store. Raises :class:`ModelNotFoundError`."""
        if name is None:
            return self.default
        slot = self.find(name)
        if slot is not None:
            return slot
        models = self.config.models
        if models is None:
            served = self.default.name
            raise ModelNotFoundError(
                f"model {name!r}: this agent serves one model ({served or 'none yet'}) from bundles.dir",
                hint="leave out args.model, or configure a models: section to serve several models",
            )
        if create and models.names is None and MODEL_NAME_PATTERN.match(name):
            with self._lock:
                slot = self._slots.get(name)
                if slot is None and len(self._slots) >= MAX_MODELS:
                    raise ModelNotFoundError(f"model {name!r} would be a new model, and this agent serves {len(self._slots)}, "
                                             f"the most one agent serves (telemetry carries at most {MAX_MODELS})",
                                             hint="deploy it to another device, or to one of the models it serves")  # fmt: skip
                if slot is None:
                    slot = self._add(name, models.dir / name)
                    slot.store.prepare()  # a new model's store: versions/ and staging/
                return slot
        known = ", ".join(str(slot.name) for slot in self.slots())
        hint = (f"add {name!r} to models.names in the agent config" if models.names is not None
                else "a model name has letters, digits, '_', '.' and '-' only")  # fmt: skip
        raise ModelNotFoundError(f"unknown model {name!r}; this agent serves: {known}", hint=hint)

    # -- life cycle -----------------------------------------------------------------------------------

    def hold(self) -> None:
        """Take ``models.dir``'s process lock (each model's folder has its own, taken by its store): with it, no
        other process adds a model folder while this one serves or installs (``edgekit-agent install --model
        <a new model>`` while the agent runs). Without a ``models:`` section, ``bundles.dir``'s lock does it."""
        models = self.config.models
        if models is None or self._holds_models_dir:
            return
        try:
            models.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DeployError(f"models.dir '{models.dir}' cannot be created: {err.strerror or err}",
                              hint="make models.dir writable by the agent (ReadWritePaths= in the systemd unit)") from err  # fmt: skip
        take_process_lock(models.dir, "models.dir")
        self._holds_models_dir = True

    def start(self) -> None:
        """Serve each model's ``current`` (else ``previous``), the default model first."""
        self.hold()
        for slot in self.slots():
            slot.deployer.start()

    def close(self) -> None:
        for slot in self.slots():
            slot.server.close()
            slot.store.release()
        if self._holds_models_dir and self.config.models is not None:
            self._holds_models_dir = False
            drop_process_lock(self.config.models.dir)

    # -- memory -----------------------------------------------------------------------------------------

    def held_mb(self, *, excluding: str | None | object = object()) -> float:
        """What the served models (and models staged by a pipeline deploy) hold together, in MiB."""
        total = 0.0
        for key, slot in list(self._slots.items()):
            if key != excluding:
                total += (slot.deployer.held_mb or 0.0) + self._pending_mb.get(key, 0.0)
        return total

    def _guard(self, key: str | None, megabytes: float, measured: bool) -> None:
        budget = self.budget_mb
        if budget is None:
            return
        others = self.held_mb(excluding=key)
        if others + megabytes <= budget:
            return
        what = f"loading it added {megabytes:.1f} MiB to the agent's memory" if measured else f"its model file alone is {megabytes:.1f} MiB"
        name = key if key is not None else self.default.name
        raise MemoryBudgetError(
            f"model {name!r} does not fit in models.memory_budget_mb ({budget:g} MiB): {what} and the other "
            f"models hold {others:.1f} MiB",
            hint="raise models.memory_budget_mb, or roll back or remove another model first",
        )

    # -- pipeline deploy ----------------------------------------------------------------------------------

    def deploy_pipeline(self, requests: Sequence[DeployRequest], *, command_id: str | None = None, watch: bool = True) -> str:
        """Switch several models together, all or none: every bundle is fetched, checked, self-checked and
        loaded first; only when all passed do they switch. One health watch covers them all, and when any
        model is unhealthy all of them roll back. Ends with one ``deploy_result`` whose ``details.models``
        lists the models; returns its outcome."""

        def result(message: str, outcome: str, level: str = "info", **details: Any) -> str:
            log = {"info": logger.info, "warning": logger.warning, "error": logger.error}[level]
            log("pipeline deploy: %s", message)
            self._emit({"kind": "deploy_result", "level": level, "message": message, "command_id": command_id,
                        "details": {"outcome": outcome, "pipeline": True, "models": names, **details}})  # fmt: skip
            return outcome

        names = [request.model for request in requests]
        try:
            slots = [self.get(request.model, create=True) for request in requests]
        except DeployError as err:
            return result(f"pipeline deploy refused: {err.message}", "failed", "error", step="model", error=str(err))
        if len({id(slot) for slot in slots}) != len(slots):
            return result("pipeline deploy refused: a model is named twice", "failed", "error", step="model",
                          error="name each model once in args.deploys")  # fmt: skip
        names = [slot.name for slot in slots]
        locked: list[ModelSlot] = []
        try:
            for slot in slots:
                if not slot.deployer.lock.acquire(blocking=False):
                    return result(f"model {slot.name} has a deploy or rollback in progress; try again later", "failed",
                                  "error", step="queued", model=slot.name)  # fmt: skip
                locked.append(slot)
            return self._pipeline_locked(list(zip(slots, requests, strict=True)), watch=watch, result=result,
                                         command_id=command_id)  # fmt: skip
        except Exception as err:  # noqa: BLE001 - a failure nothing foresaw: the fleet still gets its answer
            logger.exception("pipeline deploy failed unexpectedly")
            return result(f"pipeline deploy failed: {type(err).__name__}: {err}", "failed", "error", step="internal",
                          error=f"{type(err).__name__}: {err}")  # fmt: skip
        finally:
            self._pending_mb.clear()
            for slot in locked:
                slot.deployer.lock.release()

    def _pipeline_locked(self, pairs: list[tuple[ModelSlot, DeployRequest]], *, watch: bool, result: Callable[..., str],
                         command_id: str | None) -> str:  # fmt: skip
        staged: list[tuple[ModelSlot, StagedDeploy]] = []
        unchanged: list[str] = []  # already current: reported in the one result, not on their own
        for slot, request in pairs:
            try:
                one = slot.deployer.stage(request)
            except _StageFailed as failure:
                for other_slot, other in staged:
                    other_slot.deployer.discard(other)
                return result(f"pipeline deploy failed: model {slot.name} failed at {failure.step}: {failure.error.message}; "
                              "no model was switched", "failed", "error", step=failure.step, model=slot.name,
                              error=str(failure.error))  # fmt: skip
            if isinstance(one, StagedDeploy):
                staged.append((slot, one))
                self._pending_mb[slot.key] = one.held_mb or 0.0
            else:
                unchanged.append(str(slot.name))
        window_s = self.config.health.window_s
        watching = watch and window_s > 0 and bool(staged)
        previous: list[tuple[ModelSlot, StagedDeploy, Any]] = []
        try:  # every probation on disk before any link moves: an agent killed mid-switch finds its watches
            probations = [slot.deployer.begin_probation(one, command_id=command_id, window_s=window_s)
                          for slot, one in staged] if watching else []  # fmt: skip
            for slot, one in staged:
                previous.append((slot, one, slot.deployer.switch(one)))
        except (EdgekitError, OSError) as err:  # a full disk: the switched models go back, the rest are discarded
            restored, failed_rollbacks = self._restore(previous)
            for slot, one in staged[len(previous):]:
                slot.deployer.discard(one)
                with contextlib.suppress(OSError):
                    slot.deployer.probation.clear()
            failing = staged[len(previous)][0].name if len(previous) < len(staged) else None
            return result(f"pipeline deploy failed at switch{f' of model {failing}' if failing else ''}: {err}; rolled back "
                          f"{', '.join(restored) or 'nothing'}", "failed", "error", step="switch", model=failing, error=str(err),
                          restored=restored, rollback_failed=failed_rollbacks)  # fmt: skip
        finally:
            self._pending_mb.clear()
        if watching:
            before: list[ServingTotals] = [slot.server.totals() for slot, _ in staged]
            watched = [slot.name for slot, _ in staged]
            self._emit({"kind": "deploy_progress", "level": "info", "command_id": command_id,
                        "message": f"watching {', '.join(map(str, watched))} for {window_s:g} s",
                        "details": {"step": "watching", "pipeline": True, "models": watched, "window_s": window_s,
                                    "max_error_rate": self.config.health.max_error_rate}})  # fmt: skip
            interrupted = self._stop.wait(window_s)
            if interrupted:  # never "succeeded": each model's watch starts again with the agent (agent/probation.py)
                for (slot, _), probation in zip(staged, probations, strict=True):
                    mark_stopped(slot.deployer.probation, probation)
                return result(f"pipeline deploy interrupted: the agent stopped during the health watch of "
                              f"{', '.join(map(str, watched))}; each is watched again when it starts", "interrupted", "warning")  # fmt: skip
            verdicts = [slot.deployer.judge_health(one, totals, interrupted=interrupted)
                        for (slot, one), totals in zip(staged, before, strict=True)]  # fmt: skip
            unhealthy = [(slot.name, details) for (slot, _), (healthy, details) in zip(staged, verdicts, strict=True) if not healthy]
            if unhealthy and not interrupted:
                restored, failed_rollbacks = self._restore(previous)
                unhealthy_names = ", ".join(str(name) for name, _ in unhealthy)
                return result(f"pipeline deploy rolled back: {unhealthy_names} unhealthy; rolled back {', '.join(map(str, restored)) or 'nothing'}",
                              "rolled_back", "warning", unhealthy=[name for name, _ in unhealthy],
                              health={str(name): details for name, details in unhealthy}, restored=restored,
                              rollback_failed=failed_rollbacks)  # fmt: skip
        for slot, one in staged:
            slot.deployer.finish(one)
        switched = [{"model": slot.name, "bundle": one.loaded.name} for slot, one in staged]
        return result(f"pipeline deploy switched {len(switched)} model(s) together", "succeeded", switched=switched,
                      unchanged=unchanged)  # fmt: skip

    @staticmethod
    def _restore(switched: Sequence[tuple[ModelSlot, StagedDeploy, Any]]) -> tuple[list[str], dict[str, str]]:
        """Serve each switched model's previous bundle again (one that fails its checks stays as it is, said in the
        second value); every probation of the deploy ends either way. Returns (restored, failed rollbacks)."""
        restored: list[str] = []
        failed_rollbacks: dict[str, str] = {}
        try:
            for slot, _, previous_served in switched:
                if previous_served is None or slot.store.previous is None:
                    continue  # a model new to this device has nothing to go back to
                try:
                    slot.deployer.restore_previous()
                    restored.append(str(slot.name))
                except (EdgekitError, OSError) as err:  # a previous bundle that fails its checks, a full disk
                    failed_rollbacks[str(slot.name)] = str(err)
        finally:
            for slot, _, _ in switched:
                with contextlib.suppress(OSError):
                    slot.deployer.probation.clear()
        return restored, failed_rollbacks


class StaticModel:
    """A model served by an :class:`InferenceServer` built by the caller (no store, no deploys): the API
    embedded in another program, and the benchmark. Its version is ``"1"``."""

    key = None
    version = "1"

    def __init__(self, server: InferenceServer, name: str | None = None) -> None:
        self.server = server
        self._name = name

    @property
    def name(self) -> str | None:
        return self._name or self.server.model_name

    @property
    def ready(self) -> bool:
        return self.server.signature is not None

    def info(self) -> dict[str, Any]:
        return {"model": self.name, "ready": self.ready, "version": self.version, "batching": self.server.batching_active}


class StaticModels:
    """Already-loaded servers by name, the first the default; what :class:`~edgekit_runtime.agent.api.AgentApi`
    serves when given servers rather than a :class:`ModelRepository`."""

    def __init__(self, servers: InferenceServer | Sequence[InferenceServer | tuple[str, InferenceServer]]) -> None:
        items = [servers] if isinstance(servers, InferenceServer) else list(servers)
        self._models = [StaticModel(item[1], item[0]) if isinstance(item, tuple) else StaticModel(item) for item in items]
        if not self._models:
            raise ValueError("StaticModels needs at least one server")

    @property
    def default(self) -> StaticModel:
        return self._models[0]

    def slots(self) -> list[StaticModel]:
        return list(self._models)

    def find(self, name: str) -> StaticModel | None:
        return next((model for model in self._models if model.name == name), None)
