"""Claude Code adapter: ``claude -p`` in stream-json mode.

Bound launches get one merged ``--append-system-prompt`` (configured text, then the MCP protocol)
and launch-local ``CLAUDE_CODE_DISABLE_AUTO_MEMORY=1`` so Claude's own file memory stays out of the
prompt. Unbound launches keep Claude's ordinary native-memory policy.

Through the worker's model gateway (``runtime_bridge.gateway``) the launch's environment holds
``ANTHROPIC_BASE_URL`` (the gateway) and ``ANTHROPIC_API_KEY`` (the launch's placeholder), and no
credential of the worker's: no ``CLAUDE_CODE_OAUTH_TOKEN`` nor ``ANTHROPIC_AUTH_TOKEN``.

MCP servers: a launch gets exactly the operator's servers (``AMUX_RUNTIME_CLAUDE_MCP_CONFIG``) and,
when bound, amux's ``memory`` server, in one ``--mcp-config`` with ``--strict-mcp-config``: a
``.mcp.json`` in the workspace adds nothing, and turning memory on removes nothing the operator
configured. Their tools are allowed by name (``mcp__<server>__*``): they never wait on a person.

The launch's permission policy (``runtime_bridge.approvals``) becomes Claude's own flags, placed
after the operator's arguments so that the policy is what holds:

- ``auto``: ``--permission-mode bypassPermissions``, since amux's sandbox is the boundary. Claude
  refuses that mode to uid 0 unless ``IS_SANDBOX=1``, which the launch sets: an Agent runs as root
  only unsandboxed and unswitched, which a worker never does. ``acceptEdits`` is not enough: it
  still asks before ``python3 -c …`` or a write outside the working directory;
- ``ask``: ``--permission-prompt-tool mcp__amux__permission_prompt``, served by
  ``runtime_bridge/permission_shim.py`` (standard library only, so Claude's first model request,
  which waits for its MCP servers, does not wait for an SDK import) added to the MCP config.
  Whatever Claude's own rules would ask a person (a file edit, a changing shell command, a network
  tool) goes through it to the worker's approval socket in the run directory; ``describe`` turns
  each request into what a person judges. Reads and searches are allowed by name, so reading
  outside the working directory (Claude would ask) does not wait on anyone. A launch planned
  without a worker to ask (no ``amux_argv``) gets ``--permission-prompts none``, which denies such
  requests at once, never hangs;
- ``read-only``: the edit tools are removed (``--disallowedTools``), so the model is told plainly
  they are not there, and ``--permission-prompts none`` refuses whatever else would have been
  asked (a changing shell command), with a message that nobody can approve it. Shell commands
  Claude finds read-only still run; the sandbox mounts the workspace read-only besides.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from runtime_bridge import approvals, permission_shim
from runtime_bridge.approvals import ApprovalRequest, Approver
from runtime_bridge.launch_env import NO_OWNER_TOKEN, launch_env
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.permission_shim import PROMPT_TOOL
from runtime_bridge.permission_shim import SERVER_NAME as PERMISSION_SERVER
from runtime_bridge.providers.plan import (
    MEMORY_CONFIG_DIR,
    MEMORY_SERVER,
    Event,
    Failure,
    LaunchPlan,
    LaunchRequest,
    PlannedFile,
    PlanUpdate,
    Progress,
    Result,
)
from runtime_bridge.providers.process import LOCAL, Launcher, StreamParser, run_json_lines
from runtime_bridge.providers.steps import tool_step

MCP_CONFIG = MEMORY_CONFIG_DIR / "claude-mcp.json"
PERMISSION_SHIM = Path(permission_shim.__file__)
# Claude's tools that change files: removed under read-only, shown to a person as edits.
EDIT_TOOLS = ("Write", "Edit", "MultiEdit", "NotebookEdit")
# Tools that only read or search: never worth a person's time (the sandbox bounds what is seen).
READ_TOOLS = ("Read", "Glob", "Grep", "LS", "NotebookRead")
# Claude's todo list tool: its calls carry the whole list, shown as the turn's plan.
TODO_TOOL = "TodoWrite"
# An edit whose old and new text together pass this is not diffed (a diff of huge strings
# costs far more than it shows): its detail lists both whole, past the bound a person is shown,
# so it is denied unasked with the advice to make smaller edits.
DIFFED_CHARS = approvals.DETAIL_CHARS


def build_plan(request: LaunchRequest) -> LaunchPlan:
    """The argv, environment and files of one Claude launch (pure)."""
    memory = request.memory
    argv: list[str] = [
        request.executable or "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
    ]
    if request.resume_id:
        argv += ["--resume", request.resume_id]
        if request.fork:
            argv += ["--fork-session"]
    files: list[PlannedFile] = []
    overrides: dict[str, str] = {}
    append = request.append_instructions
    servers: dict[str, Any] = dict(request.mcp_servers)
    if memory is not None:
        append = merge_instructions(append, protocol_text("mcp"))
        overrides["CLAUDE_CODE_DISABLE_AUTO_MEMORY"] = "1"
        # Claude defers MCP tools behind a ToolSearch step by default; that costs a round trip
        # and hides the names the protocol uses.
        overrides["ENABLE_TOOL_SEARCH"] = "false"
        servers[MEMORY_SERVER] = {
            "type": "stdio",
            "command": memory.mcp_argv[0],
            "args": list(memory.mcp_argv[1:]),
            "env": memory.connection_env(),
        }
    allowed = [f"mcp__{name}__*" for name in servers]
    policy: list[str] = []
    socket: Path | None = None
    if request.permissions == approvals.AUTO:
        policy = ["--permission-mode", "bypassPermissions"]
        overrides["IS_SANDBOX"] = "1"
    elif request.permissions == approvals.READ_ONLY:
        policy = ["--disallowedTools", ",".join(EDIT_TOOLS), "--permission-prompts", "none"]
    else:
        # Anything but the two known policies is asked about: a person still decides.
        allowed += READ_TOOLS
        if request.amux_argv:
            socket = request.run_dir / approvals.SOCKET_NAME
            servers[PERMISSION_SERVER] = permission_server(socket)
            policy = ["--permission-prompt-tool", PROMPT_TOOL]
        else:
            policy = ["--permission-prompts", "none"]
    if servers:
        # Exactly the operator's servers, amux memory and amux's permission prompt:
        # --strict-mcp-config keeps out any server a workspace's .mcp.json would add.
        config_path = request.run_dir / MCP_CONFIG
        config = {"mcpServers": servers}
        files.append(PlannedFile(config_path, json.dumps(config, indent=2) + "\n", 0o600))
        argv += ["--mcp-config", str(config_path), "--strict-mcp-config"]
    if allowed:
        argv += ["--allowedTools", ",".join(allowed)]
    if append and append.strip():
        argv += ["--append-system-prompt", append]
    argv += list(request.extra_args)
    if request.model:
        argv += ["--model", request.model]
    argv += policy
    gateway = request.gateway
    routed: dict[str, str] | None = None
    if gateway is not None:
        # The Agent holds only a placeholder; the gateway adds the operator's credential.
        routed = {"ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": gateway.key("anthropic")}
    env = launch_env(
        request.base_env,
        request.pass_env,
        overrides=overrides,
        gateway=routed,
        hidden=gateway.hidden if gateway else (),
    )
    return LaunchPlan(
        provider="claude",
        argv=tuple(argv),
        env=env,
        cwd=request.cwd,
        prompt=request.prompt,
        # The prompt goes on stdin: it is then never parsed as a flag, nor visible in ps.
        stdin=request.prompt,
        files=tuple(files),
        binding=memory.binding if memory else None,
        resume_id=request.resume_id,
        secrets=(memory.credential,) if memory else (),
        permissions=request.permissions,
        approval_socket=socket,
    )


def permission_server(socket: Path) -> dict[str, Any]:
    """The MCP config entry of the permission prompt, asking on ``socket``.

    It is given the socket and nothing of the Hub: it only relays requests to the worker. It
    runs on amux's own interpreter (bound into every sandbox), isolated from the environment's
    Python settings and site packages.
    """
    return {
        "type": "stdio",
        "command": sys.executable,
        "args": ["-I", "-S", str(PERMISSION_SHIM)],
        "env": {approvals.SOCKET_ENV: str(socket), **NO_OWNER_TOKEN},
    }


def describe(tool_name: str, tool_input: Mapping[str, Any]) -> ApprovalRequest | None:
    """What a person is asked about one of Claude's permission requests (None: nobody)."""
    if tool_name in READ_TOOLS or tool_name.startswith(f"mcp__{MEMORY_SERVER}__"):
        return None
    if tool_name == "Bash":
        # The exact command is what is judged; the model's own description of it is not shown,
        # since it is the model's claim about the command rather than the command.
        action, subject, detail = approvals.COMMAND, str(tool_input.get("command", "")), ""
    elif tool_name in EDIT_TOOLS:
        action = approvals.EDIT
        subject = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
        detail = _edit_detail(tool_name, tool_input)
    else:
        action, subject = approvals.TOOL, _subject(tool_input)
        detail = json.dumps(dict(tool_input), ensure_ascii=False, indent=2, default=str)
    return ApprovalRequest(
        tool_name,
        action,
        # Both whole: a person allows all of it or nothing (one too long is denied unasked).
        subject,
        detail,
    )


