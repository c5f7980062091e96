"""What a memory write does on disk before the Hub answers, traced with strace on ``amux serve``.

An acknowledged upsert is durable: the temporary file was synced, renamed onto the document, and
the directory holding it synced, all before the answer. An acknowledged forget: the document was
unlinked and its directory synced. strace writes each syscall's line when the call returns, while
the traced thread is still stopped, so a line in the log read after the answer was sent before it.
File descriptors are matched to paths through the ``openat`` results earlier in the same log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import HubProcess, running_hub

pytestmark = pytest.mark.e2e

SYSCALLS = (
    "fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,openat,mkdir,mkdirat,link,linkat,"
    # A directory may be synced through a duplicate of its descriptor, on another thread.
    "dup,dup2,dup3,fcntl"
)
# -s: paths are longer than strace's default 32-character strings.
STRACE = ["strace", "-f", "--seccomp-bpf", "-s", "4096", "-e", f"trace={SYSCALLS}"]
TEMP_NAME = re.compile(r"^\.amux-tmp-[0-9a-f]+$")

_COMPLETE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)")
_UNFINISHED = re.compile(r"^(\w+)\((.*) <unfinished \.\.\.>$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)\)\s+=\s+(-?\d+|\?)")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Op:
    """One syscall on a path, in the order the calls returned."""

    line: int
    name: str
    path: str
    target: str = ""
    flags: str = ""


def _args(text: str) -> list[str]:
    """Top-level comma-separated arguments; strings are kept whole."""
    parts: list[str] = []
    current = ""
    quoted = escaped = False
    for char in text:
        if quoted:
            current += char
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
            current += char
        elif char == ",":
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _string(arg: str) -> str:
    found = _STRING.fullmatch(arg)
    assert found, f"not a string argument: {arg}"
    return found.group(1)


def trace_ops(log: Path, tids: set[int], cwd: Path) -> list[Op]:
    """The path operations of the threads ``tids`` in a ``strace -f`` log."""
    fds: dict[int, str] = {}
    pending: dict[int, tuple[str, str]] = {}
    ops: list[Op] = []

    def at(dirfd: str, name: str) -> str:
        if name.startswith("/"):
            return name
        base = str(cwd) if dirfd == "AT_FDCWD" else fds.get(int(dirfd), f"<fd {dirfd}>")
        return f"{base}/{name}"

    for number, line in enumerate(log.read_text(errors="replace").splitlines()):
        tid_text, _, rest = line.partition(" ")
        if not tid_text.isdigit() or int(tid_text) not in tids:
            continue
        tid = int(tid_text)
        rest = rest.strip()
        if unfinished := _UNFINISHED.match(rest):
            pending[tid] = (unfinished.group(1), unfinished.group(2))
            continue
        if resumed := _RESUMED.match(rest):
            name, head = pending.pop(tid, (resumed.group(1), ""))
            arguments, result = head + resumed.group(2), resumed.group(3)
        elif complete := _COMPLETE.match(rest):
            name, arguments, result = complete.groups()
        else:
            continue
        if result == "?" or int(result) < 0:
            continue
        args = _args(arguments)
        if name == "openat":
            path = at(args[0], _string(args[1]))
            fds[int(result)] = path
            ops.append(Op(number, "open", path, flags=args[2]))
        elif name == "dup" or (name == "fcntl" and args[1].startswith("F_DUPFD")):
            fds[int(result)] = fds.get(int(args[0]), f"<fd {args[0]}>")
        elif name in ("dup2", "dup3"):
            fds[int(args[1])] = fds.get(int(args[0]), f"<fd {args[0]}>")
        elif name in ("fsync", "fdatasync"):
            ops.append(Op(number, "fsync", fds.get(int(args[0]), f"<fd {args[0]}>")))
        elif name == "rename":
            ops.append(Op(number, "rename", _string(args[0]), _string(args[1])))
        elif name in ("renameat", "renameat2"):
            source = at(args[0], _string(args[1]))
            ops.append(Op(number, "rename", source, at(args[2], _string(args[3]))))
        elif name == "link":
            ops.append(Op(number, "link", _string(args[0]), _string(args[1])))
        elif name == "linkat":
            source = at(args[0], _string(args[1]))
            ops.append(Op(number, "link", source, at(args[2], _string(args[3]))))
        elif name == "unlink":
            ops.append(Op(number, "unlink", _string(args[0])))
        elif name == "unlinkat":
            removed = at(args[0], _string(args[1]))
            ops.append(Op(number, "rmdir" if "AT_REMOVEDIR" in args[2] else "unlink", removed))
        elif name == "mkdir":
            ops.append(Op(number, "mkdir", _string(args[0])))
        elif name == "mkdirat":
            ops.append(Op(number, "mkdir", at(args[0], _string(args[1]))))
    return ops


def first(ops: list[Op], name: str, path: str, after: int = -1) -> Op:
    """The first ``name`` on ``path`` whose line comes after ``after``."""
    for op in ops:
        if op.name == name and op.path == path and op.line > after:
            return op
    raise AssertionError(f"no {name} of {path} after line {after}:\n" + "\n".join(map(str, ops)))


@dataclass
class TracedHub:
    hub: HubProcess
    log: Path
    memory: Path

    def tids(self) -> set[int]:
        """The Hub's threads; its children (agent helpers) have fd tables of their own."""
        return {int(tid) for tid in os.listdir(f"/proc/{self.hub.pid}/task")}

    def call(self, method: str, **params: Any) -> tuple[dict[str, Any], list[Op]]:
        """One RPC, and the path operations the Hub logged from its start until the answer."""
        start = self.log.read_text(errors="replace").count("\n")
        status, body = self.hub.rpc(method, **params)
        assert status == 200, body
        # Read only now: whatever the log holds was done before the answer arrived.
        ops = trace_ops(self.log, self.tids(), self.hub.home.parent)
        return body, [op for op in ops if op.line >= start]


