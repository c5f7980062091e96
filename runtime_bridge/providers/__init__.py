"""Provider adapters: a pure plan builder and an I/O runner per agent CLI.

    plan = build_plan(LaunchRequest(provider="claude", ...))   # pure: argv, env, files
    async for event in run(plan): ...                          # Progress…, then Result | Failure

``run`` raises (``ExecutableMissing``, ``NativeMemoryUnconfirmed``, ``AgentProtocolError``) when
the launch cannot start as planned; a started agent that fails its turn yields ``Failure``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from types import ModuleType

from runtime_bridge.approvals import Approver, deny_all
from runtime_bridge.providers import claude, codex, generic, pi
from runtime_bridge.providers.errors import (
    AgentProtocolError,
    ExecutableMissing,
    NativeMemoryUnconfirmed,
)
from runtime_bridge.providers.plan import (
    CodexThread,
    Event,
    Failure,
    LaunchPlan,
    LaunchRequest,
    MemoryAttachment,
    PlannedCopy,
    PlannedFile,
    PlanUpdate,
    Progress,
    Result,
    ToolStep,
)
from runtime_bridge.providers.process import (
    LOCAL,
    AgentInput,
    AgentProcess,
    Launcher,
    LocalLauncher,
)

ADAPTERS: dict[str, ModuleType] = {"claude": claude, "codex": codex, "pi": pi}
MEMORY_PROVIDERS = frozenset(ADAPTERS)
NOBODY_TO_ASK = "this launch has nobody to ask for permission"


def _adapter(provider: str) -> ModuleType:
    return ADAPTERS.get(provider, generic)


def build_plan(request: LaunchRequest) -> LaunchPlan:
    """The launch plan for ``request.provider`` (pure)."""
    builder: Callable[[LaunchRequest], LaunchPlan] = _adapter(request.provider).build_plan
    # Every file a plan writes lies beneath the run directory or the Agent's own home.
    roots = tuple(dict.fromkeys((request.run_dir, request.home_root)))
    return dataclasses.replace(builder(request), roots=roots)


def run(
    plan: LaunchPlan, approver: Approver | None = None, launcher: Launcher = LOCAL
) -> AsyncIterator[Event]:
    """Run a plan with its provider's runner; ``approver`` answers its permission requests
    (None: every request is denied, since nobody can be asked); ``launcher`` starts and stops
    its process."""
    runner: Callable[[LaunchPlan, Approver, Launcher], AsyncIterator[Event]] = _adapter(
        plan.provider
    ).run
    return runner(plan, approver or deny_all(NOBODY_TO_ASK), launcher)


__all__ = [
    "ADAPTERS",
    "MEMORY_PROVIDERS",
    "AgentInput",
    "AgentProcess",
    "AgentProtocolError",
    "CodexThread",
    "Event",
    "ExecutableMissing",
    "Failure",
    "LOCAL",
    "LaunchPlan",
    "LaunchRequest",
    "Launcher",
    "LocalLauncher",
    "MemoryAttachment",
    "NativeMemoryUnconfirmed",
    "PlannedCopy",
    "PlannedFile",
    "PlanUpdate",
    "Progress",
    "Result",
    "ToolStep",
    "build_plan",
    "run",
]
