"""A recipe's per-target ``overrides``: which target each key names, and the recipe each makes once merged.

A key is a shipped target's name (``edgekit targets``), or the path of a profile file of your own (``boards/myboard.yaml``,
relative to the recipe), which applies to the target of that profile's name (its file's stem, as ``--target`` loads
it). Every key and every merged recipe is checked when the recipe loads, so a typo in another target's override
fails on any target, with its file, line and fix; the code-trust check of the callables an override names runs when it
is merged for its target (:meth:`edgekit.recipe.Recipe.for_target`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgekit.config import closest, validation_message
from edgekit.errors import RecipeError

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
    if key not in known:
        close = closest(key, known)
        raise RecipeError(
            f"{where}: overrides key '{key}' is not a known target" + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""),
            hint=(f"rename it to '{close[0]}'; " if close else "") + f"targets: {', '.join(known)}; for a profile of your own, "
            "key the override by its file's path relative to the recipe (e.g. boards/myboard.yaml)",
        )


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
