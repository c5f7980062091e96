"""Operator commands of the Hub: ``amux memory|system|usage|principal|token …``.

Memory, system and usage commands go through the Hub RPC with the caller's credential; principal
and token commands are local administration on the Hub host and open its state database directly.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from hub.config import ClientSettings, HubSettings
from hub.contract import DEFAULT_DAYS, MAX_DAYS, USAGE_FIGURES, UsageReport
from hub.errors import (
    AmuxError,
    Conflict,
    Forbidden,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
)

# The HTTP client and the state database are imported by the commands that use them: every
# command loads this module, `amux mcp` and `amux --version` included, and those must start
# quickly.
if TYPE_CHECKING:
    from hub.aliases import IdField
    from hub.client import HubClient
    from hub.state import Credential, State

T = TypeVar("T")


@dataclass
class CliEnv:
    """What the CLI root hands to these commands; built once per invocation."""

    client_settings: Callable[[], ClientSettings]
    hub_settings: Callable[[], HubSettings]

    def client(self) -> HubClient:
        """Raises: Unavailable: this is an Agent launch whose memory is unavailable."""
        from hub.client import HubClient

        settings = self.client_settings()
        unavailable = settings.unavailable()
        if unavailable is not None:
            raise unavailable
        return HubClient(
            settings.hub_url,
            settings.resolved_token(),
            binding=settings.memory_binding,
            timeout=settings.timeout,
            via="cli",
        )


# The exit status of a failed command by the kind of its error, so a script can tell a conflict
# from a missing document from an unreachable Hub; the first class the error is an instance of
# wins. Anything unlisted (invalid_argument among them) exits 1; usage errors exit 2, as click does.
EXIT_CODES: tuple[tuple[type[AmuxError], int], ...] = (
    (Conflict, 3),
    (NotFound, 4),
    (Unauthenticated, 5),
    (Forbidden, 5),
    (Unavailable, 6),
)


def exit_code(error: AmuxError) -> int:
    """The exit status a command that failed with ``error`` ends with."""
    return next((code for kind, code in EXIT_CODES if isinstance(error, kind)), 1)


def fail(error: AmuxError) -> NoReturn:
    """Print one line naming the error code and exit with the status of its kind."""
    line = f"error: {error.code}: {error.message}"
    observed = error.details.get("observed_revision")
    if observed:
        line += f" (observed revision: {observed})"
    typer.echo(line, err=True)
    raise typer.Exit(exit_code(error))


def run(work: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(work)
    except AmuxError as error:
        fail(error)


# The one output switch every command shares: text for people by default, JSON for scripts.
JsonOutput = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the result as JSON (times in ISO 8601 UTC) instead of text; a failure is "
        "the same one line on stderr either way.",
    ),
]


def iso_time(moment: float) -> str:
    """A moment as ISO 8601 UTC, to the second: 2026-12-02T03:04:05Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def _is_moment(key: str, value: object) -> bool:
    named = key == "at" or key.endswith(("_at", "_until"))
    return named and isinstance(value, int | float) and not isinstance(value, bool)


