"""Device identity, power mode and target detection against fixture trees of real boards (fixtures/identity)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from edgekit_runtime.agent.telemetry import build_status
from edgekit_runtime.schemas import validate_message
from edgekit_runtime.sensors.identity import PythonEnvironment, parse_cpuinfo, parse_dpkg_status, read_identity
from edgekit_runtime.sensors.jetson_releases import jetpack_for_l4t
from edgekit_runtime.sensors.power_mode import PowerModeReader, parse_nvpmodel_query
from edgekit_runtime.sensors.target_detect import inspect_device

IDENTITY = Path(__file__).parent / "fixtures" / "identity"


@pytest.fixture
def identity_root(tmp_path: Path):
    def copy(name: str) -> Path:
        destination = tmp_path / name
        shutil.copytree(IDENTITY / name, destination, symlinks=True)
        return destination

    return copy


# tree, target, board, soc, l4t, jetpack, cuda, tensorrt (source), cpu model, cores, memory MiB, power mode, locked
BOARDS = [
    ("jetson_orin_nano_jp61", "jetson-orin-nano-8gb", "NVIDIA Jetson Orin Nano Developer Kit", "nvidia,tegra234",
     "36.4.0", "6.1", "12.6.68", ("10.3.0.30", "dpkg libnvinfer10"), "Cortex-A78AE", 6, 7802880 / 1024, (1, "7W"), False),
    ("jetson_orin_nano_super_jp62", "jetson-orin-nano-super",
     "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", "nvidia,tegra234", "36.4.3", "6.2", "12.6.68",
     ("10.3.0", "/usr/lib/aarch64-linux-gnu/libnvinfer.so.10.3.0"), "Cortex-A78AE", 6, 7802880 / 1024,
     (2, "MAXN_SUPER"), True),
    ("jetson_agx_orin_64gb_jp62", "jetson-agx-orin-64gb", "Jetson AGX Orin Developer Kit", "nvidia,tegra234", "36.4.3",
     "6.2", "12.6.68", ("10.3.0.30", "dpkg tensorrt"), "Cortex-A78AE", 12, 64335836 / 1024, (3, "MODE_50W"), False),
    ("jetson_agx_thor_jp70", "jetson-agx-thor", "NVIDIA Jetson AGX Thor Developer Kit", "nvidia,tegra264", "38.2.0",
     "7.0", "13.0.48", (None, None), "Neoverse-V3AE", 14, 128347200 / 1024, (0, "MAXN"), False),
    ("raspberry_pi_5", "raspberry-pi-5", "Raspberry Pi 5 Model B Rev 1.0", "brcm,bcm2712", None, None, None, (None, None),
     "Cortex-A76", 4, 8245888 / 1024, (None, None), False),
    ("x86_server", "x86-64-cpu", "Dell Inc. PowerEdge R760", None, None, None, None, (None, None),
     "Intel(R) Xeon(R) Platinum 8480+", 4, 32858624 / 1024, (None, None), False),
    ("x86_h100", "nvidia-h100", "Dell Inc. PowerEdge XE9680", None, None, None, None, (None, None),
     "Intel(R) Xeon(R) Platinum 8480+", 16, 132000000 / 1024, (None, None), None),
]  # fmt: skip


@pytest.mark.parametrize(("tree", "target", "board", "soc", "l4t", "jetpack", "cuda", "tensorrt", "cpu_model", "cores",
                          "memory_mb", "mode", "locked"), BOARDS, ids=[row[0] for row in BOARDS])  # fmt: skip
def test_board_identity_and_target(tree, target, board, soc, l4t, jetpack, cuda, tensorrt, cpu_model, cores, memory_mb,
                                   mode, locked) -> None:  # fmt: skip
    report = inspect_device(IDENTITY / tree)
    identity = report.identity
    assert report.detection.target == target, report.detection
    assert report.detection.reason is None
    assert (identity.board, identity.soc, identity.l4t, identity.jetpack, identity.cuda) == (board, soc, l4t, jetpack, cuda)
    assert (identity.tensorrt, identity.tensorrt_source) == tensorrt
    assert (identity.cpu_model, identity.cpu_cores) == (cpu_model, cores)
    assert identity.memory_total_mb == pytest.approx(memory_mb)
    assert (report.power_mode.mode_id, report.power_mode.mode_name) == mode
    assert report.power_mode.clocks_locked is locked
    # A fixture root never reports this test process's own Python packages as the device's.
    assert identity.onnxruntime is None and identity.onnxruntime_providers == ()
    # What the status message carries validates against status.v1.
    status = build_status(device="d1", fleet="f1", state="online", identity=identity.to_dict(),
                          target=report.detection.to_status(), power_mode=report.power_mode.to_dict())  # fmt: skip
    validate_message(status, "status.v1")
    assert status["target"]["name"] == target and status["target"]["evidence"]


def test_evidence_names_what_decided() -> None:
    super_kit = inspect_device(IDENTITY / "jetson_orin_nano_super_jp62").detection
    assert "device-tree compatible nvidia,p3767-0005" in " | ".join(super_kit.evidence)
    assert "nvpmodel mode MAXN_SUPER offered (/etc/nvpmodel.conf)" in super_kit.evidence
    # The same module on JetPack 6.1 offers no MAXN_SUPER: the super target is rejected, saying so.
    plain = inspect_device(IDENTITY / "jetson_orin_nano_jp61").detection
    assert dict(plain.candidates)["jetson-orin-nano-super"] == (
        "needs nvpmodel mode MAXN_SUPER in /etc/nvpmodel.conf, found ['15W', '7W']")
    assert "no nvpmodel mode MAXN_SUPER" in plain.evidence
    thor = inspect_device(IDENTITY / "jetson_agx_thor_jp70").detection
    assert "memory 122.4 GiB (/proc/meminfo)" in thor.evidence
    server = inspect_device(IDENTITY / "x86_server").detection
    assert server.notes == ("no board-specific target matched; this generic profile describes the CPU only",)


def test_unknown_jetson_matches_no_target_and_says_why() -> None:
    report = inspect_device(IDENTITY / "jetson_xavier_nx_jp512")
    assert report.detection.target is None
    assert report.identity.l4t == "35.4.1" and report.identity.jetpack == "5.1.2"
    assert report.detection.reason == (
        "NVIDIA Jetson Xavier NX Developer Kit (arch arm64; compatible nvidia,p3509-0000+p3668-0001, nvidia,p3668-0001, "
        "nvidia,tegra194) matches no target in edgekit's table; its family (nvidia) is not a generic CPU host, so no "
        "generic profile applies; add a targets/<name>.yaml profile and a row in "
        "edgekit_runtime/sensors/target_detect.py TARGET_RULES")
    assert dict(report.detection.candidates)["jetson-orin-nano-8gb"] == (
        "needs device-tree compatible nvidia,p3767-0003 or nvidia,p3767-0005")


def test_unknown_arm64_board_gets_the_generic_profile_and_riscv_none(tmp_path: Path) -> None:
    pine = tmp_path / "pine"
    (pine / "proc/device-tree").mkdir(parents=True)
    (pine / "proc/device-tree/model").write_bytes(b"Pine64 RockPro64 v2.1\x00")
    (pine / "proc/device-tree/compatible").write_bytes(b"pine64,rockpro64-v2.1\x00rockchip,rk3399\x00")
    (pine / "proc/cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n"
                                       "CPU architecture: 8\nCPU part\t: 0xd08\n")  # fmt: skip
    detection = inspect_device(pine).detection
    assert detection.target == "arm64-cpu"
    assert detection.evidence == ("CPU architecture arm64 (/proc/cpuinfo)",)
    riscv = tmp_path / "riscv"
    (riscv / "proc").mkdir(parents=True)
    (riscv / "proc/cpuinfo").write_text("processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdc_zicsr_zifencei\n"
                                        "mmu\t\t: sv39\nuarch\t\t: sifive,u74-mc\n")  # fmt: skip
    detection = inspect_device(riscv).detection
    assert detection.target is None
    assert detection.reason.startswith("an unknown board (arch riscv64) matches no target in edgekit's table; add")


def test_python_environment_is_only_the_live_roots_unless_given() -> None:
    python = PythonEnvironment(lambda name: {"onnxruntime-gpu": "1.20.0", "tensorrt": "10.3.0"}.get(name),
                               lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])  # fmt: skip
    identity = read_identity(IDENTITY / "jetson_orin_nano_jp61", python=python)
    assert identity.onnxruntime == "1.20.0"
    assert identity.onnxruntime_providers == ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
    assert (identity.tensorrt, identity.tensorrt_source) == ("10.3.0", "python tensorrt")  # the module wins over dpkg


ONNX_RUNTIME_CHILD = """
import json, sys
from pathlib import Path
from edgekit_runtime.sensors.identity import PythonEnvironment, read_identity
root = Path(sys.argv[1])
identity = read_identity(root, python=PythonEnvironment.this_process())  # what the agent reads at start
imported_at_start = sorted(name for name in ("onnxruntime", "numpy") if name in sys.modules)
import onnxruntime  # what loading a model does
later = identity.with_onnxruntime_providers()
print(json.dumps({"imported_at_start": imported_at_start, "version": identity.onnxruntime,
                  "providers_at_start": list(identity.onnxruntime_providers),
                  "providers_later": list(later.onnxruntime_providers), "same_after": later.with_onnxruntime_providers() is later,
                  "on_request": list(read_identity(root, python=PythonEnvironment.this_process(import_onnxruntime=True))
                                     .onnxruntime_providers),
                  "module": {"version": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}}))
