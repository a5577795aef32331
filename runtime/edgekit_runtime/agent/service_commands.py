"""The agent's fleet commands (``deploy``, ``deploy_pipeline``, ``rollback``, ``set_interval``, ``ping``):
queued by the MQTT link's network thread, carried out on the agent's command thread; deploys and rollbacks
run on a thread of their own, so that pings are answered during a deploy's health watch. A part of
:class:`~edgekit_runtime.agent.service.AgentService`, which supplies the state named below.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgekit_runtime.agent.config import AgentConfig
from edgekit_runtime.agent.ota import DeployRequest
from edgekit_runtime.errors import EdgekitError

logger = logging.getLogger("edgekit_runtime.agent.service")

#: how often the command and telemetry threads look at their stop flag
COMMAND_POLL_S = 0.2


class CommandHandling:
    """Command intake and handlers of :class:`~edgekit_runtime.agent.service.AgentService`."""

    config: AgentConfig
    models: Any
    deployer: Any
    _stop: threading.Event
    _commands: queue.Queue[dict[str, Any]]
    _threads: list[threading.Thread]
    _interval_s: float
    _interval_changed: threading.Event
    _started_monotonic_s: float
    _emit: Callable[[dict[str, Any]], None]

    def handle_command(self, command: dict[str, Any]) -> None:
        """The link's ``on_command``: queue the command; never blocks the network thread."""
        self._commands.put(command)

    def _command_loop(self) -> None:
        while not self._stop.is_set():
            try:
                command = self._commands.get(timeout=COMMAND_POLL_S)
            except queue.Empty:
                continue
            self.dispatch_command(command)

    def dispatch_command(self, command: Mapping[str, Any]) -> None:
        """Carry out one command dict (``command.v1``: ``{id, command, args}``)."""
        command_id = command.get("id") if isinstance(command.get("id"), str) else None
        name = command.get("command")
        args = command.get("args") or {}
        handler = COMMAND_HANDLERS.get(name) if isinstance(name, str) else None
        if handler is None or not isinstance(args, Mapping):
            problem = f"unknown command {name!r}" if handler is None else "args must be an object"
            self._emit({"kind": "command_rejected", "level": "error", "command_id": command_id,
                        "message": f"{problem}; known commands: {', '.join(COMMAND_HANDLERS)}", "details": {"command": str(name)}})  # fmt: skip
            return
        try:
            handler(self, dict(args), command_id)
        except EdgekitError as err:
            self._emit({"kind": "command_rejected", "level": "error", "command_id": command_id, "message": err.message,
                        "details": {"command": name, "hint": err.hint}})  # fmt: skip
        except Exception as exc:  # a bug: answer the command rather than leave the host waiting
            logger.exception("command %s (%s) failed", command_id, name)
            self._emit({"kind": "command_failed", "level": "error", "command_id": command_id,
                        "message": f"command '{name}' failed: {type(exc).__name__}: {exc}", "details": {"command": name}})  # fmt: skip

    def _command_deploy(self, args: dict[str, Any], command_id: str | None) -> None:
        request = DeployRequest.from_command(args, command_id=command_id, require_signed=self.config.commands.require_signed,
                                             config_file=self.config.source)  # fmt: skip
        deployer = self.models.get(request.model, create=True).deployer  # an unknown model: command_rejected
        self._spawn_ota("edgekit-deploy", lambda: deployer.deploy(request))

    def _command_deploy_pipeline(self, args: dict[str, Any], command_id: str | None) -> None:
        deploys = args.get("deploys")
        hint = 'send args {"deploys": [{"model": "detector", "bundle_id": ..., "url": ..., "sha256": ...}, ...]}'
        if set(args) - {"deploys"} or not isinstance(deploys, list) or not deploys:
            raise EdgekitError(f"deploy_pipeline: args must be {{\"deploys\": [...]}} with at least one deploy, got keys {sorted(args)}", hint=hint)
        requests = []
        for index, item in enumerate(deploys):
            if not isinstance(item, dict) or not isinstance(item.get("model"), str):
                raise EdgekitError(f"deploy_pipeline: deploys[{index}] must be an object naming its model", hint=hint)
            requests.append(DeployRequest.from_command(item, command_id=command_id, config_file=self.config.source,
                                                       require_signed=self.config.commands.require_signed))  # fmt: skip
        self._spawn_ota("edgekit-deploy", lambda: self.models.deploy_pipeline(requests, command_id=command_id))

    def _command_rollback(self, args: dict[str, Any], command_id: str | None) -> None:
        bundle_id, model = args.get("bundle_id"), args.get("model")
        if bundle_id is not None and not isinstance(bundle_id, str):
            raise EdgekitError(f"rollback: bundle_id must be a string, got {bundle_id!r}")
        if model is not None and not isinstance(model, str):
            raise EdgekitError(f"rollback: model must be a model name (a string), got {model!r}")
        deployer = self.models.get(model).deployer
        self._spawn_ota("edgekit-rollback", lambda: deployer.rollback(command_id=command_id, bundle_id=bundle_id))

    def _spawn_ota(self, name: str, work: Callable[[], object]) -> None:
        def run() -> None:
            try:
                work()
            except Exception:  # a bug; the deployer reports user-facing failures as events itself
                logger.exception("%s crashed", name)
                self._emit({"kind": "error", "level": "error", "message": f"{name} crashed; see the agent log"})

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        # finished ones go: every deploy and rollback command starts one, and the list lives as long as the agent
        self._threads[:] = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)

    def _command_set_interval(self, args: dict[str, Any], command_id: str | None) -> None:
        interval_s = args.get("interval_s")
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not 1 <= interval_s <= 86400:
            raise EdgekitError(f"set_interval: interval_s must be a number in 1..86400, got {interval_s!r}",
                               hint='send args {"interval_s": 30}')  # fmt: skip
        previous_s, self._interval_s = self._interval_s, float(interval_s)
        self._interval_changed.set()
        self._emit({"kind": "interval_changed", "level": "info", "command_id": command_id,
                    "message": f"telemetry interval {previous_s:g} s -> {interval_s:g} s",
                    "details": {"interval_s": float(interval_s), "previous_interval_s": previous_s}})  # fmt: skip

    def _command_ping(self, args: dict[str, Any], command_id: str | None) -> None:
        served = self.deployer.served
        self._emit({"kind": "pong", "level": "info", "command_id": command_id, "message": "pong",
                    "details": {"bundle": served.telemetry_ref() if served else None,
                                "uptime_s": round(time.monotonic() - self._started_monotonic_s, 3)}})  # fmt: skip


#: Command name -> handler, dispatched by :meth:`CommandHandling.dispatch_command`.
COMMAND_HANDLERS: dict[str, Callable[[CommandHandling, dict[str, Any], str | None], None]] = {
    "deploy": CommandHandling._command_deploy,
    "rollback": CommandHandling._command_rollback,
    "set_interval": CommandHandling._command_set_interval,
    "ping": CommandHandling._command_ping,
    "deploy_pipeline": CommandHandling._command_deploy_pipeline,
}
