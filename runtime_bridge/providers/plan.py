"""What a launch is: the request, the plan built from it, and the events a run yields. Pure.

A provider adapter turns a ``LaunchRequest`` into a ``LaunchPlan`` without touching the disk or
the environment, so the exact argv, environment and files of a launch can be shown
(``amux runtime plan``) and tested before anything runs. The runner then materialises the plan's
files and starts the process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime_bridge.launch_env import DEFAULT_PASS_ENV, MEMORY_UNAVAILABLE, NO_OWNER_TOKEN
from runtime_bridge.network import Door

# The prompt that is the Agent's own compaction of its resumed session, not words to it: Claude's
# CLI runs it as its command, and the Codex adapter starts Codex's compaction instead. The bot
# heads a person's words with their sender, so none arrive as exactly this.
COMPACT_COMMAND = "/compact"

MEMORY_SERVER = "memory"
"""The MCP server name memory tools are published under (``mcp__memory__…`` to the model)."""

# Where a run keeps its memory tooling (MCP config, CLI wrapper, connection file), below its
# run directory: removed with the run.
MEMORY_CONFIG_DIR = Path("agent-config") / "memory"

MASK = "********"
# Names of variables whose values are secrets: API keys, tokens, passwords, credentials.
_SECRET_NAME = re.compile(r"(_KEY$|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
# ``scheme://user:password@host``: the password part.
# Anchored where a scheme can begin, so a long run of letters is not retried from every one of
# them (quadratic on a large text).
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+(?=@)"
)
# Shorter values ("1", "true") are settings, not secrets, and masking them would garble text.
_MIN_SECRET_CHARS = 6


def mask_text(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each secret value, and every password inside a URL, replaced."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, text)


def secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values of variables whose names look secret (``*_KEY``, ``*TOKEN*``, …)."""
    return tuple(
        value
        for key, value in env.items()
        if _SECRET_NAME.search(key) and len(value) >= _MIN_SECRET_CHARS
    )


@dataclass(frozen=True)
class MemoryAttachment:
    """How a bound launch reaches memory. Present only when the Session is bound.

    ``mcp_argv`` starts the MCP server (``amux mcp``); ``cli_dir`` holds an ``amux`` executable
    put first on PATH for agents that use the CLI.
    """

    hub_url: str
    credential: str = field(repr=False)
    binding: str
    mcp_argv: tuple[str, ...]
    cli_dir: Path | None = None
    # Why this bound launch's memory calls must fail (the Hub could not be asked); its Agent
    # still gets the protocol and keeps its own memory off.
    unavailable: str | None = None

    def connection_env(self) -> dict[str, str]:
        """The variables ``amux mcp`` and ``amux memory`` read to reach the Hub."""
        env = {"AMUX_HUB_URL": self.hub_url, "AMUX_MEMORY_BINDING": self.binding}
        if self.credential:
            env["AMUX_TOKEN"] = self.credential
        if self.unavailable:
            env[MEMORY_UNAVAILABLE] = self.unavailable
        return {**env, **NO_OWNER_TOKEN}


