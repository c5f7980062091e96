"""``amux schedule …`` and ``amux trigger …``: turns that start on a clock or a signed request.

Each goes through the Hub RPC with the caller's own credential; the rules (whose chat, who may
change what) are the Hub's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import typer

from hub.cli import JsonOutput, emit, env_of, fields_text, iso_time, note, run, table, with_client

schedule_app = typer.Typer(
    help="Schedules: an Agent turn on a clock (cron or one time), as you, into a chat.",
    no_args_is_help=True,
)
trigger_app = typer.Typer(
    help="Triggers: an Agent turn started by a signed HTTP request (a CI failure, an alert).",
    no_args_is_help=True,
)

ChatOption = typer.Option(
    None,
    "--chat",
    help="The chat its results go to (a chat id); default: your private chat with the bot. "
    "Only the owner names a group here.",
)
ProviderOption = typer.Option("claude", "--provider", help="The Agent it runs.")
NameOption = typer.Option("", "--name", help="What its cards call it (default: its prompt).")


def _call(ctx: typer.Context, method: str, **params: Any) -> dict[str, Any]:
    env = env_of(ctx)
    return run(with_client(env, lambda hub: hub.schedule_call(method, **params)))


def _moment(value: object) -> str:
    return iso_time(float(value)) if isinstance(value, int | float) else "-"


def _state(schedule: Mapping[str, Any]) -> str:
    paused = schedule.get("paused")
    return "active" if not paused else f"paused ({paused})"


def schedule_table(schedules: Sequence[Mapping[str, Any]]) -> str:
    if not schedules:
        return ""
    rows = [
        [
            str(s["id"]),
            str(s["name"]),
            str(s["spec"] or s["kind"]),
            str(s["time_zone"]),
            _state(s),
            _moment(s.get("next_run_at")),
            str(s.get("last_result") or "-"),
        ]
        for s in schedules
    ]
    return table(["ID", "NAME", "WHEN", "ZONE", "STATE", "NEXT RUN", "LAST RESULT"], rows)


def schedule_text(schedule: Mapping[str, Any]) -> str:
    shown = dict(schedule)
    for key in ("next_run_at", "last_run_at", "created_at"):
        shown[key] = _moment(shown.get(key))
    shown["state"] = _state(schedule)
    shown.pop("paused", None)
    return fields_text(shown)


@schedule_app.command("add")
def schedule_add(
    ctx: typer.Context,
    when: str = typer.Argument(
        ...,
        help="A cron expression ('0 9 * * 1-5': 09:00 on weekdays) or one time "
        "('2026-12-24 18:00'), read in --time-zone.",
    ),
    prompt: str = typer.Argument(..., help="What the Agent is asked each time."),
    chat: str | None = ChatOption,
    provider: str = ProviderOption,
    name: str = NameOption,
    time_zone: str | None = typer.Option(
        None, "--time-zone", help="An IANA zone (default: the Hub's schedules.time_zone)."
    ),
    overlap: str = typer.Option(
        "skip",
        "--overlap",
        help="skip: a run due while the last one still runs is skipped; queue: it waits.",
    ),
    as_json: JsonOutput = False,
) -> None:
    """Add a schedule: its runs are your turns (your budget, permissions and memory)."""
    added = _call(
        ctx,
        "schedules.add",
        when=when,
        prompt=prompt,
        chat_id=chat,
        provider=provider,
        name=name,
        time_zone=time_zone,
        overlap=overlap,
    )
    schedule = added["schedule"]
    emit(
        added,
        as_json,
        lambda _: (
            f"added schedule {schedule['id']}; next run {_moment(schedule.get('next_run_at'))}"
        ),
    )


@schedule_app.command("list")
def schedule_list(
    ctx: typer.Context,
    everyone: bool = typer.Option(False, "--all", help="Everyone's (the owner only)."),
    as_json: JsonOutput = False,
) -> None:
    """Your schedules and triggers."""
    listed = _call(ctx, "schedules.list", everyone=everyone)
    schedules = listed["schedules"]
    emit(listed, as_json, lambda _: schedule_table(schedules))
    if not as_json and not schedules:
        note("no schedules; add one with amux schedule add")


@schedule_app.command("show")
def schedule_show(
    ctx: typer.Context,
    schedule_id: str = typer.Argument(..., help="The schedule's id (amux schedule list)."),
    as_json: JsonOutput = False,
) -> None:
    """One schedule: its clock, state, next and last run."""
    shown = _call(ctx, "schedules.show", id=schedule_id)
    emit(shown, as_json, lambda s: schedule_text(s["schedule"]))


def _change(verb: str, method: str, past: str) -> None:
    @schedule_app.command(verb)
    def change(
        ctx: typer.Context,
        schedule_id: str = typer.Argument(..., help="The schedule's id (amux schedule list)."),
        as_json: JsonOutput = False,
    ) -> None:
        changed = _call(ctx, method, id=schedule_id)
        emit(changed, as_json, lambda c: f"{past} schedule {c['schedule']['id']}")

    change.__doc__ = {
        "pause": "Pause a schedule: it runs nothing until resumed.",
        "resume": "Resume a schedule from now on (what it missed while paused is not run).",
        "remove": "Remove a schedule or trigger (its creator or the owner).",
        "run": "Run a schedule once now, without moving its clock.",
    }[verb]


_change("pause", "schedules.pause", "paused")
_change("resume", "schedules.resume", "resumed")
_change("remove", "schedules.remove", "removed")
_change("run", "schedules.run", "asked a run of")


def _secret_told(created: Mapping[str, Any]) -> str:
    trigger = created["trigger"]
    return (
        f"trigger {trigger['id']}: POST /triggers/v1/{trigger['id']}\n"
        f"secret (shown this once): {created['secret']}"
    )


@trigger_app.command("add")
def trigger_add(
    ctx: typer.Context,
    prompt: str = typer.Argument(
        ..., help="What the Agent is asked; the request's body follows it as data."
    ),
    chat: str | None = ChatOption,
    provider: str = ProviderOption,
    name: str = NameOption,
    as_json: JsonOutput = False,
) -> None:
    """Add a trigger; its secret is printed once (sign each request's body with it)."""
    created = _call(ctx, "triggers.add", prompt=prompt, chat_id=chat, provider=provider, name=name)
    emit(created, as_json, _secret_told)


@trigger_app.command("list")
def trigger_list(ctx: typer.Context, as_json: JsonOutput = False) -> None:
    """Your triggers."""
    listed = _call(ctx, "schedules.list")
    triggers = [s for s in listed["schedules"] if s["kind"] == "trigger"]
    emit({"triggers": triggers}, as_json, lambda _: schedule_table(triggers))
    if not as_json and not triggers:
        note("no triggers; add one with amux trigger add")


@trigger_app.command("rotate")
def trigger_rotate(
    ctx: typer.Context,
    trigger_id: str = typer.Argument(..., help="The trigger's id (amux trigger list)."),
    as_json: JsonOutput = False,
) -> None:
    """Give a trigger a new secret; the old one stops working at once."""
    emit(_call(ctx, "triggers.rotate", id=trigger_id), as_json, _secret_told)


@trigger_app.command("remove")
def trigger_remove(
    ctx: typer.Context,
    trigger_id: str = typer.Argument(..., help="The trigger's id (amux trigger list)."),
    as_json: JsonOutput = False,
) -> None:
    """Remove a trigger: its requests are refused from now on."""
    removed = _call(ctx, "schedules.remove", id=trigger_id)
    emit(removed, as_json, lambda r: f"removed trigger {r['schedule']['id']}")
