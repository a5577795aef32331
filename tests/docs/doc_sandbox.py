"""Running the docs' shell blocks the way a reader would, in a scratch directory per Markdown file.

The blocks of one file run in order in one working directory (a tutorial's later block uses what an
earlier one made); running a single block first runs the earlier ones of its file. Each block is one
``bash`` script (``set -eo pipefail``) with the project's ``.venv/bin`` first on ``PATH``. What the
harness changes, so that the commands users type run in CI (the conventions of issue 19):

* **Fixtures named as the docs name them.** ``recipes/digits-cnn.yaml`` in the working directory is a
  tiny recipe of that name (a two-layer CNN on 1x4x4 images that builds in seconds) instead of the demo
  (``EDGEKIT_DOCTEST_DEMO_RECIPES=1`` links the real ``recipes/`` instead). Per-file setup (``SETUPS``)
  provides what a doc assumes exists: a built bundle, an agent configuration, ``acl.template``.
* **System paths are re-rooted.** ``/etc/``, ``/var/lib/``, ``/srv/`` and ``/run/`` in a command become
  ``$DOCTEST_ROOT/etc/`` ..., and a leading ``sudo`` is dropped, so nothing outside the sandbox is written.
* **Long-running commands** (``LONG_RUNNING``: collectors, dashboards, ``fleet up``, ``edgekit-agent run``)
  and ``&`` jobs are started in the background; the next command starts ``DOC_SETTLE_S`` seconds later
  (as when a reader types it), when they must still be running (one that exits early fails the block),
  and they are stopped (SIGTERM, then SIGKILL) when the block ends.
* **A fleet of its own.** The CI broker is shared and collectors keep persistent sessions on it, so the
  docs' fleet ids (``FLEET_IDS``) get a suffix per sandbox: ``--fleet docs19`` runs as ``docs19-<hash>``,
  and no earlier run's devices, statuses or queued telemetry reach this one.
* **Ports.** Servers whose default port may be taken on a shared CI machine get port 0 (a free one):
  ``fleet dashboard``/``fleet up`` ``--port 0``, ``fleet collect``/``fleet up`` ``--metrics-port 0``,
  and ``fleet up`` without ``--broker`` ``--broker-port 0`` (Mosquitto holds 1883 in CI).
* **Expected failures.** A command whose comment starts with ``# exit N`` must exit with status N.
* **A running agent.** Blocks that talk to the documented local API address ``127.0.0.1:8470`` (Python
  clients, curl) get a real ``edgekit-agent run`` serving a digits-shaped bundle named
  ``digits-cnn-x86-64-cpu-fp32`` (``image`` [batch, 1, 8, 8] -> ``logits``, the runtime tests' linear
  model) on a free port, and the address in the block is replaced by that port (``LocalAgent``).
* **HTTP errors fail.** ``curl`` gets ``--fail-with-body``, so a 4xx/5xx answer fails the block.
* **Typed input.** ``<!-- doc-test: stdin="secret\\nsecret\\n" -->`` is what the reader types at prompts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs.doc_blocks import REPO, DocBlock

VENV_BIN = REPO / ".venv" / "bin"
SETTLE_S = float(os.environ.get("DOC_SETTLE_S", "4"))
BLOCK_TIMEOUT_S = 300

#: command prefix -> options added right after it (unless the command already sets that option)
LONG_RUNNING: dict[str, tuple[tuple[str, str], ...]] = {
    "edgekit fleet collect": (("--metrics-port", "0"),),
    "edgekit fleet dashboard": (("--port", "0"),),
    "edgekit fleet up": (("--port", "0"), ("--broker-port", "0")),
    "edgekit-agent run": (),
}
#: fleet ids the docs use; each run of the harness gets its own (``docs19-<hash of the sandbox>``)
FLEET_IDS = ("docs19",)
_SYSTEM_PATH = re.compile(r"(?<![\w/.$-])/(etc|var/lib|srv|run)/")
_EXIT_COMMENT = re.compile(r"#\s*exit (\d+)\b")

TINY_DIGITS_RECIPE = """\
name: digits-cnn
model:
  kind: factory
  factory: tests.fixtures.tiny_models:tiny_net
inputs:
  - {name: image, dtype: float32, shape: [batch, 1, 4, 4]}
outputs: [logits]
dims:
  batch: {min: 1, opt: 4, max: 8}
data:
  samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}
  evaluation: {callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {labels: true}}
evaluation:
  metric: top1
  budget: {max_drop: 0.0}
build:
  benchmark: {warmup: 1, iterations: 5}