def _edit_detail(tool_name: str, tool_input: Mapping[str, Any]) -> str:
    """A diff of the edit from its own input; the file itself is never read by the worker,
    which could otherwise show a person what the sandbox hides from the Agent."""
    path = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
    if tool_name == "Write":
        return str(tool_input.get("content", ""))
    if tool_name == "Edit":
        edits: list[Any] = [tool_input]
    elif tool_name == "MultiEdit":
        raw = tool_input.get("edits")
        edits = raw if isinstance(raw, list) else []
    else:
        # NotebookEdit: the cell's new source, with where it goes.
        head = " ".join(
            f"{key}={tool_input[key]}"
            for key in ("cell_id", "cell_type", "edit_mode")
            if tool_input.get(key)
        )
        return (head + "\n" if head else "") + str(tool_input.get("new_source", ""))
    pairs = [
        (str(edit.get("old_string", "")), str(edit.get("new_string", "")))
        for edit in edits
        if isinstance(edit, dict)
    ]
    if sum(len(old) + len(new) for old, new in pairs) > DIFFED_CHARS:
        return "".join(f"--- {path}\n{old}\n+++ {path}\n{new}\n" for old, new in pairs)
    parts: list[str] = []
    for old, new in pairs:
        diff = difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=path,
            tofile=path,
            lineterm="\n",
        )
        parts.append("".join(line if line.endswith("\n") else line + "\n" for line in diff))
    return "".join(parts)


