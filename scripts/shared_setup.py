"""What the scripts under scripts/ set up the same way: a bundle built for this host, the MQTT broker (a private
Mosquitto on a free loopback port, from the tests' helper, or the one on 127.0.0.1:1883), a child process whose
JSON lines are read as they come, the host's CPU flags and load, and text tables.

A script imports it as ``scripts.shared_setup`` once the repository is on ``sys.path`` (the scripts put it there
first, for the ``tests.*`` helpers too); nothing here is imported by the edgekit packages.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.runtime.agent.mosquitto import MosquittoBroker, free_port  # noqa: E402,F401 (re-exported for the scripts)

#: The target the scripts build their bundles for: this host's CPU.
HOST_TARGET = "x86-64-cpu"
#: The local broker the agent benchmarks publish to (docs/fleet.md's set-up).
LOCAL_BROKER = ("127.0.0.1", 1883)
#: The ISA flags that decide ONNX Runtime's CPU kernels, recorded with every measurement.
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_tile")


# -- bundles ----------------------------------------------------------------------------------------------


def edgekit_command() -> list[str]:
    """The ``edgekit`` CLI of this interpreter's environment (or the one on PATH)."""
    edgekit = Path(sys.executable).with_name("edgekit")
    return [str(edgekit) if edgekit.exists() else shutil.which("edgekit") or "edgekit"]


def ensure_bundle(recipe: str | Path, given: Path | None, workdir: Path, *, name: str | None = None,
                  target: str = HOST_TARGET) -> Path:  # fmt: skip
    """``given`` if set (verified), else ``workdir/<name>`` (default: the recipe's stem): reused when it holds a
    bundle already, otherwise written by ``edgekit build <recipe> --target <target>``."""
    from edgekit_runtime.bundle import open_bundle

    if given is not None:
        open_bundle(given, verify=True)
        return given
    out = Path(workdir) / (name or Path(recipe).stem)
    if (out / "manifest.json").is_file():
        return out
    started_s = time.perf_counter()
    subprocess.run([*edgekit_command(), "build", str(REPO / recipe), "--target", target, "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    print(f"built {out} in {time.perf_counter() - started_s:.0f} s", file=sys.stderr)
    return out


# -- brokers and child processes --------------------------------------------------------------------------


def broker_reachable(address: tuple[str, int] = LOCAL_BROKER) -> bool:
    """Whether something accepts TCP connections at ``address`` (the broker the script needs)."""
    try:
        with socket.create_connection(address, timeout=2):
            return True
    except OSError:
        return False


class ChildProcess:
    """A subprocess (run in the repository) whose stdout lines are read by a thread, JSON lines kept apart;
    stderr goes to the ``log`` file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log, self.argv = log, argv
        self._stderr = log.open("ab")
        self.process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                        env={**os.environ, **(env or {})})  # fmt: skip
        self.lines: list[str] = []
        self.json: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            line = line.strip()
            self.lines.append(line)
            if line.startswith("{"):
                try:
                    self.json.put(json.loads(line))
                except json.JSONDecodeError:
                    pass

    def next_json(self, event: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The next JSON line whose ``event`` is ``event`` (earlier ones are skipped)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                found = self.json.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if found.get("event") == event:
                return found
        raise RuntimeError(f"no {event!r} line from {' '.join(self.argv)} within {timeout_s:g} s; see {self.log}")

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then wait (SIGKILL after ``timeout_s``)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(5)
        self._stderr.close()
        return int(self.process.returncode)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(5)
        self._stderr.close()


# -- the host ---------------------------------------------------------------------------------------------


def cpu_flags(wanted: Sequence[str] = ISA_FLAGS) -> list[str]:
    """Which of ``wanted`` /proc/cpuinfo lists for this CPU, in ``wanted``'s order (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return [flag for flag in wanted if flag in present]
    except OSError:
        pass
    return []


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, to two decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def host_conditions() -> dict[str, Any]:
    """What a measurement on this host depends on: machine, Python, CPUs, ISA flags and the load now."""
    return {"machine": platform.machine(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "cpu_flags": cpu_flags(), "load_average": load_average()}  # fmt: skip


# -- tables -----------------------------------------------------------------------------------------------


def aligned_lines(header: Sequence[str], rows: Sequence[Sequence[str]], *, text_columns: int) -> list[str]:
    """Columns padded to their widest cell: the first ``text_columns`` left-aligned, numbers right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = (cell.ljust(w) if i < text_columns else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths, strict=True)))
        return "  ".join(padded)

    return [line(header), *(line(row) for row in rows)]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, right_aligned: Collection[int] = ()) -> str:
    """A Markdown table; the columns at the indexes in ``right_aligned`` (numbers) are right-aligned."""
    rule = "|" + "|".join("---:" if i in right_aligned else "---" for i in range(len(header))) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
