"""Make a test behave as on a machine without an optional package: its import raises ImportError."""

from __future__ import annotations

import builtins
import sys
from typing import Any

import pytest


def hide_module(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """``import package`` (and its submodules) raises ImportError for the rest of the test."""
    real_import = builtins.__import__

    def without(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == package or name.startswith(f"{package}."):
            raise ImportError(f"No module named '{package}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, package, raising=False)
    monkeypatch.setattr(builtins, "__import__", without)
