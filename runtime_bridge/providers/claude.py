"""Claude Code adapter: ``claude -p`` in stream-json mode.

Bound launches get one merged ``--append-system-prompt`` (configured text, then the MCP protocol)
and launch-local ``CLAUDE_CODE_DISABLE_AUTO_MEMORY=1`` so Claude's own file memory stays out of the
prompt. Unbound launches keep Claude's ordinary native-memory policy.

MCP servers: a launch gets exactly the operator's servers (``AMUX_RUNTIME_CLAUDE_MCP_CONFIG``) and,
when bound, amux's ``memory`` server, in one ``--mcp-config`` with ``--strict-mcp-config``: a
``.mcp.json`` in the workspace adds nothing, and turning memory on removes nothing the operator
configured. Their tools are allowed by name (``mcp__<server>__*``), since a print-mode launch
cannot ask for permission.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from runtime_bridge.approvals import Approver
from runtime_bridge.launch_env import launch_env
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers.plan import (
    MEMORY_CONFIG_DIR,
    MEMORY_SERVER,
    Event,
    Failure,
    LaunchPlan,
    LaunchRequest,
    PlannedFile,
    Progress,
    Result,
)
from runtime_bridge.providers.process import StreamParser, run_json_lines

MCP_CONFIG = MEMORY_CONFIG_DIR / "claude-mcp.json"


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
    if servers:
        # Exactly the operator's servers and amux memory: --strict-mcp-config keeps out any
        # server a workspace's .mcp.json would add.
        config_path = request.run_dir / MCP_CONFIG
        config = {"mcpServers": servers}
        files.append(PlannedFile(config_path, json.dumps(config, indent=2) + "\n", 0o600))
        argv += [
            "--mcp-config",
            str(config_path),
            "--strict-mcp-config",
            "--allowedTools",
            ",".join(f"mcp__{name}__*" for name in servers),
        ]
    if append and append.strip():
        argv += ["--append-system-prompt", append]
    argv += list(request.extra_args)
    env = launch_env(request.base_env, request.pass_env, overrides=overrides)
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
    )


def _text_blocks(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    return [
        str(b.get("text", ""))
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and b.get("text")
    ]


class ClaudeStream(StreamParser):
    """Parses ``--output-format stream-json`` lines."""

    def __init__(self) -> None:
        super().__init__()
        self.session_id: str | None = None

    def feed(self, message: dict[str, Any]) -> list[Event]:
        self.session_id = message.get("session_id") or self.session_id
        kind = message.get("type")
        if kind == "assistant":
            content = (message.get("message") or {}).get("content")
            events: list[Event] = [Progress(t) for t in _text_blocks(content)]
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    events.append(Progress(f"tool: {block.get('name')}"))
            return events
        if kind == "result":
            if message.get("is_error") or message.get("subtype") != "success":
                errors = message.get("errors") or [message.get("result") or message.get("subtype")]
                self.failure = Failure(f"claude failed: {'; '.join(map(str, errors))}")
            else:
                self.result = Result(
                    text=str(message.get("result") or ""),
                    native_session_id=self.session_id,
                    usage=dict(message.get("usage") or {}),
                )
        return []


def run(plan: LaunchPlan, approver: Approver | None = None) -> AsyncIterator[Event]:
    """Run a Claude plan, yielding progress and then one ``Result`` or ``Failure``."""
    return run_json_lines(plan, ClaudeStream, approver)
