"""``--precision auto`` on a target that allows OpenVINO tries NNCF's int8 (``openvino-nncf-int8``: ``nncf.quantize`` of the
FP32 export on the recipe's calibration batches) beside edgekit's own candidates, judged by the same metric and timed in the
same interleaved loop. When it wins, the bundle is an OpenVINO int8 bundle whose manifest carries NNCF's ``quantizer``
record exactly as a plain ``--precision int8 --backend openvino`` build with ``quantizer: nncf`` does; where NNCF or
OpenVINO is missing, or the target lists one engine, nothing changes. The digits demo on real NNCF, OpenVINO and ONNX
Runtime."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from edgekit.pipeline import build
from edgekit.precision import Backend, Precision
from edgekit.quantize.candidates import Candidate
from edgekit.quantize.ov.auto import NNCF_CANDIDATE, OPENVINO_NAMES, EngineBuilder, OpenVinoAuto, nncf_why_not
from edgekit.quantize.pricing import CALIBRATING, TimeBudget
from edgekit.target import get_target
from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle, self_check
from tests.conftest import REPO
from tests.hidden_module import hide_module

DIGITS = REPO / "recipes" / "digits-cnn.yaml"
NNCF = NNCF_CANDIDATE[0]


def _needs_openvino_and_nncf() -> None:
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'edgekit[openvino]')")
    pytest.importorskip("nncf", reason="NNCF is not installed (pip install 'edgekit[openvino]')")


def _target_file(tmp_path: Path, name: str, onnxruntime: list[str] | None = None, openvino: list[str] | None = None) -> Path:
    """A copy of x86-64-cpu (this host) with the precisions given per engine; ``openvino=[]`` drops its openvino backend."""
    data = yaml.safe_load((REPO / "targets" / "x86-64-cpu.yaml").read_text())
    data["name"] = name
    backends = [b for b in data["backends"] if b["name"] != "openvino" or openvino != []]
    for backend, precisions in zip(("onnxruntime", "openvino"), (onnxruntime, openvino)):
        for entry in backends:
            if entry["name"] == backend and precisions:
                entry["precisions"] = precisions
    data["backends"] = backends
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _int8_flags() -> str:
    """The host's CPU flags that decide int8 speed (``none`` for AVX2 only)."""
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").is_file() else set()
    return ", ".join(sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8", "avx512bw"})) or "none"


def _static() -> Candidate:
    from edgekit.quantize.plan import QuantizationPlan

    plan = QuantizationPlan(Precision.INT8, Backend.ONNXRUNTIME, "uint8", False, "int8", True, "minmax")
    return Candidate("int8-static", Precision.INT8, plan)


def test_nncf_is_a_candidate_where_it_is_installed_and_int8_is_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_openvino_and_nncf()
    engines = OpenVinoAuto(get_target("x86-64-cpu"), tmp_path / "ov", threads=1)
    assert engines.nncf_refused is None
    listed = engines.add_to([_static(), Candidate("fp32", Precision.FP32, None)])
    names = [item.name for item in listed]
    # last, right before the FP32 reference: it spends the search's time budget, after the search's own candidates
    assert names[-2:] == [NNCF, "fp32"] and max(names.index(name) for name in OPENVINO_NAMES - {NNCF} if name in names) < names.index(NNCF)
    assert engines.add_to([_static()])[-1].name == NNCF  # no reference listed: at the end
    nncf = listed[names.index(NNCF)]
    assert isinstance(nncf, Candidate) and (nncf.engine, nncf.precision, nncf.plan, nncf.baseline) == ("openvino", Precision.INT8, None, False)

    no_int8 = OpenVinoAuto(get_target(str(_target_file(tmp_path, "x86-ov-float", openvino=["fp32"]))), tmp_path / "ov2", threads=1)
    assert no_int8.nncf_refused == "target 'x86-ov-float' lists no int8 for openvino"
    assert NNCF not in [item.name for item in no_int8.add_to([_static()])]
    assert no_int8.summary([], Candidate("fp32", Precision.FP32, None))["refused"][NNCF] == no_int8.nncf_refused

    hide_module(monkeypatch, "nncf")
    assert "NNCF is not installed" in (nncf_why_not(None) or "")
    hidden = OpenVinoAuto(get_target("x86-64-cpu"), tmp_path / "ov3", threads=1)
    assert "pip install 'edgekit[openvino]'" in (hidden.nncf_refused or "")
    assert NNCF not in [item.name for item in hidden.add_to([_static()])]


class _OrtBuilder:
    """What TimeBudget reads of ONNX Runtime's builder (through :class:`EngineBuilder`): no ranges held, nothing cached."""

    cached_calibration_s = 0.0
    auto_only_s = 0.0

    def has_ranges(self, candidate: Candidate) -> bool:
        return False


def test_nncf_is_priced_and_spent_like_a_calibrating_candidate(tmp_path: Path) -> None:
    """NNCF's ``nncf.quantize`` calibrates on its own (1.5-26.7 s a corpus search): the search's budget prices it at a
    calibrating candidate's cost, skips it when that would overrun (the row's reason is the manifest's record of why it
    was not tried), and spends its seconds, as it does every candidate's of either engine."""
    _needs_openvino_and_nncf()
    engines = OpenVinoAuto(get_target("x86-64-cpu"), tmp_path / "ov", threads=1)
    builder = EngineBuilder(engines, _OrtBuilder())
    nncf = next(item for item in engines.add_to([_static()]) if item.name == NNCF)
    compile_only = Candidate("openvino-fp32", Precision.FP32, None, "openvino", engine="openvino", baseline=True)
    assert isinstance(nncf, Candidate) and nncf.calibrates_itself and not compile_only.calibrates_itself

    budget = TimeBudget(builder, started=time.perf_counter() - 3.0, time_budget_s=10.0)
    budget.record(_static(), "passed", 3.0, first=True, timing_s=0.0)  # the first candidate, a calibrating one: 3 s
    budget.record(Candidate("int8-dynamic", Precision.INT8, None), "passed", 0.5, first=False, timing_s=0.0)
    assert budget.expected_cost(nncf)[0] == CALIBRATING and budget.expected_cost(nncf)[1] >= 3.0  # not a cheap one's 0.5 s
    assert budget.over_budget(nncf) is None  # about 3 s of 10 s spent, 3 s expected

    budget.record(nncf, "failed", 4.0, first=False, timing_s=0.0)
    budget.record(compile_only, "passed", 1.0, first=False, timing_s=0.0)
    # every candidate's seconds priced by its kind, of either engine: NNCF's 4 s a calibration, the compile's 1 s a cheap one
    assert sorted(budget.costs) == sorted([(CALIBRATING, 3.0), ("a candidate without calibration", 0.5), (CALIBRATING, 4.0),
                                           ("a candidate without calibration", 1.0)])

    cached = _OrtBuilder()
    cached.cached_calibration_s = 2.0  # the first candidate found its calibration cached: NNCF's own pass is not
    assert TimeBudget(EngineBuilder(engines, cached), started=time.perf_counter(), time_budget_s=10.0).expected_cost(nncf)[1] == 2.0

    late = TimeBudget(builder, started=time.perf_counter() - 8.0, time_budget_s=10.0)
    late.record(_static(), "passed", 3.0, first=True, timing_s=0.0)
    why = late.over_budget(nncf)
    assert why is not None and "time budget would overrun" in why and "for a calibrating candidate" in why


@pytest.mark.slow
def test_nncf_wins_and_the_manifest_records_it_as_a_plain_nncf_build_does(tmp_path: Path) -> None:
    """ONNX Runtime offers FP32 only and OpenVINO int8 only on this target copy, so NNCF's int8 (0.43x FP32 on this
    host) is the one candidate that can beat FP32: the bundle is an OpenVINO int8 bundle of NNCF's graph, its manifest's
    ``quantization.quantizer`` is the record a plain NNCF build writes, the report says why it won, and it self-checks."""
    _needs_openvino_and_nncf()
    target = str(_target_file(tmp_path, "x86-nncf", onnxruntime=["fp32"], openvino=["int8"]))
    result = build(DIGITS, target, precision="auto", out=tmp_path / "auto")
    manifest, auto = result.manifest, result.manifest["quantization"]["auto"]
    rows = {row["name"]: row for row in auto["candidates"]}
    if rows[NNCF]["status"] == "slower":  # timed no faster than FP32 or than the best so far (fp32-rewritten)
        # A host without VNNI or AMX (AVX2 only) runs this small CNN's OpenVINO int8 no faster than FP32: then FP32 is
        # chosen (or its rewritten graph), and the row says why; the winning path needs a host where OpenVINO int8 beats FP32.
        assert auto["chosen"] in ("fp32", "fp32-rewritten") and "faster than" in rows[NNCF]["detail"].lower()  # than FP32, or the best so far
        assert manifest["precision"] == "fp32" and "quantizer" not in manifest["quantization"]
        pytest.skip(f"NNCF int8 timed {rows[NNCF]['latency_ratio']:.2f}x FP32 on this host (cpu flags: {_int8_flags()}): "
                    "FP32 was rightly chosen; the manifest of an NNCF win is checked on hosts where OpenVINO int8 is faster")
    assert auto["chosen"] == NNCF, [(r["name"], r["status"], r["latency_ratio"], r["value"]) for r in auto["candidates"]]
    assert rows[NNCF]["latency_ratio"] < 1.0 and rows[NNCF]["passed"] is True and rows[NNCF]["value"] >= 0.98
    assert auto["engines"]["tried"]["openvino"] == [NNCF] and auto["engines"]["chosen"] == "openvino"
    assert manifest["precision"] == "int8" and manifest["backend"]["name"] == "openvino"
    assert manifest["backend"]["openvino"]["inference_precision_hint"] == "f32"
    why = auto["engines"]["why"]
    assert why.startswith(f"{NNCF} (openvino) was the fastest candidate inside the budget") and "calibration samples" in why
    assert manifest["backend"]["selected_because"] == f"--precision auto: {why}"
    assert f"engines: {why}" in auto["notes"] and NNCF in (tmp_path / "auto" / "report.html").read_text()

    recipe = yaml.safe_load(DIGITS.read_text())
    recipe.setdefault("build", {})["quantization"] = {"quantizer": "nncf"}
    plain_recipe = tmp_path / "digits-nncf.yaml"
    plain_recipe.write_text(yaml.safe_dump(recipe))
    plain = build(plain_recipe, "x86-64-cpu", precision="int8", out=tmp_path / "plain", backend="openvino").manifest
    assert manifest["quantization"]["quantizer"] == plain["quantization"]["quantizer"]  # name, version, device, batches, samples, scope
    assert (manifest["quantization"]["plan"], manifest["quantization"]["calibration"]) == (None, None) == (
        plain["quantization"]["plan"], plain["quantization"]["calibration"])
    assert manifest["quantization"]["quantizer"]["samples"] == 256
    bundle = open_bundle(tmp_path / "auto", verify=True)
    with create_runner(bundle) as runner:
        assert self_check(bundle, runner).passed


@pytest.mark.slow
def test_an_onnxruntime_only_target_gives_the_same_manifest_with_or_without_nncf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the target lists no openvino backend, NNCF being installed changes nothing: the same candidates and keys,
    no NNCF row, no quantizer record, no engines section."""
    target = str(_target_file(tmp_path, "x86-ort-only", openvino=[]))
    with_nncf = build(DIGITS, target, precision="auto", out=tmp_path / "a").manifest
    hide_module(monkeypatch, "nncf")
    without = build(DIGITS, target, precision="auto", out=tmp_path / "b").manifest
    for manifest in (with_nncf, without):
        quantization = manifest["quantization"]
        assert "quantizer" not in quantization and "engines" not in quantization["auto"]
        assert not OPENVINO_NAMES & {row["name"] for row in quantization["auto"]["candidates"]}
        assert manifest["backend"]["name"] == "onnxruntime"
    assert set(with_nncf["quantization"]) == set(without["quantization"])
    assert set(with_nncf["quantization"]["auto"]) == set(without["quantization"]["auto"])
    assert [row["name"] for row in with_nncf["quantization"]["auto"]["candidates"]] == [
        row["name"] for row in without["quantization"]["auto"]["candidates"]]
    # which candidate wins is decided by timing on this host, and the manifest's sections follow the winner (an int8
    # bundle records its calibration, an fp32 one none): compare them where both searches chose the same candidate
    if with_nncf["quantization"]["auto"]["chosen"] == without["quantization"]["auto"]["chosen"]:
        assert set(with_nncf) == set(without) and set(with_nncf["backend"]) == set(without["backend"])
