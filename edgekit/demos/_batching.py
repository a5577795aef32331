"""Small helpers shared by the demo data callables: argument checks and batching."""

from __future__ import annotations

from edgekit.errors import RecipeError


def require_int_at_least(value: object, minimum: int, *, name: str, where: str) -> int:
    """``value`` as an int if it is one and ``>= minimum``; otherwise a :class:`RecipeError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RecipeError(
            f"{where}: '{name}' must be an integer >= {minimum}, got {value!r}",
            hint=f"fix '{name}' under the data callable's kwargs in the recipe",
        )
    return value


def require_enough(available: int, batch: int, count: int, *, where: str, pool: str) -> None:
    """Raise a :class:`RecipeError` when ``count`` batches of ``batch`` need more items than exist."""
    needed = batch * count
    if needed > available:
        raise RecipeError(
            f"{where}: batch={batch} x count={count} needs {needed} items but the {pool} has only {available}",
            hint=f"lower 'batch' or 'count' in the recipe's data kwargs so that batch * count <= {available}",
        )
