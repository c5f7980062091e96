"""The I/O shell shared by the adapters: materialise a plan, find its executable, run it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from runtime_bridge.approvals import ApprovalSocket, Approver, Describe, deny_all
from runtime_bridge.providers.confined import (
    copy_into,
    open_dir,
    open_root,
    relative_to_root,
    write_file,
)
from runtime_bridge.providers.errors import ExecutableMissing
from runtime_bridge.providers.plan import Event, Failure, LaunchPlan, Result

STDERR_TAIL = 4096
LINE_LIMIT = 32 * 1024 * 1024
STOP_GRACE = 5.0


def resolve_executable(plan: LaunchPlan) -> str:
    """The absolute path of ``plan.argv[0]``, looked up on the launch's own PATH.

    Raises:
        ExecutableMissing: when it is not an executable file.
    """
    name = plan.argv[0]
    if os.sep in name:
        found = name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    else:
        found = shutil.which(name, path=plan.env.get("PATH", ""))
    if found is None:
        raise ExecutableMissing(
            f"{plan.provider} executable {name!r} was not found"
            + ("" if os.sep in name else " on the launch PATH")
            + f"; install it, or {_where_to_set(plan.provider)}",
            executable=name,
            provider=plan.provider,
        )
    return os.path.abspath(found)


def _where_to_set(provider: str) -> str:
    """The setting that names ``provider``'s executable: each built-in Agent has its own."""
    if provider in ("claude", "codex", "pi"):
        return f"set AMUX_RUNTIME_{provider.upper()} to its path"
    return f"correct the {provider!r} entry of AMUX_RUNTIME_PROVIDERS"


def materialize(plan: LaunchPlan) -> None:
    """Create the plan's directories, copies and files beneath its roots (files owner-only);
    a copy ``only_when_new`` only into a directory of the plan's that did not exist before.

    With ``run_as`` the Agent's user owns what is made; nothing is followed through a link.
    """
    owner = plan.run_as
    roots = plan.roots
    # A link counts as there: a seed only ever goes into a directory made just now.
    made = {directory for directory in plan.directories if not os.path.lexists(directory)}
    for directory in plan.directories:
        root, relative = relative_to_root(directory, roots)
        with open_root(root) as root_fd, open_dir(root_fd, relative, owner):
            pass
    for copy in plan.copies:
        if copy.only_when_new and copy.destination.parent not in made:
            continue
        root, relative = relative_to_root(copy.destination, roots)
        with open_root(root) as root_fd, open_dir(root_fd, relative.parent, owner) as parent:
            copy_into(copy.source, parent, relative.name, owner, copy.exclude)
    for planned in plan.files:
        root, relative = relative_to_root(planned.path, roots)
        with open_root(root) as root_fd, open_dir(root_fd, relative.parent, owner) as parent:
            write_file(parent, relative.name, planned.content.encode(), planned.mode, owner)


def _setpriv(plan: LaunchPlan) -> str:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise ExecutableMissing(
            "setpriv (util-linux) is needed to run Agents as another user",
            executable="setpriv",
            provider=plan.provider,
        )
    return setpriv


def user_switch(setpriv: str, uid: int, gid: int) -> tuple[str, ...]:
    """``setpriv`` to ``uid``/``gid``, with the death signal set after the uid change (a uid
    change clears it, so it must come in the same call).

    No new privileges: nothing the Agent runs (a set-uid program, file capabilities) raises it
    above the uid it was given.
    """
    return (
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--pdeathsig",
        "TERM",
        "--",
    )


def _user_switch(plan: LaunchPlan) -> tuple[str, ...]:
    if plan.run_as is None:
        return ()
    return user_switch(_setpriv(plan), *plan.run_as)


def launch_command(plan: LaunchPlan, argv: list[str]) -> list[str]:
    """The full command of a launch: sandbox, user switch and death signal, the relay of a
    launch with a network of its own, then ``argv``.

    The agent runs in a session of its own (so it can be stopped as a group), which also cuts it
    loose from the worker: if the worker is killed, the kernel must stop the agent too. bwrap's
    ``--die-with-parent`` does that for a sandboxed launch; otherwise ``setpriv --pdeathsig``.
    """
    if plan.sandbox:
        return [*plan.confine, *plan.sandbox, *_user_switch(plan), *plan.relay, *argv]
    if plan.run_as is not None:
        return [*plan.confine, *_user_switch(plan), *argv]
    setpriv = shutil.which("setpriv")
    return [*plan.confine, *((setpriv, "--pdeathsig", "TERM", "--") if setpriv else ()), *argv]


async def start(plan: LaunchPlan, argv: list[str]) -> asyncio.subprocess.Process:
    """Start the agent in its own process group, ended with the worker that started it."""
    return await asyncio.create_subprocess_exec(
        *launch_command(plan, argv),
        cwd=plan.cwd,
        env=dict(plan.env),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=LINE_LIMIT,
        start_new_session=True,
    )


