"""Generates the reference files that must not drift from the code.

- ``deploy/amux.env.example``: every environment setting of every settings model, with its default
  and meaning.
- ``docs/cli.md``: every ``amux`` command with its arguments and options, walked from the typer app.

Run ``python -m scripts.reference`` to rewrite both, ``--check`` to fail when either is stale.
Tests call the same functions and compare.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, get_args

import typer.main
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from bot.config import FeishuSettings
from bot.service.logs import LogSettings
from hub.config import ClientSettings, HubSettings
from runtime_bridge.config import RuntimeSettings

REPO = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = REPO / "deploy" / "amux.env.example"
CLI_REFERENCE = REPO / "docs" / "cli.md"

# Meanings of settings whose model field has no description. A new field without a description
# and without an entry here fails the generator, so the example file can never omit a setting.
MEANINGS: dict[str, str] = {
    "AMUX_HOME": "Directory of the Hub's state database, memory root, owner token and runtime "
    "files. The CLI on the Hub host reads the owner token from here.",
    "AMUX_HOST": "Address `amux serve` listens on. Use 0.0.0.0 only behind a firewall or proxy.",
    "AMUX_PORT": "Port `amux serve` listens on (Hub RPC, Feishu webhook, /healthz, /readyz, "
    "/metrics).",
    "AMUX_RESTART_MODE": "exec: after a graceful drain the Hub re-executes itself in place; "
    "exit: it exits with status 75 and a supervisor (systemd RestartForceExitStatus=75) starts "
    "it again.",
    "AMUX_MAX_REQUEST_BYTES": "Largest request body the Hub accepts; larger ones get "
    "payload_too_large.",
    "AMUX_REQUEST_BODY_SECONDS": "A request body (Hub RPC, Feishu webhook) must arrive whole "
    "within this many seconds; a slower one gets request_timeout (408) and its connection is "
    "closed.",
    "AMUX_LEASE_SECONDS": "How long a worker may go without a heartbeat before its running turn is "
    "retried elsewhere (once) or failed visibly.",
    "AMUX_QUEUE_SECONDS": "A turn no Runtime worker takes within this many seconds fails with a "
    "clear error instead of waiting forever.",
    "AMUX_HOME_WORKER_SECONDS": "A project conversation's turns wait for the worker holding its "
    "checkout; once that worker has not been seen for this many seconds while the Hub runs, "
    "another worker takes them and makes the checkout again from the conversation's branch (at "
    "least 10).",
    "AMUX_DRAIN_SECONDS": "A restart starts no new turns and waits this long for running ones to "
    "finish; those still running are handed back and run again after it (a stop hands back at "
    "once).",
    "AMUX_DELEGATED_CREDENTIAL_SECONDS": "Lifetime of an Agent's delegated memory credential "
    "unless revoked first (a finished turn's is revoked at once).",
    "AMUX_HUB_URL": "Where the CLI, `amux mcp` and remote workers reach the Hub.",
    "AMUX_TOKEN": "Credential the CLI or a worker presents to the Hub. Unset on the Hub host: the "
    "local owner token under AMUX_HOME is used.",
    "AMUX_MEMORY_BINDING": "Memory scope an Agent's launch froze (set by the Runtime for managed "
    "launches; the Hub rejects a mismatch).",
    "AMUX_TIMEOUT": "Seconds a Hub RPC call may take before the client gives up.",
    "AMUX_OWNER_TOKEN_FALLBACK": "Whether the CLI and `amux mcp` use the local owner token under "
    "AMUX_HOME when AMUX_TOKEN is unset. Agent launches set it false.",
    "AMUX_MEMORY_UNAVAILABLE": "Set by the Runtime in a launch of a bound conversation whose Hub "
    "could not be asked: every memory call answers unavailable with this reason.",
    "AMUX_RUNTIME_NAME": "Worker name shown to operators.",
    "AMUX_RUNTIME_IN_PROCESS": "Whether `amux serve` runs a worker beside the Hub. Set false when "
    "only remote workers should run turns.",
    "AMUX_RUNTIME_CLAUDE": "Claude Code executable: a name looked up on PATH or an absolute path.",
    "AMUX_RUNTIME_CODEX": "Codex executable: a name looked up on PATH or an absolute path.",
    "AMUX_RUNTIME_PI": "Pi executable: a name looked up on PATH or an absolute path.",
    "AMUX_RUNTIME_PROVIDERS": "Further providers Agents may run, besides claude, codex and pi "
    '(JSON map of name to executable, e.g. {"aider": "/usr/local/bin/aider"}); they run without '
    "memory. Any other provider is refused.",
    "AMUX_RUNTIME_CLAUDE_MCP_CONFIG": 'A JSON file in Claude\'s format ({"mcpServers": {...}}) '
    "naming the operator's own MCP servers: every Claude launch gets exactly these (workspace "
    ".mcp.json files are ignored), plus amux memory when the conversation is bound. Their "
    "commands and the files their absolute arguments name are visible read-only in the sandbox.",
    "AMUX_RUNTIME_SANDBOX": "bwrap: every Agent launch runs in a bubblewrap sandbox that shows it "
    "only its own workspace and home (needs the bubblewrap package); off: Agents run with the "
    "worker's own file access.",
    "AMUX_RUNTIME_CLAUDE_ARGS": "Extra arguments for every claude launch (JSON list).",
    "AMUX_RUNTIME_CODEX_ARGS": "Extra arguments for every codex launch (JSON list).",
    "AMUX_RUNTIME_PI_ARGS": "Extra arguments for every pi launch (JSON list).",
    "AMUX_RUNTIME_CODEX_CONFIG": "A Codex config directory copied into each launch's own "
    "CODEX_HOME (the global one is never used or edited).",
    "AMUX_RUNTIME_PI_AGENT_DIR": "A Pi agent directory copied into each launch's own "
    "PI_CODING_AGENT_DIR.",
    "AMUX_RUNTIME_APPEND_INSTRUCTIONS": "Extra system-prompt text for claude and pi, merged with "
    "the memory protocol (never replaced by it).",
    "AMUX_RUNTIME_DEVELOPER_INSTRUCTIONS": "Extra developer instructions for codex, merged with "
    "the memory protocol.",
    "AMUX_RUNTIME_PASS_ENV": "Environment variables a launched Agent inherits (JSON list); "
    "everything else is dropped.",
    "AMUX_RUNTIME_WORK_DIR": "Per-run files and per-session Agent homes. Unset: "
    "<AMUX_HOME>/runtime.",
    "AMUX_RUNTIME_DEFAULT_CWD": "Where Agents work when a conversation names no directory. Set: "
    "one directory all users' Agents share. Unset: each Principal's own workspace, "
    "<AMUX_RUNTIME_WORK_DIR>/workspaces/<sha256(principal-id)>/.",
    "AMUX_RUNTIME_AMUX": "The amux executable launches use for `amux mcp` and the memory CLI. "
    "Unset: the running one.",
    "AMUX_RUNTIME_RUN_AS": "Run Agents as this local user (name or uid); the worker runs as root "
    "and amux must be installed where that user can read it. Unset: the worker's own user.",
    "AMUX_FEISHU_APP_ID": "Feishu app id (cli_...). Empty: the app `amux feishu setup` saved in "
    "AMUX_HOME/feishu-app.json, else the bot is off and only the Hub runs. Set, it wins over "
    "the saved app.",
    "AMUX_FEISHU_APP_SECRET": "Feishu app secret. Never logged.",
    "AMUX_FEISHU_ENCRYPT_KEY": "Event encryption key from the app's Events page (webhook mode). "
    "Never logged.",
    "AMUX_FEISHU_VERIFICATION_TOKEN": "Event verification token (webhook mode). Never logged.",
    "AMUX_FEISHU_ALLOW_UNENCRYPTED": "A webhook without AMUX_FEISHU_ENCRYPT_KEY gets events "
    "unsigned and in clear text, checked by the verification token alone; `amux serve` refuses "
    "to start that way unless this is true.",
    "AMUX_FEISHU_DOMAIN": "OpenAPI base: https://open.feishu.cn (Feishu) or "
    "https://open.larksuite.com (Lark). `amux feishu setup` saves it with the app.",
    "AMUX_FEISHU_ACCOUNTS_DOMAIN": "Where `amux feishu setup` registers the app: "
    "https://accounts.feishu.cn, or with --lark https://accounts.larksuite.com; set only for a "
    "private deployment. Setup saves it with the app.",
    "AMUX_FEISHU_CATCH_UP_WINDOW_SECONDS": "Catch-up: messages sent while the long connection "
    "was down or the Hub stopped are listed and answered once the bot hears again. One found "
    "more than this many seconds after it was sent is not run but answered with a note whose "
    "button its sender can press to run it.",
    "AMUX_FEISHU_CATCH_UP_MAX_AGE_SECONDS": "Catch-up never looks further back than this (nor "
    "than AMUX_FEISHU_DEDUP_HOURS).",
    "AMUX_FEISHU_CATCH_UP_CHATS": "The chats and topics heard from most recently that catch-up "
    "looks at.",
    "AMUX_FEISHU_CATCH_UP_PAGES": "Pages of 50 messages catch-up reads in each chat or topic.",
    "AMUX_FEISHU_MODE": "webhook: Feishu posts events to /feishu/events on this server; "
    "long_connection: the bot connects out to Feishu and needs no public URL.",
    "AMUX_FEISHU_ENROLL": "auto: a Feishu user who messages the bot gets a Principal; closed: only "
    "users an operator enrolled may use it.",
    "AMUX_FEISHU_DEDUP_HOURS": "How long event ids are remembered, so Feishu's redeliveries run "
    "once.",
    "AMUX_FEISHU_MAX_CLOCK_SKEW_SECONDS": "Webhook requests older (or further in the future) than "
    "this are refused as replays.",
    "AMUX_FEISHU_CARD_UPDATE_INTERVAL_SECONDS": "At most one in-place progress card update per "
    "message per interval.",
    "AMUX_FEISHU_PROVIDER": "The Agent a new Feishu conversation runs: claude, codex or pi.",
    "AMUX_FEISHU_MODELS": "The models `/model` may choose for a topic's conversation, per provider "
    '(JSON map of provider to a list of model names, e.g. {"claude": ["claude-sonnet-4-5", '
    '"claude-opus-4-1"]}); a provider not listed offers none, and its Agent runs its default.',
    "AMUX_FEISHU_LANGUAGE": "Language of the bot's cards and replies: zh_cn or en_us.",
    "AMUX_FEISHU_TIME_ZONE": (
        "The IANA time zone the bot's cards tell time in (Asia/Shanghai, UTC, Europe/Berlin…); "
        "every time shown carries its UTC offset."
    ),
    "AMUX_LOG_FORMAT": "text: one readable line per record; json: one JSON object per line "
    "(time, level, logger, message, request_id, extra fields).",
    "AMUX_LOG_LEVEL": "Least severe level written: DEBUG, INFO, WARNING or ERROR.",
}

SECTIONS: tuple[tuple[str, type[BaseSettings]], ...] = (
    ("Hub (`amux serve`)", HubSettings),
    ("Clients: the CLI, `amux mcp` and remote workers", ClientSettings),
    ("Runtime workers (in-process and `amux runtime worker`)", RuntimeSettings),
    ("Feishu bot", FeishuSettings),
    ("Logging of `amux serve`", LogSettings),
)


def env_name(model: type[BaseSettings], name: str) -> str:
    prefix = str(model.model_config.get("env_prefix", ""))
    return (prefix + name).upper()


def default_text(field: FieldInfo) -> str:
    """The default as it would be written in an environment file."""
    if field.default_factory is not None:
        factory = getattr(field.default_factory, "__name__", "")
        return "(this host's name)" if factory == "gethostname" else "(computed)"
    value: Any = field.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    if isinstance(value, Enum):
        return str(value.value)
    return str(value)


def choices(field: FieldInfo) -> list[str]:
    args = get_args(field.annotation)
    if args and all(isinstance(a, str) for a in args):
        return [str(a) for a in args]
    return []


def render_env_example() -> str:
    """Every setting, commented out at its default, grouped by the process that reads it."""
    out = [
        "# amux settings. Generated from the settings models by `python -m scripts.reference`;",
        "# do not edit by hand. Every variable is optional: the value shown is the default.",
        "# Copy this file (e.g. to /etc/amux/amux.env), uncomment what you change, and keep it",
        "# readable only by the service user: it may hold the Feishu app secret and a Hub token.",
        "# Agent memory on/off, isolation and history days (memory.history_days) are not here:",
        "# they are saved in the Hub's state (`amux system config set memory.enabled true`) and",
        "# apply at the next restart. A relative path is taken from the directory amux starts in.",
    ]
    seen: set[str] = set()
    for title, model in SECTIONS:
        out += ["", f"## {title}"]
        for name, field in model.model_fields.items():
            env = env_name(model, name)
            if env in seen:
                out += ["", f"# {env}: see above (shared)."]
                continue
            seen.add(env)
            meaning = field.description or MEANINGS.get(env)
            if meaning is None:
                raise LookupError(f"{env} has no meaning: add a description for it")
            allowed = choices(field)
            if allowed:
                meaning += f" One of: {', '.join(allowed)}."
            out += [""]
            out += [f"# {line}" for line in _wrap(meaning, 96)]
            out += [f"#{env}={default_text(field)}"]
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int) -> Iterator[str]:
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            yield line
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        yield line


# -- CLI reference -------------------------------------------------------------------------------


def render_cli_reference() -> str:
    """Markdown for every command of the ``amux`` typer app, in the order the app lists them."""
    from bot.commands.cli import app

    root = typer.main.get_command(app)
    out = [
        "# amux command line reference",
        "",
        "Generated from the typer app by `python -m scripts.reference`; do not edit by hand.",
        "Every command also takes `--help`. Settings come from `AMUX_*` environment variables",
        "(see `deploy/amux.env.example`).",
    ]
    for path, command in _walk("amux", root):
        out += _command_section(path, command)
        if path == "amux" and command.epilog:
            out += ["", " ".join(command.epilog.split())]
    return "\n".join(out) + "\n"


# typer bundles its own copy of click, so commands are read by shape rather than by class.
Command = Any


def _subcommands(command: Command) -> list[str]:
    if not hasattr(command, "list_commands"):
        return []
    return list(command.list_commands(_context(command)))


def _context(command: Command) -> Any:
    return command.context_class(command, info_name=command.name)


def _walk(path: str, command: Command) -> Iterator[tuple[str, Command]]:
    if command.hidden:
        return
    yield path, command
    for name in _subcommands(command):
        sub = command.get_command(_context(command), name)
        if sub is not None:
            yield from _walk(f"{path} {name}", sub)


def _command_section(path: str, command: Command) -> list[str]:
    depth = min(path.count(" ") + 1, 4)
    out = ["", f"{'#' * (depth + 1)} `{path}`", ""]
    help_text = (command.help or command.short_help or "").strip()
    if help_text:
        out += [_first_paragraph(help_text), ""]
    pieces = ["[OPTIONS]"]
    for param in command.params:
        if param.param_type_name == "argument":
            name = (param.name or "").upper()
            pieces.append(name if param.required else f"[{name}]")
    if _subcommands(command):
        pieces.append("COMMAND [ARGS]...")
    out += ["```", f"{path} {' '.join(pieces)}", "```"]
    rows: list[str] = []
    for param in command.params:
        row = None if getattr(param, "hidden", False) else _param_row(param)
        if row is not None:
            rows.append(row)
    if rows:
        out += ["", "| argument / option | meaning | default |", "|---|---|---|"]
        out += rows
    names = _subcommands(command)
    if names:
        out += ["", "Commands: " + ", ".join(f"`{n}`" for n in names) + "."]
    return out


def _param_row(param: Any) -> str | None:
    if param.param_type_name == "option":
        if param.name == "help":
            return None
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        meaning = param.help or ""
        if param.required:
            meaning = f"(required) {meaning}".strip()
        default = _param_default(param)
    else:
        names = f"`{(param.name or '').upper()}`"
        meaning = getattr(param, "help", None) or ""
        if not param.required:
            meaning = f"(optional) {meaning}".strip()
        default = _param_default(param)
    meaning = meaning.replace("|", "\\|").replace("\n", " ")
    return f"| {names} | {meaning} | {default} |"


def _param_default(param: Any) -> str:
    value = param.default
    if value is None or callable(value) or param.required:
        return ""
    if isinstance(value, bool):
        if param.param_type_name == "option" and param.is_flag and not value:
            return ""
        return "true" if value else "false"
    if isinstance(value, list | tuple | str) and not value:
        return ""
    return f"`{value}`"


def _first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def main(argv: list[str]) -> int:
    targets = {ENV_EXAMPLE: render_env_example(), CLI_REFERENCE: render_cli_reference()}
    if "--check" in argv:
        stale = [p for p, text in targets.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"stale: {path.relative_to(REPO)}; run python -m scripts.reference")
        return 1 if stale else 0
    for path, text in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
