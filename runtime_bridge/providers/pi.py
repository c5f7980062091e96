"""Pi adapter: ``pi -p --mode json``.

Pi has no MCP, so a bound launch reaches memory through the ``amux`` CLI run by Pi's bash tool:
the launch puts the attachment's CLI directory first on PATH, passes the Hub connection variables,
and appends the CLI variant of the protocol to the system prompt. Pi keeps its sessions under its
agent directory, which each launch sets to its own home.

Through the worker's model gateway (``runtime_bridge.gateway``) the launch's ``models.json`` is
its own: the operator's providers (and Pi's built-in ``anthropic`` and ``openai``) with the
gateway's URL as ``baseUrl`` and the launch's placeholder as ``apiKey``; the operator's file,
whose keys may be literal, is not copied.

Pi has no permission system; the launch's policy becomes flags and an extension:

- ``auto``: Pi as it is, every tool running at once;
- ``read-only``: only the ``read`` and ``bash`` tools are offered, so the model is not handed edit
  tools that would fail on the read-only workspace (its shell commands still meet that mount);
- ``ask``: the extension ``pi_permissions.js``, written into the run directory and loaded with
  ``--extension``, sees each tool call before it runs (Pi's ``tool_call`` event) and asks the
  worker over the approval socket; ``describe`` decides which calls need a person. Discovered
  extensions (the agent directory's, the workspace's ``.pi/extensions``) are not loaded: one could
  rewrite a call's arguments after it was approved, or run code at start-up nobody approved.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from runtime_bridge import approvals, shell_reading
from runtime_bridge.approvals import ApprovalRequest, Approver
from runtime_bridge.launch_env import launch_env
from runtime_bridge.memoryprotocol import merge_instructions, protocol_text
from runtime_bridge.providers.plan import (
    Event,
    Failure,
    GatewayPass,
    LaunchPlan,
    LaunchRequest,
    PlannedCopy,
    PlannedFile,
    Progress,
    Result,
)
from runtime_bridge.providers.process import LOCAL, Launcher, StreamParser, run_json_lines
from runtime_bridge.providers.steps import tool_step

AGENT_DIR = "pi-agent"
MODELS_FILE = "models.json"
# Where the permission extension is written, below the run directory (read-only in the sandbox).
EXTENSION_FILE = Path("agent-config") / "pi" / "amux-permissions.js"
# Read once: a plan carries the extension's text, so building one touches no disk.
EXTENSION_TEXT = (Path(__file__).parent / "pi_permissions.js").read_text(encoding="utf-8")
# What a read-only launch offers: Pi's default tools without ``edit`` and ``write``. Pi's
# ``grep``/``find`` tools are left out because they fetch ripgrep/fd when those are missing.
READ_ONLY_TOOLS = "read,bash"


def gateway_models(gateway: GatewayPass) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The ``providers`` of a launch's ``models.json`` behind the gateway, and its warnings.

    Each of the operator's providers Pi reaches over an API the gateway carries gets the
    gateway's URL and the launch's placeholder for it; the built-in ``anthropic`` and ``openai``
    providers are pointed there too. A provider speaking another API keeps its own settings
    and is said to bypass the gateway.
    """
    models: dict[str, Any] = {}
    warnings: list[str] = []
    for name, entry in gateway.pi_providers.items():
        route = f"pi:{name}"
        if route not in gateway.keys:
            warnings.append(
                f"pi provider {name!r} speaks an API the model gateway does not carry "
                f"({entry.get('api')}); its requests go out directly"
            )
            models[name] = dict(entry)
            continue
        models[name] = {**entry, **_through(gateway, route, entry.get("api"), name)}
    for name in ("anthropic", "openai"):
        if name not in models:
            models[name] = _through(gateway, name, None, name)
    return models, tuple(warnings)


