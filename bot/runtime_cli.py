"""`amux agent run` and `amux runtime plan|worker`: managed Agent turns without Feishu."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer

from bot import logs
from hub.cli import emit, env_of, fail, run
from hub.client import HubClient
from hub.contract import (
    MEMORY,
    SUCCEEDED,
    Execution,
    MemoryUse,
    Session,
    TurnResult,
    WatchResult,
)
from hub.errors import AmuxError, InvalidArgument
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import LaunchSite
from runtime_bridge.materializer import memory_cli_dir
from runtime_bridge.providers import ExecutableMissing, MemoryAttachment, build_plan
from runtime_bridge.worker import Worker, default_amux_executable

agent_app = typer.Typer(help="Run managed Agent turns through the Hub and a Runtime worker.")
runtime_app = typer.Typer(help="Runtime workers and launch plans.")

WATCH_SECONDS = 20


def memory_line(use: MemoryUse) -> str:
    """A turn's memory call as one progress line: what it did, to which document, at which
    revision (short)."""
    if use.op == "searched":
        return f"memory: searched {use.path or 'all documents'}"
    revision = use.revision or use.previous_revision
    return f"memory: {use.op} {use.path}" + (f" ({revision[:12]})" if revision else "")


async def follow(
    hub: HubClient, execution_id: str, quiet: bool, memory: list[MemoryUse] | None = None
) -> WatchResult:
    """Print progress to stderr until the turn finishes; return its final state. The turn's
    memory calls are appended to ``memory`` when given."""
    after = 0
    while True:
        answer = WatchResult.from_wire(
            await hub.call(
                "executions.watch",
                execution_id=execution_id,
                after=after,
                wait_seconds=WATCH_SECONDS,
            )
        )
        after = max(after, answer.last_seq)
        for event in answer.events:
            use = event.memory_use()
            if use is not None and memory is not None:
                memory.append(use)
            if quiet or (event.kind == MEMORY and use is None):
                continue
            if use is not None:
                typer.echo(memory_line(use), err=True)
                continue
            prefix = {"warning": "warning: ", "status": "status: "}.get(event.kind, "")
            typer.echo(f"{prefix}{event.text}", err=True)
        if answer.execution.finished:
            return answer


@agent_app.command("run")
def agent_run(
    ctx: typer.Context,
    prompt: str = typer.Argument(..., help="What to ask the Agent."),
    provider: str = typer.Option("claude", "--provider", help="claude, codex or pi."),
    session: str | None = typer.Option(None, "--session", help="Resume this amux session."),
    cwd: Path | None = typer.Option(None, "--cwd", help="Where the Agent works."),
    as_json: bool = typer.Option(False, "--json", help="Print the structured result."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
) -> None:
    """Run one Agent turn; progress on stderr, the answer on stdout."""
    env = env_of(ctx)
    # From the caller's directory: the Hub and the worker run elsewhere. Links are kept, so the
    # Agent works in the directory as the caller named it.
    workdir = os.path.abspath(cwd) if cwd else None
    memory: list[MemoryUse] = []

    async def work() -> tuple[Execution, str]:
        async with env.client() as hub:
            submitted = await hub.call(
                "executions.submit",
                provider=provider,
                prompt=prompt,
                session_id=session,
                cwd=workdir,
            )
            execution_id = Execution.from_wire(submitted["execution"]).id
            try:
                final = await follow(hub, execution_id, quiet or as_json, memory)
            except (KeyboardInterrupt, asyncio.CancelledError):
                with contextlib.suppress(AmuxError):
                    await hub.call("executions.cancel", execution_id=execution_id)
                raise
            return final.execution, Session.from_wire(submitted["session"]).id

    final, session_id = run(work())
    result = final.result or TurnResult()
    succeeded = final.state == SUCCEEDED
    if as_json:
        emit(
            {
                "execution_id": final.id,
                "session_id": session_id,
                "state": final.state,
                "text": result.text,
                "binding": result.binding,
                "warnings": list(result.warnings),
                "usage": dict(result.usage),
                "error": final.error,
                "memory": [use.to_wire() for use in memory],
            }
        )
    elif succeeded:
        typer.echo(result.text or "")
    if not succeeded:
        if not as_json:
            typer.echo(f"error: {final.state}: {final.error or 'no answer'}", err=True)
        raise typer.Exit(1)
    if not as_json:
        typer.echo(f"session: {session_id}", err=True)


@runtime_app.command("plan")
def runtime_plan(
    ctx: typer.Context,
    provider: str = typer.Option(..., "--provider", help="claude, codex, pi or another name."),
    session: str | None = typer.Option(None, "--session", help="Plan a resume of this session."),
    prompt: str = typer.Option("<prompt>", "--prompt", help="The prompt to show in the plan."),
) -> None:
    """Print the launch plan as JSON (secrets masked) without starting anything."""
    env = env_of(ctx)
    settings = RuntimeSettings()
    client_settings = env.client_settings()

    async def work() -> dict[str, Any]:
        warnings: list[str] = []
        async with env.client() as hub:
            described: dict[str, Any] | None = None
            if session is not None:
                described = await hub.call("sessions.get", session_id=session)
                if described["provider"] != provider:
                    raise InvalidArgument(f"session {session} runs {described['provider']}")
            binding: str | None = None
            if described is not None and described["memory"] != "pending":
                binding = described["binding"] if described["memory"] == "bound" else None
            else:
                # A fresh session, or one whose first turn has not started yet: its binding is
                # frozen at launch, so show what the Hub's current policy would freeze.
                owner = described["principal_id"] if described is not None else None
                try:
                    resolved = await hub.call("memory.binding.resolve", principal_id=owner)
                    binding = resolved["binding"]
                except AmuxError as error:
                    if error.code != "memory_disabled":
                        warnings.append(f"memory unavailable: {error.message}")
            if described is None:
                who = await hub.call("system.whoami")
                planned = Session(
                    id="<session>",
                    principal_id=str(who["principal"]["id"]),
                    provider=provider,
                    cwd=None,
                    origin=None,
                    native_id=None,
                    memory="pending",
                    binding=None,
                )
            else:
                planned = Session.from_wire(described)
        site = LaunchSite(
            settings,
            settings.work_dir or (client_settings.home / "runtime"),
            amux_home=client_settings.home,
        )
        run_dir = site.run_dir("<execution>")
        amux = settings.amux or default_amux_executable()
        memory = None
        if binding is not None:
            memory = MemoryAttachment(
                hub_url=client_settings.hub_url,
                credential="<delegated at launch>",
                binding=binding,
                mcp_argv=(amux, "mcp"),
                cli_dir=memory_cli_dir(run_dir),
            )
        # Who the Agent would run as: on a root worker, a uid of the Principal's own.
        identity = site.identity_of(planned, allocate=False)
        request = site.request(
            provider=provider,
            prompt=prompt,
            session=planned,
            execution_id="<execution>",
            memory=memory,
            base_env=dict(os.environ),
            own_home=site.sandboxed or identity is not None,
        )
        launch = dataclasses.replace(build_plan(request), run_as=identity)
        # The sandbox is shown as a worker would build it; what it binds is found on this host.
        try:
            launch = site.sandbox(launch, request, (), (amux,) if memory else ())
        except ExecutableMissing as error:
            warnings.append(f"sandbox not shown: {error.message}")
        plan = launch.to_json(mask_secrets=True)
        plan["warnings"] = warnings + list(plan["warnings"])
        return plan

    emit(run(work()))


@runtime_app.command("worker")
def runtime_worker(
    ctx: typer.Context,
    hub_url: str | None = typer.Option(None, "--hub", help="The Hub URL (default AMUX_HUB_URL)."),
) -> None:
    """Run a Runtime worker: claim Agent turns from the Hub and launch them (service token)."""
    env = env_of(ctx)
    client_settings = env.client_settings()
    url = hub_url or client_settings.hub_url
    token = client_settings.resolved_token()
    if not token:
        fail(InvalidArgument("a worker needs a service token in AMUX_TOKEN"))
    settings = RuntimeSettings()
    work_dir = settings.work_dir or Path(tempfile.gettempdir()) / f"amux-runtime-{os.getuid()}"
    logs.configure(logs.LogSettings(), secrets=[token])
    warning = settings.unsandboxed_warning()
    if warning is not None:
        logging.getLogger("amux.worker").warning(warning)

    async def work() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with HubClient(url, token, timeout=60) as hub:
            worker = Worker(hub, url, settings, work_dir, amux_home=client_settings.home)
            await worker.register()
            typer.echo(f"worker {settings.name} serving {url}", err=True)
            await worker.run_forever(stop)

    run(work())
    sys.stdout.write(json.dumps({"stopped": True}) + "\n")
