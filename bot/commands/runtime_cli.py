"""`amux agent run` and `amux runtime plan|worker`: managed Agent turns without Feishu."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hub.cli import JsonOutput, emit, env_of, fail, note, run
from hub.contract import (
    ALLOW_ONCE,
    ALLOW_SESSION,
    APPROVAL,
    DENY,
    EGRESS,
    MEMORY,
    STATUS,
    SUCCEEDED,
    WARNING,
    Approval,
    Execution,
    ExecutionEvent,
    MemoryUse,
    Session,
    TurnResult,
    WatchResult,
    visible,
)
from hub.errors import AmuxError, Conflict, InvalidArgument

# The worker, the launch and the service's logging are imported by the commands that use them:
# the CLI's root loads this module for every command, `amux mcp` included, whose start an
# Agent's first model request waits for.
if TYPE_CHECKING:
    from hub.client import HubClient
    from hub.config import ClientSettings
    from runtime_bridge.config import RuntimeSettings
    from runtime_bridge.launch import LaunchSite
    from runtime_bridge.providers import LaunchRequest

agent_app = typer.Typer(help="Run managed Agent turns through the Hub and a Runtime worker.")
runtime_app = typer.Typer(help="Runtime workers and launch plans.")

WATCH_SECONDS = 20


def memory_line(use: MemoryUse) -> str:
    """A turn's memory call as one progress line: what it did, to which document, at which
    revision (whole, to paste into --expected-revision or restore)."""
    if use.op == "searched":
        return f"memory: searched {use.path or 'all documents'}"
    revision = use.revision or use.previous_revision
    return f"memory: {use.op} {use.path}" + (f" (revision {revision})" if revision else "")


APPROVE_CHOICES = {"once": ALLOW_ONCE, "session": ALLOW_SESSION, "deny": DENY}
NO_TERMINAL = "no terminal to ask; rerun with --approve once|session|deny"
_VERBS = {"command": "run", "edit": "edit", "tool": "use"}


def asked_line(approval: Approval) -> str:
    """What a permission request asks, whole, on one line: its line breaks and tabs written as
    ``\\n`` and ``\\t``, its controls escaped (see ``visible``), so the record of what was
    allowed is every character that ran."""
    subject = visible(approval.subject).replace("\n", "\\n").replace("\t", "\\t")
    verb = _VERBS.get(approval.action, visible(approval.action))
    return f"{visible(approval.tool)} wants to {verb} {subject}".rstrip()


def settled_line(approval: Approval, how: str = "") -> str:
    """A settled request as one progress line: what was asked, what was answered, by whom."""
    said = f"permission: {asked_line(approval)}: {visible(approval.message())}"
    return f"{said} ({how})" if how else said


def prompt_text(approval: Approval) -> str:
    """The terminal prompt for one request: the tool, the whole command or path, the whole
    detail (an edit's diff or new content, a tool's input: a person allows all of it or none),
    and the three answers. Whatever could move the cursor or reorder text (ESC, CR, a
    bidi override) is shown as an escape: a command cannot redraw itself as another."""
    verb = _VERBS.get(approval.action, "use")
    lines = [f"permission request: {visible(approval.tool)} wants to {verb}:"]
    lines += [f"  {line}" for line in visible(approval.subject).split("\n")]
    detail = visible(approval.detail).strip("\n")
    if detail:
        lines += [f"  | {line}" for line in detail.split("\n")]
    lines.append("allow? [o]nce, [s]ession (this conversation), [d]eny: ")
    return "\n".join(lines)


def parse_answer(text: str) -> str | None:
    """A typed answer as a decision; None for anything else (the prompt asks again)."""
    word = text.strip().lower()
    for decision, answers in (
        (ALLOW_ONCE, ("o", "once")),
        (ALLOW_SESSION, ("s", "session")),
        (DENY, ("d", "deny")),
    ):
        if word in answers:
            return decision
    return None


class Terminal:
    """Reads one answer at a time from a terminal on stdin, without blocking the event loop:
    the turn is watched (and the Hub sees the caller) while the person thinks."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def ask(self, text: str) -> str:
        """Show ``text`` and return the decision typed; end of input or Ctrl-C deny."""
        typer.echo(text, err=True, nl=False)
        while True:
            line = await self._read_line()
            if line is None:
                typer.echo("", err=True)
                return DENY
            decision = parse_answer(line)
            if decision is not None:
                return decision
            typer.echo("answer o (once), s (session) or d (deny): ", err=True, nl=False)

    async def _read_line(self) -> str | None:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[str | None] = loop.create_future()

        def settle(line: str | None) -> None:
            if not answered.done():
                answered.set_result(line)

        def readable() -> None:
            try:
                data = os.read(self._fd, 4096)
            except OSError:
                data = b""
            settle(data.decode(errors="replace") if data else None)

        def interrupted(signum: int, frame: object) -> None:
            # Ctrl-C at the prompt denies this request; the turn goes on and hears why.
            loop.call_soon_threadsafe(settle, None)

        previous = signal.getsignal(signal.SIGINT)
        loop.add_reader(self._fd, readable)
        signal.signal(signal.SIGINT, interrupted)
        try:
            return await answered
        finally:
            signal.signal(signal.SIGINT, previous)
            loop.remove_reader(self._fd)


