"""A small HTTP/1.1 server on asyncio for the dashboard: GET and HEAD only, keep-alive, gzip for large
bodies, no framework. Handlers run on one worker thread (the store is not shared between threads), so
slow queries never block the event loop that accepts connections."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import json
import logging
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
_GZIP_MIN_BYTES = 1024
_REASONS = {200: "OK", 304: "Not Modified", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 500: "Internal Server Error"}  # fmt: skip


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, payload: Any, status: int = 200) -> Response:
        body = json.dumps(payload, separators=(",", ":"), default=str, allow_nan=False).encode("utf-8")
        return cls(status, body, "application/json", {"Cache-Control": "no-store"})

    @classmethod
    def error(cls, status: int, message: str) -> Response:
        return cls.json({"error": message, "status": status}, status)


Handler = Callable[[Request], Response]


class HttpServer:
    """Serve ``handler`` on ``host:port`` from a background thread (``start()`` / ``stop()``)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 8480, *,
                 worker_init: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.handler, self.host, self.port = handler, host, port
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edgekit-dashboard-worker",
                                                             initializer=worker_init)  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout_s: float = 10.0) -> HttpServer:
        self._thread = threading.Thread(target=self._run, name="edgekit-dashboard-http", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the dashboard server did not start within {timeout_s:g} s")
        if self._startup_error is not None:
            raise self._startup_error
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._worker.shutdown(wait=True, cancel_futures=True)

    def run_in_worker(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` on the handler thread (e.g. to close the store) and return its result."""
        return self._worker.submit(action).result()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(asyncio.start_server(self._serve_connection, self.host, self.port,
                                                                        limit=MAX_HEADER_BYTES))  # fmt: skip
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as err:
            self._startup_error = err
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            # connections a browser keeps alive are still waiting for a request: end them while the loop runs
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    break
                if isinstance(request, Response):
                    await self._write(writer, request, head=False, gzip_ok=False, keep_alive=False)
                    break
                if request.method not in ("GET", "HEAD"):
                    response = Response.error(405, f"method {request.method} is not allowed; the dashboard is read-only")
                else:
                    response = await asyncio.get_running_loop().run_in_executor(self._worker, self._call, request)
                keep_alive = request.headers.get("connection", "").lower() != "close"
                gzip_ok = "gzip" in request.headers.get("accept-encoding", "")
                await self._write(writer, response, head=request.method == "HEAD", gzip_ok=gzip_ok, keep_alive=keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # the server is stopping (see _run); ending normally keeps asyncio's stream callback quiet
        finally:
            writer.close()

    def _call(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception as exc:  # one failing request must not take the server down
            logger.exception("dashboard request %s failed", request.path)
            return Response.error(500, f"{type(exc).__name__}: {exc}")

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | Response | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError:
            return Response.error(413, f"request headers are larger than {MAX_HEADER_BYTES} bytes")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return Response.error(400, "malformed request line")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length:
            await reader.readexactly(min(length, 1 << 20))
        target = urllib.parse.urlsplit(parts[1])
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(target.query).items()}
        return Request(parts[0].upper(), urllib.parse.unquote(target.path), query, headers)

    async def _write(self, writer: asyncio.StreamWriter, response: Response, *, head: bool, gzip_ok: bool,
                     keep_alive: bool) -> None:  # fmt: skip
        body = response.body
        headers = {"Content-Type": response.content_type, "X-Content-Type-Options": "nosniff",
                   "Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:",
                   **response.headers}  # fmt: skip
        if gzip_ok and len(body) >= _GZIP_MIN_BYTES:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        headers["Content-Length"] = str(len(body))
        headers["Connection"] = "keep-alive" if keep_alive else "close"
        status_line = f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}\r\n"
        writer.write((status_line + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1"))
        if not head:
            writer.write(body)
        await writer.drain()