"""


def test_onnxruntime_is_not_imported_to_read_the_identity() -> None:
    """Importing onnxruntime (and numpy) at agent start only to report it cost an idle agent about 24 MB of RSS:
    its version comes from the distribution's metadata, its providers once a model has imported it."""
    import json
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", ONNX_RUNTIME_CHILD, str(IDENTITY / "x86_server")], capture_output=True,
                           text=True, timeout=120, check=True)  # fmt: skip
    report = json.loads(child.stdout)
    module = report["module"]
    assert report["imported_at_start"] == []
    assert report["version"] == module["version"] and report["providers_at_start"] == []
    assert report["providers_later"] == module["providers"] and "CPUExecutionProvider" in module["providers"]
    assert report["same_after"] is True and report["on_request"] == module["providers"]


def test_l4t_fallbacks_and_an_unknown_release(identity_root) -> None:
    root = identity_root("jetson_orin_nano_jp61")
    # A first line that is not a release line: the nvidia-l4t-core package decides.
    (root / "etc/nv_tegra_release").write_text("garbage\n")
    identity = read_identity(root)
    assert (identity.l4t, identity.l4t_source, identity.jetpack) == ("36.4.0", "dpkg nvidia-l4t-core", "6.1")
    (root / "etc/nv_tegra_release").write_text("# R36 (release), REVISION: 9.1, GCID: 1, BOARD: generic, EABI: aarch64\n")
    identity = read_identity(root)
    assert (identity.l4t, identity.jetpack) == ("36.9.1", None)
    assert identity.notes == ("L4T 36.9.1 is not in edgekit's JetPack table (edgekit_runtime/sensors/jetson_releases.py)",)
    assert jetpack_for_l4t("36.4") is not None and jetpack_for_l4t("36.4").jetpack == "6.1"


