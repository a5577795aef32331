"""Every command and option of ``edgekit`` and ``edgekit-agent`` has help text, and every metavar says what
its option takes: a walk over the whole argparse tree, so a new command or option without help fails here."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from edgekit.cli.main import build_parser
from edgekit_runtime.agent.cli import build_parser as build_agent_parser

#: Metavars that name a path, and what their option must take (a str or Path, never a number).
PATH_METAVARS = re.compile(r"^(DIR|FILE|PATH|PEM|CONFIG|BUNDLE|RECIPE|[A-Z]*\.(pem|tar|yaml|db|json)|[a-z.]+\.(pem|tar|yaml))$", re.I)
#: Metavars that name a number.
NUMBER_METAVARS = {"N", "S", "MB", "H", "M", "P", "R", "KIB", "SECONDS"}


def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action | None, str | None]]:
    """(command path, parser, action, help of the command in its parent's list) for the parser and every
    option and subcommand below it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub, None, helps.get(name)
                yield from walk(sub, f"{path} {name}")
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield path, parser, action, None


def every_parser() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action | None, str | None]]:
    yield from walk(build_parser(), "edgekit")
    yield from walk(build_agent_parser(), "edgekit-agent")


def _name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or action.dest


def test_every_command_has_a_help_line_and_a_description() -> None:
    missing = []
    for path, parser, action, listed_help in every_parser():
        if action is None:
            if not listed_help:
                missing.append(f"{path}: no help= (the line in its parent's command list)")
            if not parser.description:
                missing.append(f"{path}: no description= (what `{path} --help` says on top)")
    assert not missing, "commands without help:\n" + "\n".join(missing)


def test_every_option_and_argument_has_help() -> None:
    missing = [f"{path} {_name(action)}" for path, _, action, _ in every_parser()
               if action is not None and (not action.help or action.help == argparse.SUPPRESS)]  # fmt: skip
    assert not missing, "options without help=:\n" + "\n".join(missing)


def test_metavars_agree_with_what_the_option_takes() -> None:
    wrong = []
    for path, _, action, _ in every_parser():
        if action is None or action.nargs == 0 or action.choices is not None:
            continue
        # what --help shows: the metavar, else argparse's default (DEST for an option, dest for an argument)
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper() if action.option_strings else action.dest
        # int, float, or a checking type of ours that returns one (fleet_options.port_number, finite_number)
        takes_number = action.type in (int, float) or getattr(action.type, "__annotations__", {}).get("return") in (int, float, "int", "float")
        if takes_number and PATH_METAVARS.match(metavar):
            wrong.append(f"{path} {_name(action)}: takes a number but its metavar {metavar} names a path")
        if not takes_number and metavar.upper() in NUMBER_METAVARS:
            wrong.append(f"{path} {_name(action)}: metavar {metavar} names a number but the option takes {action.type}")
        help_text = (action.help or "").lower()
        if metavar == "DIR" and not re.search(r"director|folder", help_text):
            wrong.append(f"{path} {_name(action)}: metavar DIR but the help does not say it is a directory")
        if (metavar.upper().startswith("FILE") or metavar.lower().endswith((".tar", ".pem", ".yaml"))) and "directory" in help_text \
                and "file" not in help_text:
            wrong.append(f"{path} {_name(action)}: metavar {metavar} names a file but the help speaks of a directory")
    assert not wrong, "metavars that disagree with their option:\n" + "\n".join(wrong)


def test_pack_out_takes_a_tar_file() -> None:
    (pack,) = [parser for path, parser, action, _ in every_parser() if path == "edgekit pack" and action is None]
    (out,) = [action for action in pack._actions if "--out" in action.option_strings]
    assert out.metavar == "FILE.tar" and "tar file" in out.help
    assert "--out FILE.tar" in pack.format_help()


@pytest.mark.parametrize("argv", [["--help"], ["fleet", "--help"], ["pack", "--help"], ["targets", "--help"]])
def test_help_prints_to_stdout(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: edgekit") and captured.err == ""
