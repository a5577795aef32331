"""Progress reporting for long work. Library code reports stages through a :class:`StageReporter`;
the CLI passes a rich one, Python callers get a logging one by default. No prints in library code."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Iterator

log = logging.getLogger("edgekit")
#: How a stage's note starts when the stage had nothing to do (edgekit.pipeline passes it to :meth:`StageReporter.skip`).
SKIPPED = "skipped: "


@dataclass
class StageTimes:
    """Seconds spent per stage, in order; what the manifest's ``stages`` records."""

    entries: list[dict[str, float | str]] = field(default_factory=list)

    def add(self, name: str, seconds: float) -> None:
        self.entries.append({"name": name, "seconds": round(seconds, 4)})


class StageReporter:
    """Logs stage start/end; subclasses show them to a person."""

    def __init__(self) -> None:
        self.times = StageTimes()
        self._skipped: str | None = None
        self._failed: str | None = None

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        started = time.perf_counter()
        self._skipped = self._failed = None
        self.started(name, detail)
        try:
            yield
        except BaseException:
            self.failed(name, time.perf_counter() - started)
            raise
        seconds = time.perf_counter() - started
        self.times.add(name, seconds)
        if self._failed is not None:
            self.failed(name, seconds, self._failed)
        elif self._skipped is not None:
            self.skipped(name, seconds, self._skipped)
        else:
            self.finished(name, seconds)

    def skip(self, reason: str) -> None:
        """The running stage had nothing to do: it ends as skipped (with ``reason``), not as done."""
        self._skipped = reason

    def fail(self, reason: str) -> None:
        """The running stage failed and its caller carries on (a sweep's variant): it ends as failed (with
        ``reason``), not as done, without raising out of the ``with``."""
        self._failed = reason

    def note(self, message: str) -> None:
        log.info("%s", message)

    def skipped(self, name: str, seconds: float, reason: str) -> None:
        log.info("stage %s skipped: %s", name, reason)

    def started(self, name: str, detail: str) -> None:
        log.info("stage %s started %s", name, detail)

    def finished(self, name: str, seconds: float) -> None:
        log.info("stage %s done in %.2f s", name, seconds)

    def failed(self, name: str, seconds: float, reason: str | None = None) -> None:
        log.info("stage %s failed after %.2f s%s", name, seconds, f": {reason}" if reason else "")


class RichStageReporter(StageReporter):
    """One line per stage on stderr, with a spinner while it runs."""

    def __init__(self, console: "object") -> None:
        super().__init__()
        from rich.console import Console

        assert isinstance(console, Console)
        self.console = console
        self._status: object | None = None

    def started(self, name: str, detail: str) -> None:
        from rich.markup import escape

        self._status = self.console.status(f"[bold]{escape(name)}[/] {escape(detail)}")
        self._status.__enter__()  # type: ignore[attr-defined]

    def _stop(self) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)  # type: ignore[attr-defined]
            self._status = None

    def note(self, message: str) -> None:
        from rich.markup import escape

        self.console.print(f"  [dim]{escape(message)}[/]")

    def finished(self, name: str, seconds: float) -> None:
        self._stop()
        self.console.print(f"[green]✓[/] {name:<10} {seconds:7.2f} s")

    def failed(self, name: str, seconds: float, reason: str | None = None) -> None:
        from rich.markup import escape

        self._stop()
        self.console.print(f"[red]✗[/] {name:<10} {seconds:7.2f} s" + (f"  [red]failed: {escape(reason)}[/]" if reason else ""))

    def skipped(self, name: str, seconds: float, reason: str) -> None:
        from rich.markup import escape

        self._stop()
        self.console.print(f"[yellow]-[/] {name:<10} {seconds:7.2f} s  [dim]skipped: {escape(reason)}[/]")