class ApprovalDesk:
    """Answers a turn's permission requests as the caller chose: by ``--approve``, on the
    terminal, or (with neither) by denying them; keeps each request's latest state."""

    def __init__(
        self,
        hub: HubClient,
        approve: str | None,
        terminal: Terminal | None,
        quiet: bool,
    ) -> None:
        self._hub = hub
        self._approve = approve
        self._terminal = terminal
        self._quiet = quiet
        self.requests: dict[str, Approval] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Requests whose answer from here is on its way or given: their settled events are told
        # by the answer's own line, which says how it was given.
        self._answering: set[str] = set()
        # Prompts on the terminal, so a request settled elsewhere stops being asked.
        self._asking: dict[str, asyncio.Task[str]] = {}
        self._prompting = asyncio.Lock()

    def seen(self, approval: Approval) -> None:
        known = self.requests.get(approval.request_id)
        if known is not None and not known.pending:
            return
        self.requests[approval.request_id] = approval
        if approval.pending:
            if known is None:
                self._tasks.append(asyncio.create_task(self._answer(approval)))
            return
        asking = self._asking.pop(approval.request_id, None)
        if asking is not None:
            # Settled elsewhere (its timeout, the owner) while asked here: stop asking.
            asking.cancel()
            typer.echo("", err=True)
        if approval.request_id not in self._answering and not self._quiet:
            typer.echo(settled_line(approval), err=True)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _answer(self, approval: Approval) -> None:
        request_id = approval.request_id
        reason: str | None = None
        if self._approve is not None:
            decision, how = APPROVE_CHOICES[self._approve], f"--approve {self._approve}"
        elif self._terminal is not None:
            async with self._prompting:
                if not self.requests[request_id].pending:
                    return
                asking = asyncio.create_task(self._terminal.ask(prompt_text(approval)))
                self._asking[request_id] = asking
                try:
                    decision = await asking
                except asyncio.CancelledError:
                    if asking.cancelled() and not self.requests[request_id].pending:
                        return
                    raise
                finally:
                    self._asking.pop(request_id, None)
            how = "answered here"
        else:
            # The denial's reason says it all: no "how" after it.
            decision, how, reason = DENY, "", NO_TERMINAL
        self._answering.add(request_id)
        try:
            answered = await self._hub.approve(
                approval.execution_id, request_id, decision, reason=reason
            )
        except AmuxError as error:
            self._answering.discard(request_id)
            settled = self.requests[request_id]
            if isinstance(error, Conflict):
                # Answered meanwhile by someone else or its timeout: told as its event is.
                if not settled.pending and not self._quiet:
                    typer.echo(settled_line(settled), err=True)
                return
            typer.echo(
                f"warning: cannot answer the request of {visible(approval.tool)}: "
                f"{error.code}: {error.message}",
                err=True,
            )
            return
        self.requests[request_id] = answered
        # A denial for want of a terminal is told even with --quiet or --json: it says how to
        # let the Agent do what it asked.
        if not self._quiet or reason == NO_TERMINAL:
            typer.echo(settled_line(answered, how), err=True)