def _subject(tool_input: Mapping[str, Any]) -> str:
    """What another tool acts on, when its input names it (a URL, a path, a query)."""
    for key in ("url", "file_path", "path", "query", "command"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _text_blocks(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    return [
        str(b.get("text", ""))
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and b.get("text")
    ]


def _todo_plan(tool_input: Any) -> PlanUpdate:
    """Claude's todo list (its ``TodoWrite`` input) as the turn's plan."""
    todos = tool_input.get("todos") if isinstance(tool_input, dict) else None
    steps = [
        (str(todo.get("content") or ""), str(todo.get("status") or ""))
        for todo in (todos if isinstance(todos, list) else [])
        if isinstance(todo, dict)
    ]
    return PlanUpdate.of(steps)


class ClaudeStream(StreamParser):
    """Parses ``--output-format stream-json`` lines."""

    def __init__(self) -> None:
        super().__init__()
        self.session_id: str | None = None
        # The model that answered, and how many tokens its last request held: the context's fill.
        self.model: str | None = None
        self.context_tokens: int | None = None

    def feed(self, message: dict[str, Any]) -> list[Event]:
        self.session_id = message.get("session_id") or self.session_id
        kind = message.get("type")
        if kind == "system" and isinstance(message.get("model"), str):
            self.model = message["model"]
        if kind == "assistant":
            self._note_usage(message.get("message") or {})
            content = (message.get("message") or {}).get("content")
            events: list[Event] = [Progress(t) for t in _text_blocks(content)]
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    if block.get("name") == TODO_TOOL:
                        events.append(_todo_plan(block.get("input")))
                    else:
                        events.append(tool_step(str(block.get("name")), block.get("input")))
            return events
        if kind == "result":
            if message.get("is_error") or message.get("subtype") != "success":
                errors = message.get("errors") or [message.get("result") or message.get("subtype")]
                self.failure = Failure(f"claude failed: {'; '.join(map(str, errors))}")
            else:
                usage = dict(message.get("usage") or {})
                if self.model:
                    usage["model"] = self.model
                if self.context_tokens is not None:
                    usage["context_tokens"] = self.context_tokens
                self.result = Result(
                    text=str(message.get("result") or ""),
                    native_session_id=self.session_id,
                    usage=usage,
                )
        return []

    def _note_usage(self, body: Any) -> None:
        """The model and the context's fill from one of the model's answers: what its request
        held, cached or not."""
        if not isinstance(body, dict):
            return
        if isinstance(body.get("model"), str) and body["model"]:
            self.model = body["model"]
        usage = body.get("usage")
        if isinstance(usage, dict):
            counts = [usage.get(key) for key in CONTEXT_KEYS]
            held = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
            if held:
                self.context_tokens = sum(held)


CONTEXT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def run(
    plan: LaunchPlan, approver: Approver | None = None, launcher: Launcher = LOCAL
) -> AsyncIterator[Event]:
    """Run a Claude plan, yielding progress and then one ``Result`` or ``Failure``."""
    return run_json_lines(plan, ClaudeStream, approver, describe, launcher)
