"""What a ``torch.export`` archive (``.pt2``) would unpickle when loaded: the code it can run.

``torch.export.load`` reads most of an archive as data (JSON configs, raw tensor bytes), but it unpickles
some parts with ``weights_only=False`` (``pickle`` may call any function): weights or constants marked
``use_pickle`` (tensor subclasses), custom and opaque objects among the constants, and sample inputs that do
not load as plain tensors. A model file is not code to its user, so such an archive is refused unless the
recipe is trusted (:mod:`edgekit.code_trust`): ``--trust-code``, or the file in ``EDGEKIT_TRUSTED_CODE_DIRS``.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

#: constant files torch.export.load unpickles whatever their config says
_PICKLED_CONSTANT_PREFIXES = ("custom_obj", "opaque_obj")


def unpickled_parts(path: Path) -> list[str]:
    """The parts of the archive at ``path`` that loading it would unpickle (empty: it loads as data only)."""
    found: list[str] = []
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith(("model_weights_config.json", "model_constants_config.json")):
                found += _pickled_entries(archive, name)
            elif name.endswith(".pt") and not _loads_as_tensors(archive.read(name)):
                # sample inputs, and the older layout's serialized_state_dict.pt / _constants.pt / _example_inputs.pt:
                # what weights_only refuses, torch.export.load loads again with weights_only=False
                found.append(f"{name} (not plain tensors)")
    return found


def _pickled_entries(archive: zipfile.ZipFile, name: str) -> list[str]:
    try:
        config = json.loads(archive.read(name)).get("config") or {}
    except (ValueError, AttributeError):
        return [f"{name} (not a config torch.export wrote)"]
    return [f"{name}: {key}" for key, entry in config.items()
            if not isinstance(entry, dict) or entry.get("use_pickle") or str(entry.get("path_name", "")).startswith(_PICKLED_CONSTANT_PREFIXES)]  # fmt: skip


def _loads_as_tensors(data: bytes) -> bool:
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:  # noqa: BLE001 - anything weights_only refuses, torch.export.load would unpickle
        return False
    return True


__all__ = ["unpickled_parts"]