async def stop(process: asyncio.subprocess.Process) -> None:
    """End the agent and anything it started: SIGTERM to its group, then SIGKILL."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_GRACE):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    for stream in (process.stdin,):
        if stream is not None and not stream.is_closing():
            stream.close()


class AgentInput(Protocol):
    """What the runners write an Agent's stdin through (an ``asyncio.StreamWriter`` is one)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...


class AgentProcess(Protocol):
    """What the runners use of a running Agent: a local ``asyncio.subprocess.Process`` is one, a
    command in a pod of its own another."""

    @property
    def stdin(self) -> AgentInput | None: ...

    @property
    def stdout(self) -> asyncio.StreamReader | None: ...

    @property
    def stderr(self) -> asyncio.StreamReader | None: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class Launcher(Protocol):
    """Where a launch's process runs: given the plan (its sandbox layout, confinement, identity,
    environment and working directory) and the Agent's argv, ``start`` returns the running
    process whose stdin, stdout and stderr the runner streams; ``stop`` ends it and everything
    it started; ``reclaim``, once as the worker starts, ends what an earlier run of the same
    worker left behind."""

    async def start(self, plan: LaunchPlan, argv: list[str]) -> AgentProcess: ...

    async def stop(self, process: AgentProcess) -> None: ...

    async def reclaim(self) -> None: ...


class LocalLauncher:
    """On this host, under the plan's bubblewrap sandbox and confinement when it has them."""

    async def start(self, plan: LaunchPlan, argv: list[str]) -> AgentProcess:
        return await start(plan, argv)

    async def stop(self, process: AgentProcess) -> None:
        assert isinstance(process, asyncio.subprocess.Process)
        await stop(process)

    async def reclaim(self) -> None:
        """Nothing: an Agent on this host ended with the worker that started it (its death
        signal)."""


LOCAL = LocalLauncher()


class StderrTail:
    """Drains a child's stderr (so it never blocks on a full pipe) and keeps the last bytes."""

    def __init__(self, stream: asyncio.StreamReader | None) -> None:
        self._buffer = bytearray()
        self._task = asyncio.create_task(self._drain(stream)) if stream is not None else None

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._buffer.extend(chunk)
            del self._buffer[:-STDERR_TAIL]

    async def text(self) -> str:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self._buffer.decode("utf-8", "replace").strip()

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


class StreamParser:
    """Turns an agent's JSON-lines output into events; subclasses implement ``feed``."""

    def __init__(self) -> None:
        self.result: Result | None = None
        self.failure: Failure | None = None

    def feed(self, message: dict[str, Any]) -> list[Event]:
        raise NotImplementedError

    def finish(self, returncode: int, stderr: str) -> list[Event]:
        """The closing event once the process has exited."""
        if self.failure is not None:
            return [self.failure]
        if self.result is not None and returncode == 0:
            return [self.result]
        detail = stderr.splitlines()[-1] if stderr else "no output"
        return [Failure(f"agent exited with status {returncode} before finishing: {detail}")]


async def run_json_lines(
    plan: LaunchPlan,
    parser_factory: Callable[[], StreamParser],
    approver: Approver | None = None,
    describe: Describe | None = None,
    launcher: Launcher = LOCAL,
) -> AsyncIterator[Event]:
    """Run a print-mode agent that reads the prompt on stdin and writes JSON lines.

    With a plan's ``approval_socket`` (and ``describe`` to read its requests), the Agent's
    permission requests are answered by ``approver`` while it runs.

    Raises:
        ExecutableMissing: before anything starts, when the executable is absent.
    """
    executable = resolve_executable(plan)
    materialize(plan)
    async with contextlib.AsyncExitStack() as stack:
        if plan.approval_socket is not None and describe is not None:
            await stack.enter_async_context(
                ApprovalSocket(
                    plan.approval_socket,
                    approver or deny_all("this launch has nobody to ask for permission"),
                    describe,
                    plan.mask,
                    plan.run_as,
                )
            )
        async for event in _run_json_lines(plan, executable, parser_factory, launcher):
            yield event


async def _run_json_lines(
    plan: LaunchPlan,
    executable: str,
    parser_factory: Callable[[], StreamParser],
    launcher: Launcher,
) -> AsyncIterator[Event]:
    process = await launcher.start(plan, [executable, *plan.argv[1:]])
    stderr = StderrTail(process.stderr)
    parser = parser_factory()
    try:
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write((plan.stdin or "").encode())
            await process.stdin.drain()
        process.stdin.close()
        while line := await process.stdout.readline():
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(message, dict):
                for event in parser.feed(message):
                    yield event
        returncode = await process.wait()
        for event in parser.finish(returncode, plan.mask(await stderr.text())):
            yield event
    finally:
        await launcher.stop(process)
        stderr.cancel()
        await stderr.text()
