"""The footprint promise in a real bare environment: a fresh venv (no system site packages) gets
``pip install runtime/`` and nothing else, so only edgekit-runtime's declared dependencies are there.

In that venv: torch, onnx, onnxscript, optimum and transformers are not importable, every
``edgekit_runtime`` module imports, ``edgekit-agent install`` and ``check`` accept a tiny bundle
signed here with a fresh Ed25519 key, and ``edgekit-agent run`` serves one inference through the
local API to that venv's ``AgentClient``. The dependencies come from the package index; without
one reachable the test skips. Timings are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgekit_runtime.signing import encode_signature, public_key_fingerprint
from tests.runtime.tiny_bundle import build_bundle, reference_logits

pytestmark = pytest.mark.slow

RUNTIME_SOURCE = Path(__file__).resolve().parents[2] / "runtime"
HEAVY_PACKAGES = ("torch", "onnx", "onnxscript", "optimum", "transformers")
# Lines pip prints when it cannot reach a package index (then the test skips rather than fails).
NO_INDEX_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
    "Max retries exceeded",
)
PIP_TIMEOUT_S = 240
COMMAND_TIMEOUT_S = 120


@dataclass
class BareVenv:
    root: Path
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def agent(self) -> Path:
        return self.root / "bin" / "edgekit-agent"

    def env(self) -> dict[str, str]:
        """This process's environment without anything that would leak other packages in."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
        env["PYTHONNOUSERSITE"] = "1"
        env["VIRTUAL_ENV"] = str(self.root)
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(
        self, command: Sequence[str | os.PathLike[str]], *, cwd: Path, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(part) for part in command], check=False, cwd=cwd, env=self.env(), capture_output=True,
                              text=True, timeout=timeout_s)  # fmt: skip

    def python_json(self, code: str, *args: str, cwd: Path) -> dict[str, Any]:
        completed = self.run([self.python, "-c", textwrap.dedent(code), *args], cwd=cwd)
        assert completed.returncode == 0, f"bare venv python failed:\n{completed.stdout}\n{completed.stderr}"
        return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def _timed(timings_s: dict[str, float], name: str, started_s: float) -> None:
    timings_s[name] = round(time.perf_counter() - started_s, 2)
    print(f"bare environment: {name} took {timings_s[name]:.1f} s")


