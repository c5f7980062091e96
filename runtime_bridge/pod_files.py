"""What of the worker's work directory a sandbox pod gets, and what the worker takes back.

A sandbox pod shares no volume with its worker: its work directory is an empty directory of its
own, at the worker's path, so the plan's absolute paths hold in both. Before its Agent starts
the worker streams in (a tar on the exec's stdin) only the launch's trees: its run directory,
its conversation's home, its workspace and, for a project checkout, the default branch's objects
the checkout borrows. Nothing else of the work directory (another conversation's workspace,
another turn's run directory and its credentials) is ever in the pod.

After the Agent, the worker takes back (a tar on the exec's stdout) only what it reads later:
the workspace (the branch it commits, the next turn's files) and the conversation's home (the
Agent's native session, which the next turn resumes). What comes back is the Agent's and is
untrusted: it is bounded in bytes, extracted with tarfile's ``data`` filter (no absolute paths,
no ``..``, no link leading out of the tree, no devices) into a staging directory beside the
tree, and only then applied: what the pod changed replaces the worker's copy, what it removed
is removed, and what it left as given stays as the worker now has it (another turn in the same
workspace may have changed it meanwhile). A refused or broken stream changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from runtime_bridge.bounds import format_size
from runtime_bridge.providers.errors import SandboxUnavailable
from runtime_bridge.providers.plan import LaunchPlan

CHUNK = 256 * 1024
READ_ONLY = "read-only"


def work_dir_of(plan: LaunchPlan) -> Path:
    """The worker's work directory: the plan's first root is its run directory,
    ``<work_dir>/runs/<execution>`` (``LaunchSite.run_dir``)."""
    return plan.roots[0].parent.parent


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _outermost(paths: Iterable[Path]) -> tuple[Path, ...]:
    kept: list[Path] = []
    for path in sorted(dict.fromkeys(paths), key=lambda p: len(p.parts)):
        if not any(_within(path, other) for other in kept):
            kept.append(path)
    return tuple(kept)


def _inside_work_dir(plan: LaunchPlan, paths: Iterable[Path]) -> tuple[Path, ...]:
    work_dir = work_dir_of(plan)
    for path in paths:
        if not _within(path, work_dir) or path == work_dir:
            raise SandboxUnavailable(
                f"{path} lies outside the worker's work directory {work_dir}: a sandbox pod is "
                "given only the launch's own directories within it",
                reason="OutsideWorkDir",
            )
    return _outermost(paths)


def trees_in(plan: LaunchPlan) -> tuple[Path, ...]:
    """What the pod is given: the plan's roots (run directory, the conversation's home), its
    workspace and the objects a project checkout borrows, as far as they exist."""
    wanted = (*plan.roots, plan.cwd, *plan.borrowed)
    return tuple(p for p in _inside_work_dir(plan, wanted) if p.exists())


def trees_back(plan: LaunchPlan) -> tuple[Path, ...]:
    """What the worker takes back: the conversation's home, and the workspace unless the turn
    was read-only (its edits are then never kept)."""
    home = plan.roots[-1]
    wanted = (home,) if plan.permissions == READ_ONLY else (home, plan.cwd)
    return _inside_work_dir(plan, wanted)


def pack(trees: tuple[Path, ...], work_dir: Path, send: Callable[[bytes], None]) -> None:
    """A tar of ``trees``, named relative to ``work_dir``, written through ``send``."""

    class Sink:
        def write(self, data: bytes) -> int:
            if data:
                send(bytes(data))
            return len(data)

    with tarfile.open(fileobj=Sink(), mode="w|", bufsize=CHUNK) as tar:  # type: ignore[call-overload]
        for tree in trees:
            tar.add(str(tree), arcname=str(tree.relative_to(work_dir)))


class Bounded:
    """The stream back, spooled to a file beside its tree and refused past ``limit`` bytes."""

    def __init__(self, spool: IO[bytes], tree: Path, limit: int) -> None:
        self.spool = spool
        self.tree = tree
        self.limit = limit
        self.size = 0

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise SandboxUnavailable(
                f"the pod's copy of {self.tree} is larger than {format_size(self.limit)}: "
                "nothing of the turn's files was brought back, and the worker keeps the copies "
                "from before the turn",
                reason="StreamBackTooLarge",
            )
        self.spool.write(data)


def _confined(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo | None:
    # The data filter would strip the leading slash and extract it within the tree: a pod's
    # ``tar -c .`` names no such path, so one is refused as the tampering it is.
    if member.name.startswith("/"):
        raise tarfile.AbsolutePathError(member)
    return tarfile.data_filter(member, destination)


# What one entry of a tree is, as far as telling a change goes: its kind, size, mtime (whole
# seconds, as tar keeps it), permission bits and, for a link, its target.
Entry = tuple[str, int, int, int, str]
Manifest = dict[str, Entry]
RECENT = -1


def _entry(path: Path) -> Entry | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ("link", 0, 0, 0, os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", 0, 0, 0, "")
    return ("file", st.st_size, int(st.st_mtime), stat.S_IMODE(st.st_mode), "")


def manifest(tree: Path, mark_recent: bool = True) -> Manifest:
    """Every entry beneath ``tree`` by its relative path: what was given to the pod.

    A file written in the last seconds is marked as never matching (mtime ``RECENT``): tar keeps
    whole seconds, so the Agent's same-size rewrite within that second would look unchanged.
    """
    found: Manifest = {}
    recent = int(time.time()) - 2
    for parent, directories, files in os.walk(tree):
        for name in (*directories, *files):
            path = Path(parent) / name
            entry = _entry(path)
            if entry is not None:
                if mark_recent and entry[0] == "file" and entry[2] >= recent:
                    entry = (entry[0], entry[1], RECENT, entry[3], entry[4])
                found[str(path.relative_to(tree))] = entry
    return found


def _unchanged(given: Entry, entry: Entry | None) -> bool:
    if entry is None:
        return False
    if given[2] == RECENT:
        return given[:2] + given[3:] == entry[:2] + entry[3:]
    return given == entry


def stage(spool: IO[bytes], tree: Path) -> Path:
    """The tar in ``spool`` extracted, confined, into a new directory beside ``tree``.

    Raises:
        SandboxUnavailable: the stream holds an absolute path, a ``..``, a link leading out of
            the tree, a device, or is no tar at all; nothing is left beside the tree.
    """
    staging = tree.parent / f".{tree.name}.incoming-{secrets.token_hex(4)}"
    staging.mkdir(mode=0o700)
    try:
        spool.seek(0)
        with tarfile.open(fileobj=spool, mode="r:") as tar:
            tar.extractall(staging, filter=_confined)
    except (tarfile.TarError, OSError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise SandboxUnavailable(
            f"what the pod left in {tree} was refused ({error}): nothing of the turn's files "
            "was brought back, and the worker keeps the copies from before the turn",
            reason="StreamBackRefused",
        ) from None
    return staging


def apply(staging: Path, tree: Path, sent: Manifest) -> None:
    """Apply to ``tree`` what the pod changed in it, as ``staging`` holds it, then remove
    ``staging``: each entry that differs from what was ``sent`` replaces the worker's, each one
    sent and gone from the pod is removed unless the worker's copy changed meanwhile. Entries
    the pod left as they were stay as the worker now has them, so another turn's changes to the
    same tree, ended meanwhile, are kept."""
    try:
        _apply(staging, tree, sent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def unpack(spool: IO[bytes], tree: Path, sent: Manifest) -> None:
    """``stage`` then ``apply``: nothing is applied before the whole stream was extracted."""
    apply(stage(spool, tree), tree, sent)


def _apply(staging: Path, tree: Path, sent: Manifest) -> None:
    tree.mkdir(mode=0o700, parents=True, exist_ok=True)
    real = tree.resolve()
    now = manifest(staging, mark_recent=False)
    # Checked for every entry before any is applied, so a refusal leaves the tree as it was.
    for relative in now:
        parent = (tree / relative).parent
        if parent.exists() and parent.resolve() != real / Path(relative).parent:
            raise SandboxUnavailable(
                f"{tree / relative} no longer lies within {tree}", reason="StreamBackRefused"
            )
    for relative in sorted(now, key=lambda r: len(Path(r).parts)):  # Parents first.
        entry = now[relative]
        target = tree / relative
        if entry[0] == "dir":
            if not (target.is_dir() and not target.is_symlink()):
                _remove(target)
                target.mkdir(mode=0o700)
            continue
        if sent.get(relative) == entry:
            continue  # As given: the worker's copy, whatever it is now, stays.
        # Every parent on the way is a directory of the tree's own (made above), never a link.
        if target.parent.resolve() != real / Path(relative).parent:
            raise SandboxUnavailable(
                f"{target} no longer lies within {tree}", reason="StreamBackRefused"
            )
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staging / relative, target)
    for relative in sorted(sent, key=lambda r: -len(Path(r).parts)):  # Children first.
        if relative not in now and _unchanged(sent[relative], _entry(tree / relative)):
            _remove(tree / relative, only_empty=True)


def _remove(path: Path, only_empty: bool = False) -> None:
    if path.is_dir() and not path.is_symlink():
        if only_empty:
            with contextlib.suppress(OSError):
                path.rmdir()
        else:
            shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def spool_beside(tree: Path) -> Iterator[IO[bytes]]:
    """A nameless file on the tree's own file system (the work volume, not a small /tmp)."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=tree.parent) as spool:
        yield spool
