"""Whether an Agent's own uid can run what its launch names.

A root worker runs each Agent as an unprivileged uid of its own (``agent_users``). Being root, the
worker finds a program anywhere; the Agent's uid does not get past a directory closed to others
(an installation under ``/root``, or in a ``mktemp -d`` directory, which is 0700). Such a program is
named before the launch with the directory to fix, where the Agent's CLI would otherwise fail on
every turn with a bare "Permission denied".

Inside the sandbox only what is bound counts: the directories bwrap makes above a bound
installation are its own (0755, or 0111 under a hidden path), so a closed directory above the
installation does not stop the Agent, and one inside it does (a bind keeps the host's permissions).

The answer comes from the permission bits, checked as the kernel checks them for a uid holding only
its own group (``setpriv --clear-groups``). A path carrying an access ACL counts as reachable: the
ACL may grant what its bits do not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime_bridge.mcp_launcher import SHIM
from runtime_bridge.providers.errors import ExecutableUnreachable
from runtime_bridge.providers.plan import LaunchPlan
from runtime_bridge.sandbox import _shebang_interpreter

READ = 4
EXECUTE = 1
ACL = "system.posix_acl_access"


@dataclass(frozen=True)
class Blocked:
    """What stops a uid: ``path`` (a directory on the way, or the file) lacks a permission."""

    path: str
    problem: str
    change: str

    def describe(self) -> str:
        return f"{self.path} {self.problem}"


def _has_acl(path: str) -> bool:
    try:
        return ACL in os.listxattr(path)
    except OSError:
        return False


def _denied(path: str, wanted: int, uid: int, gid: int) -> Blocked | None:
    try:
        info = os.stat(path)
    except OSError:
        return None  # A missing path fails the launch its own way.
    if info.st_uid == uid:
        shift, who, letter = 6, "its owner", "u"
    elif info.st_gid == gid:
        shift, who, letter = 3, "its group", "g"
    else:
        shift, who, letter = 0, "others", "o"
    missing = wanted & ~(info.st_mode >> shift)
    if not missing & (READ | EXECUTE) or _has_acl(path):
        return None
    if os.path.isdir(path):
        return Blocked(path, f"is not searchable by {who}", f"chmod {letter}+x {path}")
    if missing & EXECUTE:
        return Blocked(path, f"is not executable by {who}", f"chmod {letter}+x {path}")
    return Blocked(path, f"is not readable by {who}", f"chmod {letter}+r {path}")


def _directories(path: str) -> list[str]:
    """The directories a lookup of ``path`` searches, outermost first: those it names and,
    past a link, the real ones."""
    found: list[str] = []
    for spelled in (os.path.abspath(path), os.path.realpath(path)):
        for parent in reversed(Path(spelled).parents):
            if str(parent) not in found:
                found.append(str(parent))
    return found


def _inside(path: str, roots: Sequence[Path] | None) -> bool:
    if roots is None:
        return True
    # Part tuples, not ``root in here.parents``: that builds every parent as a path of its own.
    parts = Path(path).parts
    return any(parts[: len(root.parts)] == root.parts for root in roots)


def unreachable(
    path: str, uid: int, gid: int, wanted: int, within: Sequence[Path] | None = None
) -> Blocked | None:
    """What stops ``uid``/``gid`` from ``wanted`` (``READ``, ``EXECUTE``) on ``path``; None
    when nothing does. ``within``: the sandbox's bound trees, where only their insides count."""
    for directory in _directories(path):
        if _inside(directory, within):
            blocked = _denied(directory, EXECUTE, uid, gid)
            if blocked is not None:
                return blocked
    return _denied(path, wanted, uid, gid) if _inside(path, within) else None


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def unrunnable(
    executable: str,
    uid: int,
    gid: int,
    search_path: str,
    within: Sequence[Path] | None = None,
) -> Blocked | None:
    """What stops ``uid`` running ``executable``: the program itself (a script must be
    readable too) or the interpreter its ``#!`` line names (by ``env``: the first one on
    ``search_path`` it may run, as ``env`` itself looks)."""
    script = _is_script(executable)
    blocked = unreachable(executable, uid, gid, EXECUTE | (READ if script else 0), within)
    if blocked is not None or not script:
        return blocked
    interpreter = _shebang_interpreter(executable)
    if interpreter is None:
        return None
    if os.sep in interpreter:
        return unreachable(interpreter, uid, gid, EXECUTE, within)
    candidates = [
        os.path.join(directory, interpreter)
        for directory in search_path.split(os.pathsep)
        if directory and os.path.isfile(os.path.join(directory, interpreter))
    ]
    first: Blocked | None = None
    for candidate in candidates:
        blocked = unreachable(candidate, uid, gid, EXECUTE, within)
        if blocked is None:
            return None
        first = first or blocked
    return first