@dataclass(frozen=True)
class GatewayPass:
    """How one launch reaches its models: through the worker's model gateway, never directly.

    ``url`` is the gateway's base (``http://127.0.0.1:PORT``; OpenAI-shaped clients add ``/v1``).
    ``keys`` are the launch's placeholder credentials by route (``anthropic``, ``openai``,
    ``pi:<provider>``): worthless outside the gateway, and only while the launch runs.
    ``hidden`` names further variables of the worker's environment holding a credential the
    gateway adds, kept out of the Agent's environment with the usual ones. ``pi_providers`` are
    the operator's Pi providers (``models.json``), their keys left out, rewritten per launch to
    point at the gateway.
    """

    url: str
    keys: Mapping[str, str] = field(repr=False)
    hidden: tuple[str, ...] = ()
    pi_providers: Mapping[str, Any] = field(default_factory=dict)

    def key(self, route: str) -> str:
        return self.keys.get(route, "")


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a provider adapter needs to plan one launch.

    ``run_dir`` holds per-run files (removed with the run); ``state_dir`` (default ``run_dir``)
    holds the agent's own home, which must outlive the run for a resume to find native state.
    ``provider_home_source`` is a Codex ``config.toml`` or a Pi agent directory copied into that
    home; nothing else of the service user's home is used.
    """

    provider: str
    prompt: str
    cwd: Path
    run_dir: Path
    resume_id: str | None = None
    append_instructions: str | None = None
    developer_instructions: str | None = None
    memory: MemoryAttachment | None = None
    executable: str | None = None
    extra_args: tuple[str, ...] = ()
    base_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    pass_env: tuple[str, ...] = DEFAULT_PASS_ENV
    provider_home_source: Path | None = None
    # Files copied into the provider's home when this launch makes it (``codex_seed``).
    home_seed: tuple[Path, ...] = ()
    state_dir: Path | None = None
    # The operator's own MCP servers (name -> Claude's server config), beside amux memory.
    mcp_servers: Mapping[str, Any] = field(default_factory=dict)
    # ``ask``, ``auto`` or ``read-only`` (see runtime_bridge.approvals).
    permissions: str = "auto"
    # The command that runs amux's own CLI (``amux``), for in-sandbox helpers such as Claude's
    # permission prompt; empty: no helper can be started, so nothing can be asked.
    amux_argv: tuple[str, ...] = ()
    # The model gateway this launch's requests go through; None (a caller outside a worker):
    # the Agent is given the provider settings of ``base_env`` as they are.
    gateway: GatewayPass | None = None
    # The model the conversation asks for (``/model``), after the operator's arguments so it
    # wins; None: the Agent's own default.
    model: str | None = None
    # Resume a copy of ``resume_id`` (a side question's), leaving that session as it was.
    fork: bool = False

    @property
    def compacts(self) -> bool:
        """Whether this turn is the compaction of the resumed session rather than a prompt."""
        return self.prompt == COMPACT_COMMAND and self.resume_id is not None

    @property
    def home_root(self) -> Path:
        return self.state_dir or self.run_dir


@dataclass(frozen=True)
class PlannedFile:
    """A file the runner writes before starting the agent."""

    path: Path
    content: str
    mode: int = 0o600


@dataclass(frozen=True)
class PlannedCopy:
    """A file or directory the runner copies into the launch's own home."""

    source: Path
    destination: Path
    exclude: tuple[str, ...] = ()
    # Copied only when this launch makes the destination's directory: a seed for a new home,
    # never written over what a conversation's earlier turns left there.
    only_when_new: bool = False


@dataclass(frozen=True)
class CodexThread:
    """The app-server calls a Codex launch makes after ``initialize``.

    ``developer_instructions`` is amux's part (the operator's amux setting, then the memory
    protocol); at launch it is merged after the ``developer_instructions`` of Codex's own
    effective configuration, which ``config/read`` reports, so sending it never replaces what
    the operator configured for Codex. Base instructions are never sent.
    """

    developer_instructions: str | None
    memory_disabled: bool
    approval_policy: str = "never"
    instruction_sources: tuple[str, ...] = ()
    # Open the resumed thread as a fork of it (a side question's), leaving the thread as it was.
    fork: bool = False
    # The turn is Codex's own compaction of the resumed thread (``thread/compact/start``), not a
    # prompt.
    compact: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    """One launch, fully decided: run it with ``runtime_bridge.providers.run``."""

    provider: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    prompt: str
    stdin: str | None = None
    files: tuple[PlannedFile, ...] = ()
    copies: tuple[PlannedCopy, ...] = ()
    directories: tuple[Path, ...] = ()
    warnings: tuple[str, ...] = ()
    binding: str | None = None
    resume_id: str | None = None
    codex: CodexThread | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # (uid, gid) the Agent runs as, and owns its files as; None: the worker's own user.
    run_as: tuple[int, int] | None = None
    # The directories the plan's files, copies and directories are written beneath.
    roots: tuple[Path, ...] = ()
    # The ``bwrap … --`` prefix the Agent runs under; empty: no sandbox.
    sandbox: tuple[str, ...] = ()
    # The ``agent_exec … --`` prefix before it (cgroups, limits, keyring, seccomp filter).
    confine: tuple[str, ...] = ()
    # The permission policy the launch runs under, and the socket in-sandbox helpers ask on
    # (None: nothing in the sandbox asks).
    permissions: str = "auto"
    approval_socket: Path | None = None
    # The relay's words after the user switch (the launch's doors; runtime_bridge.network), and
    # the doors it opens; empty: the launch shares the host's network.
    relay: tuple[str, ...] = ()
    doors: tuple[Door, ...] = ()
    # The turn it runs for: a launcher outside this host names what it makes for the launch by it.
    execution_id: str | None = None
    # Objects a project checkout borrows (its default branch's), which the Agent reads: a
    # launcher outside this host gives them to the Agent with its workspace.
    borrowed: tuple[Path, ...] = ()

    def mask(self, text: str) -> str:
        """``text`` with every secret of this plan (its credential, secret-named variables of its
        environment, passwords inside URLs) replaced."""
        return mask_text(text, (*self.secrets, *secret_values(self.env)))

    def to_json(self, mask_secrets: bool = True) -> dict[str, Any]:
        """A JSON-ready view of the plan; secrets masked unless ``mask_secrets`` is false."""

        def clean(text: str) -> str:
            return self.mask(text) if mask_secrets else text

        def env_value(key: str, value: str) -> str:
            if mask_secrets and _SECRET_NAME.search(key):
                return MASK
            return clean(value)

        out: dict[str, Any] = {
            "provider": self.provider,
            "argv": [clean(a) for a in self.argv],
            "env": {k: env_value(k, v) for k, v in self.env.items()},
            "cwd": str(self.cwd),
            "prompt": self.prompt,
            "stdin": "prompt" if self.stdin is not None else None,
            "files": [
                {"path": str(f.path), "mode": f"{f.mode:04o}", "content": clean(f.content)}
                for f in self.files
            ],
            "copies": [
                {"source": str(c.source), "destination": str(c.destination)} for c in self.copies
            ],
            "sandbox": [clean(a) for a in self.sandbox],
            "confine": [clean(a) for a in self.confine],
            "run_as": list(self.run_as) if self.run_as is not None else None,
            "warnings": list(self.warnings),
            "binding": self.binding,
            "resume_id": self.resume_id,
            "permissions": self.permissions,
            "approval_socket": str(self.approval_socket) if self.approval_socket else None,
            "relay": list(self.relay),
            "doors": [d.to_json() for d in self.doors],
        }
        if self.codex is not None:
            out["codex"] = {
                "developer_instructions": self.codex.developer_instructions,
                "developer_instructions_sources": list(self.codex.instruction_sources),
                "memory_disabled": self.codex.memory_disabled,
                "approval_policy": self.codex.approval_policy,
                "fork": self.codex.fork,
                "compact": self.codex.compact,
            }
        # A secret can hide inside structured text such as JSON file content.
        return json.loads(clean(json.dumps(out))) if mask_secrets else out