"""


def _has_option(command: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", command) is not None


@dataclass
class BlockRun:
    returncode: int
    output: str
    seconds: float


def rewrite_script(text: str, root: Path) -> str:
    """The block as the harness runs it (see the module docstring); one logical command at a time."""
    suffix = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    logical: list[list[str]] = [[]]
    for line in text.splitlines():
        logical[-1].append(line)
        if not line.rstrip().endswith("\\"):
            logical.append([])
    out: list[str] = []
    for lines in (group for group in logical if group):
        command = "\n".join(lines)
        command = _SYSTEM_PATH.sub(lambda m: f"{root}/{m.group(1)}/", command)
        command = re.sub(r"^(\s*)sudo\s+", r"\1", command)
        command = re.sub(r"(^|[;&|(]\s*)curl ", r"\1curl --fail-with-body ", command)
        for fleet in FLEET_IDS:
            command = re.sub(rf"(?<![\w-]){fleet}(?![\w-])", f"{fleet}-{suffix}", command)
        command = re.sub(r"\|\s*sudo\s+", "| ", command)
        code, hash_mark, comment = command.partition(" #")
        background = re.search(r"(?<!&)&\s*$", code) is not None
        if background:
            command = code.rstrip()[:-1].rstrip() + (f"  #{comment}" if hash_mark else "")
        stripped = command.lstrip()
        for prefix, options in LONG_RUNNING.items():
            if stripped.startswith(prefix + " ") or stripped == prefix:
                added = " ".join(f"{opt} {val}" for opt, val in options if not _has_option(command, opt)
                                 and not (opt == "--broker-port" and _has_option(command, "--broker")))
                if added:
                    command = command.replace(prefix, f"{prefix} {added}", 1)
                if "--duration" not in command and "--retire" not in command:
                    background = True
                break
        if background:
            command = "doc_long_running " + command.lstrip()
        expected = _EXIT_COMMENT.search(lines[-1])
        if expected:
            first = lines[0].strip().replace("'", "")
            command = (f"set +e\n{command}\ndoc_rc=$?\nset -e\n"
                       f"[ \"$doc_rc\" -eq {expected.group(1)} ] || "
                       f"{{ echo 'doc-test: expected exit {expected.group(1)}, got '$doc_rc': {first}' >&2; exit 97; }}")
        out.append(command)
    prelude = textwrap.dedent(f"""\
        set -eo pipefail
        doc_long_running() {{
            "$@" &
            local pid=$!
            sleep {SETTLE_S}
            if ! kill -0 "$pid" 2>/dev/null; then
                set +e; wait "$pid"; local rc=$?
                echo "doc-test: long-running '$*' exited early with status $rc" >&2
                exit 98
            fi
        }}
        """)
    return prelude + "\n".join(out) + "\n"


@dataclass
class DocSandbox:
    """The scratch directory of one Markdown file: ``root`` (re-rooted system paths) and ``work`` (cwd)."""

    root: Path
    doc: str
    done: dict[int, BlockRun] = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return self.root / "work"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["EDGEKIT_TRUSTED_CODE_DIRS"] = os.pathsep.join(p for p in (env.get("EDGEKIT_TRUSTED_CODE_DIRS"), str(REPO / "tests")) if p)
        env["EDGEKIT_CACHE_DIR"] = str(self.root / "cache")
        env["HF_HUB_OFFLINE"] = "1"
        env["DOCTEST_ROOT"] = str(self.root)
        env["COLUMNS"] = "200"
        return env

    def setup(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        recipes = self.work / "recipes"
        if os.environ.get("EDGEKIT_DOCTEST_DEMO_RECIPES") == "1":
            recipes.symlink_to(REPO / "recipes")
        else:
            recipes.mkdir()
            (recipes / "digits-cnn.yaml").write_text(TINY_DIGITS_RECIPE)
        setup = SETUPS.get(self.doc)
        if setup is not None:
            setup(self)

    def shell(self, script: str, timeout_s: float = BLOCK_TIMEOUT_S, stdin: str = "") -> BlockRun:
        """Run ``script`` (already rewritten) with bash in ``work``, ``stdin`` as what the reader types;
        stop everything it started afterwards."""
        started = time.monotonic()
        log = self.root / f"block-{len(self.done)}-{time.time_ns()}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(["bash", "-c", script], cwd=self.work, env=self.env(), stdout=sink,
                                    stderr=subprocess.STDOUT, stdin=subprocess.PIPE, start_new_session=True)
            typist = threading.Thread(target=_type_lines, args=(proc, stdin), daemon=True)
            typist.start()
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = -1
            finally:
                _stop_group(proc.pid)
        output = log.read_text(errors="replace")
        if returncode == -1:
            output += f"\ndoc-test: the block ran past {timeout_s:.0f} s"
        return BlockRun(returncode, output, time.monotonic() - started)

    def run_block(self, block: DocBlock, earlier: list[DocBlock], text: str | None = None) -> BlockRun:
        """Run ``block`` (its ``text`` as given, e.g. with the agent's address put in) after the earlier
        blocks of its file that have not run yet."""
        for before in earlier:
            if before.line not in self.done and before.kind == "run":
                self.done[before.line] = self.shell(rewrite_script(before.text, self.root))
        timeout_s = float(block.marker.get("timeout", BLOCK_TIMEOUT_S))
        typed = block.marker.get("stdin", "").replace("\\n", "\n")
        run = self.shell(rewrite_script(block.text if text is None else text, self.root), timeout_s, stdin=typed)
        self.done[block.line] = run
        return run


def _type_lines(proc: subprocess.Popen[bytes], text: str) -> None:
    """Type ``text`` a line every 0.3 s, as a reader would, so each prompting command reads only its lines."""
    assert proc.stdin is not None
    try:
        for line in text.splitlines(keepends=True):
            time.sleep(0.3)
            proc.stdin.write(line.encode())
            proc.stdin.flush()
        proc.stdin.close()
    except OSError:  # the block ended before reading it all
        pass


def _stop_group(pgid: int) -> None:
    """SIGTERM, then SIGKILL to what the block left running. (Not SIGINT: bash starts background jobs of a
    script with SIGINT ignored, so the docs' Ctrl-C would reach nothing; every server here stops on SIGTERM.)"""
    for sig, grace in ((signal.SIGTERM, 8.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _checked(sandbox: DocSandbox, script: str) -> None:
    run = sandbox.shell(script)
    if run.returncode != 0:
        raise RuntimeError(f"doc-test setup for {sandbox.doc} failed:\n{run.output[-4000:]}")


def setup_agent_doc(sandbox: DocSandbox) -> None:
    """docs/agent.md: a built bundle at out/digits-cnn-x86-64-cpu-fp32, /etc/edgekit/agent.yaml (this host,
    Mosquitto on loopback, the sandbox's /var/lib) and a signed bundle.tar for ``edgekit-agent install``."""
    root = sandbox.root
    _checked(sandbox, textwrap.dedent(f"""\
        set -e
        edgekit build recipes/digits-cnn.yaml --target x86-64-cpu --precision fp32 --out out/digits-cnn-x86-64-cpu-fp32
        mkdir -p {root}/etc/edgekit {root}/setup
        edgekit keygen --out {root}/setup/keys
        cp {root}/setup/keys/fleet.pub.pem {root}/etc/edgekit/fleet.pub.pem
        cp -r out/digits-cnn-x86-64-cpu-fp32 {root}/setup/digits-cnn
        edgekit sign {root}/setup/digits-cnn --key {root}/setup/keys/fleet.key.pem
        edgekit pack {root}/setup/digits-cnn --out bundle.tar
        """))
    (root / "etc" / "edgekit" / "agent.yaml").write_text(textwrap.dedent(f"""\
        device_id: doc-device-{os.getpid()}
        fleet: docs19-agent
        broker: {{url: "mqtt://127.0.0.1:1883"}}
        bundles: {{dir: {root}/var/lib/edgekit/bundles, public_key: fleet.pub.pem}}
        api: {{address: "127.0.0.1:0"}}
        telemetry: {{interval_s: 2, spool: {{path: {root}/var/lib/edgekit/spool.db}}}}
        power: {{sensor: none}}
        """))


def setup_mosquitto_readme(sandbox: DocSandbox) -> None:
    """runtime/mosquitto/README.md is read in its folder: acl.template beside the commands."""
    shutil.copy(REPO / "runtime" / "mosquitto" / "acl.template", sandbox.work / "acl.template")
    (sandbox.root / "etc" / "mosquitto").mkdir(parents=True, exist_ok=True)


SETUPS: dict[str, Callable[[DocSandbox], None]] = {
    "docs/agent.md": setup_agent_doc,
    "runtime/mosquitto/README.md": setup_mosquitto_readme,
}

PYTHON = sys.executable


AGENT_ADDRESS = "127.0.0.1:8470"


class LocalAgent:
    """``edgekit-agent run`` (local API only) serving the digits-shaped test bundle on a free port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> LocalAgent:
        import socket
        import urllib.request

        from tests.runtime.tiny_bundle import build_bundle, load_manifest, save_manifest

        bundle = build_bundle(self.root / "digits-cnn")
        manifest = load_manifest(bundle)
        manifest["name"] = "digits-cnn-x86-64-cpu-fp32"
        save_manifest(bundle, manifest)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        config = self.root / "agent.yaml"
        config.write_text(textwrap.dedent(f"""\
            device_id: doc-agent
            fleet: docs
            bundles: {{dir: {self.root}/bundles, allow_unsigned: true}}
            api: {{address: "{self.address}"}}
            telemetry: {{spool: {{path: {self.root}/spool.db}}}}
            power: {{sensor: none}}
            """))
        env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        subprocess.run([str(VENV_BIN / "edgekit-agent"), "install", "--config", str(config), str(bundle)],
                       check=True, capture_output=True, env=env, timeout=120)
        log = (self.root / "agent.log").open("wb")
        self.proc = subprocess.Popen([str(VENV_BIN / "edgekit-agent"), "run", "--config", str(config)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.address}/v1/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"the doc-test agent did not come up:\n{(self.root / 'agent.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc.pid)
            self.proc.wait(timeout=10)
