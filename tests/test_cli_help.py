"""Every command's --help reads as help for people: each option says what it does, and no value is
labelled with a Python type name (<bool>, <FileBinaryRead>); every command that prints a result
takes --json, and the README's CLI table names every command."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from bot.commands.cli import app
from tests.conftest import AMUX, REPO

README = REPO / "README.md"
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


# Commands that print no result of their own: servers whose output is a log (`--log-format`) or
# a protocol on stdio. Every other command takes --json.
SERVERS = {"serve", "mcp"}


def leaf_commands() -> list[tuple[str, Any]]:
    return [
        (" ".join(path), command)
        for path, command in every_command()
        if path and not hasattr(command, "list_commands")
    ]


def test_every_command_that_prints_a_result_takes_json() -> None:
    runner = CliRunner()
    missing = []
    for path, command in leaf_commands():
        if path in SERVERS:
            continue
        flags = {opt for param in command.params for opt in getattr(param, "opts", [])}
        shown = runner.invoke(app, [*path.split(), "--help"], prog_name="amux", terminal_width=200)
        if "--json" not in flags or "--json" not in shown.output:
            missing.append(f"amux {path}")
    assert not missing, f"without --json: {missing}"


def test_the_readme_table_lists_every_command() -> None:
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `amux ")]
    commands_shown = {
        snippet for row in rows for snippet in re.findall(r"`(amux [^`]*)`", row.split(" | ")[0])
    }
    missing = [
        f"amux {path}"
        for path, command in leaf_commands()
        if not command.hidden
        and not any(re.match(rf"amux {re.escape(path)}(?: |$)", shown) for shown in commands_shown)
    ]
    assert not missing, f"README.md's CLI table lacks {missing}"
