"""Power rails (and device state) from ``tegrastats`` lines, live or recorded.

Two sources:

* ``lines=``: any iterable of lines (an open log file, a list, a pipe); :meth:`read` takes the next
  line, so a recorded log replays sample by sample;
* otherwise a ``tegrastats --interval <ms>`` subprocess (``/usr/bin/tegrastats`` under ``root``,
  shipped with JetPack), started on the first read. A reader thread stamps each line with the
  sensor clock as it arrives and keeps the newest ``max_pending`` of them; :meth:`read_pending`
  returns all lines that arrived since the last call, so the agent integrates every sample.

``auto`` never picks this sensor: it needs a running process or a line source, so ask for it by
name. Line format: :mod:`edgekit_runtime.sensors.tegrastats_parse`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from edgekit_runtime.errors import SensorError
from edgekit_runtime.sensors.base import Clock, PowerSample, PowerSensor
from edgekit_runtime.sensors.tegrastats_parse import (
    TOTAL_RAIL_NAMES,
    TegrastatsReading,
    parse_tegrastats_line,
)

logger = logging.getLogger(__name__)

TEGRASTATS_PATH = "usr/bin/tegrastats"


class TegrastatsPowerSensor(PowerSensor):
    """Reads tegrastats lines; ``total_mw`` is VDD_IN / POM_5V_IN when present, else the rail sum."""

    name = "tegrastats"

    def __init__(
        self,
        root: Path = Path("/"),
        *,
        lines: Iterable[str] | None = None,
        interval_ms: int = 1000,
        executable: Path | None = None,
        line_timestamps: bool = False,
        read_timeout_s: float | None = None,
        max_pending: int = 1000,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(root, clock=clock)
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms <= 0:
            raise SensorError(
                f"tegrastats: interval_ms must be a positive int of milliseconds, got {interval_ms!r}",
                hint="tegrastats --interval takes milliseconds, e.g. interval_ms=500",
            )
        self._lines: Iterator[str] | None = iter(lines) if lines is not None else None
        self._interval_ms = interval_ms
        self._executable = Path(executable) if executable is not None else self.path(TEGRASTATS_PATH)
        self._line_timestamps = line_timestamps
        self._read_timeout_s = read_timeout_s if read_timeout_s is not None else 2.0 + 3 * interval_ms / 1000
        self._pending: deque[tuple[float, str]] = deque(maxlen=max_pending)
        self._arrived = threading.Condition()
        self._process: subprocess.Popen[str] | None = None
        self._stderr_file: IO[str] | None = None  # a file, so a chatty stderr never blocks it
        self._reader: threading.Thread | None = None
        self._stream_ended = False
        self._last_reading: TegrastatsReading | None = None

    @property
    def last_reading(self) -> TegrastatsReading | None:
        """The most recent parsed line (RAM, CPU, GPU and temperatures as well as rails)."""
        return self._last_reading

    def _probe_impl(self) -> str | None:
        if self._lines is not None:
            return None
        if not self._executable.is_file():
            return f"tegrastats not found at {self._executable} (it ships with JetPack on Jetson devices)"
        if not os.access(self._executable, os.X_OK):
            return f"{self._executable} is not executable"
        return None

    def _read_impl(self) -> PowerSample:
        if self._lines is not None:
            return self._next_from_iterator(self._lines)
        self._start_process()
        with self._arrived:
            if not self._arrived.wait_for(lambda: self._pending or self._stream_ended, self._read_timeout_s):
                raise SensorError(
                    f"no line from {self._executable} within {self._read_timeout_s:.1f} s",
                    hint="check that tegrastats runs by hand (`sudo tegrastats --interval 1000`)",
                )
            if not self._pending:
                raise SensorError(f"{self._executable} exited: {self._exit_description()}")
            received_s, line = self._pending.popleft()
        return self._sample(line, received_s)

    def _read_pending_impl(self) -> list[PowerSample]:
        if self._lines is not None:
            return [self._next_from_iterator(self._lines)]
        self._start_process()
        with self._arrived:
            pending = list(self._pending)
            self._pending.clear()
            ended = self._stream_ended
        if not pending and ended:
            raise SensorError(f"{self._executable} exited: {self._exit_description()}")
        return [self._sample(line, received_s) for received_s, line in pending]

    def _next_from_iterator(self, lines: Iterator[str]) -> PowerSample:
        for line in lines:
            if line.strip():
                return self._sample(line, self._clock())
        raise SensorError("the tegrastats line source has no more lines")

    def _sample(self, line: str, received_s: float) -> PowerSample:
        reading = parse_tegrastats_line(line)
        self._last_reading = reading
        timestamp_s = received_s
        if self._line_timestamps and reading.logged_at is not None:
            timestamp_s = reading.logged_at.timestamp()
        return PowerSample(
            timestamp_s=timestamp_s, rails_mw=dict(reading.rails_mw), total_mw=reading.total_mw
        )

    def _start_process(self) -> None:
        if self._process is not None:
            return
        command = [str(self._executable), "--interval", str(self._interval_ms)]
        self._stderr_file = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        try:
            self._process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=self._stderr_file,
                text=True,
                bufsize=1,
                start_new_session=True,  # its own process group, so close() ends any children too
            )
        except OSError as exc:
            self._stderr_file.close()
            raise SensorError(f"cannot start {' '.join(command)}: {exc}") from exc
        self._reader = threading.Thread(target=self._pump, name="tegrastats-reader", daemon=True)
        self._reader.start()
        logger.debug("started %s (pid %d)", " ".join(command), self._process.pid)

    def _pump(self) -> None:
        process = self._process
        if process is None or process.stdout is None:
            return
        for line in process.stdout:
            with self._arrived:
                self._pending.append((self._clock(), line))
                self._arrived.notify_all()
        with self._arrived:
            self._stream_ended = True
            self._arrived.notify_all()

    def _exit_description(self) -> str:
        if self._process is None:
            return "not started"
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it closed its output but still runs"
        stderr = ""
        if self._stderr_file is not None:
            self._stderr_file.seek(0)
            stderr = self._stderr_file.read().strip()
        return f"exit status {code}" + (f": {stderr[-200:]}" if stderr else "")

    def _source_impl(self) -> str:
        origin = (
            "line source" if self._lines is not None else f"{self._executable} --interval {self._interval_ms}"
        )
        total_rail = self._last_reading.total_rail if self._last_reading else None
        if total_rail:
            total = f"total_mw = {total_rail} rail"
        elif self._last_reading and self._last_reading.rails_mw:
            total = f"total_mw = sum of rails (no {'/'.join(TOTAL_RAIL_NAMES)} rail)"
        else:
            total = f"total_mw = {'/'.join(TOTAL_RAIL_NAMES)} rail when present, else the sum of rails"
        return f"tegrastats ({origin}): {total}"

    def _close_impl(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:  # never signal a reaped pid: it may belong to someone else now
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=2)
        if self._reader is not None:
            self._reader.join(timeout=2)
        if process.stdout is not None:
            process.stdout.close()
        if self._stderr_file is not None:
            self._stderr_file.close()


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    """Signal the process group this sensor started (tegrastats and anything it spawned)."""
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


__all__ = ["TEGRASTATS_PATH", "TegrastatsPowerSensor"]
