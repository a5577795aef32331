"""The docs are tests: every fenced block of README.md, docs/**/*.md, runtime/*.md and the Mosquitto README
runs (shell), executes (Python) or is validated by the project's own loaders and schemas (YAML, JSON).

One test per block, named ``FILE:LINE``. The conventions (markers, fixtures, re-rooted paths, long-running
commands, ``# exit N``) are in ``doc_blocks`` and ``doc_sandbox``. A block that cannot run here says so in
the Markdown (``<!-- doc-test: skip reason="..." -->``); those are skipped with their reason, and
``test_skipped_blocks_are_few_and_listed`` lists and counts them so none is skipped silently.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.docs.doc_blocks import (REPO, SHOWN_LANGUAGES, DocBlock, all_blocks, command_spans, doc_files, extract_blocks,
                                   parse_marker)
from tests.docs.doc_sandbox import AGENT_ADDRESS, DocSandbox, LocalAgent, rewrite_script
from tests.docs.doc_synopsis import synopsis_problems, target_name_problems
from tests.docs.doc_validators import VALIDATORS, parse_block_data

BLOCKS = all_blocks()
#: skipped blocks allowed at most: raise it only with a reason in the Markdown for each new one
MAX_SKIPPED = 6


def _broker_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 1883), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def doc_sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], DocSandbox]:
    """One sandbox per Markdown file, made on first use and kept for the session."""
    made: dict[str, DocSandbox] = {}

    def get(doc: str) -> DocSandbox:
        if doc not in made:
            root = tmp_path_factory.mktemp("doc-" + doc.replace("/", "-").removesuffix(".md"))
            sandbox = DocSandbox(root, doc)
            sandbox.setup()
            made[doc] = sandbox
        return made[doc]

    return get


@pytest.fixture(scope="session")
def local_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], LocalAgent]]:
    """A real agent for the blocks that call the local API at 127.0.0.1:8470, started on first use."""
    agents: list[LocalAgent] = []

    def get() -> LocalAgent:
        if not agents:
            agents.append(LocalAgent(tmp_path_factory.mktemp("doc-agent")).start())
        return agents[0]

    yield get
    for agent in agents:
        agent.stop()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.test_id for b in BLOCKS])
def test_doc_block(block: DocBlock, doc_sandboxes: Callable[[str], DocSandbox],
                   local_agent: Callable[[], LocalAgent], tmp_path: Path) -> None:
    kind = block.kind
    if kind == "unknown":
        pytest.fail(f"{block.test_id}: fence language {block.language!r} is not one the doc tests know: tag it "
                    f"bash, python, yaml, json or (not code) {', '.join(sorted(SHOWN_LANGUAGES))}")
    if kind == "skip":
        pytest.skip(f"{block.test_id}: {block.skip_reason}")
    if kind == "shown":
        assert block.text.strip(), f"{block.test_id}: empty block"
        return
    if kind == "validate":
        name = block.marker.get("validate")
        assert name in VALIDATORS, (f"{block.test_id}: a {block.language} block needs <!-- doc-test: validate=\"NAME\" --> "
                                    f"(NAME one of {sorted(VALIDATORS)}) or a skip with a reason; got {name!r}")
        VALIDATORS[name](parse_block_data(block), block, tmp_path)
        return
    if kind == "output":
        _check_output(block)
        return
    text = block.text
    if AGENT_ADDRESS in text and kind in ("python", "run"):
        text = text.replace(AGENT_ADDRESS, local_agent().address)
    if kind == "python":
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            exec(compile(text, block.test_id, "exec"), {"__name__": "__doc_test__"})  # noqa: S102 - the doc's own code
        finally:
            os.chdir(cwd)
        return
    if ("mqtt://127.0.0.1:1883" in block.text or "edgekit-agent" in block.text) and not _broker_up():
        pytest.skip("no MQTT broker on 127.0.0.1:1883 (.ci/run starts Mosquitto)")
    sandbox = doc_sandboxes(block.relpath)
    earlier = [b for b in BLOCKS if b.path == block.path and b.line < block.line]
    run = sandbox.run_block(block, earlier, text=text)
    assert run.returncode == 0, f"{block.test_id} exited {run.returncode} after {run.seconds:.1f} s:\n{run.output[-6000:]}"


def _check_output(block: DocBlock) -> None:
    shown = block.text.splitlines()
    assert shown and shown[0].startswith("$ "), f"{block.test_id}: program output starts with the '$ command' line"
    ignore = re.compile(block.marker["ignore"]) if block.marker.get("ignore") else None
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}
    done = subprocess.run(shlex.split(block.marker["output"]), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    got = [line for line in done.stdout.splitlines() if not (ignore and ignore.search(line))]
    want = [line for line in shown[1:] if not (ignore and ignore.search(line))]
    assert got == want, (f"{block.test_id}: `{block.marker['output']}` (exit {done.returncode}) prints\n"
                         + "\n".join(got) + f"\nbut the doc shows\n" + "\n".join(want) + f"\n{done.stderr[-2000:]}")


def test_skipped_blocks_are_few_and_listed() -> None:
    skipped = [f"{b.test_id}: {b.skip_reason}" for b in BLOCKS if b.kind == "skip"]
    shown = [f"{b.test_id} ({b.language})" for b in BLOCKS if b.kind == "shown"]
    print(f"\n{len(skipped)} of {len(BLOCKS)} doc blocks are not run here:\n  " + "\n  ".join(skipped))
    print(f"{len(shown)} are output, trees or other tools' files, shown only:\n  " + "\n  ".join(shown))
    assert len(skipped) <= MAX_SKIPPED, "more doc blocks skipped than allowed:\n" + "\n".join(skipped)
    by_kind: dict[str, int] = {}
    for block in BLOCKS:
        by_kind[block.kind] = by_kind.get(block.kind, 0) + 1
    assert by_kind.get("run", 0) >= 5 and by_kind.get("validate", 0) >= 4, by_kind


def test_the_quickstart_commands_are_what_ci_runs() -> None:
    """README's two Quickstart commands are not run inside the suite (``test.sh`` would run itself, ``demo.sh``
    builds the demos): they are marked, and CI runs ``scripts/test.sh``, which exists with ``demo.sh``."""
    readme = [b for b in BLOCKS if b.relpath == "README.md"]
    quickstart = {b.text.strip(): b for b in readme if b.text.strip() in ("./scripts/demo.sh", "./scripts/test.sh")}
    assert set(quickstart) == {"./scripts/demo.sh", "./scripts/test.sh"}
    for block in quickstart.values():
        assert block.kind == "skip", f"{block.test_id} must carry a doc-test skip marker"
    for script in ("scripts/demo.sh", "scripts/test.sh", ".ci/run"):
        mode = (REPO / script).stat().st_mode
        assert mode & stat.S_IXUSR, f"{script} is not executable"
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "exec ./scripts/test.sh" in commands, "CI must run the README's test command"
    assert "pytest" in (REPO / "scripts" / "test.sh").read_text()


def test_the_doc_set_is_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in doc_files()}
    assert {"README.md", "docs/agent.md", "docs/fleet.md", "runtime/mosquitto/README.md"} <= names


# -- the harness itself -----------------------------------------------------------------------------------


def test_extractor_reads_markers_indented_fences_and_languages(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "intro\n\n<!-- doc-test: skip reason=\"needs a Jetson\" -->\n```bash\nnvpmodel -q\n```\n\n"
        "1. step\n\n   ```sh\n   echo hi\n   ```\n\n````text\n```\nnested\n```\n````\n\n```\nuntagged\n```\n"
    )
    blocks = extract_blocks(doc)
    assert [(b.line, b.language, b.kind) for b in blocks] == [(4, "bash", "skip"), (10, "sh", "run"),
                                                             (14, "text", "shown"), (20, "", "unknown")]
    assert blocks[0].skip_reason == "needs a Jetson"
    assert blocks[1].text == "echo hi\n"
    assert blocks[2].text == "```\nnested\n```\n"


def test_a_skip_without_reason_is_an_error() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        parse_marker("skip", where="doc.md:3")


def test_rewrites_reroot_system_paths_background_servers_and_check_exit_codes(tmp_path: Path) -> None:
    script = rewrite_script(
        "sudo tee /etc/mosquitto/x.acl < a\n"
        "edgekit fleet collect --broker mqtt://127.0.0.1:1883 --store sqlite:///f.db   # until Ctrl-C\n"
        "edgekit fleet up --broker mqtt://h:1883 --simulate 2 &\n"
        "edgekit fleet deploy b.tar \\\n    --key k.pem   # exit 2: refused\n",
        tmp_path,
    )
    assert f"tee {tmp_path}/etc/mosquitto/x.acl" in script and "sudo" not in script
    assert "doc_long_running edgekit fleet collect --metrics-port 0 --broker" in script
    assert "doc_long_running edgekit fleet up --port 0 --broker mqtt://h:1883 --simulate 2\n" in script
    assert '[ "$doc_rc" -eq 2 ]' in script
    assert "curl --fail-with-body -s 127.0.0.1:8470/v1/health" in rewrite_script("curl -s 127.0.0.1:8470/v1/health\n", tmp_path)


def test_a_long_running_command_that_dies_fails_its_block(tmp_path: Path) -> None:
    sandbox = DocSandbox(tmp_path, "none.md")
    sandbox.work.mkdir()
    run = sandbox.shell(rewrite_script("edgekit fleet dashboard --store sqlite:///missing.db\n", tmp_path))
    assert run.returncode == 98 and "exited early" in run.output
    run = sandbox.shell(rewrite_script("edgekit targets   # exit 2\n", tmp_path))
    assert run.returncode == 97 and "expected exit 2, got 0" in run.output


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_inline_command_synopses_match_the_parsers(doc: Path) -> None:
    """Commands in tables and prose (`edgekit fleet deploy BUNDLE --key ...`) name real subcommands and options."""
    from edgekit.cli.main import build_parser
    from edgekit_runtime.agent.cli import build_parser as build_agent_parser

    parsers = {"edgekit": build_parser(), "edgekit-agent": build_agent_parser()}
    problems = [f"{doc.relative_to(REPO)}:{line}: {problem}" for line, text in command_spans(doc)
                for problem in synopsis_problems(text, parsers)]
    assert not problems, "\n".join(problems)


def test_synopsis_checker_catches_unknown_options_and_subcommands() -> None:
    from edgekit.cli.main import build_parser

    parsers = {"edgekit": build_parser()}
    assert synopsis_problems("edgekit build RECIPE --target NAME [--precision P] [--json]", parsers) == []
    assert synopsis_problems("edgekit targets [--json\\|--csv]", parsers) == []
    assert synopsis_problems("edgekit fleet status | grep nano", parsers) == []
    assert synopsis_problems("edgekit build RECIPE --tagret NAME", parsers) == ["`edgekit build` has no option --tagret"]
    assert "no such subcommand" in synopsis_problems("edgekit fleet rollback BUNDLE", parsers)[0]


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_target_names_in_the_docs_exist(doc: Path) -> None:
    """`--target NAME` in commands (blocks and inline) names a shipped profile: docs/fleet.md once used
    `jetson-orin-nano`, which `edgekit fleet report` silently matched to no device."""
    known = {p.stem for p in (REPO / "targets").glob("*.yaml")}
    texts = [(b.line, b.text) for b in extract_blocks(doc) if b.language in ("bash", "sh", "shell")] + command_spans(doc)
    problems = [f"{doc.relative_to(REPO)}:{line}: {problem}" for line, text in texts
                for problem in target_name_problems(text, known)]
    assert not problems, "\n".join(problems)


def test_target_name_checker() -> None:
    known = {"jetson-orin-nano-8gb", "x86-64-cpu"}
    assert target_name_problems("edgekit fleet report --target jetson-orin-nano --json", known)
    assert not target_name_problems("edgekit build R --target x86-64-cpu; edgekit targets show NAME", known)
    assert target_name_problems("corpus.py --targets x86-64-cpu,raspberry-pi-5", known)
