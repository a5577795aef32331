"""Which Python code a recipe may run without the user's say-so.

A recipe names callables (``model.factory``, ``model.path_from``, the ``data`` callables, the metric
and fine-tuning callables) that edgekit imports and calls with the recipe's ``kwargs``, as pip runs a
``setup.py``. Code that ships with the recipe (modules in the recipe's own folder) and edgekit's demo
package is trusted as the recipe itself is. Anything else (the standard library, installed packages,
other folders) is refused unless the user opts in: ``edgekit build --trust-code``,
``load_recipe(path, trust_code=True)``, or folders listed in ``EDGEKIT_TRUSTED_CODE_DIRS``
(``os.pathsep``-separated). Without that rule a recipe from elsewhere could name ``os:system`` or
``shutil:rmtree`` with the arguments to go with it.

Where a module lives is worked out without importing it: the finders locate each package along the
dotted name, so no package ``__init__`` runs before the check.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from edgekit.errors import RecipeError
from edgekit.recipe_model import CALLABLE_PATTERN

#: The environment variable listing folders whose modules recipes may name without --trust-code.
TRUSTED_DIRS_ENV = "EDGEKIT_TRUSTED_CODE_DIRS"
#: edgekit's own recipe code (the demo models and data): trusted like the recipe's folder.
EDGEKIT_DEMOS_DIR = Path(__file__).resolve().parent / "demos"
#: What :func:`module_files` returns for a built-in or frozen module (no file: never trusted).
BUILT_IN = Path("(built-in)")


@dataclass(frozen=True)
class CodeTrust:
    """The trust decision a recipe was loaded with: everything (``trust_code``), or code in the recipe's
    folder (except Python's own and installed packages, should they lie inside it) and in ``folders``."""

    trust_code: bool
    recipe_dir: Path
    folders: tuple[Path, ...]  # trusted wherever they are: edgekit's demos, EDGEKIT_TRUSTED_CODE_DIRS
    installed: tuple[Path, ...]  # the standard library, site-packages, the environment: never "the recipe's code"

    @classmethod
    def for_recipe(cls, recipe_dir: Path, trust_code: bool = False, installed: tuple[Path, ...] | None = None) -> "CodeTrust":
        extra = [Path(p) for p in os.environ.get(TRUSTED_DIRS_ENV, "").split(os.pathsep) if p.strip()]
        folders = tuple(dict.fromkeys(_real(folder) for folder in (EDGEKIT_DEMOS_DIR, *extra)))
        installed = installation_roots() if installed is None else tuple(_real(p) for p in installed)
        return cls(trust_code, _real(recipe_dir), folders, installed)

    def trusts(self, file: Path) -> bool:
        """Whether code in ``file`` may run without --trust-code."""
        if file == BUILT_IN:
            return False
        if any(_inside(file, folder) for folder in self.folders):
            return True
        return _inside(file, self.recipe_dir) and not any(_inside(file, root) for root in self.installed)

    def check(self, recipe: BaseModel, recipe_dir: Path, where: str) -> None:
        """Raise :class:`RecipeError` naming the first callable of ``recipe`` whose code is not trusted."""
        if self.trust_code:
            return
        for field, reference in callable_references(recipe):
            files = module_files(reference.partition(":")[0], recipe_dir)
            if files is None:
                continue  # not found: importing it fails later with the import error itself
            outside = [f for f in files if not self.trusts(f)]
            if outside:
                shown = "a built-in module" if outside[-1] == BUILT_IN else str(outside[-1])
                if outside[-1] != BUILT_IN and any(_inside(outside[-1], root) for root in self.installed):
                    shown += " (installed Python code)"
                raise RecipeError(
                    f"{where}: {field} '{reference}' is code outside the recipe's folder ({self.recipe_dir}) "
                    f"and edgekit's demos: {shown}. A recipe runs the code it names; this one is not trusted",
                    hint="if you trust this recipe, pass --trust-code (edgekit build, edgekit sweep) or trust_code=True "
                    f"(load_recipe, build); or list the code's folder in {TRUSTED_DIRS_ENV}",
                )


def installation_roots() -> tuple[Path, ...]:
    """Where Python's own modules and installed packages live (and the environment's prefix)."""
    paths = sysconfig.get_paths()
    roots = [paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += [sys.prefix, sys.base_prefix, sys.exec_prefix, *getattr(site, "getsitepackages", lambda: [])()]
    return tuple(dict.fromkeys(_real(Path(root)) for root in roots if root))


def callable_references(model: BaseModel, loc: str = "") -> Iterator[tuple[str, str]]:
    """(field path, 'module:function') for every field of ``model`` (nested) that names a callable."""
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        field = f"{loc}.{name}" if loc else name
        if isinstance(value, str) and any(getattr(m, "pattern", None) == CALLABLE_PATTERN for m in info.metadata):
            yield field, value
        yield from _references_in(value, field)


def _references_in(value: Any, field: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, BaseModel):
        yield from callable_references(value, field)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _references_in(item, f"{field}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, BaseModel):
                yield from callable_references(item, f"{field}.{key}")


def module_files(module_name: str, search_dir: Path) -> list[Path] | None:
    """The files whose code ``import module_name`` would run (packages along the name not imported
    yet, and the module itself, whose attribute is called), with ``search_dir`` first on sys.path as
    the recipe's callables are imported; found without running any module. None when the module
    cannot be found; a built-in or frozen module is ``Path('(built-in)')``."""
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name):
        return None
    parts = module_name.split(".")
    added = str(search_dir) not in sys.path
    if added:
        sys.path.insert(0, str(search_dir))
    try:
        files: list[Path] = []
        spec: importlib.machinery.ModuleSpec | None = None
        locations: list[str] | None = None
        for index in range(len(parts)):
            name = ".".join(parts[: index + 1])
            module = sys.modules.get(name)
            last = index == len(parts) - 1
            if module is not None:
                spec = getattr(module, "__spec__", None)
                if spec is None:
                    return [BUILT_IN]
            elif index == 0:
                spec = importlib.util.find_spec(name)  # a top-level name: nothing is imported
            else:
                spec = importlib.machinery.PathFinder.find_spec(name, locations)
            if spec is None:
                return None
            locations = list(spec.submodule_search_locations or [])
            if module is None or last:  # its code runs (or, for the last, is called)
                files.extend(_spec_files(spec, locations))
            if not last and not locations:
                return None  # 'a.b' where 'a' is not a package: the import fails later
    except (ImportError, ValueError):
        return None
    finally:
        if added:
            sys.path.remove(str(search_dir))
    return files


def _spec_files(spec: importlib.machinery.ModuleSpec, locations: list[str]) -> list[Path]:
    if spec.origin in (None, "namespace") and locations:  # a namespace package: its folders
        return [Path(p) for p in locations]
    if spec.origin is None or spec.origin in ("built-in", "frozen") or not spec.has_location:
        return [BUILT_IN]
    return [Path(spec.origin)]


def _real(path: Path) -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return Path(path).absolute()


def _inside(path: Path, folder: Path) -> bool:
    if path == BUILT_IN:
        return False
    real = _real(path)
    return real == folder or folder in real.parents
