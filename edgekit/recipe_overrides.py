"""A recipe's per-target ``overrides``: which target each key names, and the recipe each makes once merged.

A key is a shipped target's name (``edgekit targets``), or the path of a profile file of your own (``boards/myboard.yaml``,
relative to the recipe), which applies to the target of that profile's name (its file's stem, as ``--target`` loads
it). Every key and every merged recipe is checked when the recipe loads, so a typo in another target's override
fails on any target, with its file, line and fix; the code-trust check of the callables an override names runs when it
is merged for its target (:meth:`edgekit.recipe.Recipe.for_target`)."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgekit.config import validation_message
from edgekit.errors import RecipeError

log = logging.getLogger(__name__)
#: An :class:`edgekit.recipe.Recipe` (not imported: that module imports this one).
Recipe = Any
Positions = dict[tuple[str | int, ...], tuple[int, int]]
PROFILE_SUFFIXES = (".yaml", ".yml")


def is_profile_path(key: str) -> bool:
    return Path(key).suffix in PROFILE_SUFFIXES


def override_key(recipe: Recipe, target_name: str) -> str | None:
    """The ``overrides`` key that applies to the target named ``target_name``: its name, else a profile path of that stem."""
    if target_name in recipe.overrides:
        return target_name
    return next((key for key in recipe.overrides if is_profile_path(key) and Path(key).stem == target_name), None)


def merged(recipe: Recipe, key: str, positions: Positions | None = None) -> Recipe:
    """The recipe with ``overrides.<key>`` merged into its build and export sections (validated, not trust-checked)."""
    model = type(recipe)
    override = recipe.overrides[key]
    data = recipe.model_dump(mode="python", exclude={"path", "sha256"})
    for section in ("build", "export"):
        data[section] = _deep_merge(data[section], getattr(override, section))
    try:
        result = model.model_validate(data)
    except ValidationError as exc:
        where = Path(f"{recipe.path}") if positions else Path(f"{recipe.path} (overrides.{key})")  # lines: the file's own
        message, hint = validation_message(exc, model, where, _override_positions(positions or {}, key))
        raise RecipeError(
            f"overrides.{key} makes the recipe invalid:\n{message}",
            hint=hint or "check the keys under overrides against the build and export sections",
        ) from None
    return result.model_copy(update={"path": recipe.path, "sha256": recipe.sha256})


def check_overrides(recipe: Recipe, positions: Positions, known: list[str]) -> None:
    """Every key names a target (``known``: the shipped targets) or a profile file, and every override merges into a
    valid recipe."""
    _check_one_key_per_target(recipe)
    for key in recipe.overrides:
        _check_key(recipe, key, positions, known)
        merged(recipe, key, positions)


def _check_key(recipe: Recipe, key: str, positions: Positions, known: list[str]) -> None:
    pos = positions.get(("overrides", key))
    where = f"{recipe.path}:{pos[0]}:{pos[1]}" if pos else str(recipe.path)
    if is_profile_path(key):
        if not recipe.resolve(Path(key)).is_file():
            raise RecipeError(f"{where}: overrides key '{key}' is not a target profile file (looked for {recipe.resolve(Path(key))})",
                              hint="key an override by a target name from `edgekit targets`, or by the path of a profile "
                                   "file relative to the recipe")  # fmt: skip
        return
    if key in known:
        return
    close = difflib.get_close_matches(key, known, n=2, cutoff=0.8)  # a typo of a shipped target's name
    if close:
        raise RecipeError(
            f"{where}: overrides key '{key}' is not a known target (did you mean {' or '.join(repr(c) for c in close)}?)",
            hint=f"rename it to '{close[0]}'; for a profile of your own, key the override by its name or by its file's "
                 "path relative to the recipe (e.g. boards/myboard.yaml)",
        )  # fmt: skip
    log.warning("%s: overrides key '%s' is no shipped target: it applies only to a profile of your own named '%s' "
                "(shipped: %s)", where, key, key, ", ".join(known))  # fmt: skip


def _check_one_key_per_target(recipe: Recipe) -> None:
    """Two keys that apply to one target (a name and a profile path of that stem, or two such paths) are refused:
    only the first would apply."""
    seen: dict[str, str] = {}
    for key in recipe.overrides:
        target = Path(key).stem if is_profile_path(key) else key
        if target in seen:
            raise RecipeError(f"{recipe.path}: overrides keys '{seen[target]}' and '{key}' both apply to target '{target}'; "
                              "only the first would", hint="merge them into one override")  # fmt: skip
        seen[target] = key


def _override_positions(positions: Positions, key: str) -> Positions:
    """The file positions of ``overrides.<key>``'s values, keyed by where they land in the merged recipe."""
    prefix = ("overrides", key)
    out: Positions = {loc[2:]: pos for loc, pos in positions.items() if loc[:2] == prefix}
    if prefix in positions:
        out[()] = positions[prefix]
    return out


def _deep_merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