async def follow(
    hub: HubClient,
    execution_id: str,
    quiet: bool,
    memory: list[MemoryUse] | None = None,
    desk: ApprovalDesk | None = None,
) -> WatchResult:
    """Print progress to stderr until the turn finishes; return its final state. The turn's
    memory calls are appended to ``memory`` when given; its permission requests go to
    ``desk``, which answers them."""
    after = 0
    try:
        while True:
            answer = await hub.watch(execution_id, after, WATCH_SECONDS)
            after = max(after, answer.last_seq)
            for event in answer.events:
                if event.kind == APPROVAL:
                    approval = event.approval()
                    if approval is not None and desk is not None:
                        desk.seen(approval)
                    continue
                use = event.memory_use()
                if use is not None and memory is not None:
                    memory.append(use)
                if quiet or (event.kind == MEMORY and use is None):
                    continue
                if use is not None:
                    typer.echo(memory_line(use), err=True)
                    continue
                shown = _plan_or_step(event)
                if shown is not None:
                    typer.echo(shown, err=True)
                    continue
                prefix = {WARNING: "warning: ", STATUS: "status: ", EGRESS: "network: "}.get(
                    event.kind, ""
                )
                typer.echo(f"{prefix}{event.text}", err=True)
            if answer.execution.finished:
                return answer
    finally:
        if desk is not None:
            await desk.close()


PLAN_MARKS = {"completed": "[x]", "in_progress": "[>]", "pending": "[ ]"}


def _plan_or_step(event: ExecutionEvent) -> str | None:
    """A plan or step event as a line of the run's progress; None for any other event."""
    steps = event.plan_steps()
    if steps is not None:
        return "plan: " + "; ".join(f"{PLAN_MARKS.get(s, '[ ]')} {t}" for t, s in steps)
    step = event.tool_step()
    if step is not None:
        return f"{step[0]}: {step[1]}"
    return None


@agent_app.command("run")
def agent_run(
    ctx: typer.Context,
    prompt: str = typer.Argument(..., help="What to ask the Agent."),
    provider: str = typer.Option("claude", "--provider", help="claude, codex or pi."),
    session: str | None = typer.Option(None, "--session", help="Resume this amux session."),
    cwd: Path | None = typer.Option(
        None, "--cwd", help="Where the Agent works: an existing directory, never created."
    ),
    as_json: JsonOutput = False,
    quiet: bool = typer.Option(False, "--quiet", help="No progress on stderr."),
    approve: str | None = typer.Option(
        None,
        "--approve",
        help="Answer every permission request of the turn so: once, session or deny "
        "(default: ask on the terminal; without one, deny).",
    ),
) -> None:
    """Run one Agent turn; progress on stderr, the answer on stdout. When the Agent asks
    permission (under agents.permissions ask), --approve answers; else a terminal on stdin is
    asked (o once, s session, d deny; end of input or Ctrl-C denies), shown the whole command
    and the whole diff or input with control characters as escapes such as \\x1b; else the
    request is denied, saying so on stderr. --json prints the structured result instead of the
    answer, each request's final state under approvals."""
    env = env_of(ctx)
    if approve is not None and approve not in APPROVE_CHOICES:
        fail(InvalidArgument(f"--approve must be one of {', '.join(APPROVE_CHOICES)}"))
    # From the caller's directory: the Hub and the worker run elsewhere. Links are kept, so the
    # Agent works in the directory as the caller named it.
    workdir = os.path.abspath(cwd) if cwd else None
    if workdir is not None and not os.path.isdir(workdir):
        problem = "is not a directory" if os.path.exists(workdir) else "does not exist"
        fail(InvalidArgument(f"--cwd {workdir} {problem}; name an existing directory"))
    memory: list[MemoryUse] = []
    terminal = Terminal(sys.stdin.fileno()) if approve is None and _stdin_is_terminal() else None
    requests: dict[str, Approval] = {}

    async def work() -> tuple[Execution, str]:
        async with env.client() as hub:
            submitted = await hub.submit(provider, prompt, session_id=session, cwd=workdir)
            execution_id = submitted.execution.id
            desk = ApprovalDesk(hub, approve, terminal, quiet or as_json)
            try:
                final = await follow(hub, execution_id, quiet or as_json, memory, desk)
            except (KeyboardInterrupt, asyncio.CancelledError):
                with contextlib.suppress(AmuxError):
                    await hub.cancel(execution_id)
                raise
            finally:
                requests.update(desk.requests)
            return final.execution, submitted.session.id

    final, session_id = run(work())
    result = final.result or TurnResult()
    succeeded = final.state == SUCCEEDED
    outcome: dict[str, Any] = {
        "execution_id": final.id,
        "session_id": session_id,
        "state": final.state,
        "text": result.text,
        "binding": result.binding,
        "warnings": list(result.warnings),
        "usage": dict(result.usage),
        "error": final.error,
        "memory": [use.to_wire() for use in memory],
        "approvals": [approval.to_wire() for approval in requests.values()],
    }
    if result.budget_reached:
        outcome["budget_reached"] = True
    if as_json:
        emit(outcome, as_json, str)
    elif succeeded:
        typer.echo(result.text or "")
    if not succeeded:
        # The same line with --json or without, as every failed command prints.
        note(f"error: {final.state}: {final.error or 'no answer'}")
        raise typer.Exit(1)
    if not as_json:
        note(f"session: {session_id}")


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and os.isatty(sys.stdin.fileno())
    except (OSError, ValueError):
        return False