def _index_reachable(venv: BareVenv, cwd: Path) -> bool:
    """Whether pip can list numpy's versions. Under ``-q`` pip hides its connection warnings, so after a
    failed install this asks the index directly: no answer means skip, an answer means a real failure."""
    probe = venv.run([venv.python, "-m", "pip", "index", "versions", "numpy", "--disable-pip-version-check"], cwd=cwd)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BareVenv]:
    work = tmp_path_factory.mktemp("bare_env")
    venv = BareVenv(work / "venv")
    started_s = time.perf_counter()
    created = subprocess.run([sys.executable, "-m", "venv", str(venv.root)], check=False, capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT_S)  # fmt: skip
    if created.returncode != 0:
        pytest.skip(f"cannot create a venv with pip here: {created.stderr.strip()[-300:]}")
    _timed(venv.timings_s, "venv", started_s)

    # Install from a copy, so that pip's in-tree build leaves no build/ or egg-info behind in the checkout.
    source = work / "runtime"
    shutil.copytree(RUNTIME_SOURCE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc"))
    started_s = time.perf_counter()
    installed = venv.run([venv.python, "-m", "pip", "install", "--disable-pip-version-check", "-q", source], cwd=work,
                         timeout_s=PIP_TIMEOUT_S)  # fmt: skip
    output = installed.stdout + installed.stderr
    if installed.returncode != 0:
        if any(marker in output for marker in NO_INDEX_MARKERS) or not _index_reachable(venv, work):
            pytest.skip(f"no package index reachable, so the runtime's dependencies cannot be installed: {output.strip()[-300:]}")
        pytest.fail(f"pip install runtime/ failed in a bare venv although the package index answers:\n{output}")
    _timed(venv.timings_s, "pip install runtime/", started_s)
    yield venv
    print(f"bare environment timings (s): {json.dumps(venv.timings_s)}")


def test_heavy_packages_are_absent_and_every_runtime_module_imports(bare_venv: BareVenv, tmp_path: Path) -> None:
    report = bare_venv.python_json(
        """
        import importlib, json, pkgutil, sys
        heavy = {}
        for name in sys.argv[1].split(","):
            try:
                importlib.import_module(name)
                heavy[name] = True
            except ImportError:
                heavy[name] = False
        import edgekit_runtime
        modules = [info.name for info in pkgutil.walk_packages(edgekit_runtime.__path__, prefix="edgekit_runtime.")]
        for module in modules:
            importlib.import_module(module)
        try:
            import edgekit
            host = True
        except ImportError:
            host = False
        print(json.dumps({"heavy": heavy, "runtime_file": edgekit_runtime.__file__, "prefix": sys.prefix,
                          "modules": modules, "host_package": host,
                          "loaded_heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy)}))
        """,
        ",".join(HEAVY_PACKAGES),
        cwd=tmp_path,
    )
    assert report["heavy"] == dict.fromkeys(HEAVY_PACKAGES, False)
    assert report["loaded_heavy"] == []
    assert report["host_package"] is False  # only edgekit-runtime was installed, not the host toolkit
    assert Path(str(report["runtime_file"])).is_relative_to(bare_venv.root)  # the installed copy, not the checkout
    assert Path(str(report["prefix"])) == bare_venv.root
    for module in ("edgekit_runtime.agent.cli", "edgekit_runtime.agent.service", "edgekit_runtime.agent.mqtt",
                   "edgekit_runtime.backends.onnxruntime", "edgekit_runtime.signing"):  # fmt: skip
        assert module in report["modules"]


def _signed_tiny_bundle(tmp_path: Path) -> tuple[Path, Path, str]:
    """A tiny bundle and the PEM public key of the fresh key that signed it (manifest.sig, base64)."""
    bundle_dir = build_bundle(tmp_path / "bundle")
    key = Ed25519PrivateKey.generate()
    (bundle_dir / "manifest.sig").write_text(encode_signature(key.sign((bundle_dir / "manifest.json").read_bytes())) + "\n")
    public_path = tmp_path / "fleet.pub.pem"
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return bundle_dir, public_path, public_key_fingerprint(key.public_key())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


CLIENT = """
    import json, sys, time
    import numpy as np
    from edgekit_runtime.agent.client import AgentClient
    from edgekit_runtime.agent.errors import AgentApiError

    client = AgentClient(sys.argv[1])
    deadline = time.monotonic() + 60
    while True:
        try:
            health = client.health()
            if health["status"] == "ok":
                break
        except AgentApiError:
            health = None
        if time.monotonic() > deadline:
            raise SystemExit(f"the agent did not become healthy: {health}")
        time.sleep(0.1)
    started = time.perf_counter()
    outputs = client.infer({"image": np.load(sys.argv[2])})
    infer_s = time.perf_counter() - started
    np.save(sys.argv[3], outputs["logits"])
    print(json.dumps({"health": health, "infer_s": infer_s, "timing": client.last_timing,
                      "stats": client.stats()}))
"""


def test_agent_checks_a_signed_bundle_and_serves_it_from_the_bare_venv(bare_venv: BareVenv, tmp_path: Path) -> None:
    bundle_dir, public_key, fingerprint = _signed_tiny_bundle(tmp_path)
    port = _free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "device_id": "bare-1",
        "fleet": "ci",
        "bundles": {"dir": str(tmp_path / "bundles"), "public_key": str(public_key)},
        "api": {"address": f"127.0.0.1:{port}"},
        "telemetry": {"interval_s": 60, "spool": {"path": str(tmp_path / "spool.db")}},
        "power": {"sensor": "none"},  # never the machine's own /sys
        "health": {"window_s": 0},
    }), encoding="utf-8")  # fmt: skip

    started_s = time.perf_counter()
    installed = bare_venv.run([bare_venv.agent, "install", "--config", config, bundle_dir], cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    for step in ("signature verified", "files verified", "self check passed"):  # progress: stderr
        assert step in installed.stderr, installed.stderr
    assert "deploy_result: deployed" in installed.stdout, installed.stdout  # the outcome: stdout
    _timed(bare_venv.timings_s, "edgekit-agent install", started_s)

    started_s = time.perf_counter()
    checked = bare_venv.run([bare_venv.agent, "check", "--config", config, "--json"], cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert report["ok"] is True and report["problems"] == []
    current = next(line for line in report["passed"] if line.startswith("current bundle"))
    assert f"signed by {fingerprint}" in current and "self-check passed" in current
    _timed(bare_venv.timings_s, "edgekit-agent check", started_s)

    image = np.random.default_rng(21).standard_normal((3, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "image.npy", image)
    started_s = time.perf_counter()
    log_path = tmp_path / "agent.log"
    with log_path.open("w") as log:
        agent = subprocess.Popen([str(bare_venv.agent), "run", "--config", str(config)], cwd=tmp_path, env=bare_venv.env(),
                                 stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        served = bare_venv.python_json(CLIENT, f"127.0.0.1:{port}", str(tmp_path / "image.npy"), str(tmp_path / "logits.npy"), cwd=tmp_path)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent_rc = agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent_rc = agent.wait()
    _timed(bare_venv.timings_s, "edgekit-agent run + one inference", started_s)
    print(f"bare environment: inference through the local API took {1000 * float(served['infer_s']):.1f} ms")

    log_text = log_path.read_text()
    assert agent_rc == 0, log_text
    health = served["health"]
    assert isinstance(health, dict) and health["model"] == "tiny-linear-x86-64-cpu-fp32" and health["signed_by"] == fingerprint
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), reference_logits(image), rtol=1e-4, atol=1e-4)
    stats = served["stats"]
    assert isinstance(stats, dict)
    assert stats["totals"]["requests"] == 1 and stats["totals"]["items"] == 3 and stats["totals"]["errors"] == 0
    assert "agent stopped" in log_text
