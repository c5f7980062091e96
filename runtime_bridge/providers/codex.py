"""Codex adapter: ``codex app-server`` driven over stdio JSON-RPC.

A bound launch sets the three native memory settings false with launch-local ``-c`` overrides
(never editing a config file), reads the effective config back and refuses to go on unless all
three are confirmed false, starts (or resumes) the thread with the merged developer instructions,
and sets the thread's memory mode to disabled. Any of those calls failing fails the launch with
``NativeMemoryUnconfirmed`` naming what was missing. Unbound launches make none of these calls.

The memory MCP server is configured with ``-c mcp_servers.memory.*``; the Hub connection values
reach it through ``env_vars`` (forwarded from Codex's own environment), so the credential never
appears in argv. Its tools are approved in advance (``default_tools_approval_mode``): memory calls
never wait on a person.

Through the worker's model gateway (``runtime_bridge.gateway``) a launch selects a model provider
``amux`` (``-c model_provider``, after the operator's arguments) whose ``base_url`` is the gateway
and whose ``env_key`` variable holds the launch's placeholder; the provider the operator's
``config.toml`` names is what the gateway forwards to, with its real key.

Codex's own sandbox is off for every launch (``-c sandbox_mode="danger-full-access"`` and the
thread's ``sandbox``): its bubblewrap cannot start inside amux's, so with it on no command runs at
all, and amux's sandbox is the boundary. The launch's permission policy
(``runtime_bridge.approvals``) becomes the thread's ``approvalPolicy``, also set launch-locally
with ``-c approval_policy`` (the thread's value is the one that holds):

- ``auto``: ``never``: Codex runs every command and edit without asking;
- ``ask``: ``untrusted`` on the thread, under which Codex asks before every command and every file
  change (its config refuses that value, so ``-c`` carries ``on-request``, the nearest it takes).
  Its requests (``item/commandExecution/requestApproval``, ``item/fileChange/requestApproval``)
  go to the launch's approver, except commands amux reads as plainly read-only (``ls``,
  ``cat``, ``rg`` without the flags that run other programs…), which run at once. A declined
  request reaches the model as Codex's own "rejected by user" tool result;
- ``read-only``: ``never``; the worker mounts the workspace read-only, so edits fail there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import AsyncIterator, Mapping
from typing import Any

from hub.errors import Unavailable
from runtime_bridge import approvals, shell_reading
from runtime_bridge.approvals import ApprovalAnswer, ApprovalRequest, Approver
from runtime_bridge.codex_rpc import CodexRpc, Notification, RpcError, Unhandled
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
    PlanUpdate,
    Progress,
    Result,
    ToolStep,
)
from runtime_bridge.providers.process import (
    LOCAL,
    STOP_GRACE,
    Launcher,
    StderrTail,
    materialize,
    resolve_executable,
)
from runtime_bridge.providers.steps import first_words

CODEX_HOME = "codex-home"
NOBODY_TO_ASK = "this launch has nobody to ask for permission"
EFFECTIVE_CONFIG_SOURCE = "developer_instructions of Codex's effective config (config/read)"
CLIENT_INFO = {"name": "amux", "title": "amux", "version": "0.1.0"}

# (config/read section, key) → the value a bound launch requires; set launch-locally.
MEMORY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("features", "memories"),
    ("memories", "use_memories"),
    ("memories", "generate_memories"),
)


# Codex's plan tool (``update_plan``), off by default in this Codex: with it the Agent writes the
# plan that its progress and result cards show (``turn/plan/updated``).
PLAN_TOOL = ("-c", "tools.update_plan.enabled=true")

# The model provider a launch through the worker's gateway uses, and the variable holding its
# placeholder.
GATEWAY_PROVIDER = "amux"
GATEWAY_ENV_KEY = "OPENAI_API_KEY"

# Codex's own sandbox cannot start inside amux's: amux's sandbox is the boundary.
SANDBOX_MODE = "danger-full-access"
# The thread's approval policy per launch policy; anything else is asked about.
THREAD_APPROVAL = {approvals.AUTO: "never", approvals.READ_ONLY: "never"}
ASK_APPROVAL = "untrusted"
# Codex's config refuses ``untrusted``; under ``ask`` it carries the nearest asking value.
CONFIG_APPROVAL = {ASK_APPROVAL: "on-request"}

COMMAND_APPROVAL = "item/commandExecution/requestApproval"
FILE_CHANGE_APPROVAL = "item/fileChange/requestApproval"
# The v1 forms, which a v2 thread is not sent; answered alike should a build send them.
LEGACY_COMMAND_APPROVAL = "execCommandApproval"
LEGACY_PATCH_APPROVAL = "applyPatchApproval"


def _toml(value: Any) -> str:
    # JSON strings, booleans, numbers and arrays of them are valid TOML values.
    return json.dumps(value)


def gateway_provider(url: str) -> list[str]:
    """``-c`` overrides selecting a model provider that is the worker's gateway.

    The operator's own provider (its base URL and key) is what the gateway forwards to; Codex
    only ever sees the gateway and the launch's placeholder.
    """
    provider = f"model_providers.{GATEWAY_PROVIDER}"
    words: list[str] = ["-c", f"model_provider={_toml(GATEWAY_PROVIDER)}"]
    for key, value in (
        ("name", "amux model gateway"),
        ("base_url", f"{url}/v1"),
        ("env_key", GATEWAY_ENV_KEY),
        ("wire_api", "responses"),
    ):
        words += ["-c", f"{provider}.{key}={_toml(value)}"]
    return words


def build_plan(request: LaunchRequest) -> LaunchPlan:
    """The argv, environment and thread calls of one Codex launch (pure)."""
    memory = request.memory
    home = request.home_root / CODEX_HOME
    # First, so the operator's arguments can still turn it off.
    argv: list[str] = [request.executable or "codex", *PLAN_TOOL]
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
    approval = THREAD_APPROVAL.get(request.permissions, ASK_APPROVAL)
    # After the operator's arguments: a later -c wins, so the policy is what holds.
    argv += [*request.extra_args]
    if request.model:
        argv += ["-c", f"model={_toml(request.model)}"]
    gateway = request.gateway
    routed: dict[str, str] | None = None
    if gateway is not None:
        argv += gateway_provider(gateway.url)
        routed = {GATEWAY_ENV_KEY: gateway.key("openai")}
    argv += ["-c", f"sandbox_mode={_toml(SANDBOX_MODE)}"]
    argv += ["-c", f"approval_policy={_toml(CONFIG_APPROVAL.get(approval, approval))}"]
    argv += ["app-server"]
    copies: tuple[PlannedCopy, ...] = ()
    if request.provider_home_source is not None:
        copies = (PlannedCopy(request.provider_home_source, home / "config.toml"),)
    # Codex's empty databases, so that its first start in a new home does not make them.
    copies += tuple(PlannedCopy(f, home / f.name, only_when_new=True) for f in request.home_seed)
    env = launch_env(
        request.base_env,
        request.pass_env,
        homes={"CODEX_HOME": str(home)},
        overrides=overrides,
        gateway=routed,
        hidden=gateway.hidden if gateway else (),
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
            approval_policy=approval,
            instruction_sources=tuple(sources) if developer else (),
            fork=request.fork and request.resume_id is not None,
            compact=request.compacts,
        ),
        secrets=(memory.credential,) if memory else (),
        permissions=request.permissions,
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


def _thread_method(plan: LaunchPlan, thread: CodexThread) -> str:
    """How the launch opens its thread: a fork of the resumed one (a side question's, so the
    conversation's own thread and any turn running on it are left as they were), the resumed one,
    or a new one."""
    if not plan.resume_id:
        return "thread/start"
    return "thread/fork" if thread.fork else "thread/resume"


async def _start_turn(rpc: CodexRpc, plan: LaunchPlan, thread: CodexThread, thread_id: str) -> None:
    """Start the launch's turn on ``thread_id``: Codex's own compaction of the thread, or the
    prompt."""
    if thread.compact:
        # A turn of its own: Codex summarises the thread, which later turns continue from.
        await rpc.call("thread/compact/start", {"threadId": thread_id})
        return
    await rpc.call(
        "turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": plan.prompt}]}
    )


def _opened_model(opened: Any) -> str | None:
    """The model a ``thread/start``/``resume``/``fork`` answer says the thread runs."""
    model = opened.get("model") if isinstance(opened, Mapping) else None
    return model if isinstance(model, str) and model else None


async def _open_thread(
    rpc: CodexRpc, plan: LaunchPlan, thread: CodexThread
) -> tuple[str, str | None]:
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
    method = _thread_method(plan, thread)
    params: dict[str, Any] = {
        "cwd": str(plan.cwd),
        "approvalPolicy": thread.approval_policy,
        "sandbox": SANDBOX_MODE,
    }
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
    return thread_id, _opened_model(opened)


def read_only_command(command: str) -> bool:
    """Whether ``command`` (as Codex reports it, usually ``/bin/bash -lc '<script>'``) plainly
    only reads, by ``runtime_bridge.shell_reading``.

    Codex's own ``commandActions`` are a reading for display (``find -delete`` is a "search"),
    so they decide nothing here. Anything that reading does not vouch for is asked about.
    """
    script = shell_reading.script_of(command)
    return script is not None and shell_reading.reads_only(script)


def _lines(*pairs: tuple[str, Any]) -> str:
    return "\n".join(f"{name}: {value}" for name, value in pairs if value)


def describe_command(params: Mapping[str, Any]) -> ApprovalRequest | None:
    """What a person is asked about a command Codex wants to run (None: nobody)."""
    command = str(params.get("command") or "")
    extra = params.get("additionalPermissions") or params.get("networkApprovalContext")
    if params.get("kind", "command") == "command" and not extra and read_only_command(command):
        return None
    if params.get("kind") == "writeStdin":
        command = f"(input to a running command) {command}"
    network = params.get("networkApprovalContext")
    detail = _lines(
        ("cwd", params.get("cwd")),
        ("reason", params.get("reason")),
        ("network", json.dumps(network) if network else None),
        ("permissions", json.dumps(params.get("additionalPermissions") or None) if extra else None),
    )
    return ApprovalRequest("commandExecution", approvals.COMMAND, command, detail)


def describe_file_change(
    params: Mapping[str, Any], changes: list[Mapping[str, Any]]
) -> ApprovalRequest:
    """What a person is asked about a file change, from its item's ``changes``."""
    paths = [str(change.get("path", "")) for change in changes]
    parts: list[str] = []
    for change, path in zip(changes, paths, strict=True):
        kind = change.get("kind")
        kind_name = kind.get("type") if isinstance(kind, Mapping) else kind
        moved = kind.get("move_path") if isinstance(kind, Mapping) else None
        head = f"{kind_name or 'change'} {path}" + (f" -> {moved}" if moved else "")
        parts.append(head + "\n" + str(change.get("diff") or ""))
    extra = _lines(("reason", params.get("reason")), ("writes under", params.get("grantRoot")))
    subject = "\n".join(paths) or str(params.get("grantRoot") or "(files Codex did not name)")
    detail = "\n".join(p.rstrip("\n") for p in [extra, *parts] if p)
    return ApprovalRequest("fileChange", approvals.EDIT, subject, detail)


def _legacy_changes(file_changes: Any) -> list[Mapping[str, Any]]:
    """``applyPatchApproval``'s ``fileChanges`` map in the shape of a v2 item's ``changes``."""
    if not isinstance(file_changes, Mapping):
        return []
    changes: list[Mapping[str, Any]] = []
    for path, change in file_changes.items():
        change = change if isinstance(change, Mapping) else {}
        diff = change.get("unified_diff") or change.get("content") or ""
        kind = {"type": change.get("type"), "move_path": change.get("move_path")}
        changes.append({"path": path, "kind": kind, "diff": diff})
    return changes


class CodexApprovals:
    """Answers the app-server's approval requests of one launch through its approver.

    A file change's request names only its item: the changes come in that item's
    ``item/started``, which ``observe`` sees (as the connection reads it) before the request.
    Every decision is for that one request: Codex's "accept for session" is never given, since
    amux keeps its own session rules.
    """

    def __init__(self, plan: LaunchPlan, approver: Approver) -> None:
        self._plan = plan
        self._approver = approver
        self._changes: dict[str, list[Mapping[str, Any]]] = {}

    def observe(self, note: Notification) -> None:
        item = note.params.get("item")
        if not isinstance(item, Mapping) or item.get("type") != "fileChange":
            return
        item_id = str(item.get("id"))
        if note.method == "item/started":
            changes = item.get("changes")
            self._changes[item_id] = [c for c in changes or [] if isinstance(c, Mapping)]
        elif note.method == "item/completed":
            self._changes.pop(item_id, None)

    async def __call__(self, method: str, params: dict[str, Any]) -> Any:
        if method == COMMAND_APPROVAL:
            allowed = await self._ask(describe_command(params))
            return {"decision": "accept" if allowed.allowed else "decline"}
        if method == FILE_CHANGE_APPROVAL:
            changes = self._changes.get(str(params.get("itemId")), [])
            allowed = await self._ask(describe_file_change(params, changes))
            return {"decision": "accept" if allowed.allowed else "decline"}
        if method in (LEGACY_COMMAND_APPROVAL, LEGACY_PATCH_APPROVAL):
            if method == LEGACY_COMMAND_APPROVAL:
                raw = params.get("command")
                command = shlex.join(map(str, raw)) if isinstance(raw, list) else str(raw or "")
                request = describe_command({**params, "command": command})
            else:
                changes = _legacy_changes(params.get("fileChanges"))
                request = describe_file_change(params, changes)
            answer = await self._ask(request)
            if answer.allowed:
                return {"decision": "approved"}
            return {"decision": {"denied": {"rejection": answer.message or "denied"}}}
        raise Unhandled(method)

    async def _ask(self, request: ApprovalRequest | None) -> ApprovalAnswer:
        if request is None:
            return ApprovalAnswer(True)
        # Judged before masking, whose cost grows faster than the text; neither the subject nor
        # the detail is ever cut, so a person allows all of it or nothing.
        refused = request.refusal()
        if refused is not None:
            return refused
        mask = self._plan.mask
        masked = ApprovalRequest(
            request.tool,
            request.action,
            mask(request.subject),
            mask(request.detail),
        ).bounded()
        return await self._approver(masked)


# Codex's step statuses (camel case on the wire) as a plan's.
PLAN_STATUS = {"pending": "pending", "inProgress": "in_progress", "completed": "completed"}


def _plan_update(plan: Any) -> PlanUpdate:
    """A ``turn/plan/updated`` plan (its steps with their statuses) as the turn's plan."""
    steps = [
        (str(step.get("step") or ""), PLAN_STATUS.get(str(step.get("status")), "pending"))
        for step in (plan if isinstance(plan, list) else [])
        if isinstance(step, Mapping)
    ]
    return PlanUpdate.of(steps)


def _named_model(usage: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": usage["model"]} if "model" in usage else {}


class CodexTurn:
    """Folds app-server notifications of one turn into events. Pure."""

    def __init__(self, thread_id: str, model: str | None = None) -> None:
        self.thread_id = thread_id
        self.last_text = ""
        # The model is named on the turn's footer with its usage.
        self.usage: dict[str, Any] = {"model": model} if model else {}
        self.error: str | None = None
        self.done: Result | Failure | None = None

    def feed(self, method: str, params: Mapping[str, Any]) -> list[Event]:
        if params.get("threadId") not in (None, self.thread_id):
            return []
        item = params.get("item") if isinstance(params.get("item"), Mapping) else {}
        assert isinstance(item, Mapping)
        if method == "item/started" and item.get("type") == "mcpToolCall":
            return [ToolStep.of("tool", f"{item.get('server')}.{item.get('tool')}")]
        if method == "item/started" and item.get("type") == "commandExecution":
            return [ToolStep.of("run", first_words(str(item.get("command") or "")))]
        if method == "item/started" and item.get("type") == "fileChange":
            changes = item.get("changes") if isinstance(item.get("changes"), list) else []
            assert isinstance(changes, list)
            paths = [str(c.get("path")) for c in changes if isinstance(c, Mapping)]
            return [ToolStep.of("edit", ", ".join(paths))]
        if method == "item/completed" and item.get("type") == "contextCompaction":
            return [ToolStep.of("compact", "")]
        if method == "item/completed" and item.get("type") == "agentMessage":
            self.last_text = str(item.get("text") or "")
            return [Progress(self.last_text)] if self.last_text else []
        if method == "turn/plan/updated":
            return [_plan_update(params.get("plan"))]
        if method == "thread/tokenUsage/updated":
            usage = params.get("tokenUsage")
            if isinstance(usage, Mapping) and isinstance(usage.get("total"), Mapping):
                self.usage = {**_named_model(self.usage), **usage["total"]}
                # The context's fill: what the last request held, of the window Codex reports.
                last = usage.get("last")
                if isinstance(last, Mapping) and isinstance(last.get("inputTokens"), int):
                    self.usage["context_tokens"] = last["inputTokens"]
                if isinstance(usage.get("modelContextWindow"), int):
                    self.usage["context_window"] = usage["modelContextWindow"]
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


async def run(
    plan: LaunchPlan, approver: Approver | None = None, launcher: Launcher = LOCAL
) -> AsyncIterator[Event]:
    """Run a Codex plan, yielding progress and then one ``Result`` or ``Failure``.

    Raises:
        ExecutableMissing: the codex executable is absent.
        NativeMemoryUnconfirmed: a bound launch could not confirm native memory is off.
        AgentProtocolError: the app-server refused to open the thread.
    """
    thread = plan.codex or CodexThread(developer_instructions=None, memory_disabled=False)
    executable = resolve_executable(plan)
    materialize(plan)
    process = await launcher.start(plan, [executable, *plan.argv[1:]])
    stderr = StderrTail(process.stderr)
    assert process.stdout is not None and process.stdin is not None
    answers = CodexApprovals(plan, approver or approvals.deny_all(NOBODY_TO_ASK))
    rpc = CodexRpc(process.stdout, process.stdin, on_request=answers, observe=answers.observe)
    try:
        try:
            thread_id, model = await _open_thread(rpc, plan, thread)
            await _start_turn(rpc, plan, thread, thread_id)
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
        turn = CodexTurn(thread_id, model)
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
        await launcher.stop(process)
        stderr.cancel()
        await stderr.text()