@runtime_app.command("plan")
def runtime_plan(
    ctx: typer.Context,
    provider: str = typer.Option(..., "--provider", help="claude, codex, pi or another name."),
    session: str | None = typer.Option(None, "--session", help="Plan a resume of this session."),
    prompt: str = typer.Option("<prompt>", "--prompt", help="The prompt to show in the plan."),
    as_json: JsonOutput = False,
) -> None:
    """Print the launch plan (secrets masked) without starting anything: the command, its
    environment, working directory and files."""
    from runtime_bridge.config import RuntimeSettings

    env = env_of(ctx)
    settings = RuntimeSettings()
    client_settings = env.client_settings()

    async def work() -> dict[str, Any]:
        warnings: list[str] = []
        async with env.client() as hub:
            described = await _described_session(hub, session, provider)
            binding = await _binding_to_freeze(hub, described, warnings)
            permissions = await _next_permissions(hub)
            planned = described or await _fresh_session(hub, provider)
        site, request, identity = _launch_request(
            settings, client_settings, planned, provider, prompt, binding, permissions
        )
        return _shown_plan(site, request, identity, settings, warnings)

    plan = run(work())
    emit(plan, as_json, plan_text)
    if not as_json:
        for warning in plan.get("warnings") or []:
            note(f"warning: {warning}")


async def _described_session(hub: HubClient, session: str | None, provider: str) -> Session | None:
    """The session a resume would continue, checked to run ``provider``; None for a new one."""
    if session is None:
        return None
    described = await hub.session(session)
    if described.provider != provider:
        raise InvalidArgument(f"session {session} runs {described.provider}")
    return described


async def _binding_to_freeze(
    hub: HubClient, described: Session | None, warnings: list[str]
) -> str | None:
    """The memory binding the launch would run with."""
    if described is not None and described.memory != "pending":
        return described.binding if described.memory == "bound" else None
    # A fresh session, or one whose first turn has not started yet: its binding is frozen at
    # launch, so show what the Hub's current policy would freeze.
    owner = described.principal_id if described is not None else None
    try:
        return (await hub.resolve_binding(owner)).binding
    except AmuxError as error:
        if error.code != "memory_disabled":
            warnings.append(f"memory unavailable: {error.message}")
        return None


async def _next_permissions(hub: HubClient) -> str:
    """The policy the next turn would run under, and so the flags it becomes."""
    capabilities = await hub.capabilities()
    agents = capabilities.get("agents") if isinstance(capabilities, dict) else None
    return str((agents or {}).get("permissions") or "ask")


async def _fresh_session(hub: HubClient, provider: str) -> Session:
    """A session not made yet, as the caller's next new conversation with ``provider``."""
    who = await hub.whoami()
    return Session(
        id="<session>",
        principal_id=str(who["principal"]["id"]),
        provider=provider,
        cwd=None,
        origin=None,
        native_id=None,
        memory="pending",
        binding=None,
    )


def _launch_request(
    settings: RuntimeSettings,
    client_settings: ClientSettings,
    planned: Session,
    provider: str,
    prompt: str,
    binding: str | None,
    permissions: str,
) -> tuple[LaunchSite, LaunchRequest, tuple[int, int] | None]:
    """The launch a worker beside this home would make, its memory delegated at launch, and who
    it would run as."""
    from runtime_bridge.launch import LaunchSite
    from runtime_bridge.materializer import memory_cli_dir
    from runtime_bridge.providers import MemoryAttachment
    from runtime_bridge.worker import default_amux_executable

    site = LaunchSite(
        settings,
        settings.work_dir_beside(client_settings.home),
        amux_home=client_settings.home,
    )
    run_dir = site.run_dir("<execution>")
    amux = settings.amux or default_amux_executable()
    memory = None
    if binding is not None:
        memory = MemoryAttachment(
            hub_url=site.agent_hub_url(client_settings.hub_url),
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
        permissions=permissions,
        amux_argv=(amux,),
    )
    return site, request, identity


