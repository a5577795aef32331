"""Helpers shared by the source loaders: importing ``package.module:function`` references."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable

from edgekit.errors import EdgekitError


def import_callable(reference: str, error: type[EdgekitError], field: str, search_dir: Path | None = None) -> Callable[..., Any]:
    """Import ``package.module:function``; ``search_dir`` (the recipe's folder) is tried on sys.path too."""
    module_name, _, attr = reference.partition(":")
    added = False
    if search_dir is not None and str(search_dir) not in sys.path:
        sys.path.insert(0, str(search_dir))
        added = True
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(
            f"{field}: cannot import module '{module_name}' for '{reference}': {exc}",
            hint="check the spelling, and that the package is installed or sits next to the recipe",
        ) from None
    except Exception as exc:  # the module itself raised while importing
        raise error(f"{field}: importing '{module_name}' raised {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            sys.path.remove(str(search_dir))
    try:
        fn = getattr(module, attr)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise error(
            f"{field}: module '{module_name}' has no attribute '{attr}'",
            hint=f"callables there: {', '.join(public[:12]) or 'none'}",
        ) from None
    if not callable(fn):
        raise error(f"{field}: '{reference}' is a {type(fn).__name__}, not a callable")
    return fn
