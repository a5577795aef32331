"""Inline command synopses (``edgekit build RECIPE --target NAME [--precision P]``) against the real parsers:
every subcommand named must exist and every ``--option`` must be one that subcommand takes."""

from __future__ import annotations

import argparse
import re


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def synopsis_problems(text: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What in ``text`` (one inline code span) the CLI does not accept; ``[]`` when all of it is known."""
    command = text.replace("\\|", "|").split(" | ")[0]  # a spaced '|' is a shell pipe; '|' alone, alternatives
    words = [w.strip("[]()") for w in command.split()]
    program, words = words[0], words[1:]
    paths: list[tuple[str, argparse.ArgumentParser]] = [(program, parsers[program])]
    problems: list[str] = []
    while words and not words[0].startswith("-"):
        subs = _subcommands(paths[0][1])
        if not subs:
            break
        names = [n for n in words[0].split("|") if n]
        if not all(re.fullmatch(r"[a-z][a-z-]*", n) for n in names):
            break  # a placeholder (RECIPE, BUNDLE) or an argument
        unknown = [n for n in names if n not in subs]
        if unknown and len(paths) > 1:
            break
        if unknown:
            if all(n.isupper() for n in names):
                break
            problems.append(f"`{paths[0][0]} {words[0]}`: no such subcommand (known: {', '.join(sorted(subs))})")
            return problems
        paths = [(f"{paths[0][0]} {n}", subs[n]) for n in names]
        words = words[1:]
    for word in words:
        for option in word.split("|"):
            option = option.split("=", 1)[0].strip("[](),.;:")
            if not re.fullmatch(r"--[a-z][a-z0-9-]*|-[a-zA-Z]", option):
                continue
            for name, parser in paths:
                if option not in _options(parser):
                    problems.append(f"`{name}` has no option {option}")
    return problems


_TARGET_VALUE = re.compile(r"--targets?[= ]+(?P<value>[A-Za-z0-9_.,-]+)|\btargets show (?P<shown>[A-Za-z0-9_.-]+)")


def target_name_problems(text: str, known: set[str]) -> list[str]:
    """Target names given to ``--target``/``--targets``/``targets show`` in ``text`` that no shipped profile
    has (placeholders in capitals, NAME, are not names)."""
    problems = []
    for found in _TARGET_VALUE.finditer(text):
        for name in (found["value"] or found["shown"]).split(","):
            if name and not name.isupper() and name not in known:
                problems.append(f"target {name!r} does not exist (shipped: {', '.join(sorted(known))})")
    return problems
