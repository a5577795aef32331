"""A small HTTP/1.1 server on asyncio for the dashboard: GET and HEAD only, keep-alive, gzip for large
bodies, no framework. Handlers run on one worker thread (the store is not shared between threads), so
slow queries never block the event loop that accepts connections.

Limits, each answered with a JSON ``{"error", "status"}`` naming the limit:

* a connection must send its first request's line and headers within ``header_timeout_s`` (408, then
  closed), a kept-alive one its next request's first byte within ``idle_timeout_s`` (closed) and the
  rest of the head within ``header_timeout_s``, a body within ``body_timeout_s`` (408);
* at most ``max_connections`` connections at once and ``max_connections_per_client`` from one client
  address (503 beyond them, answered at once and closed, so that a flood ends in refusals, not in
  running out of file handles);
* a ``Content-Length`` that is not one decimal number (``abc``, ``-1``) is a 400, a chunked body 411,
  a body over ``MAX_BODY_BYTES`` 413, headers over ``MAX_HEADER_BYTES`` 431;
* against web pages (:mod:`edgekit_runtime.agent.http_guard`): a ``Host`` that is not a loopback name
  or address, the address listened on, or a name allowed with ``allow_hosts`` (``fleet dashboard
  --allow-host``) is a 421 (DNS rebinding), an ``Origin`` from another host a 403, a body-carrying
  request sent as ``text/plain``, a form or multipart a 415."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import json
import logging
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from edgekit_runtime.agent.http_guard import SIMPLE_REQUEST_TYPES, HostPolicy, Refusal, media_type

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_HEADER_TIMEOUT_S = 5.0
DEFAULT_IDLE_TIMEOUT_S = 30.0
DEFAULT_BODY_TIMEOUT_S = 10.0
#: how long a refused connection's request may take to arrive before the 503 (so closing sends no reset)
_REFUSAL_READ_S = 0.2
_GZIP_MIN_BYTES = 1024
_REASONS = {200: "OK", 304: "Not Modified", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
            415: "Unsupported Media Type", 421: "Misdirected Request", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    version: str = "HTTP/1.1"  # as the request line gave it

    def keeps_alive(self) -> bool:
        """Whether the connection stays open after the answer (RFC 9112 9.3): HTTP/1.1 unless it asks
        ``Connection: close``; HTTP/1.0 only when it asks ``Connection: keep-alive``."""
        tokens = {token.strip().lower() for token in self.headers.get("connection", "").split(",")}
        if "close" in tokens:
            return False
        return "keep-alive" in tokens or self.version not in ("HTTP/1.0", "HTTP/0.9")


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

    @classmethod
    def refusal(cls, refusal: Refusal) -> Response:
        return cls.error(refusal.status.value, f"{refusal.message}; {refusal.hint}")


class _Closing(Exception):
    """The connection ends after ``response`` (None: without a word)."""

    def __init__(self, response: Response | None) -> None:
        super().__init__()
        self.response = response


Handler = Callable[[Request], Response]


class HttpServer:
    """Serve ``handler`` on ``host:port`` from a background thread (``start()`` / ``stop()``)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 8480, *,
                 worker_init: Callable[[], None] | None = None, allowed_hosts: Iterable[str] = (),
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, max_connections_per_client: int | None = None,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:  # fmt: skip
        self.handler, self.host, self.port = handler, host, port
        self.allowed_hosts = tuple(allowed_hosts)
        self.max_connections = max_connections
        #: one client address may hold at most this many connections (a quarter of the cap by default)
        self.max_connections_per_client = max_connections_per_client or max(1, max_connections // 4)
        self.header_timeout_s, self.idle_timeout_s, self.body_timeout_s = header_timeout_s, idle_timeout_s, body_timeout_s
        self._host_policy = HostPolicy(self.allowed_hosts, bound_host=host, setting="--allow-host")
        self._clients: Counter[str] = Counter()  # open connections per client address (event loop thread only)
        self.refused_connections = 0
        self.timed_out_connections = 0
        self._refusing = 0  # connections being answered 503
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

    def allow_hosts(self, names: Iterable[str]) -> None:
        """Answer to these host names too (``Host`` and ``Origin``), besides loopback ones and the address
        listened on; ``*`` turns the check off. Call before ``start()``."""
        self.allowed_hosts = (*self.allowed_hosts, *names)
        self._host_policy = HostPolicy(self.allowed_hosts, bound_host=self.host, setting="--allow-host")

    @property
    def open_connections(self) -> int:
        return sum(self._clients.values())

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
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) else "local"
        busy = self._busy(client)
        if busy is not None:
            await self._refuse(reader, writer, busy)
            return
        self._clients[client] += 1
        try:
            wait_s = self.header_timeout_s
            while True:
                try:
                    request = await self._read_request(reader, wait_s)
                except _Closing as closing:
                    if closing.response is not None:
                        await self._write(writer, closing.response, head=False, gzip_ok=False, keep_alive=False)
                    break
                wait_s = self.idle_timeout_s
                refusal = self._host_policy.host_refusal(request.headers.get("host")) or \
                    self._host_policy.origin_refusal(request.headers.get("origin"))  # fmt: skip
                if refusal is not None:
                    logger.info("dashboard: refused %s %s from %s: %s", request.method, request.path[:80], client, refusal.message)
                    await self._write(writer, Response.refusal(refusal), head=False, gzip_ok=False, keep_alive=False)
                    break
                if request.method not in ("GET", "HEAD"):
                    kind = media_type(request.headers.get("content-type"))
                    if kind in SIMPLE_REQUEST_TYPES:
                        response = Response.error(415, f"Content-Type {kind!r} is not accepted (a type any web page may send "
                                                       "without asking); the dashboard is read-only")  # fmt: skip
                    else:
                        response = Response.error(405, f"method {request.method} is not allowed; the dashboard is read-only")
                else:
                    response = await asyncio.get_running_loop().run_in_executor(self._worker, self._call, request)
                keep_alive = request.keeps_alive()
                gzip_ok = "gzip" in request.headers.get("accept-encoding", "")
                await self._write(writer, response, head=request.method == "HEAD", gzip_ok=gzip_ok, keep_alive=keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # the server is stopping (see _run); ending normally keeps asyncio's stream callback quiet
        finally:
            self._clients[client] -= 1
            if self._clients[client] <= 0:
                del self._clients[client]
            writer.close()

    def _busy(self, client: str) -> Response | None:
        """503 when every connection slot, or this client's share of them, is taken."""
        if self.open_connections >= self.max_connections:
            message = f"the dashboard already serves {self.max_connections} connections, its limit; try again shortly"
        elif self._clients[client] >= self.max_connections_per_client:
            message = (f"this client ({client}) already holds {self._clients[client]} connections, its share of "
                       f"{self.max_connections}; reuse them (keep-alive) or close some")  # fmt: skip
        else:
            return None
        self.refused_connections += 1
        return Response.error(503, message)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: Response) -> None:
        """Answer 503 and close. While few are being refused, first take in what the client already sent (at
        most ``_REFUSAL_READ_S``), so that closing does not reset the connection under the reply; in a flood,
        at once, so that refused connections do not hold file handles."""
        self._refusing += 1
        try:
            if self._refusing <= self.max_connections:
                try:
                    await asyncio.wait_for(reader.read(MAX_HEADER_BYTES), _REFUSAL_READ_S)
                except (asyncio.TimeoutError, ConnectionError):
                    pass
            await self._write(writer, response, head=False, gzip_ok=False, keep_alive=False)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._refusing -= 1
            writer.close()

    def _call(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception as exc:  # one failing request must not take the server down
            logger.exception("dashboard request %s failed", request.path)
            return Response.error(500, f"{type(exc).__name__}: {exc}")

    async def _read_request(self, reader: asyncio.StreamReader, wait_s: float) -> Request:
        """The next request; :class:`_Closing` when the connection is to end (with the reason, if any)."""
        try:
            first = await asyncio.wait_for(reader.readexactly(1), wait_s)
        except asyncio.IncompleteReadError:
            raise _Closing(None) from None  # the client closed the connection
        except asyncio.TimeoutError:
            if wait_s == self.idle_timeout_s:
                raise _Closing(None) from None  # a kept-alive connection with nothing to do
            self.timed_out_connections += 1
            raise _Closing(Response.error(408, f"no request arrived within {wait_s:g} s of connecting; send it at once")) from None
        try:
            head = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.header_timeout_s)
        except asyncio.IncompleteReadError:
            raise _Closing(None) from None
        except asyncio.TimeoutError:
            self.timed_out_connections += 1
            raise _Closing(Response.error(408, f"the request line and headers did not arrive within "
                                               f"{self.header_timeout_s:g} s; send them at once")) from None  # fmt: skip
        except asyncio.LimitOverrunError:
            raise _Closing(Response.error(431, f"request headers are larger than {MAX_HEADER_BYTES} bytes")) from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise _Closing(Response.error(400, f"malformed request line {lines[0][:80]!r}: expected METHOD /path HTTP/1.1"))
        headers: dict[str, str] = {}
        lengths: list[str] = []
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                name, value = name.strip().lower(), value.strip()
                headers[name] = value
                if name == "content-length":
                    lengths.append(value)
        await self._skip_body(reader, headers, lengths)
        target = urllib.parse.urlsplit(parts[1])
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(target.query).items()}
        return Request(parts[0].upper(), urllib.parse.unquote(target.path), query, headers, parts[2].upper())

    async def _skip_body(self, reader: asyncio.StreamReader, headers: dict[str, str], lengths: list[str]) -> None:
        """Read past a request's body (no handler reads one), or refuse framing that cannot be trusted."""
        if "transfer-encoding" in headers:
            raise _Closing(Response.error(411, f"Transfer-Encoding {headers['transfer-encoding'][:40]!r} is not supported; "
                                               "send a Content-Length (the dashboard reads no request bodies)"))  # fmt: skip
        if len(lengths) > 1:
            raise _Closing(Response.error(400, f"{len(lengths)} Content-Length headers; send one"))
        text = lengths[0] if lengths else "0"
        if not (text.isascii() and text.isdigit()):
            raise _Closing(Response.error(400, f"Content-Length {text[:40]!r} is not a non-negative decimal number of bytes"))
        length = int(text)
        if length > MAX_BODY_BYTES:
            raise _Closing(Response.error(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}"))
        if length:
            try:
                await asyncio.wait_for(reader.readexactly(length), self.body_timeout_s)
            except asyncio.TimeoutError:
                self.timed_out_connections += 1
                raise _Closing(Response.error(408, f"the request body did not arrive within {self.body_timeout_s:g} s")) from None

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
