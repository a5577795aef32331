"""What a ``torch.export`` archive (``.pt2``) would run when loaded: the code it can hold.

``torch.export.load`` reads most of an archive as data (JSON configs, raw tensor bytes), but it unpickles
some parts with ``weights_only=False`` (``pickle`` may call any function): weights or constants marked
``use_pickle`` (tensor subclasses), custom and opaque objects among the constants, and sample inputs that do
not load as plain tensors. It also loads every program it finds, and opens the native libraries of any
AOTInductor entry (``data/aotinductor/``: ``dlopen`` runs their code). A model file is not code to its user, so
such an archive is refused unless the recipe is trusted (:mod:`edgekit.code_trust`): ``--trust-code``, or the
file in ``EDGEKIT_TRUSTED_CODE_DIRS``.

The scan is an allow-list: every member must be a part ``torch.export.save`` writes (this torch's layout, or
torch 2.7's, which ``torch.export.load`` still reads), and every part that can hold a pickle is checked, for
every program in the archive, not only the one named ``model``.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

#: constant files torch.export.load unpickles whatever their config says
_PICKLED_CONSTANT_PREFIXES = ("custom_obj", "opaque_obj")
#: the parts of this torch's layout, under the archive's one top folder: data, read as data
_DATA_PARTS = re.compile(r"archive_format|archive_version|byteorder|\.data/[^/]+|models/[^/]+\.json|extra/.+"
                         r"|data/(?:weights|constants)/[^/]+")  # fmt: skip
#: configs saying which weights and constants are pickles, one per program
_CONFIGS = re.compile(r"data/(?:weights/[^/]+_weights|constants/[^/]+_constants)_config\.json")
#: parts torch.load reads (sample inputs, and the legacy weights and constants files of one program each)
_TENSOR_FILES = re.compile(r"data/(?:sample_inputs|weights|constants)/[^/]+\.pt")
#: parts that are native code, loaded (and so run) by torch.export.load
_NATIVE_PARTS = re.compile(r"data/(?:aotinductor|executorch|mtia)(?:/.*)?|xl_model_weights/.*")
#: torch 2.7's layout (top-level names), read by torch.export.load when the new layout holds no program
_OLDER_DATA_PARTS = {"version", "byteorder", "serialized_exported_program.json", "serialized_state_dict.json",
                     "serialized_constants.json"}  # fmt: skip
#: a member decompressing to more than this, at more than MAX_RATIO times its stored size, is a bomb, not a model
BOMB_BYTES = 64 * 1024 * 1024
MAX_RATIO = 200
#: the largest config read (they list one entry per weight: a few MB for the largest models)
MAX_CONFIG_BYTES = 256 * 1024 * 1024


def unpickled_parts(path: Path) -> list[str]:
    """The parts of the archive at ``path`` that loading it would unpickle or run (empty: it loads as data only)."""
    found: list[str] = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename
            if name.endswith("/"):
                continue  # a folder entry
            if info.file_size > BOMB_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                found.append(f"{name} (decompresses {info.file_size / max(info.compress_size, 1):.0f}x, to "
                             f"{info.file_size / 2**20:.0f} MiB: not a part torch.export.save writes)")  # fmt: skip
                continue
            inner = name.split("/", 1)[1] if "/" in name else ""  # this torch's layout sits under one top folder
            if _NATIVE_PARTS.fullmatch(inner):
                found.append(f"{name} (native code, loaded and run by torch.export.load)")
            elif _CONFIGS.fullmatch(inner):
                found += _pickled_entries(archive, info)
            elif name.endswith(".pt") and (_TENSOR_FILES.fullmatch(inner) or "/" not in name):
                # sample inputs, legacy weight files, and the older layout's serialized_state_dict.pt / _constants.pt /
                # _example_inputs.pt: what weights_only refuses, torch.export.load loads again with weights_only=False
                if not _loads_as_tensors(archive, info):
                    found.append(f"{name} (not plain tensors)")
            elif not (_DATA_PARTS.fullmatch(inner) or name in _OLDER_DATA_PARTS or name.startswith("extra_files/")):
                found.append(f"{name} (not a part torch.export.save writes)")
    return found


def _pickled_entries(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> list[str]:
    name = info.filename
    if info.file_size > MAX_CONFIG_BYTES:
        return [f"{name} ({info.file_size / 2**20:.0f} MiB: not a config torch.export wrote)"]
    try:
        config = json.loads(archive.read(info)).get("config") or {}
    except (ValueError, AttributeError):
        return [f"{name} (not a config torch.export wrote)"]
    if not isinstance(config, dict):
        return [f"{name} (not a config torch.export wrote)"]
    return [f"{name}: {key}" for key, entry in config.items()
            if not isinstance(entry, dict) or entry.get("use_pickle") or str(entry.get("path_name", "")).startswith(_PICKLED_CONSTANT_PREFIXES)]  # fmt: skip


def _loads_as_tensors(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """Whether the member loads with ``weights_only`` (read from the archive as a stream, not into memory)."""
    import torch

    try:
        with archive.open(info) as member:
            torch.load(member, weights_only=True)
    except Exception:  # noqa: BLE001 - anything weights_only refuses, torch.export.load would unpickle
        return False
    return True


__all__ = ["unpickled_parts"]
