"""Shared fixtures for the sensor tests: fixture trees, a controllable clock and a fake pynvml."""

from __future__ import annotations

import shutil
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def fixture_root(tmp_path: Path) -> Callable[[str], Path]:
    """Copy a fixture tree into tmp_path (symlinks kept) so a test can change its files."""

    def copy(name: str) -> Path:
        destination = tmp_path / name
        shutil.copytree(FIXTURES / name, destination, symlinks=True)
        return destination

    return copy


class FakeClock:
    """A clock the test moves by hand: ``clock()`` returns ``now``."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@dataclass
class FakeGpu:
    """What one fake GPU answers; ``None`` means NVML_ERROR_NOT_SUPPORTED for that query.

    Each query returns the next value of its list (the last one repeats); the sensor's probe in
    ``available()`` consumes the first value of each.
    """

    name: str = "NVIDIA H100 80GB HBM3"
    power_mw: list[int] | None = field(default_factory=lambda: [70_000])
    energy_mj: list[int] | None = field(default_factory=lambda: [1_000_000])
    utilization_gpu_pct: int | None = 37
    fail_reads_after: int | None = None  # raise NVML_ERROR_GPU_IS_LOST after this many reads


def make_fake_nvml(gpus: list[FakeGpu], *, init_error: int | None = None) -> types.ModuleType:
    """A module object with pynvml's names (nvidia-ml-py 13.x) backed by ``gpus``."""
    nvml = types.ModuleType("fake_pynvml")
    nvml.NVML_ERROR_NOT_SUPPORTED = 3
    nvml.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    nvml.NVML_ERROR_GPU_IS_LOST = 15
    messages = {3: "Not Supported", 12: "NVML Shared Library Not Found", 15: "GPU is lost"}

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return messages.get(self.value, f"NVML Error with code {self.value}")

    nvml.NVMLError = NVMLError
    nvml.calls = {"init": 0, "shutdown": 0, "reads": 0}
    cursors = {id(gpu): {"power": 0, "energy": 0} for gpu in gpus}

    def next_value(gpu: FakeGpu, kind: str, values: list[int] | None) -> int:
        if values is None:
            raise NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        nvml.calls["reads"] += 1
        if gpu.fail_reads_after is not None and nvml.calls["reads"] > gpu.fail_reads_after:
            raise NVMLError(nvml.NVML_ERROR_GPU_IS_LOST)
        index = min(cursors[id(gpu)][kind], len(values) - 1)
        cursors[id(gpu)][kind] += 1
        return values[index]

    def nvmlInit() -> None:
        nvml.calls["init"] += 1
        if init_error is not None:
            raise NVMLError(init_error)

    def nvmlShutdown() -> None:
        nvml.calls["shutdown"] += 1

    nvml.nvmlInit = nvmlInit
    nvml.nvmlShutdown = nvmlShutdown
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda index: gpus[index]
    nvml.nvmlDeviceGetName = lambda gpu: gpu.name
    nvml.nvmlDeviceGetPowerUsage = lambda gpu: next_value(gpu, "power", gpu.power_mw)
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda gpu: next_value(gpu, "energy", gpu.energy_mj)

    def nvmlDeviceGetUtilizationRates(gpu: FakeGpu) -> types.SimpleNamespace:
        if gpu.utilization_gpu_pct is None:
            raise NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(gpu=gpu.utilization_gpu_pct, memory=5)

    nvml.nvmlDeviceGetUtilizationRates = nvmlDeviceGetUtilizationRates
    return nvml


@pytest.fixture
def fake_nvml() -> Callable[..., types.ModuleType]:
    return make_fake_nvml


@pytest.fixture
def gpu_spec() -> type[FakeGpu]:
    return FakeGpu


#: The pynvml names the fake provides; checked against the real module when it is installed.
FAKE_NVML_NAMES = (
    "NVMLError",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetUtilizationRates",
)


@pytest.fixture
def fake_nvml_names() -> tuple[str, ...]:
    return FAKE_NVML_NAMES
