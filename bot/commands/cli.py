"""The ``amux`` command line: the composition root that builds settings and clients."""

from __future__ import annotations

import sys
from typing import Any

import typer
import typer.core
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsError

from bot.commands.feishu_cli import feishu_app
from bot.commands.runtime_cli import agent_app, runtime_app
from bot.config import FeishuSettings
from hub.cli import (
    CliEnv,
    JsonOutput,
    emit,
    fail,
    memory_app,
    principal_app,
    project_app,
    system_app,
    token_app,
    usage_app,
)
from hub.config import ClientSettings, HubSettings, invalid_settings, unparsable_setting
from hub.errors import AmuxError, InvalidArgument, Unavailable
from hub.schedule_cli import schedule_app, trigger_app

# Only what builds the command tree is imported above: every Agent launch may start `amux mcp`
# (when the worker's warm host is not up), and its first model request waits for it. The
# service, the worker and the Hub are imported by the commands that run them.

LOG_FORMATS = ("text", "json")
MAX_PORT = 65535


def settings_models() -> tuple[type[BaseSettings], ...]:
    """Every settings model a command may read from the environment."""
    from bot.service.logs import LogSettings
    from runtime_bridge.config import RuntimeSettings

    return (HubSettings, ClientSettings, RuntimeSettings, FeishuSettings, LogSettings)


# Exit status by the kind of error (hub.cli.EXIT_CODES); the CLI reference prints it too.
EXIT_STATUS_HELP = (
    "Exit status: 0 success; 1 a failure not listed here (invalid_argument among them); "
    "2 a usage error (an unknown option, a missing argument); 3 conflict (a stale "
    "--expected-revision); 4 not_found; 5 unauthenticated or forbidden; 6 unavailable (the Hub "
    "cannot be reached, or its storage refuses). A failure prints one line on stderr: "
    "error: CODE: MESSAGE."
)
# The output switch, told beside the exit status in --help and the CLI reference.
OUTPUT_HELP = (
    "Output: every command that prints a result prints text for people by default and JSON "
    "with --json (every field of the result; times as ISO 8601 UTC, e.g. "
    "2026-12-02T03:04:05Z; revisions whole). Notes and warnings go to stderr, so stdout stays "
    "the result alone. --json does not change failures: the same error: CODE: MESSAGE line on "
    "stderr and the same exit status."
)


READABLE_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": "BOOLEAN"}


def _value_label(param: Any, ctx: Any) -> str | None:
    """What an option or argument takes, as click names it (TEXT, INTEGER, [text|json]).

    typer labels each with its Python annotation (<bool>, <FileBinaryRead>); a flag takes nothing.
    """
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if param.metavar is not None:
        return str(param.metavar)
    described = param.type_descriptor
    inner = str(param.display_type(ctx)).removeprefix("<").removesuffix(">")
    if described.is_choice:
        return f"[{inner}]"
    if described.is_file:
        return "FILE"
    if described.is_path:
        return "PATH"
    many = inner.startswith("list[")
    if many:
        inner = inner.removeprefix("list[").removesuffix("]")
    label = READABLE_TYPES.get(inner, "VALUE")
    return f"{label}..." if many or param.nargs != 1 else label


typer.core.TyperOption.display_type_rich = _value_label  # type: ignore[method-assign,assignment]
typer.core.TyperArgument.display_type_rich = _value_label  # type: ignore[method-assign,assignment]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"amux {version('amux')}")
        raise typer.Exit()


app = typer.Typer(
    name="amux",
    help="amux: Feishu chats to managed coding Agents, with a shared long-term memory.",
    epilog=f"{EXIT_STATUS_HELP}\n\n{OUTPUT_HELP}",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(memory_app, name="memory")
app.add_typer(system_app, name="system")
app.add_typer(principal_app, name="principal")
app.add_typer(token_app, name="token")
app.add_typer(agent_app, name="agent")
app.add_typer(runtime_app, name="runtime")
app.add_typer(feishu_app, name="feishu")


@app.callback()
def root(
    ctx: typer.Context,
    _show_version: bool = typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        help="Print the amux version and exit.",
    ),
) -> None:
    ctx.obj = CliEnv(client_settings=ClientSettings, hub_settings=HubSettings)


