"""Write a bundle into a hidden staging directory next to its destination and rename it into place
only when complete, so that an interrupted or failed build never leaves a partial bundle."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from types import TracebackType

from edgekit.bundle.leftovers import HELD, hold, release, remove_abandoned
from edgekit.errors import BuildError


def check_destination(out: Path, force: bool) -> None:
    """Refuse to overwrite an existing bundle unless ``force``; never replace a non-bundle directory."""
    if not out.exists():
        return
    if out.is_file():
        raise BuildError(f"output path {out} is a file, not a bundle directory", hint="choose another --out")
    holds_bundle = (out / "manifest.json").is_file()
    empty = not any(out.iterdir())
    if empty:
        return
    if not holds_bundle:
        raise BuildError(
            f"output directory {out} exists and is not an edgekit bundle (no manifest.json); refusing to replace it",
            hint="choose another --out, or remove the directory yourself",
        )
    if not force:
        raise BuildError(f"output directory {out} already holds a bundle", hint="pass --force to replace it, or choose another --out")


class BundleStaging:
    """``with BundleStaging(out, force) as staging: ...write into staging.path...; staging.commit()``."""

    def __init__(self, out: Path, force: bool = False) -> None:
        self.out = Path(out).resolve()
        self.force = force
        self.path = self.out.parent / f".{self.out.name}.partial-{HELD}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.committed = False
        self._held: int | None = None  # the staging folder's lock while the build runs (edgekit.bundle.leftovers)

    def __enter__(self) -> "BundleStaging":
        check_destination(self.out, self.force)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(self.out.parent, f".{self.out.name}.partial-{HELD}*")  # what a killed build into --out left
        self.path.mkdir()
        self._held = hold(self.path)
        return self

    def commit(self) -> Path:
        check_destination(self.out, self.force)
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(self.out, old)
        os.rename(self.path, self.out)
        self.committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        release(self._held)
        self._held = None
        if not self.committed:
            shutil.rmtree(self.path, ignore_errors=True)
