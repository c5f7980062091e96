"""docs/: the CLI reference is generated, and the guides name only commands, options and settings
that exist, with the limits the Hub enforces."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main

from bot.commands.cli import app
from bot.feishu import app_manifest
from bot.feishu.ingress import EVENTS_PATH
from hub.limits import DEFAULT_LIMITS, KIB, MIB
from scripts.reference import CLI_REFERENCE, ENV_EXAMPLE, render_cli_reference
from tests.conftest import REPO

DOCS = REPO / "docs"
ARCHITECTURE = DOCS / "architecture.md"
GUIDES = [DOCS / "operator-guide.md", DOCS / "user-guide.md", ARCHITECTURE]
PROSE = [*GUIDES, REPO / "README.md", *sorted((REPO / "deploy").rglob("*"))]


def command_tree() -> dict[str, Any]:
    """``"amux memory upsert"`` → its command object, for every command."""
    found: dict[str, Any] = {}

    def walk(path: str, command: Any) -> None:
        found[path] = command
        if hasattr(command, "list_commands"):
            ctx = command.context_class(command, info_name=command.name)
            for name in command.list_commands(ctx):
                walk(f"{path} {name}", command.get_command(ctx, name))

    walk("amux", typer.main.get_command(app))
    return found


def amux_invocations(text: str) -> list[str]:
    """Every ``amux …`` command line quoted in inline code or code blocks.

    ``/amux …`` is the bot's chat command, not the CLI, so a bare leading slash does not count.
    """
    quoted = re.findall(r"`([^`\n]+)`", text)
    quoted += [
        line
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        for line in block.splitlines()
    ]
    lines = []
    for snippet in quoted:
        snippet = re.sub(r"(^|\s)#.*$", "", snippet)
        for match in re.finditer(r"(?:^\s*|[;&|(]\s*|bin/)amux((?: +[^\s;&|)#]+)+)", snippet):
            lines.append("amux" + match.group(1))
    return lines


def test_cli_reference_is_regenerated_from_the_typer_app() -> None:
    assert CLI_REFERENCE.read_text() == render_cli_reference(), (
        "docs/cli.md is stale: run `python -m scripts.reference`"
    )


def test_cli_reference_covers_every_command() -> None:
    text = CLI_REFERENCE.read_text()
    for path, command in command_tree().items():
        if not command.hidden:
            assert f"`{path}`" in text, path


@pytest.mark.parametrize("doc", [p for p in PROSE if p.is_file()], ids=lambda p: p.name)
def test_documented_commands_and_their_options_exist(doc: Path) -> None:
    tree = command_tree()
    for line in amux_invocations(doc.read_text()):
        words = line.split()
        path = "amux"
        for word in words[1:]:
            if f"{path} {word}" not in tree:
                break
            path = f"{path} {word}"
        if path == "amux":
            assert len(words) < 2 or words[1].startswith("-"), (
                f"{doc.name}: unknown command in `{line}`"
            )
            continue
        command = tree[path]
        known = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
        known.add("--help")
        for word in words:
            option = word.split("=", 1)[0]
            if option.startswith("--"):
                assert option in known, f"{doc.name}: `{path}` has no option {option}"


def test_every_setting_the_docs_mention_exists() -> None:
    settings = set(re.findall(r"#(AMUX_[A-Z_]+)=", ENV_EXAMPLE.read_text()))
    for doc in PROSE:
        if not doc.is_file():
            continue
        for name in set(re.findall(r"\bAMUX_[A-Z_]*[A-Z]\b", doc.read_text())):
            assert name in settings, f"{doc.name} mentions {name}, which is no setting"


def test_links_between_docs_resolve() -> None:
    for doc in [*GUIDES, CLI_REFERENCE]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_the_operator_guide_names_the_feishu_setup_the_bot_needs() -> None:
    text = (DOCS / "operator-guide.md").read_text()
    for needed in (
        "im:message",
        "im:message:send_as_bot",
        "im.message.receive_v1",
        "card.action.trigger",
        EVENTS_PATH,
        "AMUX_FEISHU_ENCRYPT_KEY",
        "long_connection",
        ".backup",
    ):
        assert needed in text, needed


def test_the_operator_guide_names_every_scope_event_and_callback_setup_asks_for() -> None:
    text = (DOCS / "operator-guide.md").read_text()
    for needed in (*app_manifest.SCOPES, *app_manifest.EVENTS, *app_manifest.CALLBACKS):
        assert f"`{needed}`" in text, needed


def test_the_user_guide_states_the_limits_the_hub_enforces() -> None:
    text = (DOCS / "user-guide.md").read_text()
    limits = DEFAULT_LIMITS
    assert f"at most {limits.entry_bytes // KIB} KiB and {limits.entry_lines} lines" in text
    assert f"at most {limits.document_bytes // KIB} KiB" in text
    assert (
        f"at most {limits.scope_documents:,} documents and {limits.scope_bytes // MIB} MiB" in text
    )


def test_the_architecture_names_only_modules_that_exist() -> None:
    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"\b(?:hub|bot|runtime_bridge|cards|tests)/[\w/]*\.py\b", text))
    assert named, "the architecture names no module"
    assert sorted(path for path in named if not (REPO / path).is_file()) == []


def test_the_readme_links_every_guide() -> None:
    readme = (REPO / "README.md").read_text()
    for guide in [*GUIDES, CLI_REFERENCE]:
        assert f"]({guide.relative_to(REPO)})" in readme, guide.name
