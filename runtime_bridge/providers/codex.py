"""Codex adapter: ``codex app-server`` driven over stdio JSON-RPC.

A bound launch sets the three native memory settings false with launch-local ``-c`` overrides
(never editing a config file), reads the effective config back and refuses to go on unless all
three are confirmed false, starts (or resumes) the thread with the merged developer instructions,
and sets the thread's memory mode to disabled. Any of those calls failing fails the launch with
``NativeMemoryUnconfirmed`` naming what was missing. Unbound launches make none of these calls.

The memory MCP server is configured with ``-c mcp_servers.memory.*``; the Hub connection values
reach it through ``env_vars`` (forwarded from Codex's own environment), so the credential never
appears in argv.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from hub.errors import Unavailable
from runtime_bridge.approvals import Approver
from runtime_bridge.codex_rpc import CodexRpc, RpcError
from runtime_bridge.launch_env import launch_env
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers.errors import AgentProtocolError, NativeMemoryUnconfirmed
from runtime_bridge.providers.plan import (
    MEMORY_SERVER,
    CodexThread,
    Event,
    Failure,
    LaunchPlan,
    LaunchRequest,
    PlannedCopy,
    Progress,
    Result,
)
from runtime_bridge.providers.process import (
    STOP_GRACE,
    StderrTail,
    materialize,
    resolve_executable,
    start,
    stop,
)

CODEX_HOME = "codex-home"
EFFECTIVE_CONFIG_SOURCE = "developer_instructions of Codex's effective config (config/read)"
CLIENT_INFO = {"name": "amux", "title": "amux", "version": "0.1.0"}

# (config/read section, key) → the value a bound launch requires; set launch-locally.
MEMORY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("features", "memories"),
    ("memories", "use_memories"),
    ("memories", "generate_memories"),
)


def _toml(value: Any) -> str:
    # JSON strings, booleans, numbers and arrays of them are valid TOML values.
    return json.dumps(value)


def build_plan(request: LaunchRequest) -> LaunchPlan:
    """The argv, environment and thread calls of one Codex launch (pure)."""
    memory = request.memory
    home = request.home_root / CODEX_HOME
    argv: list[str] = [request.executable or "codex"]
    overrides: dict[str, str] = {}
    developer = request.developer_instructions
    sources = [EFFECTIVE_CONFIG_SOURCE]
    if developer and developer.strip():
        sources.append("AMUX_RUNTIME_DEVELOPER_INSTRUCTIONS")
    if memory is not None:
        developer = merge_instructions(developer, protocol_text("mcp"))
        sources.append("amux memory protocol")
        for section, key in MEMORY_SETTINGS:
            argv += ["-c", f"{section}.{key}=false"]
        server = f"mcp_servers.{MEMORY_SERVER}"
        for key, value in (
            ("command", memory.mcp_argv[0]),
            ("args", list(memory.mcp_argv[1:])),
            ("env_vars", list(memory.connection_env())),
            ("default_tools_approval_mode", "approve"),
            # Required: otherwise the first model request can go out before the tools are listed.
            ("required", True),
            ("startup_timeout_sec", 30),
        ):
            argv += ["-c", f"{server}.{key}={_toml(value)}"]
        overrides.update(memory.connection_env())
    argv += [*request.extra_args, "app-server"]
    copies: tuple[PlannedCopy, ...] = ()
    if request.provider_home_source is not None:
        copies = (PlannedCopy(request.provider_home_source, home / "config.toml"),)
    env = launch_env(
        request.base_env,
        request.pass_env,
        homes={"CODEX_HOME": str(home)},
        overrides=overrides,
    )
    return LaunchPlan(
        provider="codex",
        argv=tuple(argv),
        env=env,
        cwd=request.cwd,
        prompt=request.prompt,
        copies=copies,
        directories=(home,),
        binding=memory.binding if memory else None,
        resume_id=request.resume_id,
        codex=CodexThread(
            developer_instructions=developer,
            memory_disabled=memory is not None,
            instruction_sources=tuple(sources) if developer else (),
        ),
        secrets=(memory.credential,) if memory else (),
    )


def unconfirmed_memory_settings(config: Any) -> list[str]:
    """The native memory settings that ``config/read`` did not report as false."""
    config = config if isinstance(config, Mapping) else {}
    missing: list[str] = []
    for section, key in MEMORY_SETTINGS:
        values = config.get(section)
        value = values.get(key) if isinstance(values, Mapping) else None
        if value is not False:
            missing.append(f"{section}.{key}={json.dumps(value)}")
    return missing


async def _read_config(rpc: CodexRpc, plan: LaunchPlan, purpose: str) -> Mapping[str, Any]:
    """Codex's effective configuration for this launch's working directory.

    Raises:
        NativeMemoryUnconfirmed: when it cannot be read; ``purpose`` says what needed it.
    """
    try:
        read = await rpc.call("config/read", {"includeLayers": False, "cwd": str(plan.cwd)})
    except RpcError as exc:
        raise NativeMemoryUnconfirmed(
            f"codex cannot {purpose}: config/read failed: {exc.message}", method="config/read"
        ) from exc
    config = (read or {}).get("config") if isinstance(read, Mapping) else None
    return config if isinstance(config, Mapping) else {}


def effective_instructions(config: Mapping[str, Any], ours: str) -> str:
    """The operator's configured developer instructions first, then amux's part once."""
    configured = config.get("developer_instructions")
    return merge_instructions(configured if isinstance(configured, str) else None, ours)


async def _open_thread(rpc: CodexRpc, plan: LaunchPlan, thread: CodexThread) -> str:
    await rpc.call(
        "initialize", {"clientInfo": CLIENT_INFO, "capabilities": {"experimentalApi": True}}
    )
    await rpc.notify("initialized")
    config: Mapping[str, Any] = {}
    if thread.memory_disabled:
        config = await _read_config(rpc, plan, "confirm native memory is off")
        missing = unconfirmed_memory_settings(config)
        if missing:
            raise NativeMemoryUnconfirmed(
                "codex did not confirm native memory is off: " + ", ".join(missing),
                settings=missing,
            )
    elif thread.developer_instructions:
        config = await _read_config(rpc, plan, "merge its developer instructions")
    method = "thread/resume" if plan.resume_id else "thread/start"
    params: dict[str, Any] = {"cwd": str(plan.cwd), "approvalPolicy": thread.approval_policy}
    if plan.resume_id:
        params["threadId"] = plan.resume_id
    if thread.developer_instructions:
        # Sent developer instructions replace the configured ones for the thread: send both.
        params["developerInstructions"] = effective_instructions(
            config, thread.developer_instructions
        )
    try:
        opened = await rpc.call(method, params)
        thread_id = str(opened["thread"]["id"])
    except RpcError as exc:
        raise AgentProtocolError(f"codex rejected {method}: {exc.message}", method=method) from exc
    except (KeyError, TypeError) as exc:
        raise AgentProtocolError(f"codex answered {method} without a thread id") from exc
    if thread.memory_disabled:
        try:
            await rpc.call("thread/memoryMode/set", {"threadId": thread_id, "mode": "disabled"})
        except RpcError as exc:
            raise NativeMemoryUnconfirmed(
                f"codex cannot disable thread memory: thread/memoryMode/set failed: {exc.message}",
                method="thread/memoryMode/set",
            ) from exc
    return thread_id


class CodexTurn:
    """Folds app-server notifications of one turn into events. Pure."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.last_text = ""
        self.usage: dict[str, Any] = {}
        self.error: str | None = None
        self.done: Result | Failure | None = None

    def feed(self, method: str, params: Mapping[str, Any]) -> list[Event]:
        if params.get("threadId") not in (None, self.thread_id):
            return []
        item = params.get("item") if isinstance(params.get("item"), Mapping) else {}
        assert isinstance(item, Mapping)
        if method == "item/started" and item.get("type") == "mcpToolCall":
            return [Progress(f"tool: {item.get('server')}.{item.get('tool')}")]
        if method == "item/started" and item.get("type") == "commandExecution":
            return [Progress(f"command: {item.get('command')}")]
        if method == "item/completed" and item.get("type") == "agentMessage":
            self.last_text = str(item.get("text") or "")
            return [Progress(self.last_text)] if self.last_text else []
        if method == "thread/tokenUsage/updated":
            usage = params.get("tokenUsage")
            if isinstance(usage, Mapping) and isinstance(usage.get("total"), Mapping):
                self.usage = dict(usage["total"])
        elif method == "error" and not params.get("willRetry"):
            error = params.get("error")
            self.error = str(error.get("message") if isinstance(error, Mapping) else error)
        elif method == "turn/completed":
            turn = params.get("turn") if isinstance(params.get("turn"), Mapping) else {}
            assert isinstance(turn, Mapping)
            if turn.get("status") == "completed":
                self.done = Result(self.last_text, self.thread_id, self.usage)
            else:
                error = turn.get("error")
                detail = error.get("message") if isinstance(error, Mapping) else None
                self.done = Failure(
                    f"codex turn {turn.get('status')}: {detail or self.error or 'no detail'}"
                )
            return [self.done]
        return []


