#!/usr/bin/env python
"""The agent's resident memory while its local API is abused; one run, JSON out.

    .venv/bin/python scripts/abuse_local_api.py [--claims 16] [--claim-mb 64] [--slowloris 64]
                                                [--flood 300] [--hold-s 2]

A child process serves :class:`~edgekit_runtime.agent.api.AgentApi` (default limits, no model: the
abuse ends before inference) on a loopback port, and the parent, over real sockets:

1. ``claims``: opens ``--claims`` connections that each send ``Content-Length: <claim-mb> MB`` and one
   body byte, and hold them (a server that sizes its buffer from the header allocates them all);
2. ``slowloris``: opens ``--slowloris`` connections that send a header byte every 0.5 s (counted: how
   many the API closed with 408 within its header_timeout_s);
3. ``flood``: opens ``--flood`` idle connections at once (counted: how many were refused with 503);
4. ``hostile_json`` (with ``--bundle DIR``, which the child then serves): POSTs ``--json-mb`` MB of JSON
   to ``/v1/infer``, once as compact values (``0.0,`` ...: more values than most models take) and once
   as 25-digit values (as many as a float32[2, 3, 640, 640] input takes), then four of the latter at
   once; each reports the peak RSS growth (VmHWM after resetting it through ``/proc/<pid>/clear_refs``).
   The model of tests/runtime/agent/wide_bundle.py is big enough for 60 MB to be read::

       .venv/bin/python -c "from pathlib import Path; from tests.runtime.agent.wide_bundle import write_wide_bundle; write_wide_bundle(Path('/tmp/wide'))"
       .venv/bin/python scripts/abuse_local_api.py --bundle /tmp/wide --json-mb 60

After each phase it reads the child's VmRSS from ``/proc/<pid>/status``; the figures are in MB.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

_CHILD = """
import sys, time
from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.serving import InferenceServer
if len(sys.argv) > 1:
    from edgekit_runtime.backends import create_runner
    from edgekit_runtime.bundle import open_bundle
    bundle = open_bundle(sys.argv[1])
    server = InferenceServer(create_runner(bundle).load(), model_name=bundle.name)
else:
    server = InferenceServer()
api = AgentApi(server, "127.0.0.1:0").start()
print(api.bound_address, getattr(api, "header_timeout_s", 0), getattr(api, "max_connections", 0), flush=True)
sys.stdin.read()  # until the parent closes it
api.stop()
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def settle_rss(pid: int, seconds: float) -> float:
    """The highest RSS seen over ``seconds`` (sampled every 0.1 s)."""
    peak = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss_mb(pid))
        time.sleep(0.1)
    return peak


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
    sockets.clear()


def answer_status(sock: socket.socket) -> int | None:
    """The status the server answered with; 0 when it closed (or reset) without one; None while open."""
    try:
        sock.settimeout(0.02)
        head = sock.recv(64)
    except TimeoutError:
        return None
    except OSError:
        return 0
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 0


