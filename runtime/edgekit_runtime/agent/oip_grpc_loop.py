"""The gRPC server's event loop: grpcio's asyncio server (``grpc.aio``) on an asyncio loop in a thread of its own.

``ModelInfer`` handlers decode their request on the loop and hand it to :class:`InferPasses`, which runs the
requests queued together with :meth:`~edgekit_runtime.agent.serving.InferenceServer.infer_together` (with
batching, one runner call for those whose shapes agree; no hand-off to a batching worker): a pass starts once
the loop has woken every handler ready with it (``call_soon``). A lone request runs on the loop itself unless its
model is slow; when requests come while others run (a busy server), passes run on the model's runner thread (one
per model), so that the loop goes on taking in calls meanwhile and the next pass takes all of them. The other RPCs (health, metadata,
configuration, statistics, repository load / unload, some of which block: a load verifies a bundle again)
run on a few worker threads, so that they never hold up inference.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent import futures
from typing import Any

logger = logging.getLogger(__name__)

#: a request alone in its pass runs on the loop (no hand-off), but one such pass in this many runs on the runner
#: thread, to see whether requests arrive while it runs (a busy server, whose passes then go there and batch)
PROBE_EVERY = 8
#: a lone request whose pass took longer than this on the loop (a slow model) sends that model's later lone
#: requests to its runner thread, so that it never holds up the loop and the other models' requests
SLOW_ON_LOOP_S = 0.002
#: threads answering the RPCs other than ModelInfer (health, metadata, load / unload, ...)
WORKERS = 4
#: how long start() waits for the loop to bind its address and start serving
START_TIMEOUT_S = 30.0


class InferPasses:
    """The ``ModelInfer`` requests queued on ``loop``, run together: a pass takes every request queued so far
    and runs it with ``infer_together`` on ``runner`` (one thread), so that the loop goes on reading requests
    meanwhile: those make the next pass, started as soon as this one is done. grpcio's asyncio server takes in
    one call at a time, so a lone request is the rule even under load; it runs on the loop itself (no
    hand-off) unless the server is busy: the last pass on the runner had company, or had requests arrive
    while it ran (every :data:`PROBE_EVERY` th lone pass goes there to find out)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, runner: futures.Executor) -> None:
        self._loop, self._runner = loop, runner
        self._queued: list[_Queued] = []
        self._running = False  # a pass is on the runner thread
        self._in_flight = 0  # ModelInfer handlers between infer() and their result
        self._busy = False  # whether the last pass on the runner thread had company
        self._slow = False  # whether this model's last pass took longer than SLOW_ON_LOOP_S
        self._lone_passes = 0
        self._pass_started = 0.0

    async def infer(self, server: Any, feeds: dict[str, Any]) -> Any:
        """``feeds``' result on ``server`` (an ``InferenceServer``): its ``InferenceResult``, or the exception it
        failed with (as ``infer_together`` gives it, returned, not raised). Call on the loop."""
        if not self._queued and not self._running and not self._busy and not self._in_flight and not self._slow:
            self._lone_passes += 1  # alone on an idle server: run now, no future, no further turn of the loop
            if self._lone_passes % PROBE_EVERY:
                started = time.perf_counter()
                result = _run_together([(server, feeds, time.perf_counter_ns(), None)])[0]
                self._slow = time.perf_counter() - started > SLOW_ON_LOOP_S
                return result
        future = self._loop.create_future()
        if not self._queued and not self._running:
            self._loop.call_soon(self._start_pass)  # once this pass of the loop has woken every ready handler
        self._queued.append((server, feeds, time.perf_counter_ns(), future))
        self._in_flight += 1
        try:
            return await future
        finally:
            self._in_flight -= 1

    def _start_pass(self) -> None:
        if self._running or not self._queued:
            return
        queued, self._queued = self._queued, []
        self._running = True
        self._pass_started = time.perf_counter()
        done = self._loop.run_in_executor(self._runner, _run_together, queued)
        done.add_done_callback(lambda finished: self._finish_pass(queued, finished))

    def _finish_pass(self, queued: list[_Queued], finished: asyncio.Future[Any]) -> None:
        self._running = False
        self._busy = len(queued) > 1 or bool(self._queued)  # others came while it ran: keep the loop free
        self._slow = time.perf_counter() - self._pass_started > SLOW_ON_LOOP_S
        try:
            results = finished.result()  # _run_together answers every request, errors included
        except BaseException as err:  # the runner thread was shut down under it: the server is stopping
            results = [RuntimeError(f"the gRPC server stopped while the request waited ({type(err).__name__})")] * len(queued)
        self._resolve(queued, results)
        self._start_pass()

    @staticmethod
    def _resolve(queued: list[_Queued], results: list[Any]) -> None:
        for item, result in zip(queued, results):
            future = item[3]
            if future is not None and not future.done():  # a cancelled call (the client went away) has no one waiting
                future.set_result(result)