def test_dpkg_status_keeps_only_installed_packages() -> None:
    packages = parse_dpkg_status((IDENTITY / "jetson_orin_nano_jp61/var/lib/dpkg/status").read_text())
    assert packages == {"nvidia-l4t-core": "36.4.0-20240912212859", "libnvinfer10": "10.3.0.30-1+cuda12.5"}


def test_cpuinfo_flags_of_interest() -> None:
    thor = parse_cpuinfo((IDENTITY / "jetson_agx_thor_jp70/proc/cpuinfo").read_text())
    assert thor.arch == "arm64" and thor.cores == 14
    assert thor.isa_flags == ("asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "svei8mm", "svebf16")
    server = parse_cpuinfo((IDENTITY / "x86_server/proc/cpuinfo").read_text())
    assert {"avx512_vnni", "amx_int8", "avx512_fp16"} <= set(server.isa_flags) and "sse" not in server.isa_flags
    assert parse_cpuinfo("").arch is None


def test_power_mode_follows_nvpmodel_and_jetson_clocks(identity_root) -> None:
    root = identity_root("jetson_orin_nano_super_jp62")
    reader = PowerModeReader(root)
    state = reader.read()
    assert (state.mode_id, state.mode_name, state.mode_source, state.label) == (
        2, "MAXN_SUPER", "/var/lib/nvpmodel/status", "MAXN_SUPER+clocks")
    assert [c.domain for c in state.clocks] == ["cpu:policy0", "cpu:policy4", "gpu:17000000.gpu"]
    # nvpmodel -m 0 and a reboot without jetson_clocks: the GPU can scale again.
    (root / "var/lib/nvpmodel/status").write_text("pmode:0000 fmode:quiet\n")
    (root / "sys/class/devfreq/17000000.gpu/min_freq").write_text("306000000\n")
    state = reader.read()
    assert (state.mode_id, state.mode_name, state.clocks_locked, state.label) == (0, "15W", False, "15W")
    gpu = state.clocks[-1]
    assert (gpu.min_khz, gpu.max_khz) == (306000.0, 1020000.0)


def test_power_mode_without_a_status_file(identity_root) -> None:
    root = identity_root("jetson_agx_orin_64gb_jp62")  # no /var/lib/nvpmodel/status: the conf's default applies
    assert PowerModeReader(root).read().mode_source == "/etc/nvpmodel.conf DEFAULT"
    query = "NV Fan Mode:quiet\nNV Power Mode: MAXN\n0\n"
    state = PowerModeReader(root, query=lambda: query).read()
    assert (state.mode_id, state.mode_name, state.mode_source) == (0, "MAXN", "nvpmodel -q")
    assert parse_nvpmodel_query("NVPM ERROR: failed to read PARAM") is None


def test_cli_detect(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from edgekit_runtime.agent.cli import main

    assert main(["detect", "--root", str(IDENTITY / "raspberry_pi_5"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"]["target"] == "raspberry-pi-5"
    assert report["identity"]["os"]["name"] == "Debian GNU/Linux 12 (bookworm)"
    assert main(["detect", "--root", str(IDENTITY / "jetson_orin_nano_jp61")]) == 0
    text = capsys.readouterr().out
    assert "target       jetson-orin-nano-8gb\n" in text
    assert "power mode   7W (id 1, /var/lib/nvpmodel/status)\n" in text and "jetpack      6.1\n" in text
    assert main(["detect", "--root", str(IDENTITY / "jetson_xavier_nx_jp512")]) == 1
    assert capsys.readouterr().out.startswith("target       none: NVIDIA Jetson Xavier NX Developer Kit (arch arm64;")
    assert main(["detect", "--root", str(IDENTITY / "missing")]) == 2
    assert "detect --root" in capsys.readouterr().err