def strace_refusal(log: Path) -> str | None:
    """Why strace cannot trace a child here, or None when it can."""
    if shutil.which("strace") is None:
        return "strace is not installed (Debian package strace)"
    probe = subprocess.run(
        [*STRACE, "-o", str(log), "true"], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0 or not log.exists():
        return f"strace cannot trace a process here: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedHub]:
    """One ``amux serve`` with memory on, started under strace; every test uses its own paths."""
    place = tmp_path_factory.mktemp("traced")
    refusal = strace_refusal(place / "probe.strace")
    if refusal:
        pytest.skip(refusal)
    home = place / "amux-home"
    log = place / "hub.strace"
    trace = [*STRACE, "-o", str(log)]
    with running_hub(home, {"memory.enabled": True}, prefix=trace) as hub:
        yield TracedHub(hub, log, home / "memory")


def test_an_upsert_answers_after_temp_sync_rename_and_directory_sync(traced: TracedHub) -> None:
    body, ops = traced.call(
        "memory.upsert", path="traced/upsert.md", content="# traced\n", expected_revision="absent"
    )
    assert body["path"] == "traced/upsert.md"
    directory = str(traced.memory / "global" / "traced")
    document = f"{directory}/upsert.md"

    rename = next(op for op in ops if op.name == "rename" and op.target == document)
    temp = rename.path
    assert temp.rpartition("/")[0] == directory and TEMP_NAME.match(temp.rpartition("/")[2])
    created = first(ops, "open", temp)
    assert "O_CREAT" in created.flags and "O_EXCL" in created.flags
    synced = first(ops, "fsync", temp, after=created.line)
    assert synced.line < rename.line, "the temporary file was renamed before it was synced"
    first(ops, "fsync", directory, after=rename.line)


def test_an_overwrite_keeps_the_old_body_durably_before_replacing_it(traced: TracedHub) -> None:
    first_body = "# kept\nthe first version\n"
    written, _ = traced.call(
        "memory.upsert", path="kept/doc.md", content=first_body, expected_revision="absent"
    )
    _, ops = traced.call(
        "memory.upsert",
        path="kept/doc.md",
        content="# kept\nthe second version\n",
        expected_revision=written["revision"],
    )
    document = str(traced.memory / "global" / "kept" / "doc.md")
    history = traced.hub.home / "memory-history" / "global" / "kept" / "doc.md"
    copy = history / written["revision"]

    # The replaced file itself, under a second name: no second write of its bytes.
    link = next(op for op in ops if op.name == "link" and op.target == str(copy))
    assert link.path == document
    kept = first(ops, "fsync", str(history), after=link.line)
    rename = next(op for op in ops if op.name == "rename" and op.target == document)
    assert kept.line < rename.line, "the document was replaced before its old body was kept"
    assert copy.read_text() == first_body
    assert copy.stat().st_mode & 0o777 == 0o600


def test_a_forget_answers_after_unlink_and_directory_sync(traced: TracedHub) -> None:
    written, _ = traced.call(
        "memory.upsert", path="gone/forget.md", content="# soon gone\n", expected_revision="absent"
    )
    body, ops = traced.call(
        "memory.forget", path="gone/forget.md", expected_revision=written["revision"]
    )
    assert body == {"path": "gone/forget.md", "already_absent": False}
    scope = str(traced.memory / "global")
    directory = f"{scope}/gone"

    unlink = first(ops, "unlink", f"{directory}/forget.md")
    synced = first(ops, "fsync", directory, after=unlink.line)
    # The directory the forget left empty goes too, and its removal is synced in the scope.
    removed = first(ops, "rmdir", directory, after=synced.line)
    first(ops, "fsync", scope, after=removed.line)


def test_the_first_write_into_a_directory_a_crash_left_syncs_its_entry_once(
    traced: TracedHub,
) -> None:
    # The Hub wrote in the scope already, so the scope directory itself is known to be synced.
    traced.call("memory.upsert", path="warm.md", content="# warm\n", expected_revision="absent")
    scope = str(traced.memory / "global")
    left = traced.memory / "global" / "left-by-crash"
    # As a crash between the Hub's mkdir and its sync of the scope directory leaves it.
    left.mkdir(mode=0o700)

    _, ops = traced.call(
        "memory.upsert", path="left-by-crash/a.md", content="# a\n", expected_revision="absent"
    )
    assert not [op for op in ops if op.name == "mkdir"]
    rename = next(op for op in ops if op.name == "rename" and op.target == f"{left}/a.md")
    entry = first(ops, "fsync", scope)
    assert entry.line < rename.line, "the document went into a directory whose entry is unsynced"
    first(ops, "fsync", str(left), after=rename.line)

    _, again = traced.call(
        "memory.upsert", path="left-by-crash/b.md", content="# b\n", expected_revision="absent"
    )
    assert [op for op in again if op.name == "fsync" and op.path == scope] == []
    rename = next(op for op in again if op.name == "rename" and op.target == f"{left}/b.md")
    first(ops + again, "fsync", str(left), after=rename.line)