@app.command("serve")
def serve(
    host: str | None = typer.Option(None, "--host", help="Listen address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="Listen port (default 8765)."),
    log_format: str | None = typer.Option(
        None, "--log-format", help="text or json (default: AMUX_LOG_FORMAT, else text)."
    ),
) -> None:
    """Run the Hub (and, when configured, the Feishu bot and a local worker process)."""
    from bot.service import logs

    # Checked before anything is made: a bad option must not leave an owner and a token behind.
    if log_format is not None and log_format not in LOG_FORMATS:
        fail(InvalidArgument(f"--log-format must be one of {', '.join(LOG_FORMATS)}"))
    if port is not None and not 0 <= port <= MAX_PORT:
        fail(InvalidArgument(f"--port must be a port number from 0 to {MAX_PORT}"))
    log_overrides: dict[str, object] = {} if log_format is None else {"format": log_format}
    try:
        log_settings = logs.LogSettings(**log_overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        fail(InvalidArgument(f"bad logging setting: {invalid_settings(error, 'AMUX_LOG_')}"))
    logs.configure(log_settings, secrets=_process_secrets())
    overrides: dict[str, object] = {}
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    settings = HubSettings(**overrides)  # type: ignore[arg-type]
    # Imported here: the service pulls in lark-oapi, which takes seconds to import, and every
    # other command (the CLI Agents run, `amux mcp`) must start quickly.
    from bot.service import serve as serving

    try:
        serving.run(settings)
    except AmuxError as error:
        fail(error)
    except OSError as error:
        # Not the listen error (serve names that one with its fix): a file or device failed.
        fail(Unavailable(f"amux serve stopped: {error.strerror or error}"))


def _process_secrets() -> list[str]:
    """Secret values this process may hold, so the log can never print them even by mistake."""
    from bot.feishu import saved_app

    feishu = FeishuSettings()
    values = [feishu.app_secret, feishu.encrypt_key, feishu.verification_token]
    try:
        saved = saved_app.load(HubSettings().home)
    except AmuxError:
        saved = None  # serve itself says what is wrong with the file
    if saved is not None:
        values.append(SecretStr(saved.app_secret))
    token = ClientSettings().token
    if token is not None:
        values.append(token)
    return [value.get_secret_value() for value in values]


@app.command("mcp")
def mcp() -> None:
    """Run the stdio MCP server Agents use for memory (configured by AMUX_* variables)."""
    from runtime_bridge.mcp_server import main as mcp_main

    mcp_main()


@app.command("doctor")
def doctor(as_json: JsonOutput = False) -> None:
    """Check the installation and say how to fix each failure; exits 1 if a check fails."""
    import asyncio

    from bot.commands import doctor as doctoring

    checks = asyncio.run(doctoring.diagnose())
    emit(doctoring.to_json(checks), as_json, lambda _: doctoring.render(checks))
    if not doctoring.passed(checks):
        raise typer.Exit(1)


app.add_typer(usage_app, name="usage")
app.add_typer(project_app, name="project")
app.add_typer(schedule_app, name="schedule")
app.add_typer(trigger_app, name="trigger")


def main() -> None:
    try:
        app(prog_name="amux")
    except ValidationError as err:
        # Settings are read from the environment when a command runs; name what is wrong.
        line = f"error: {InvalidArgument.code}: bad setting: {invalid_settings(err)}"
        typer.echo(line, err=True)
        sys.exit(1)
    except SettingsError as err:
        # A JSON setting that is not JSON fails before pydantic validates anything.
        line = f"error: {InvalidArgument.code}: {unparsable_setting(err, settings_models())}"
        typer.echo(line, err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