def iso_times(value: Any) -> Any:
    """``value`` with every moment (``at``, ``*_at``, ``*_until``; epoch seconds as the Hub and
    the state database keep them) written as ISO 8601, so a script reads one time format."""
    if isinstance(value, Mapping):
        return {
            key: iso_time(item) if _is_moment(str(key), item) else iso_times(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [iso_times(item) for item in value]
    return value


def emit(value: T, as_json: bool, text: Callable[[T], str]) -> None:
    """Print a command's result: JSON with ``--json``, else the text ``text`` makes of it (nothing
    when it is empty). Anything else a command tells goes to stderr (``note``), so stdout is the
    result alone in both modes; a note that only restates the result is told in text mode only."""
    if as_json:
        typer.echo(json.dumps(iso_times(value), ensure_ascii=False, indent=2))
        return
    shown = text(value)
    if shown:
        typer.echo(shown)


def note(text: str) -> None:
    typer.echo(text, err=True)


def _value_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(_value_text(item) for item in value) or "-"
    return str(value)


def _flat(value: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, str]]:
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            yield from _flat(item, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", _value_text(item)


def fields_text(value: Mapping[str, Any]) -> str:
    """Nested fields as aligned ``name  value`` lines (nested names joined with dots)."""
    pairs = list(_flat(value))
    width = max((len(key) for key, _ in pairs), default=0)
    return "\n".join(f"{key:<{width}}  {item}".rstrip() for key, item in pairs)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Rows under headers in aligned columns, as ``kubectl get`` prints them."""
    cells = [list(headers), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def env_of(ctx: typer.Context) -> CliEnv:
    obj = ctx.find_root().obj
    assert isinstance(obj, CliEnv), "the CLI root must provide a CliEnv"
    return obj


async def with_client(env: CliEnv, work: Callable[[HubClient], Awaitable[T]]) -> T:
    async with env.client() as client:
        return await work(client)


# -- amux memory ----------------------------------------------------------------------------------

memory_app = typer.Typer(help="Search, read, write and forget memory documents in your scope.")


@memory_app.command("search")
def memory_search(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="Literal keywords separated by spaces."),
    path_prefix: str | None = typer.Option(None, "--path-prefix", help="Only under this path."),
    limit: int | None = typer.Option(None, "--limit", help="At most this many documents (1-20)."),
    as_json: JsonOutput = False,
) -> None:
    """Search documents for literal keywords: one line per match (path:line: snippet)."""
    env = env_of(ctx)
    found = run(with_client(env, lambda hub: hub.memory_search(query, path_prefix, limit)))
    emit(found, as_json, search_text)
    if as_json:
        return
    if not found["matches"]:
        note(f"no matches in {found.get('scanned_files', 0)} document(s)")
    if found.get("truncated") or found.get("incomplete"):
        note("more may match than shown: use more keywords, --path-prefix or --limit")


def search_text(found: Mapping[str, Any]) -> str:
    return "\n".join(
        f"{match['path']}:{match['line']}: {' '.join(str(match['snippet']).split())}"
        for match in found["matches"]
    )


@memory_app.command("show")
def memory_show(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Logical document path, e.g. topics/review-format.md."),
    start_line: int | None = typer.Option(None, "--start-line", help="First line (1-based)."),
    end_line: int | None = typer.Option(None, "--end-line", help="Last line (inclusive)."),
    offset: int | None = typer.Option(None, "--offset", help="Continue from a next_offset."),
    as_json: JsonOutput = False,
) -> None:
    """Read a bounded fragment of one document: the text on stdout, its revision (and where
    to continue, when cut short) on stderr."""
    env = env_of(ctx)
    shown = run(with_client(env, lambda hub: hub.memory_get(path, start_line, end_line, offset)))
    if as_json:
        emit(shown, as_json, str)
        return
    if not shown["exists"]:
        note(f"no document at {shown['path']} (revision: absent)")
        return
    note(f"revision: {shown['revision']}")
    # As stored, so `show > file` keeps the document's own line ends.
    sys.stdout.write(shown["content"])
    sys.stdout.flush()
    if shown.get("truncated") and shown.get("next_offset") is not None:
        note(f"cut short: continue with --offset {shown['next_offset']}")


@memory_app.command("upsert")
def memory_upsert(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Logical document path."),
    expected_revision: str = typer.Option(
        ..., "--expected-revision", help="The revision you read, or 'absent' to create."
    ),
    file: typer.FileBinaryRead | None = typer.Option(
        None, "--file", help="Read the Markdown from this file instead of stdin."
    ),
    allow_empty: bool = typer.Option(
        False, "--allow-empty", help="Write an empty document if the input is empty."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Replace the whole document (or create it) from raw UTF-8 Markdown."""
    env = env_of(ctx)
    source = file if file is not None else sys.stdin.buffer
    if file is None and sys.stdin.isatty():
        fail(InvalidArgument("pipe the document on stdin or pass --file"))
    try:
        content = source.read().decode("utf-8")
    except UnicodeDecodeError:
        fail(InvalidArgument("the document is not valid UTF-8"))
    # A CLI rule, not a memory one: memory.upsert takes any text, "" included (an Agent may
    # empty a document on purpose), but here empty input is nearly always a missing pipe or an
    # empty file, and replacing a document with nothing by accident must take a deliberate flag.
    if not content and not allow_empty:
        fail(
            InvalidArgument(
                "the input is empty; nothing was written (pass --allow-empty to write an empty "
                "document)"
            )
        )
    saved = run(with_client(env, lambda hub: hub.memory_upsert(path, content, expected_revision)))
    emit(saved, as_json, lambda done: f"saved {done['path']} revision {done['revision']}")


@memory_app.command("forget")
def memory_forget(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Logical document path."),
    expected_revision: str = typer.Option(
        ..., "--expected-revision", help="The revision you read."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Delete one document if it is still at the revision you read; a document that does not
    exist is said so on stderr (already_absent), and exits 0."""
    env = env_of(ctx)
    forgotten = run(with_client(env, lambda hub: hub.memory_forget(path, expected_revision)))
    emit(forgotten, as_json, lambda done: "" if done["already_absent"] else f"forgot {path}")
    if forgotten.get("already_absent"):
        note(f"{forgotten['path']} did not exist: nothing was forgotten")


def _when(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(moment))


def history_line(entry: Mapping[str, Any]) -> str:
    """One change of the log in one line: when, what, which revisions (whole, to paste into
    restore and --expected-revision), who and how."""
    previous = entry.get("previous_revision") or "absent"
    new = entry.get("new_revision") or "absent"
    line = (
        f"{_when(entry['at'])}  {entry['action']:<7} {entry['path']}  {previous} -> {new}  "
        f"{entry['size_bytes']} bytes  by {entry.get('principal') or entry['principal_id']}"
        f" via {entry['via']}"
    )
    if entry.get("session_id"):
        line += f"  session {entry['session_id']}"
    if entry.get("execution_id"):
        line += f"  execution {entry['execution_id']}"
    if entry.get("restorable_until"):
        line += f"  restorable until {_when(entry['restorable_until'])}"
    return line


@memory_app.command("history")
def memory_history(
    ctx: typer.Context,
    path: str | None = typer.Argument(None, help="Only this document's changes."),
    limit: int | None = typer.Option(None, "--limit", help="At most this many (1-200)."),
    before: int | None = typer.Option(None, "--before", help="Continue from a next_before."),
    as_json: JsonOutput = False,
) -> None:
    """Changes to your memory, newest first: who made them, how, and until when the previous
    body can be restored."""
    env = env_of(ctx)
    answer = run(with_client(env, lambda hub: hub.memory_history(path, limit, before)))
    emit(answer, as_json, lambda logged: "\n".join(map(history_line, logged["entries"])))
    if as_json:
        return
    if not answer["entries"]:
        note("no changes recorded")
    if answer.get("next_before"):
        note(f"more: --before {answer['next_before']}")


@memory_app.command("restore")
def memory_restore(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Logical document path."),
    revision: str = typer.Option(
        ...,
        "--revision",
        help="The kept revision to bring back: whole, or its first 12 or more hex digits.",
    ),
    expected_revision: str = typer.Option(
        ..., "--expected-revision", help="The document's current revision, or 'absent'."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Write a kept earlier revision back, if the document is still at the one you name."""
    env = env_of(ctx)
    restored = run(
        with_client(env, lambda hub: hub.memory_restore(path, revision, expected_revision))
    )
    emit(restored, as_json, lambda done: f"restored {done['path']} revision {done['revision']}")


def confirm_or_refuse(what: str, yes: bool) -> None:
    """Ask before destroying ``what`` on a terminal; off a terminal only ``--yes`` goes on.

    Raises:
        InvalidArgument: not on a terminal without ``--yes``, or the answer was no.
    """
    if yes:
        return
    if not sys.stdin.isatty():
        raise InvalidArgument(f"this erases {what} and nothing undoes it: pass --yes to erase it")
    if not typer.confirm(f"Erase {what}? Nothing undoes it.", default=False, err=True):
        raise InvalidArgument("nothing erased")


def receipt_text(receipt: Mapping[str, Any]) -> str:
    return (
        f"erased {receipt['documents_removed']} document(s) and "
        f"{receipt['history_copies_removed']} kept copy(ies); "
        f"{receipt['log_entries_redacted']} change log entry(ies) redacted"
    )


def print_receipt(receipt: dict[str, Any], as_json: bool) -> None:
    emit(receipt, as_json, receipt_text)
    for kept in receipt.get("kept") or []:
        note(f"kept: {kept['path']} ({kept['reason']})")
    note(str(receipt.get("not_erased", "")))


@memory_app.command("erase")
def memory_erase(
    ctx: typer.Context,
    path: str | None = typer.Argument(None, help="The document to erase with all its history."),
    everything: bool = typer.Option(
        False, "--all", help="Erase your whole memory scope and its history (forget me)."
    ),
    yes: bool = typer.Option(False, "--yes", help="With --all: erase without asking."),
    as_json: JsonOutput = False,
) -> None:
    """Remove a document, every kept copy of it, and its path from the change log; in shared
    memory, a document someone else changed too is kept and named.

    --all asks first on a terminal and needs --yes otherwise. A path with nothing to erase is
    an error (not_found)."""
    if (path is None) == (not everything):
        fail(InvalidArgument("name one document, or pass --all for your whole memory"))
    if everything:
        try:
            confirm_or_refuse("your whole memory and its history", yes)
        except AmuxError as error:
            fail(error)
    env = env_of(ctx)
    print_receipt(run(with_client(env, lambda hub: hub.memory_erase(path))), as_json)


async def export_document(hub: HubClient, path: str) -> str:
    """The whole document, read page by page at one revision.

    Raises:
        NotFound: there is no such document.
        Conflict: it changed between pages.
    """
    first = await hub.memory_get(path)
    if not first["exists"]:
        raise NotFound(f"no document at {path}", path=path)
    revision = first["revision"]
    pieces = [first["content"]]
    page = first
    while page["truncated"]:
        page = await hub.memory_get(path, offset=page["next_offset"])
        if page["revision"] != revision:
            raise Conflict(
                f"'{path}' changed during export; nothing was written, run it again",
                path=path,
                observed_revision=page["revision"],
            )
        pieces.append(page["content"])
    return "".join(pieces)


@memory_app.command("export")
def memory_export(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Logical document path."),
    as_json: JsonOutput = False,
) -> None:
    """Write one whole document to stdout, exactly as stored; nothing at all if it changes
    meanwhile."""
    env = env_of(ctx)
    text = run(with_client(env, lambda hub: export_document(hub, path)))
    if as_json:
        emit({"path": path, "content": text}, as_json, str)
        return
    sys.stdout.write(text)
    sys.stdout.flush()


# -- amux system ----------------------------------------------------------------------------------

system_app = typer.Typer(help="Hub-wide settings, restart and identity.")
config_app = typer.Typer(help="Saved and running Hub settings.")
system_app.add_typer(config_app, name="config")


@config_app.command("get")
def config_get(
    ctx: typer.Context,
    key: str | None = typer.Argument(None, help="One setting, or all."),
    as_json: JsonOutput = False,
) -> None:
    """Show each setting's running value, and its saved one while a restart is pending:
    key = value lines."""
    env = env_of(ctx)
    described = run(with_client(env, lambda hub: hub.config_get()))
    if key is not None:
        if key not in described:
            fail(InvalidArgument(f"unknown setting; known settings: {', '.join(described)}"))
        described = {key: described[key]}
    emit(described, as_json, config_text)


def config_text(described: Mapping[str, Mapping[str, Any]]) -> str:
    """``key = running value``, with what a restart would change it to or that it is live."""
    width = max((len(key) for key in described), default=0)
    lines = []
    for key, entry in described.items():
        line = f"{key:<{width}} = {_value_text(entry['running'])}"
        if entry.get("restart_pending"):
            line += f" (saved {_value_text(entry['saved'])}; applies after a restart)"
        elif entry.get("live"):
            line += " (live: no restart needed)"
        lines.append(line)
    return "\n".join(lines)


# What a change of a live setting reaches, as `config set` tells it.
LIVE_SCOPE = {
    "agents.permissions": "turns started from now on",
    "projects.worktree_days": "turns workers take from now on",
    "agents.approval_timeout": "permission requests made from now on",
    "agents.max_events_per_turn": "turns started from now on",
    "agents.max_event_bytes_per_turn": "turns started from now on",
    "schedules.min_interval_seconds": "schedules added from now on",
    "schedules.max_per_principal": "schedules added from now on",
    "schedules.grace_seconds": "runs due from now on",
    "schedules.time_zone": "schedules added from now on",
}


@config_app.command("set")
def config_set(
    ctx: typer.Context,
    key: str = typer.Argument(
        ..., help="A setting, e.g. memory.enabled; amux system config get lists them."
    ),
    value: str = typer.Argument(
        ..., help="true|false, on|off, a whole number, ask|auto|read-only, or a duration (10m)"
    ),
    as_json: JsonOutput = False,
) -> None:
    """Save a setting (owner only); it takes effect when the Hub restarts, except
    agents.permissions (ask|auto|read-only), agents.approval_timeout (90, 90s, 10m, 1h),
    agents.max_events_per_turn and agents.max_event_bytes_per_turn (4m), which apply to turns
    and requests started after the change."""
    env = env_of(ctx)
    result = run(with_client(env, lambda hub: hub.config_set(key, value)))
    emit(result, as_json, config_text)
    hidden = result.get("memory.isolation", {}).get("global_documents")
    if hidden is not None:
        typer.echo(
            f"warning: the global memory scope holds {hidden} document(s); with isolation on, "
            "each person has their own scope and existing global memory will not be visible "
            "in it. To keep a document, before restarting save it with `amux memory export "
            "PATH > FILE`; after the restart write it with `amux memory upsert PATH "
            "--expected-revision absent --file FILE` using the token of the person to keep it.",
            err=True,
        )
    if any(entry.get("restart_pending") for entry in result.values()):
        typer.echo("saved; restart the Hub to apply it: amux system restart", err=True)
    elif any(entry.get("live") for entry in result.values()):
        # A live setting: no restart pending, so say what it applies to instead.
        what = LIVE_SCOPE.get(key, "what starts from now on")
        typer.echo(f"saved; applies to {what}, no restart needed", err=True)


@system_app.command("restart")
def system_restart(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """Restart the Hub (owner only): no new Agent turns start, running ones get AMUX_DRAIN_SECONDS
    to finish and are then handed back to run again after the restart, in-flight requests drain."""
    env = env_of(ctx)
    restarting = run(with_client(env, lambda hub: hub.restart()))
    emit(restarting, as_json, lambda _: "the Hub is restarting: it drains, then starts again")


@system_app.command("capabilities")
def system_capabilities(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """What this Hub offers: memory state, limits, protocol version."""
    env = env_of(ctx)
    emit(run(with_client(env, lambda hub: hub.capabilities())), as_json, fields_text)


@system_app.command("whoami")
def system_whoami(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """The Principal your credential acts as and its memory scope."""
    env = env_of(ctx)
    emit(run(with_client(env, lambda hub: hub.whoami())), as_json, whoami_text)


def whoami_text(who: Mapping[str, Any]) -> str:
    principal, credential = who["principal"], who.get("credential") or {}
    return fields_text(
        {
            "principal": principal_label(principal),
            "id": principal["id"],
            "credential": f"{credential.get('id', '-')} ({credential.get('kind', '-')})",
            "memory scope": who.get("memory_scope"),
            "aliases": [alias_text(alias) for alias in who.get("aliases") or []],
        }
    )


def principal_label(principal: Mapping[str, Any]) -> str:
    """``alice (user)``, ``owner (user, owner)``, ``feishu-on_1a2b (user) "Alice Wang"``."""
    traits = [str(principal["kind"]), *(["owner"] if principal.get("owner") else [])]
    known_as = principal.get("display_name")
    shown = f' "{known_as}"' if known_as else ""
    return f"{principal['name']} ({', '.join(traits)}){shown}"


def alias_text(alias: Mapping[str, Any] | str) -> str:
    if isinstance(alias, Mapping):
        return f"{alias.get('kind')}={alias.get('value')}"
    return str(alias)


# -- amux usage -----------------------------------------------------------------------------------


usage_app = typer.Typer(
    help="Model tokens and requests the model gateway counted, and today's budget extensions.",
    invoke_without_command=True,
)


@usage_app.callback()
def usage(
    ctx: typer.Context,
    principal: str | None = typer.Option(
        None,
        "--principal",
        help="Only this Principal's, by name or id (the owner only, for anyone but yourself).",
    ),
    days: int = typer.Option(
        DEFAULT_DAYS, "--days", help=f"The last N UTC days, today included (1-{MAX_DAYS})."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Model tokens and requests the model gateway counted, per day, Principal and provider:
    yours, or for the owner everyone's."""
    if ctx.invoked_subcommand is not None:
        return
    env = env_of(ctx)
    report = run(with_client(env, lambda hub: hub.usage_report(principal, days)))
    emit(report.to_wire(), as_json, lambda _: usage_text(report))
    if not as_json and not report.rows:
        note(f"no model usage counted from {report.since} to {report.until}")


@usage_app.command("extend")
def usage_extend(
    ctx: typer.Context,
    principal: str = typer.Argument(..., help="The Principal, by name or id."),
    tokens: int = typer.Option(..., "--tokens", min=1, help="Tokens to add to today's budget."),
    as_json: JsonOutput = False,
) -> None:
    """Add tokens to a Principal's budget for today (UTC; the owner only): to its daily budget,
    or with none set, to the per-turn ceiling of its turns today."""
    env = env_of(ctx)
    extended = run(with_client(env, lambda hub: hub.usage_extend(principal, tokens)))
    emit(
        extended,
        as_json,
        lambda e: f"{principal}: {e['tokens']} tokens added to {e['day']} (UTC) in all",
    )


def usage_text(report: UsageReport) -> str:
    if not report.rows:
        return ""
    rows = [
        [
            row.day,
            row.principal,
            row.provider,
            str(row.input_tokens),
            str(row.output_tokens),
            str(row.requests),
            str(row.turns),
        ]
        for row in report.rows
    ]
    total = ["total", "", "", *(str(report.total(figure)) for figure in USAGE_FIGURES)]
    headers = ["DAY", "PRINCIPAL", "PROVIDER", "INPUT", "OUTPUT", "REQUESTS", "TURNS"]
    return table(headers, [*rows, total])


# -- amux project ---------------------------------------------------------------------------------

project_app = typer.Typer(
    help="Projects: git repositories Feishu chats are bound to (the owner only).",
    no_args_is_help=True,
)


@project_app.command("add")
def project_add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The project's name: a-z, 0-9 and -, up to 32."),
    path: str | None = typer.Option(
        None, "--path", help="The absolute path of a git repository on the worker's host."
    ),
    remote: str | None = typer.Option(
        None, "--remote", help="A git remote URL (no credentials in it) the worker clones once."
    ),
    credential_env: str | None = typer.Option(
        None,
        "--credential-env",
        help="The worker's environment variable holding the remote's token (never its value).",
    ),
    branch: str = typer.Option("main", "--branch", help="The default branch checkouts start from."),
    provider: str = typer.Option("claude", "--provider", help="The Agent its conversations run."),
    permissions: str | None = typer.Option(
        None,
        "--permissions",
        help="ask, auto or read-only for its conversations (default: agents.permissions).",
    ),
    as_json: JsonOutput = False,
) -> None:
    """Add a project (the owner only); the repository is checked before anything is saved."""
    if (path is None) == (remote is None):
        fail(InvalidArgument("give exactly one of --path and --remote"))
    env = env_of(ctx)
    added = run(
        with_client(
            env,
            lambda hub: hub.project_add(
                name,
                path=path,
                remote=remote,
                credential_env=credential_env,
                branch=branch,
                provider=provider,
                permissions=permissions,
            ),
        )
    )
    emit(added, as_json, lambda a: f"added project {a['project']['name']}")


@project_app.command("forge")
def project_forge(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The project's name."),
    kind: str = typer.Option(..., "--kind", help="github or gitlab."),
    base_url: str | None = typer.Option(
        None,
        "--base-url",
        help="The forge's API base URL (GitHub Enterprise: https://HOST/api/v3; "
        "self-hosted GitLab: https://HOST); default github.com's or gitlab.com's.",
    ),
    repo: str | None = typer.Option(
        None, "--repo", help="owner/name on the forge (default: the remote URL's path)."
    ),
    token_file: str = typer.Option(
        "-", "--token-file", help="A file holding the forge token; - (default) reads stdin."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Set where the project's pull requests are opened, and the token to open them with (the
    owner only); the token is kept by the Hub and never printed."""
    try:
        if token_file == "-":
            token = sys.stdin.readline()
        else:
            token = Path(token_file).read_text(encoding="utf-8")
    except OSError as error:
        fail(InvalidArgument(f"the token file cannot be read: {error.strerror}"))
    except UnicodeDecodeError:
        fail(InvalidArgument("the token file is not text"))
    env = env_of(ctx)
    set_ = run(
        with_client(
            env,
            lambda hub: hub.project_forge(
                name, kind=kind, token=token.strip(), base_url=base_url, repo=repo
            ),
        )
    )
    emit(
        set_,
        as_json,
        lambda f: (
            f"project {name} opens pull requests on {f['forge']['kind']} "
            f"{f['forge']['base_url']} ({f['forge']['repo']})"
        ),
    )


@project_app.command("list")
def project_list(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """The projects and how many chats each is bound to."""
    env = env_of(ctx)
    projects = run(with_client(env, lambda hub: hub.project_list()))
    emit({"projects": projects}, as_json, lambda _: project_table(projects))
    if not as_json and not projects:
        note("no projects; add one with amux project add")


def project_table(projects: Sequence[Mapping[str, Any]]) -> str:
    if not projects:
        return ""
    rows = [
        [
            str(p["name"]),
            str(p["kind"]),
            str(p["source"]),
            str(p["default_branch"]),
            str(p["provider"]),
            str(p.get("permissions") or "-"),
            str(len(p.get("chats") or [])),
        ]
        for p in projects
    ]
    headers = ["NAME", "KIND", "SOURCE", "BRANCH", "PROVIDER", "PERMISSIONS", "CHATS"]
    return table(headers, rows)


@project_app.command("show")
def project_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The project's name."),
    as_json: JsonOutput = False,
) -> None:
    """One project and the chats bound to it."""
    env = env_of(ctx)
    shown = run(with_client(env, lambda hub: hub.project_show(name)))
    emit(shown, as_json, project_text)


def project_text(shown: Mapping[str, Any]) -> str:
    project = dict(shown["project"])
    project.pop("principal_id", None)
    project["created_at"] = iso_time(float(project["created_at"]))
    chats = shown.get("chats") or []
    project["chats"] = ", ".join(str(c["chat_id"]) for c in chats) or "none"
    return fields_text(project)


@project_app.command("remove")
def project_remove(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The project's name."),
    as_json: JsonOutput = False,
) -> None:
    """Remove a project no chat is bound to (unbind its chats first). Its branches stay in its
    repository and its memory with its service Principal."""
    env = env_of(ctx)
    removed = run(with_client(env, lambda hub: hub.project_remove(name)))
    emit(removed, as_json, lambda r: f"removed project {r['project']['name']}")


# -- amux principal / amux token (local administration) -------------------------------------------

principal_app = typer.Typer(help="Principals on this Hub host (local administration).")
token_app = typer.Typer(help="CLI credentials on this Hub host (local administration).")


def open_state(ctx: typer.Context) -> State:
    """The Hub's state database, opened directly.

    Raises:
        NotFound: AMUX_HOME holds no state database; none is made, since no Hub would read it.
    """
    settings = env_of(ctx).hub_settings()
    if not settings.state_path.is_file():
        unset = "" if "home" in settings.model_fields_set else ", the default: AMUX_HOME is unset"
        raise NotFound(
            f"no Hub state in AMUX_HOME {settings.home} (no {settings.state_path.name}{unset}); "
            "run this on the Hub's host with AMUX_HOME set to the home `amux serve` uses"
        )
    from hub.state import State

    return State(settings.state_path)


def local(ctx: typer.Context, work: Callable[[State], T]) -> T:
    try:
        state = open_state(ctx)
    except AmuxError as error:
        # A state database written by a newer amux is refused in one line, like any other error.
        fail(error)
    try:
        return work(state)
    except AmuxError as error:
        fail(error)
    finally:
        state.close()


@principal_app.command("add")
def principal_add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A short unique name."),
    owner: bool = typer.Option(False, "--owner", help="May change settings and restart."),
    service: bool = typer.Option(False, "--service", help="A service (Runtime) principal."),
    as_json: JsonOutput = False,
) -> None:
    """Create a Principal."""
    kind = "service" if service else "user"
    principal = local(ctx, lambda state: state.add_principal(name, kind, owner))
    emit(
        principal.to_wire(),
        as_json,
        lambda added: f"added principal {principal_label(added)} id {added['id']}",
    )


ALIAS_FIELDS: dict[IdField, str] = {
    "union_id": "--feishu-union-id",
    "user_id": "--feishu-user-id",
    "open_id": "--feishu-open-id",
}


@principal_app.command("alias")
def principal_alias(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The Principal these outside identities belong to."),
    feishu_union_id: str | None = typer.Option(
        None, "--feishu-union-id", help="A union_id: one per person for all apps of a developer."
    ),
    feishu_user_id: str | None = typer.Option(
        None, "--feishu-user-id", help="A user_id of the bot's own tenant."
    ),
    feishu_open_id: str | None = typer.Option(
        None, "--feishu-open-id", help="An open_id for the bot's own app."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Map outside identities (Feishu ids) to one Principal."""
    given: dict[IdField, str | None] = {
        "union_id": feishu_union_id,
        "user_id": feishu_user_id,
        "open_id": feishu_open_id,
    }
    ids = [(field, value) for field, value in given.items() if value]
    if not ids:
        fail(InvalidArgument(f"name at least one of {', '.join(ALIAS_FIELDS.values())}"))

    from hub.aliases import alias_kind, recorded_app

    def add(state: State) -> dict[str, Any]:
        principal = state.principal_by_name(name)
        app = recorded_app(state)
        if app is None and any(field != "union_id" for field, _ in ids):
            typer.echo(
                "the Feishu app's tenant is not known yet: the user_id and open_id wait until "
                "amux serve learns it",
                err=True,
            )
        with state.transaction():
            for field, value in ids:
                state.add_alias(principal.id, alias_kind(field, app), value)
        return describe_principal(state, principal.id)

    emit(local(ctx, add), as_json, principal_text)


def describe_principal(state: State, principal_id: str) -> dict[str, Any]:
    principal = state.principal(principal_id)
    if principal is None:
        raise NotFound("no such principal")
    names = {principal.id: principal.name}
    return {
        **principal.to_wire(),
        "aliases": [{"kind": k, "value": v} for k, v in state.aliases(principal_id)],
        "credentials": [credential_wire(c, names) for c in state.credentials(principal_id)],
    }


def principal_text(described: Mapping[str, Any]) -> str:
    head = fields_text(
        {
            "principal": principal_label(described),
            "id": described["id"],
            "aliases": [alias_text(alias) for alias in described["aliases"]],
        }
    )
    if not described["credentials"]:
        return f"{head}\ntokens     -"
    return f"{head}\n\n{tokens_text(described['credentials'])}"


@principal_app.command("show")
def principal_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The Principal's name."),
    as_json: JsonOutput = False,
) -> None:
    """A Principal with its aliases and credentials (never their secrets)."""
    described = local(
        ctx, lambda state: describe_principal(state, state.principal_by_name(name).id)
    )
    emit(described, as_json, principal_text)


@principal_app.command("erase")
def principal_erase(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The Principal whose memory goes."),
    yes: bool = typer.Option(False, "--yes", help="Erase without asking."),
    as_json: JsonOutput = False,
) -> None:
    """Erase everything a Principal wrote to memory, with its history (owner, on the Hub host).

    Asks first on a terminal and needs --yes otherwise."""
    principal = local(ctx, lambda state: state.principal_by_name(name))
    try:
        confirm_or_refuse(f"everything '{principal.name}' wrote to memory, with its history", yes)
    except AmuxError as error:
        fail(error)
    env = env_of(ctx)
    receipt = run(with_client(env, lambda hub: hub.memory_erase_principal(principal.id)))
    print_receipt(receipt, as_json)


@principal_app.command("list")
def principal_list(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """List Principals: name, kind, whether an owner, and id."""
    listed = local(ctx, lambda state: [p.to_wire() for p in state.principals()])
    rows = ([p["name"], p["kind"], "yes" if p["owner"] else "no", p["id"]] for p in listed)
    emit(listed, as_json, lambda _: table(["NAME", "KIND", "OWNER", "ID"], rows))


def credential_wire(credential: Credential, names: Mapping[str, str]) -> dict[str, Any]:
    """A credential as the admin commands print it: whose it is by name, and when it was
    revoked besides whether."""
    return {
        **credential.to_wire(),
        "principal": names.get(credential.principal_id, credential.principal_id),
        "revoked_at": credential.revoked_at,
    }


def _status(credential: Mapping[str, Any]) -> str:
    if credential["revoked"]:
        return "revoked"
    expires = credential.get("expires_at")
    return "expired" if expires is not None and expires <= time.time() else "active"


def tokens_text(credentials: Sequence[Mapping[str, Any]]) -> str:
    rows = (
        [
            c["id"],
            c["principal"],
            c["kind"],
            c["label"] or "-",
            _when(c["created_at"]),
            _when(c["expires_at"]) if c.get("expires_at") is not None else "never",
            _status(c),
        ]
        for c in credentials
    )
    return table(["ID", "PRINCIPAL", "KIND", "LABEL", "CREATED", "EXPIRES", "STATUS"], rows)


@token_app.command("issue")
def token_issue(
    ctx: typer.Context,
    name: str | None = typer.Argument(
        None, help="The Principal the token acts as (with --owner-file: the local owner's)."
    ),
    label: str = typer.Option("", "--label", help="A note to recognise the token by."),
    owner_file: bool = typer.Option(
        False,
        "--owner-file",
        help="Write the token to $AMUX_HOME/owner.token (mode 0600) instead of printing it: "
        "a fresh local owner token when the old one is lost or revoked.",
    ),
    as_json: JsonOutput = False,
) -> None:
    """Issue a CLI token: only the token on stdout (--json: with its id), shown once and stored
    only as a hash."""
    from hub.services import LOCAL_OWNER_NAME, write_owner_token

    if name is None and not owner_file:
        fail(InvalidArgument("name the Principal the token acts as"))
    who = name or LOCAL_OWNER_NAME

    def issue(state: State) -> tuple[str, dict[str, Any]]:
        principal = state.principal_by_name(who)
        if owner_file and not principal.is_owner:
            raise InvalidArgument(f"'{who}' is not an owner; owner.token holds an owner's token")
        said = label or ("local owner" if owner_file else "")
        token, credential = state.issue_credential(principal.id, "cli", label=said)
        return token, credential_wire(credential, {principal.id: principal.name})

    token, credential = local(ctx, issue)
    if not owner_file:
        note(f"token id {credential['id']} for {who} (shown once, keep it secret):")
        emit({**credential, "token": token}, as_json, lambda issued: str(issued["token"]))
        return
    home = env_of(ctx).hub_settings().home
    try:
        path = write_owner_token(home, token)
    except OSError as error:
        # Nobody can hold a token that was never written: it must not stay valid.
        local(ctx, lambda state: state.revoke_credential(credential["id"]))
        fail(InvalidArgument(f"cannot write {home}/owner.token: {error.strerror}"))
    note(f"token id {credential['id']} for {who} written to {path}")
    emit({**credential, "path": str(path)}, as_json, lambda _: "")


def in_use(ctx: typer.Context, state: State) -> tuple[str | None, bool]:
    """The id of the credential this CLI acts with, and whether it came from owner.token."""
    settings = env_of(ctx).client_settings()
    token = settings.resolved_token()
    found = state.credential_by_token(token) if token else None
    from_file = settings.token is None or not settings.token.get_secret_value()
    return (found[0].id if found else None), from_file


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context,
    token_id: str = typer.Argument(..., help="The token id to revoke."),
    yes: bool = typer.Option(
        False, "--yes", help="Revoke it even if it is the token this CLI is using, unasked."
    ),
    as_json: JsonOutput = False,
) -> None:
    """Revoke a token by id; it stops working immediately.

    Revoking the token this CLI is using asks first on a terminal and needs --yes otherwise. A
    token already revoked is left as it is, said so on stderr, and exits 0.
    """

    from hub.state import no_such_credential

    def revoke(state: State) -> tuple[dict[str, Any], str | None]:
        """The credential, and what to tell: that it was revoked before, or how to get another
        when it was this CLI's own."""
        known = next((c for c in state.credentials() if c.id == token_id), None)
        if known is None:
            raise no_such_credential(token_id)
        names = {p.id: p.name for p in state.principals()}
        if known.revoked_at is not None:
            return credential_wire(known, names), f"token {token_id} is already revoked"
        used, from_file = in_use(ctx, state)
        if used != token_id:
            return credential_wire(state.revoke_credential(token_id), names), None
        if not yes:
            said = f"token {token_id} is the one this CLI is using; once revoked it is refused"
            if not sys.stdin.isatty():
                raise InvalidArgument(f"{said}: pass --yes to revoke it anyway")
            if not typer.confirm(f"{said}. Revoke it?", default=False, err=True):
                raise InvalidArgument("not revoked")
        fix = (
            "`amux token issue --owner-file` on the Hub's host writes a fresh owner token"
            if from_file
            else "set AMUX_TOKEN to another token (`amux token issue <principal>`)"
        )
        revoked = credential_wire(state.revoke_credential(token_id), names)
        return revoked, f"this CLI's token is revoked: {fix}"

    revoked, told = local(ctx, revoke)
    already = told is not None and told.endswith("already revoked")
    emit(revoked, as_json, lambda done: "" if already else f"revoked token {done['id']}")
    if told is not None:
        note(told)


@token_app.command("list")
def token_list(
    ctx: typer.Context,
    name: str | None = typer.Argument(None, help="Only this Principal's."),
    as_json: JsonOutput = False,
) -> None:
    """List tokens (never their secrets): id, whose, kind, label, when made and until when."""

    def listing(state: State) -> list[dict[str, Any]]:
        principal_id = state.principal_by_name(name).id if name else None
        names = {p.id: p.name for p in state.principals()}
        return [credential_wire(c, names) for c in state.credentials(principal_id)]

    emit(local(ctx, listing), as_json, tokens_text)
