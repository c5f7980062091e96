"""Every command's --help reads as help for people: each option says what it does, and no value is
labelled with a Python type name (<bool>, <FileBinaryRead>)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from bot.commands.cli import app
from tests.conftest import AMUX

# A Python annotation as typer prints it by default: <bool>, <str>, <FileBinaryRead>, <list[str]>
# (a placeholder default such as <prompt> is not one).
PYTHON_TYPE = re.compile(r"<(?:bool|str|int|float|bytes|list\[[^>]*\]|tuple\[[^>]*\]|[A-Z]\w*)>")


def commands(path: list[str], command: Any) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    if hasattr(command, "list_commands"):
        ctx = command.context_class(command, info_name=command.name)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                yield from commands([*path, name], sub)


def every_command() -> list[tuple[list[str], Any]]:
    return list(commands([], typer.main.get_command(app)))


def test_the_walk_reaches_nested_commands() -> None:
    paths = {" ".join(path) for path, _ in every_command()}
    assert {"", "serve", "memory upsert", "runtime plan", "doctor"} <= paths


def test_no_help_labels_a_value_with_a_python_type() -> None:
    runner = CliRunner()
    for path, _ in every_command():
        shown = runner.invoke(app, [*path, "--help"], prog_name="amux")
        assert shown.exit_code == 0, (path, shown.output)
        found = PYTHON_TYPE.findall(shown.output)
        assert not found, f"amux {' '.join(path)} --help shows {found}"


def test_every_option_and_argument_says_what_it_does() -> None:
    missing = [
        f"amux {' '.join(path)} {param.opts[0] if param.opts else param.name}"
        for path, command in every_command()
        for param in command.params
        if not getattr(param, "hidden", False) and not (getattr(param, "help", None) or "").strip()
    ]
    assert not missing, missing


def test_version_prints_the_package_version() -> None:
    done = subprocess.run([AMUX, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"amux \d+\.\d+\.\d+\S*\n", done.stdout), done.stdout


def test_root_help_lists_the_exit_statuses() -> None:
    shown = CliRunner().invoke(app, ["--help"], prog_name="amux", terminal_width=200)
    text = " ".join(shown.output.split())
    for status in ("3 conflict", "4 not_found", "5 unauthenticated or forbidden", "6 unavailable"):
        assert status in text, text