def check_launch(
    plan: LaunchPlan,
    executable: str,
    amux_executables: Sequence[str],
    within: Sequence[Path] | None = None,
) -> None:
    """Refuse a launch whose Agent uid cannot run its CLI, or use amux's own installation
    (``amux_executables``, the Python and CLI its memory tools and permission prompts run,
    and the MCP shim that Python reads).

    Raises:
        ExecutableUnreachable: naming the directory or file to fix.
    """
    if plan.run_as is None:
        return  # The worker's own uid: what it found, it can run.
    uid, gid = plan.run_as
    search_path = plan.env.get("PATH", "")
    blocked = unrunnable(executable, uid, gid, search_path, within)
    if blocked is not None:
        what = f"the {plan.provider} executable {executable}"
        raise _refusal(what, executable, blocked, plan, "the CLI")
    if not amux_executables:
        return
    for amux in dict.fromkeys(amux_executables):
        blocked = unrunnable(amux, uid, gid, search_path, within)
        if blocked is not None:
            raise _refusal(f"amux's own {amux}", amux, blocked, plan, "amux")
    blocked = unreachable(str(SHIM), uid, gid, READ, within)
    if blocked is not None:
        raise _refusal(f"amux's own {SHIM}", str(SHIM), blocked, plan, "amux")


def _refusal(
    what: str, executable: str, blocked: Blocked, plan: LaunchPlan, moved: str
) -> ExecutableUnreachable:
    assert plan.run_as is not None
    return ExecutableUnreachable(
        f"{what} cannot be run by the Agent's user (uid {plan.run_as[0]}): "
        f"{blocked.describe()}; {advice(blocked, moved)}",
        executable=executable,
        provider=plan.provider,
        blocked=blocked.path,
    )


def advice(blocked: Blocked, moved: str) -> str:
    """How to fix ``blocked``: open it up, or move ``moved`` somewhere others may enter."""
    if blocked.problem.startswith("is not searchable"):
        return f"make it traversable ({blocked.change}) or install {moved} elsewhere"
    return f"{blocked.change}, or install {moved} elsewhere"


def amux_programs(amux: str) -> tuple[str, ...]:
    """What of amux's own installation an Agent runs: this Python (the MCP shim) and the CLI."""
    return (sys.executable, amux)


def amux_in_use(
    plan: LaunchPlan, programs: Sequence[str], memory_cli: Path | None
) -> tuple[str, ...]:
    """Which of amux's ``programs`` the launch runs: those its argv or files name (an MCP
    server's command, Claude's permission prompt), and all of them when its memory CLI
    (``memory_cli``, whose wrapper runs amux) is on its PATH. A declared provider's launch,
    given none of them, does not depend on where amux is installed."""
    path = plan.env.get("PATH", "").split(os.pathsep)
    if memory_cli is not None and str(memory_cli) in path:
        return tuple(programs)
    texts = [*plan.argv, *(planned.content for planned in plan.files)]
    return tuple(p for p in programs if any(p in text for text in texts))
