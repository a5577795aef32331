"""A simulated fleet spread over several processes, for fleets one Python thread cannot drive.

One :class:`~edgekit.fleet.simulate.FleetSimulator` keeps every connection on one thread: about
10,000 devices at 10 s windows is a whole core of this kind of host. :class:`ShardedFleetSimulator`
splits the devices into contiguous shards (``first_device`` ... of :class:`SimulationConfig`), runs
each shard's simulator in its own process (``multiprocessing`` spawn), and drives them over pipes:
the same device names, client ids, last wills and messages as one simulator of the whole fleet.
Each shard connects paced at ``max_connecting / processes``, so the broker sees the same pace.

Python::

    with ShardedFleetSimulator(SimulationConfig("mqtt://127.0.0.1:1883", devices=10_000), processes=2) as sim:
        sim.run_for(60)
        sim.crash("jetson-orin-nano-8gb-000")   # a real socket close: the broker publishes its last will
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import time
from multiprocessing.connection import Connection as Pipe
from typing import Any

from edgekit.fleet.sim.seed import device_names
from edgekit.fleet.simulate import (CONNECT_STALL_S, FleetSimulator, SimulationConfig, SimulationError, SimulatorCounters,
                                     block_for)

logger = logging.getLogger(__name__)

#: Devices one process drives well at 10 s windows on a 2-core host (``auto_processes``).
DEVICES_PER_PROCESS = 5000
_REPLY_S = 30.0


def auto_processes(devices: int, cpus: int | None = None) -> int:
    """How many simulator processes for ``devices``: one per :data:`DEVICES_PER_PROCESS`, at most one per CPU."""
    import os

    cpus = cpus or os.cpu_count() or 1
    return max(1, min(cpus, -(-devices // DEVICES_PER_PROCESS)))


def _shard_main(config: SimulationConfig, pipe: Pipe) -> None:
    """A shard process: one FleetSimulator, driven by (command, argument) messages on ``pipe``."""
    simulator = FleetSimulator(config)
    try:
        while True:
            try:
                command, argument = pipe.recv()
            except (EOFError, OSError):  # the parent went away: stop like a clean shutdown
                command, argument = "stop", 1.0
            try:
                if command == "start":
                    simulator.start(telemetry=False, **argument)
                    reply: Any = simulator.connect_seconds
                elif command == "telemetry":
                    simulator.start_telemetry()
                    reply = None
                elif command == "counters":
                    reply = dataclasses.asdict(simulator.counters())
                elif command == "crash":
                    simulator.crash(argument)
                    reply = None
                elif command == "flush":
                    reply = simulator.flush(argument)
                elif command == "stop":
                    simulator.stop(flush_s=argument)
                    reply = dataclasses.asdict(simulator.counters())
                else:
                    raise SimulationError(f"unknown shard command {command!r}")
                answer: tuple[str, Any] = ("ok", reply)
            except Exception as exc:  # handed back to the parent, which raises it
                answer = ("error", f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}")
            try:
                pipe.send(answer)
            except (OSError, ValueError):  # nobody to answer: the parent is gone
                if command != "stop":
                    simulator.stop(flush_s=1.0)
                return
            if command == "stop":
                return
    finally:
        pipe.close()


class ShardedFleetSimulator:
    """``processes`` :class:`FleetSimulator` shards of one fleet: ``start()``, ``run_for()``, ``crash()``, ``stop()``."""

    def __init__(self, config: SimulationConfig, processes: int | None = None) -> None:
        config.check()
        config = config.resolved()  # the whole fleet's defaults, not each shard's
        processes = processes or auto_processes(config.devices)
        if not 1 <= processes <= config.devices:
            raise SimulationError(f"processes must be from 1 to the number of devices ({config.devices}), got {processes}",
                                  hint="e.g. processes=2 for 10,000 devices on 2 cores")  # fmt: skip
        self.config = config
        self.processes = processes
        per_shard_connecting = max(8, config.max_connecting // processes)
        sizes = [config.devices // processes + (1 if i < config.devices % processes else 0) for i in range(processes)]
        self.shard_configs: list[SimulationConfig] = []
        first = config.first_device
        for size in sizes:
            self.shard_configs.append(dataclasses.replace(config, devices=size, first_device=first, max_connecting=per_shard_connecting))
            first += size
        self.devices: dict[str, int] = {}  # device -> shard index
        for index, shard in enumerate(self.shard_configs):
            for device, _ in device_names(shard.devices, shard.targets, shard.first_device):
                self.devices[device] = index
        self.connect_seconds: float | None = None
        self._pipes: list[Pipe] = []
        self._workers: list[multiprocessing.process.BaseProcess] = []
        self._stopped_counters: SimulatorCounters | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, *, wait_s: float | None = None, stall_s: float = CONNECT_STALL_S, telemetry: bool = True) -> ShardedFleetSimulator:
        """Start the shard processes and connect every device (each shard as :meth:`FleetSimulator.start`)."""
        if self._workers:
            raise SimulationError("this simulator was already started", hint="create a new ShardedFleetSimulator")
        started = time.monotonic()
        context = multiprocessing.get_context("spawn")
        for index, shard in enumerate(self.shard_configs):
            parent_end, child_end = context.Pipe()
            worker = context.Process(target=_shard_main, args=(shard, child_end), name=f"edgekit-sim-shard-{index}", daemon=True)
            worker.start()
            child_end.close()
            self._pipes.append(parent_end)
            self._workers.append(worker)
        shard_wait_s = 30.0 + 0.02 * max(s.devices for s in self.shard_configs) if wait_s is None else wait_s
        try:
            self._all("start", {"wait_s": shard_wait_s, "stall_s": stall_s}, timeout_s=shard_wait_s + 60.0)
        except SimulationError:
            self.stop(flush_s=1.0)
            raise
        self.connect_seconds = time.monotonic() - started
        if telemetry:
            self.start_telemetry()
        return self

    def start_telemetry(self) -> None:
        self._all("telemetry", None)

    def stop(self, *, flush_s: float = 5.0) -> None:
        """Every shard flushes, says ``offline`` and disconnects cleanly; then the processes exit."""
        if not self._workers:
            return
        try:
            finals = self._all("stop", flush_s, timeout_s=3 * flush_s + _REPLY_S)
            self._stopped_counters = _sum_counters(finals)
        except SimulationError as err:
            logger.warning("sharded simulator stop: %s", err.message)
        for worker in self._workers:
            worker.join(10.0)
            if worker.is_alive():
                worker.kill()
                worker.join(5.0)
        for pipe in self._pipes:
            pipe.close()
        self._workers, self._pipes = [], []

    def __enter__(self) -> ShardedFleetSimulator:
        return self if self._workers else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_for(self, duration_s: float | None) -> None:
        """Block for ``duration_s`` seconds (forever when None) while the devices run."""
        block_for(duration_s)

    # -- inspection and control ----------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        """Process ids of the running shards (for CPU and memory accounting)."""
        return [worker.pid for worker in self._workers if worker.pid is not None]

    def counters(self) -> SimulatorCounters:
        """The fleet's counters, summed over the shards (the final ones once stopped)."""
        if not self._workers:
            if self._stopped_counters is not None:
                return self._stopped_counters
            return SimulatorCounters(devices=self.config.devices, connected=0, published=0, acked=0, queued=0, windows=0)
        return _sum_counters(self._all("counters", None))

    def flush(self, timeout_s: float) -> bool:
        return all(self._all("flush", timeout_s, timeout_s=timeout_s + _REPLY_S))

    def crash(self, device: str) -> None:
        """:meth:`FleetSimulator.crash` in the shard that owns ``device``: its socket is closed without a
        DISCONNECT and the broker publishes its last will."""
        if device not in self.devices:
            raise SimulationError(f"no simulated device {device!r}", hint=f"devices: {', '.join(list(self.devices)[:5])}, ...")
        index = self.devices[device]
        self._send(index, "crash", device)
        self._receive(index, _REPLY_S)

    def record_targets(self, store: Any) -> None:
        """Tell a fleet store each simulated device's target."""
        for shard in self.shard_configs:
            for device, target in device_names(shard.devices, shard.targets, shard.first_device):
                store.set_device_target(shard.fleet, device, target)

    # -- pipes --------------------------------------------------------------------------------------

    def _send(self, index: int, command: str, argument: Any) -> None:
        try:
            self._pipes[index].send((command, argument))
        except (OSError, ValueError) as exc:
            raise SimulationError(f"simulator shard {index} is gone ({exc})", hint="see its log lines above") from exc

    def _receive(self, index: int, timeout_s: float) -> Any:
        pipe = self._pipes[index]
        if not pipe.poll(timeout_s):
            raise SimulationError(f"simulator shard {index} did not answer within {timeout_s:g} s",
                                  hint="the host may be overloaded; try fewer devices per process")  # fmt: skip
        try:
            status, value = pipe.recv()
        except (EOFError, OSError) as exc:
            raise SimulationError(f"simulator shard {index} exited ({exc})", hint="see its log lines above") from exc
        if status == "error":
            raise SimulationError(f"simulator shard {index}: {value}")
        return value

    def _all(self, command: str, argument: Any, timeout_s: float = _REPLY_S) -> list[Any]:
        for index in range(len(self._pipes)):
            self._send(index, command, argument)
        deadline = time.monotonic() + timeout_s
        replies, errors = [], []
        for index in range(len(self._pipes)):
            try:
                replies.append(self._receive(index, max(0.1, deadline - time.monotonic())))
            except SimulationError as err:
                errors.append(err)
        if errors:
            raise errors[0]
        return replies


def _sum_counters(values: list[dict[str, int]]) -> SimulatorCounters:
    return SimulatorCounters(**{name: sum(v[name] for v in values) for name in values[0]})