def peak_growth_mb(pid: int, action) -> float:  # type: ignore[no-untyped-def]
    """Peak RSS growth of ``pid`` while ``action()`` runs: VmHWM reset to VmRSS first (clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = rss_mb(pid)
    action()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024 - before, 1)
    raise RuntimeError(f"no VmHWM for pid {pid}")


def post_status(target: tuple[str, int], body: bytes) -> int:
    """POST ``body`` as JSON to /v1/infer; the status (read also when the agent answers before the body went)."""
    with socket.create_connection(target, timeout=120) as sock:
        sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))  # fmt: skip
        try:
            sock.sendall(body)
        except OSError:
            pass
        head = sock.recv(64)
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 0


def hostile_json(target: tuple[str, int], pid: int, megabytes: int) -> dict[str, object]:
    import threading

    head, tail = b'{"inputs": {"image": {"dtype": "float32", "data": [', b"0]}}}"

    def body(value: bytes) -> bytes:
        return head + (value + b",") * ((megabytes * 1024 * 1024 - len(head) - len(tail)) // (len(value) + 1)) + tail

    result: dict[str, object] = {"body_mb": megabytes}
    for name, value in (("compact", b"0.0"), ("long_values", b"0.10000000000000000000001")):
        data = body(value)
        statuses: list[int] = []
        result[name] = {"rss_growth_mb": peak_growth_mb(pid, lambda: statuses.append(post_status(target, data))), "status": statuses}
    statuses = []

    def four() -> None:
        threads = [threading.Thread(target=lambda: statuses.append(post_status(target, data))) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    result["four_long_values"] = {"rss_growth_mb": peak_growth_mb(pid, four), "status": statuses}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=16)
    parser.add_argument("--claim-mb", type=int, default=64)
    parser.add_argument("--slowloris", type=int, default=64)
    parser.add_argument("--flood", type=int, default=300)
    parser.add_argument("--hold-s", type=float, default=2.0)
    parser.add_argument("--bundle", help="a bundle directory for the child to serve (enables the hostile_json phase)")
    parser.add_argument("--json-mb", type=int, default=60)
    args = parser.parse_args()

    child = subprocess.Popen([sys.executable, "-c", _CHILD, *([args.bundle] if args.bundle else [])], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        address, header_timeout_s, max_connections = child.stdout.readline().split()  # type: ignore[union-attr]
        host, port = address.rsplit(":", 1)
        target = (host, int(port))
        result: dict[str, object] = {"baseline_rss_mb": round(settle_rss(child.pid, 0.5), 1),
                                     "header_timeout_s": float(header_timeout_s), "max_connections": int(max_connections)}  # fmt: skip

        held: list[socket.socket] = []
        for _ in range(args.claims):
            sock = socket.create_connection(target, timeout=5)
            sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n{" % (args.claim_mb * 1024 * 1024))  # fmt: skip
            held.append(sock)
        result["claims"] = {"connections": args.claims, "claimed_mb_each": args.claim_mb,
                            "rss_mb": round(settle_rss(child.pid, args.hold_s), 1)}  # fmt: skip
        close_all(held)

        started = time.monotonic()
        for _ in range(args.slowloris):
            sock = socket.create_connection(target, timeout=5)
            sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
            held.append(sock)
        peak, closed_408, closed_other = 0.0, 0, 0
        while held and time.monotonic() - started < 2 * float(header_timeout_s) + 5:
            for sock in list(held):
                status = answer_status(sock)
                if status is not None:
                    closed_408 += status == 408
                    closed_other += status != 408
                    held.remove(sock)
                    sock.close()
                    continue
                try:
                    sock.sendall(b"X")
                except OSError:
                    closed_other += 1
                    held.remove(sock)
            peak = max(peak, rss_mb(child.pid))
            time.sleep(0.5)
        result["slowloris"] = {"connections": args.slowloris, "answered_408": closed_408,
                               "closed_without_answer": closed_other, "still_open": len(held),
                               "seconds": round(time.monotonic() - started, 1), "rss_mb": round(peak, 1)}  # fmt: skip
        close_all(held)
        time.sleep(0.5)

        refused = 0
        for _ in range(args.flood):
            held.append(socket.create_connection(target, timeout=5))
        time.sleep(0.5)
        for sock in held:
            refused += answer_status(sock) == 503
        result["flood"] = {"connections": args.flood, "refused_503": refused, "rss_mb": round(settle_rss(child.pid, 0.5), 1)}
        close_all(held)
        if args.bundle:
            result["hostile_json"] = hostile_json(target, child.pid, args.json_mb)
        result["peak_rss_mb"] = max(result["claims"]["rss_mb"], result["slowloris"]["rss_mb"], result["flood"]["rss_mb"])  # type: ignore[index]
        print(json.dumps(result, indent=2))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
