"""Validators for the docs' YAML and JSON blocks, by name (``<!-- doc-test: validate="NAME" -->``).

Each takes the block's parsed data, the block and a scratch directory, and raises (an ``EdgekitError``
from the project's own loader, or ``AssertionError`` with the schema's problems) when the block is not
what the project accepts. Fragments (a section of a bigger file) are completed from a base first:

* ``recipe``: a whole recipe, loaded with ``edgekit.recipe.load_recipe`` from the scratch directory;
* ``recipe-fragment``: top-level sections that replace those of ``base`` (a recipe path relative to the
  repository, default ``recipes/digits-cnn.yaml``), then loaded as a recipe;
* ``agent-config`` / ``agent-config-fragment``: ``edgekit_runtime.agent.config.parse_config``, the
  fragment's sections replacing those of a minimal config;
* ``command``, ``status``, ``telemetry``, ``event``: the runtime's JSON Schemas (``command.v1`` ...);
  ``status-fragment``: members of a status message (the block may leave out the outer braces), put
  into a minimal valid status message;
* ``infer-request``: a ``POST /v1/infer`` JSON body, decoded by the agent's own decoder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.docs.doc_blocks import REPO, DocBlock

Validator = Callable[[Any, DocBlock, Path], None]

MINIMAL_AGENT_CONFIG: dict[str, Any] = {"device_id": "doc-device", "fleet": "docs", "bundles": {"dir": "bundles", "allow_unsigned": True},
                                        "telemetry": {"spool": {"path": "spool.db"}}}
MINIMAL_STATUS: dict[str, Any] = {"schema": "edgekit.status/1", "state": "online", "device": "doc-device", "fleet": "docs",
                                  "agent_version": "0.1.0", "at": "2026-01-01T00:00:00Z"}  # fmt: skip


def _write_recipe(data: Any, scratch: Path, name: str) -> Path:
    path = scratch / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def validate_recipe(data: Any, block: DocBlock, scratch: Path) -> None:
    from edgekit.recipe import load_recipe

    load_recipe(_write_recipe(data, scratch, f"doc-{block.line}.yaml"))


def validate_recipe_fragment(data: Any, block: DocBlock, scratch: Path) -> None:
    assert isinstance(data, dict), f"{block.test_id}: a recipe fragment is a mapping of top-level sections"
    base_path = REPO / block.marker.get("base", "recipes/digits-cnn.yaml")
    base = yaml.safe_load(base_path.read_text(encoding="utf-8"))
    for key in block.marker.get("drop", "").split(","):
        base.pop(key.strip(), None)
    validate_recipe({**base, **data}, block, scratch)


def validate_agent_config(data: Any, block: DocBlock, scratch: Path) -> None:
    from edgekit_runtime.agent.config import parse_config

    parse_config(data, file=scratch / "agent.yaml")


def validate_agent_config_fragment(data: Any, block: DocBlock, scratch: Path) -> None:
    assert isinstance(data, dict), f"{block.test_id}: an agent config fragment is a mapping of sections"
    merged = {key: {**MINIMAL_AGENT_CONFIG[key], **value} if isinstance(value, dict) and isinstance(MINIMAL_AGENT_CONFIG.get(key), dict)
              else value for key, value in data.items()}  # a section the fragment shows keeps the minimal keys it omits
    validate_agent_config({**MINIMAL_AGENT_CONFIG, **merged}, block, scratch)


def _schema(name: str) -> Validator:
    def validate(data: Any, block: DocBlock, scratch: Path) -> None:
        from edgekit_runtime.schemas import schema_problems

        problems = schema_problems(data, name)
        assert not problems, f"{block.test_id} is not a valid {name}: {problems}"

    return validate


def validate_status_fragment(data: Any, block: DocBlock, scratch: Path) -> None:
    assert isinstance(data, dict), f"{block.test_id}: a status fragment is a set of members"
    _schema("status.v1")({**MINIMAL_STATUS, **data}, block, scratch)


def validate_infer_request(data: Any, block: DocBlock, scratch: Path) -> None:
    from edgekit_runtime.agent.wire import decode_json_tensors

    assert isinstance(data, dict) and set(data) == {"inputs"}, f"{block.test_id}: an infer request is {{\"inputs\": {{...}}}}"
    tensors = decode_json_tensors(data["inputs"])
    assert tensors, f"{block.test_id}: the request carries no tensor"


def validate_alert_rules(data: Any, block: DocBlock, scratch: Path) -> None:
    from edgekit.fleet.alerts.rules import load_alert_rules

    path = scratch / f"doc-{block.line}-rules.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_alert_rules(path).rules, f"{block.test_id}: the rules file holds no rule"


VALIDATORS: dict[str, Validator] = {
    "recipe": validate_recipe,
    "recipe-fragment": validate_recipe_fragment,
    "agent-config": validate_agent_config,
    "agent-config-fragment": validate_agent_config_fragment,
    "command": _schema("command.v1"),
    "status": _schema("status.v1"),
    "telemetry": _schema("telemetry.v1"),
    "event": _schema("event.v1"),
    "status-fragment": validate_status_fragment,
    "infer-request": validate_infer_request,
    "alert-rules": validate_alert_rules,
}


def parse_block_data(block: DocBlock) -> Any:
    """The block's YAML or JSON; a JSON block of bare members (``"a": 1, "b": 2``) is read inside braces."""
    if block.language == "json":
        try:
            return json.loads(block.text)
        except json.JSONDecodeError:
            if block.marker.get("validate", "").endswith("-fragment"):
                return json.loads("{" + block.text + "}")
            raise
    return yaml.safe_load(block.text)
