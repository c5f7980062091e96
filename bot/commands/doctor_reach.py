"""``amux doctor``'s check that an Agent's uid can run what its launches need, where it is.

A root worker runs Agents as unprivileged uids of their own, which do not get past a directory
closed to others above an installation (one under ``/root``, or in a ``mktemp -d`` directory).
The check reads permissions as a launch's own (``runtime_bridge.reach``) does: with the sandbox
on, only inside the directories it would bind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from bot.commands.doctor import Check
from hub.errors import AmuxError
from runtime_bridge.agent_users import DYNAMIC_UIDS, configured_user
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.mcp_launcher import SHIM
from runtime_bridge.reach import READ, Blocked, advice, amux_programs, unreachable, unrunnable
from runtime_bridge.sandbox import (
    SYSTEM_PATHS,
    amux_installation,
    find_installations,
    service_hidden,
)
from runtime_bridge.worker import default_amux_executable

NAME = "agent_reach"


def check_agent_reach(runtime: RuntimeSettings, home: Path, euid: int | None = None) -> Check:
    """Whether the Agents' uids can run each installed Agent CLI (a failure: its every turn
    would be refused) and amux's own Python, CLI and MCP shim (a warning: memory tools and
    permission prompts need them)."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return Check(NAME, "skip", "Agents run as this service's own uid")
    try:
        uid, gid = (
            configured_user(runtime.run_as)
            if runtime.run_as
            else (DYNAMIC_UIDS.start, DYNAMIC_UIDS.start)
        )
    except AmuxError:
        return Check(NAME, "skip", "needs a valid AMUX_RUNTIME_RUN_AS (see agent_user)")
    search = os.environ.get("PATH", os.defpath)
    hidden = service_hidden(amux_home=home, work_dir=runtime.work_dir_beside(home))
    amux = amux_programs(runtime.amux or default_amux_executable())

    def bound(executables: Sequence[str]) -> tuple[Path, ...] | None:
        if runtime.sandbox == "off":
            return None
        found = [e for e in executables if os.path.exists(e)]
        installed = find_installations(found, search, hidden)
        return (*installed, *amux_installation(hidden), *(Path(p) for p in SYSTEM_PATHS))

    failed: list[tuple[str, Blocked]] = []
    reached: list[str] = []
    for provider in runtime.accepted_providers():
        path = shutil.which(runtime.executable(provider) or provider)
        if path is None:
            continue  # Not installed: the agent_<provider> check says so.
        blocked = unrunnable(path, uid, gid, search, bound([path, *amux]))
        if blocked is None:
            reached.append(provider)
        else:
            failed.append((f"{provider} ({path})", blocked))
    warned: list[tuple[str, Blocked]] = []
    within = bound(amux)
    for program in dict.fromkeys(amux):
        blocked = unrunnable(program, uid, gid, search, within)
        if blocked is not None:
            warned.append((f"amux's own {program}", blocked))
            break
    else:
        blocked = unreachable(str(SHIM), uid, gid, READ, within)
        if blocked is not None:
            warned.append((f"amux's own {SHIM}", blocked))
    who = f"uid {uid}"
    if failed or warned:
        detail = "; ".join(
            f"{what} cannot be run by an Agent's user ({who}): {blocked.describe()}"
            for what, blocked in (*failed, *warned)
        )
        if not failed:
            detail += " (memory tools and permission prompts cannot run)"
        fixes = [advice(b, "the CLI") for _, b in failed] + [advice(b, "amux") for _, b in warned]
        return Check(NAME, "fail" if failed else "warn", detail, "; ".join(dict.fromkeys(fixes)))
    names = ", ".join(reached) if reached else "no Agent CLI installed"
    return Check(NAME, "ok", f"an Agent's user ({who}) can run {names} and amux's own programs")