class ModelPasses:
    """One :class:`InferPasses`, with a runner thread of its own, per model (per ``InferenceServer``): a slow
    model's passes run beside the others' and never hold them up (before, one runner thread ran every model's
    passes in turn, and a 60 ms model put 48 ms on a 1 ms model's calls). Call on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop, self._name = loop, name
        self._by_server: dict[int, tuple[Any, InferPasses, futures.ThreadPoolExecutor]] = {}

    async def infer(self, server: Any, feeds: dict[str, Any]) -> Any:
        """``feeds``' result on ``server``, as :meth:`InferPasses.infer` gives it."""
        entry = self._by_server.get(id(server))
        if entry is None or entry[0] is not server:  # (an id reused by a new server object: a new entry)
            runner = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self._name}-infer")
            entry = (server, InferPasses(self._loop, runner), runner)
            self._by_server[id(server)] = entry
        return await entry[1].infer(server, feeds)

    def shutdown(self) -> None:
        entries, self._by_server = list(self._by_server.values()), {}
        for _, _, runner in entries:
            runner.shutdown(wait=False, cancel_futures=True)


#: a queued request: (its model's InferenceServer, its feeds, its arrival stamp, the future of its result)
_Queued = tuple[Any, dict[str, Any], int, "asyncio.Future[Any] | None"]


def _run_together(queued: list[_Queued]) -> list[Any]:
    """Run ``queued``, per model server, with ``infer_together``; each one's result or exception, in order."""
    by_server: dict[int, list[int]] = {}
    for index, item in enumerate(queued):
        by_server.setdefault(id(item[0]), []).append(index)
    results: list[Any] = [None] * len(queued)
    for indices in by_server.values():
        try:
            answers = queued[indices[0]][0].infer_together([(queued[i][1], queued[i][2]) for i in indices])
        except Exception as err:  # a bug: every request of the model gets it, as an internal error
            logger.exception("gRPC event loop: running %d request(s) failed", len(indices))
            answers = [err] * len(indices)
        for index, answer in zip(indices, answers):
            results[index] = answer
    return results


class AioServerThread:
    """A ``grpc.aio`` server and the asyncio loop it runs on, in a daemon thread; ``start()`` / ``stop()``."""

    def __init__(self, grpc: Any, name: str = "edgekit-grpc") -> None:
        self._grpc, self._name = grpc, name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.passes: ModelPasses | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self.workers: futures.ThreadPoolExecutor | None = None

    def start(self, handlers: Any, options: list[tuple[str, Any]], target: str) -> int:
        """Serve ``handlers`` (a generic RPC handler of async methods) on ``target``; the port bound. Raises what
        ``add_insecure_port`` raises when it cannot bind (``RuntimeError``), with the loop stopped again."""
        loop = asyncio.new_event_loop()
        self.workers = futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=f"{self._name}-rpc")
        self.loop, self.passes = loop, ModelPasses(loop, self._name)
        self._thread = threading.Thread(target=_run_loop, args=(loop,), name=self._name, daemon=True)
        self._thread.start()
        try:
            return asyncio.run_coroutine_threadsafe(self._serve(handlers, options, target), loop).result(START_TIMEOUT_S)
        except BaseException:
            self._close_loop()
            raise

    async def _serve(self, handlers: Any, options: list[tuple[str, Any]], target: str) -> int:
        server = self._grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((handlers,))
        port = server.add_insecure_port(target)
        await server.start()
        self._server = server
        return int(port)

    def stop(self, grace_s: float) -> None:
        """Stop serving: calls in flight get ``grace_s`` seconds to finish; then the loop and its thread end."""
        loop, server = self.loop, self._server
        if loop is None:
            return
        if server is not None:
            self._server = None
            try:
                asyncio.run_coroutine_threadsafe(server.stop(grace_s), loop).result(grace_s + START_TIMEOUT_S)
            except Exception:  # stopping goes on: the loop and its thread end below either way
                logger.exception("gRPC server: stopping failed")
        self._close_loop()

    def _close_loop(self) -> None:
        loop, thread, workers, passes = self.loop, self._thread, self.workers, self.passes
        self.loop = self._thread = self.workers = self.passes = None
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(START_TIMEOUT_S)
        if workers is not None:
            workers.shutdown(wait=False, cancel_futures=True)
        if passes is not None:
            passes.shutdown()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The server thread: ``loop`` until it is stopped, then closed."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
