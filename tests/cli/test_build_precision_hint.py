"""A precision the chosen backend cannot run, but another backend of the same target can: the refusal's hint names
that backend (review: `edgekit build --target x86-64-cpu --precision bf16` listed only ONNX Runtime's precisions,
though the target runs bf16 through --backend openvino on a CPU with AVX-512 BF16 or AMX)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.quantize.gating import decide_precision, other_backends_for
from edgekit.target import TARGETS_DIR, load_target_file

REPO = Path(__file__).resolve().parents[2]


def _x86_profile(folder: Path, name: str, isa: str, openvino_precisions: str = "[fp32, bf16, int8]") -> Path:
    """x86-64-cpu with fixed CPU flags instead of the build host's, so the test does not depend on this machine."""
    text = (TARGETS_DIR / "x86-64-cpu.yaml").read_text().replace("name: x86-64-cpu", f"name: {name}")
    text = text.replace("  isa: host ", f"  isa: {isa} ").replace("    precisions: [fp32, bf16, int8]", f"    precisions: {openvino_precisions}")
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_the_hint_names_the_backend_that_runs_bf16(tmp_path: Path) -> None:
    target = load_target_file(_x86_profile(tmp_path, "bf16-cpu", "[avx2, avx512f, avx512_bf16]"))
    assert other_backends_for(target, Backend.ONNXRUNTIME, Precision.BF16) == [Backend.OPENVINO]
    with pytest.raises(QuantizationError) as info:
        decide_precision(target, Backend.ONNXRUNTIME, Precision.BF16)
    assert info.value.message.startswith("precision bf16 cannot run on target 'bf16-cpu' (onnxruntime): bf16 has no CPU")
    assert info.value.hint == ("use one of: fp32, fp16, int8, int8-dynamic, int4; or build it with --backend openvino "
                               "(build.backend in the recipe), which can run bf16 on this target; or list a fallback order "
                               "in the recipe, e.g. build.precision_fallback: [fp32, fp16]")  # fmt: skip


def test_no_backend_is_named_when_none_runs_it(tmp_path: Path) -> None:
    target = load_target_file(_x86_profile(tmp_path, "avx2-cpu", "[avx2]", "[fp32, int8]"))
    assert other_backends_for(target, Backend.ONNXRUNTIME, Precision.BF16) == []
    with pytest.raises(QuantizationError) as info:
        decide_precision(target, Backend.ONNXRUNTIME, Precision.BF16)
    assert "--backend" not in info.value.hint and info.value.hint.startswith("use one of: fp32, fp16, int8, int8-dynamic, int4; or list")


def test_edgekit_build_prints_the_hint(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    profile = _x86_profile(tmp_path, "bf16-cpu", "[avx2, avx512f, avx512_bf16]")
    code = main(["build", str(REPO / "recipes" / "digits-cnn.yaml"), "--target", str(profile), "--precision", "bf16",
                 "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "error: precision bf16 cannot run on target 'bf16-cpu' (onnxruntime)" in err
    assert "or build it with --backend openvino (build.backend in the recipe), which can run bf16 on this target" in err
    assert not (tmp_path / "out").exists()
