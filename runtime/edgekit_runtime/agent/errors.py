"""Errors of the device agent. All derive from :class:`~edgekit_runtime.errors.EdgekitError`."""

from __future__ import annotations

from edgekit_runtime.errors import BundleError, EdgekitError


class AgentConfigError(EdgekitError):
    """The agent's YAML configuration is missing, unparsable or invalid."""


class DeployError(BundleError):
    """A deploy or rollback command cannot be carried out (bad command, download, hash, switch)."""


class MemoryBudgetError(DeployError):
    """Loading a model would take the loaded models past ``models.memory_budget_mb``."""


class ModelNotFoundError(DeployError):
    """A command or request names a model the repository does not have."""


class AgentApiError(EdgekitError):
    """The local inference API refused a request, or cannot be reached or bound."""


class NoModelError(AgentApiError):
    """No bundle is loaded, so there is nothing to run."""