def _through(gateway: GatewayPass, route: str, api: Any, name: str) -> dict[str, str]:
    anthropic = api == "anthropic-messages" or (api is None and name == "anthropic")
    # Anthropic's clients add /v1 themselves; OpenAI's expect it in the base URL.
    base = gateway.url if anthropic else f"{gateway.url}/v1"
    return {"baseUrl": base, "apiKey": gateway.key(route)}


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
    if request.model:
        argv += ["--model", request.model]
    files: tuple[PlannedFile, ...] = ()
    socket: Path | None = None
    # After the operator's arguments, so that the policy is what holds.
    if request.permissions == approvals.READ_ONLY:
        argv += ["--tools", READ_ONLY_TOOLS]
    elif request.permissions == approvals.ASK:
        extension = request.run_dir / EXTENSION_FILE
        socket = request.run_dir / approvals.SOCKET_NAME
        files = (PlannedFile(extension, EXTENSION_TEXT),)
        argv += ["--no-extensions", "--extension", str(extension)]
        overrides[approvals.SOCKET_ENV] = str(socket)
    copies: tuple[PlannedCopy, ...] = ()
    gateway = request.gateway
    # Another installation's sessions are its conversation history, not configuration; behind
    # the gateway its models.json (which may hold keys) is replaced by the launch's own.
    exclude = ("sessions", MODELS_FILE) if gateway is not None else ("sessions",)
    if request.provider_home_source is not None:
        copies = (PlannedCopy(request.provider_home_source, agent_dir, exclude=exclude),)
    warnings: tuple[str, ...] = ()
    if gateway is not None:
        models, warnings = gateway_models(gateway)
        text = json.dumps({"providers": models}, indent=2) + "\n"
        files = (*files, PlannedFile(agent_dir / MODELS_FILE, text))
    env = launch_env(
        request.base_env,
        request.pass_env,
        homes={"PI_CODING_AGENT_DIR": str(agent_dir)},
        prepend_path=prepend,
        overrides=overrides,
        gateway={} if gateway is not None else None,
        hidden=gateway.hidden if gateway else (),
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
        files=files,
        copies=copies,
        directories=(agent_dir,),
        warnings=warnings,
        binding=memory.binding if memory else None,
        resume_id=request.resume_id,
        secrets=(memory.credential,) if memory else (),
        permissions=request.permissions,
        approval_socket=socket,
    )


# Pi's tools that only read; ``write`` and ``edit`` change files; ``bash`` is judged per command.
READ_TOOLS = frozenset({"read", "grep", "find", "ls"})
EDIT_TOOLS = frozenset({"write", "edit"})


def _edit_detail(tool_input: Mapping[str, Any]) -> str:
    """The change an edit makes, as removed and added lines per replacement."""
    lines: list[str] = []
    edits = tool_input.get("edits")
    for edit in edits if isinstance(edits, list) else []:
        if not isinstance(edit, dict):
            continue
        lines += [f"- {line}" for line in str(edit.get("oldText", "")).splitlines()]
        lines += [f"+ {line}" for line in str(edit.get("newText", "")).splitlines()]
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def describe(tool: str, tool_input: Mapping[str, Any]) -> ApprovalRequest | None:
    """What a person is asked about one of Pi's tool calls, or None when it only reads."""
    if tool in READ_TOOLS:
        return None
    if tool == "bash":
        command = tool_input.get("command")
        if isinstance(command, str) and shell_reading.reads_only(command):
            return None
        return ApprovalRequest("bash", approvals.COMMAND, str(command or ""))
    if tool in EDIT_TOOLS:
        path = str(tool_input.get("path") or "")
        if tool == "write":
            detail = str(tool_input.get("content") or "")
        else:
            detail = _edit_detail(tool_input)
        return ApprovalRequest(tool, approvals.EDIT, path, detail).bounded()
    # A tool of an extension the operator named: amux cannot tell what it does.
    return ApprovalRequest(tool, approvals.TOOL, tool, json.dumps(dict(tool_input))).bounded()


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
            return [tool_step(str(message.get("toolName")), message.get("args"))]
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


def run(
    plan: LaunchPlan, approver: Approver | None = None, launcher: Launcher = LOCAL
) -> AsyncIterator[Event]:
    """Run a Pi plan, yielding progress and then one ``Result`` or ``Failure``."""
    return run_json_lines(plan, PiStream, approver, describe, launcher)