async def run(plan: LaunchPlan, approver: Approver | None = None) -> AsyncIterator[Event]:
    """Run a Codex plan, yielding progress and then one ``Result`` or ``Failure``.

    Raises:
        ExecutableMissing: the codex executable is absent.
        NativeMemoryUnconfirmed: a bound launch could not confirm native memory is off.
        AgentProtocolError: the app-server refused to open the thread.
    """
    thread = plan.codex or CodexThread(developer_instructions=None, memory_disabled=False)
    executable = resolve_executable(plan)
    materialize(plan)
    process = await start(plan, [executable, *plan.argv[1:]])
    stderr = StderrTail(process.stderr)
    assert process.stdout is not None and process.stdin is not None
    rpc = CodexRpc(process.stdout, process.stdin)
    try:
        try:
            thread_id = await _open_thread(rpc, plan, thread)
            await rpc.call(
                "turn/start",
                {"threadId": thread_id, "input": [{"type": "text", "text": plan.prompt}]},
            )
        except RpcError as exc:
            raise AgentProtocolError(f"codex rejected {exc.method}: {exc.message}") from exc
        except (NativeMemoryUnconfirmed, AgentProtocolError):
            raise
        except Unavailable as exc:
            # The app-server died during set-up (a bad -c key, an MCP server that would not start):
            # its last stderr line says why.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_GRACE):
                    await process.wait()
            tail = plan.mask(await stderr.text()) if process.returncode is not None else ""
            detail = tail.splitlines()[-1] if tail else exc.message
            raise AgentProtocolError(f"codex app-server failed to start: {detail}") from exc
        turn = CodexTurn(thread_id)
        async for note in rpc.notifications():
            for event in turn.feed(note.method, note.params):
                yield event
            if turn.done is not None:
                break
        if turn.done is None:
            process.stdin.close()
            await process.wait()
            tail = plan.mask(await stderr.text())
            detail = tail.splitlines()[-1] if tail else f"status {process.returncode}"
            yield Failure(f"codex app-server exited before the turn completed: {detail}")
    finally:
        await rpc.close()
        if process.returncode is None and not process.stdin.is_closing():
            # Closing stdin is the app-server's orderly shutdown; the group signal is the fallback.
            process.stdin.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_GRACE):
                    await process.wait()
        await stop(process)
        stderr.cancel()
        await stderr.text()