def _shown_plan(
    site: LaunchSite,
    request: LaunchRequest,
    identity: tuple[int, int] | None,
    settings: RuntimeSettings,
    warnings: list[str],
) -> dict[str, Any]:
    """The plan of ``request`` as a worker would lay it out, secrets masked, warnings first."""
    from runtime_bridge.providers import ExecutableMissing, build_plan

    launch = dataclasses.replace(build_plan(request), run_as=identity)
    # The sandbox is shown as a worker would build it; what it binds is found on this host.
    try:
        # A worker's launch goes through its gateway, so it is isolated when the site is.
        launch = site.sandbox(launch, request, (), request.amux_argv, isolate=site.isolated)
    except ExecutableMissing as error:
        warnings.append(f"sandbox not shown: {error.message}")
    plan = launch.to_json(mask_secrets=True)
    shared_network = settings.network_warning()
    if shared_network is not None:
        warnings.append(shared_network)
    plan["warnings"] = warnings + list(plan["warnings"])
    return plan


def plan_text(plan: dict[str, Any]) -> str:
    """A launch plan for people: the command line as a shell would take it, then where it runs,
    as whom, with which environment and files."""
    # The confinement prefix runs first, then the sandbox, the relay, then the Agent itself.
    prefix = [str(arg) for key in ("confine", "sandbox", "relay") for arg in plan.get(key) or []]
    run_as = plan.get("run_as")
    lines = [
        f"provider     {plan['provider']}",
        f"command      {shlex.join([*prefix, *map(str, plan['argv'])])}",
        f"cwd          {plan.get('cwd') or '-'}",
        f"run as       {':'.join(map(str, run_as)) if run_as else 'the worker user'}",
        f"stdin        {plan.get('stdin') or '-'}",
        f"memory       {plan.get('binding') or 'none'}",
        f"permissions  {plan.get('permissions') or '-'}",
        "environment",
        *(f"  {key}={value}" for key, value in sorted((plan.get("env") or {}).items())),
    ]
    doors = plan.get("doors") or []
    lines.append("network      " + ("own namespace, doors:" if doors else "the host's"))
    lines += [f"  {door['name']:<7} {door['listen']} -> {door['socket']}" for door in doors]
    files = plan.get("files") or []
    if files:
        lines.append("files")
        lines += [f"  {entry['path']} (mode {entry.get('mode', '-')})" for entry in files]
    return "\n".join(lines)


@runtime_app.command("worker")
def runtime_worker(
    ctx: typer.Context,
    hub_url: str | None = typer.Option(None, "--hub", help="The Hub URL (default AMUX_HUB_URL)."),
    as_json: JsonOutput = False,
) -> None:
    """Run a Runtime worker: claim Agent turns from the Hub and launch them (service token)."""
    from bot.service import logs
    from hub.client import HubClient
    from runtime_bridge.config import RuntimeSettings
    from runtime_bridge.launchers import configured_launcher
    from runtime_bridge.worker import Worker

    env = env_of(ctx)
    client_settings = env.client_settings()
    url = hub_url or client_settings.hub_url
    token = client_settings.resolved_token()
    if not token:
        fail(InvalidArgument("a worker needs a service token in AMUX_TOKEN"))
    settings = RuntimeSettings()
    work_dir = settings.standalone_work_dir()
    logs.configure(logs.LogSettings(), secrets=[token])
    # Its launches' doors hold files in this process, as in `amux serve`.
    from bot.service.serve import raise_open_files

    raise_open_files()
    warning = settings.unsandboxed_warning()
    if warning is not None:
        logging.getLogger("amux.worker").warning(warning)
    try:
        launcher = configured_launcher(settings)
    except AmuxError as error:
        fail(error)

    async def work() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with HubClient(url, token, timeout=60) as hub:
            worker = Worker(
                hub, url, settings, work_dir, amux_home=client_settings.home, launcher=launcher
            )

            def stopping() -> None:
                # Said once, so whoever stopped it (a scale-down, an upgrade) sees it drain.
                if not stop.is_set():
                    logging.getLogger("amux.worker").info(worker.stopping_notice())
                stop.set()

            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stopping)
            await worker.register()
            typer.echo(f"worker {settings.name} serving {url}", err=True)
            await worker.run_forever(stop)

    run(work())
    emit({"stopped": True}, as_json, lambda _: f"worker {settings.name} stopped")
