"""What a deploy holds between its steps: the bundle served now, and a staged one loaded but not yet served.

Plain data, below both :mod:`~edgekit_runtime.agent.ota` (which makes them) and
:mod:`~edgekit_runtime.agent.health_watch` (which watches them), so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgekit_runtime.agent.deploy_request import DeployRequest
from edgekit_runtime.agent.loading import LoadedBundle
from edgekit_runtime.signature import IOSignature


@dataclass(frozen=True)
class ServedBundle:
    """What the agent serves now, for telemetry, status and health."""

    name: str
    bundle_id: str
    manifest_sha256: str
    path: Path
    signed_by: str | None
    #: the version the repository serves it as (Open Inference Protocol): its ``bundle_version``, else its
    #: manifest's sha256 prefix
    version: str = ""

    def telemetry_ref(self) -> dict[str, str]:
        """The ``bundle`` object of telemetry.v1 and status.v1."""
        return {"id": self.bundle_id, "sha256": self.manifest_sha256}


@dataclass(frozen=True)
class AlreadyCurrent:
    """What staging a deploy of the bundle ``current`` already serves gives: nothing to switch."""

    bundle: str


@dataclass
class StagedDeploy:
    """A bundle that passed every check and is installed under ``versions/``, loaded but not yet served."""

    request: DeployRequest
    loaded: LoadedBundle
    version_dir: Path
    old_current: Path | None
    old_signature: IOSignature | None
    held_mb: float | None
