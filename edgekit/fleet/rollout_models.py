"""Rollouts to named models of the devices' model repositories (issue 20): ``fleet deploy --model NAME``
deploys one bundle to one model; ``--pipeline detector=DIR,classifier=DIR`` (or a pipeline file) sends one
``deploy_pipeline`` command per device, which switches all its models or none. The health gate then
watches the deployed models' own windows (telemetry.v1 ``models``) rather than the device's default model.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from edgekit.fleet.rollout_bundle import BundleArtifact, RolloutError
from edgekit.fleet.store.base import FleetStore, ModelAggregate

#: command.v1's ``model`` (the agent's models: names)
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: command.v1's deploy_pipeline takes at most this many deploys
MAX_PIPELINE_MODELS = 16


@dataclass(frozen=True)
class ModelDeploy:
    """One model of a rollout and the verified bundle it gets."""

    model: str
    artifact: BundleArtifact


def check_model_name(name: str, option: str = "--model") -> str:
    if not MODEL_NAME_RE.match(name):
        raise RolloutError(f"{option} {name!r} is not a model name",
                           hint="a model name is 1-64 letters, digits, '_', '.', '-', starting with a letter or digit "
                                "(the names under models: in the agent config)")  # fmt: skip
    return name


def parse_pipeline(text: str) -> list[tuple[str, Path]]:
    """``detector=DIR,classifier=DIR`` or the path of a YAML file mapping model -> bundle (paths relative to
    the file) into (model, bundle path) pairs, in order."""
    candidate = Path(text)
    if "=" not in text and candidate.is_file():
        return _pipeline_file(candidate)
    pairs: list[tuple[str, Path]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, bundle = part.partition("=")
        if not sep or not bundle.strip():
            raise RolloutError(f"--pipeline: {part!r} is not MODEL=BUNDLE",
                               hint="write --pipeline detector=build/yolo,classifier=build/mobilenet or name a pipeline file")  # fmt: skip
        pairs.append((check_model_name(name.strip(), "--pipeline model"), Path(bundle.strip())))
    return _checked(pairs, "--pipeline")


def _pipeline_file(path: Path) -> list[tuple[str, Path]]:
    from edgekit_runtime.yaml_limited import parse_yaml_limited, read_limited_bytes

    data, _ = parse_yaml_limited(read_limited_bytes(path, RolloutError, "pipeline file"), path, RolloutError, "pipeline file")
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict) or set(data) != {"models"}:
        raise RolloutError(f"pipeline file {path} must hold one key, models:, mapping each model name to its bundle",
                           hint="models:\n  detector: build/yolo\n  classifier: build/mobilenet")  # fmt: skip
    pairs = []
    for name, bundle in models.items():
        if not isinstance(name, str) or not isinstance(bundle, str) or not bundle:
            raise RolloutError(f"pipeline file {path}: models.{name} must be a bundle path (a string)")
        pairs.append((check_model_name(name, f"pipeline file {path}: model"), (path.parent / bundle)))
    return _checked(pairs, f"pipeline file {path}")


def _checked(pairs: list[tuple[str, Path]], where: str) -> list[tuple[str, Path]]:
    if not pairs:
        raise RolloutError(f"{where} names no model", hint="list MODEL=BUNDLE pairs")
    names = [name for name, _ in pairs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise RolloutError(f"{where} names model(s) {', '.join(twice)} twice", hint="give each model one bundle")
    if len(pairs) > MAX_PIPELINE_MODELS:
        raise RolloutError(f"{where} names {len(pairs)} models; a pipeline deploy takes at most {MAX_PIPELINE_MODELS}")
    return pairs


def pipeline_bundle_id(models: Sequence[ModelDeploy]) -> str:
    """What a pipeline rollout records as its bundle: ``model=bundle`` pairs joined with commas."""
    return ",".join(f"{m.model}={m.artifact.bundle_id}" for m in models)


def model_health_rows(store: FleetStore, models: Sequence[ModelDeploy], devices: Sequence[tuple[str, str]], *,
                      since: dt.datetime, baseline_since: dt.datetime) -> tuple[list[Any], list[Any]]:  # fmt: skip
    """(after, before) per device for the health gate: after, the windows of the deployed models on their new
    bundles since the rollout started (a device counts as heard from only when every model reported on its new
    bundle); before, the same models' windows in the baseline."""
    wanted = {(m.model, m.artifact.bundle_id) for m in models}
    names = {m.model for m in models}
    after_rows = [r for r in store.model_aggregate(("device", "model", "bundle_id"), devices=devices, since=since)
                  if (r.model, r.bundle_id) in wanted]  # fmt: skip
    before_rows = [r for r in store.model_aggregate(("device", "model"), devices=devices, since=baseline_since, until=since)
                   if r.model in names]  # fmt: skip
    return _per_device(after_rows, len(wanted)), _per_device(before_rows, 0)


@dataclass(frozen=True)
class _DeviceFigures:
    device: str
    windows: int
    inferences: int
    errors: int
    p99_ms: float | None


def _per_device(rows: Sequence[ModelAggregate], models_needed: int) -> list[_DeviceFigures]:
    by_device: dict[str, list[ModelAggregate]] = {}
    for row in rows:
        by_device.setdefault(row.device or "", []).append(row)
    found = []
    for device, group in sorted(by_device.items()):
        if models_needed and len(group) < models_needed:
            continue  # not every deployed model has reported on its new bundle yet
        weighted = [(r.p99_ms, r.inferences) for r in group if r.p99_ms is not None and r.inferences > 0]
        total = sum(n for _, n in weighted)
        found.append(_DeviceFigures(device, sum(r.windows for r in group), sum(r.inferences for r in group),
                                    sum(r.errors for r in group), sum(p * n for p, n in weighted) / total if total else None))  # fmt: skip
    return found


__all__ = ["MAX_PIPELINE_MODELS", "MODEL_NAME_RE", "ModelDeploy", "check_model_name", "model_health_rows", "parse_pipeline",
           "pipeline_bundle_id"]  # fmt: skip
