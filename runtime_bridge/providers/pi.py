"""Pi adapter: ``pi -p --mode json``.

Pi has no MCP, so a bound launch reaches memory through the ``amux`` CLI run by Pi's bash tool:
the launch puts the attachment's CLI directory first on PATH, passes the Hub connection variables,
and appends the CLI variant of the protocol to the system prompt. Pi keeps its sessions under its
agent directory, which each launch sets to its own home.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from runtime_bridge.approvals import Approver
from runtime_bridge.launch_env import launch_env
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers.plan import (
    Event,
    Failure,
    LaunchPlan,
    LaunchRequest,
    PlannedCopy,
    Progress,
    Result,
)
from runtime_bridge.providers.process import StreamParser, run_json_lines

AGENT_DIR = "pi-agent"


def build_plan(request: LaunchRequest) -> LaunchPlan:
    """The argv, environment and files of one Pi launch (pure)."""
    memory = request.memory
    agent_dir = request.home_root / AGENT_DIR
    argv: list[str] = [request.executable or "pi", "-p", "--mode", "json"]
    if request.resume_id:
        argv += ["--session", request.resume_id]
    append = request.append_instructions
    prepend: list[str] = []
    overrides: dict[str, str] = {}
    if memory is not None:
        append = merge_instructions(append, protocol_text("cli"))
        if memory.cli_dir is not None:
            prepend.append(str(memory.cli_dir))
        overrides.update(memory.connection_env())
    if append and append.strip():
        argv += ["--append-system-prompt", append]
    argv += list(request.extra_args)
    copies: tuple[PlannedCopy, ...] = ()
    if request.provider_home_source is not None:
        # Another installation's sessions are its conversation history, not configuration.
        copies = (PlannedCopy(request.provider_home_source, agent_dir, exclude=("sessions",)),)
    env = launch_env(
        request.base_env,
        request.pass_env,
        homes={"PI_CODING_AGENT_DIR": str(agent_dir)},
        prepend_path=prepend,
        overrides=overrides,
    )
    return LaunchPlan(
        provider="pi",
        argv=tuple(argv),
        env=env,
        cwd=request.cwd,
        prompt=request.prompt,
        # Pi reads the prompt from stdin when none is given in argv; it has no ``--`` to keep a
        # prompt starting with "-" from being taken as a flag.
        stdin=request.prompt,
        copies=copies,
        directories=(agent_dir,),
        binding=memory.binding if memory else None,
        resume_id=request.resume_id,
        secrets=(memory.credential,) if memory else (),
    )


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
    )


class PiStream(StreamParser):
    """Parses ``--mode json`` lines."""

    def __init__(self) -> None:
        super().__init__()
        self.session_id: str | None = None
        self.last_text = ""
        self.usage: dict[str, int] = {}

    def feed(self, message: dict[str, Any]) -> list[Event]:
        kind = message.get("type")
        if kind == "session":
            self.session_id = str(message.get("id") or "") or None
        elif kind == "tool_execution_start":
            return [Progress(f"tool: {message.get('toolName')}")]
        elif kind == "message_end":
            body = message.get("message") or {}
            if body.get("role") != "assistant":
                return []
            for key, value in (body.get("usage") or {}).items():
                if isinstance(value, int):
                    self.usage[key] = self.usage.get(key, 0) + value
            if body.get("stopReason") in ("error", "aborted"):
                self.failure = Failure(f"pi failed: {body.get('errorMessage') or 'model error'}")
                return []
            text = _text(body)
            if text:
                self.last_text = text
                return [Progress(text)]
        elif kind == "agent_end" and self.failure is None:
            self.result = Result(self.last_text, self.session_id, dict(self.usage))
        return []


def run(plan: LaunchPlan, approver: Approver | None = None) -> AsyncIterator[Event]:
    """Run a Pi plan, yielding progress and then one ``Result`` or ``Failure``."""
    return run_json_lines(plan, PiStream, approver)