@dataclass(frozen=True)
class Progress:
    """Something the agent did or said before finishing."""

    text: str


# A plan keeps at most this many steps, each cut to this many characters, and its JSON at most
# this many bytes: within one event's bound (``hub.eventbudget.MAX_EVENT_BYTES``), so a plan event
# is never cut in the middle of its JSON.
PLAN_STEPS = 40
PLAN_STEP_CHARS = 200
PLAN_JSON_BYTES = 12 * 1024
PLAN_STATUSES = ("pending", "in_progress", "completed")


@dataclass(frozen=True)
class PlanUpdate:
    """The Agent's plan as it now stands (its whole checklist, each step with its status:
    pending, in_progress or completed)."""

    steps: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, steps: list[tuple[str, str]]) -> PlanUpdate:
        """A plan from what an Agent reported: steps bounded, unknown statuses as pending."""
        kept: list[tuple[str, str]] = []
        size = 2
        for text, status in steps[:PLAN_STEPS]:
            if not text.strip():
                continue
            known = status if status in PLAN_STATUSES else "pending"
            step = (text.strip()[:PLAN_STEP_CHARS], known)
            size += len(cls((step,)).to_json().encode("utf-8", "surrogatepass"))
            if size > PLAN_JSON_BYTES:
                break
            kept.append(step)
        return cls(tuple(kept))

    def to_json(self) -> str:
        return json.dumps([{"step": t, "status": s} for t, s in self.steps], ensure_ascii=False)


STEP_ACTIONS = ("read", "edit", "run", "search", "tool", "compact")
# A step's subject (a path, a command's first words, a tool's name) at most.
STEP_SUBJECT_CHARS = 160


@dataclass(frozen=True)
class ToolStep:
    """One tool call of the Agent: ``action`` read, edit, run, search or tool, and what it acted
    on (a path, a command's first words, a query, or the tool's name)."""

    action: str
    subject: str

    @classmethod
    def of(cls, action: str, subject: str) -> ToolStep:
        """A step bounded for its event: a known action, a subject on one line, cut."""
        shown = " ".join(subject.split())
        if len(shown) > STEP_SUBJECT_CHARS:
            shown = shown[: STEP_SUBJECT_CHARS - 1] + "…"
        return cls(action if action in STEP_ACTIONS else "tool", shown)

    def to_json(self) -> str:
        return json.dumps({"action": self.action, "subject": self.subject}, ensure_ascii=False)


@dataclass(frozen=True)
class Result:
    """The agent's final answer and the native id to resume its conversation with."""

    text: str
    native_session_id: str | None
    usage: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """The agent ran but did not finish the turn."""

    message: str


Event = Progress | PlanUpdate | ToolStep | Result | Failure
