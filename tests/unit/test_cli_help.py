"""Help text is for users: `laneway --help`, every subcommand's `--help` and `laneway loadtest
--list` exit 0 and name no file of this repository (a module, a design note, a reference
document) that a user of the installed command has never seen."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys

import pytest

from laneway.cli import build_parser, main

# What only a reader of the source knows: a module or markdown file, the design notes.
INTERNAL = re.compile(r"\b[\w/]+\.(py|md)\b|\breference/|\bDESIGN\b")


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


COMMANDS = list(commands(build_parser()))


def output_of(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as ended:
        main(argv)
    return ended.value.code, out.getvalue()


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "laneway")
def test_help_is_for_users(path: tuple[str, ...]) -> None:
    code, text = output_of([*path, "--help"])
    assert code == 0
    assert text.startswith("usage: laneway")
    assert INTERNAL.search(text) is None, INTERNAL.search(text).group(0)


def test_the_commands_for_batches_and_files_are_there() -> None:
    assert {("batches", "watch"), ("batches", "download"), ("files", "upload")} <= set(COMMANDS)


def test_laneway_help_from_a_shell_opens_with_what_laneway_is() -> None:
    ran = subprocess.run([sys.executable, "-m", "laneway.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    description = ran.stdout.split("\n\n")[1]
    assert description.startswith("Laneway serves OpenAI-compatible"), description
    assert INTERNAL.search(ran.stdout) is None


def test_loadtest_list_cites_nothing_outside_the_repository(capsys) -> None:
    assert main(["loadtest", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "batch-flood" in listed
    assert INTERNAL.search(listed) is None, INTERNAL.search(listed).group(0)
