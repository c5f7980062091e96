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
tree, and only then swapped in, so a refused or broken stream leaves the previous tree as it
was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tarfile
import tempfile
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
                "it was not brought back, and the worker keeps the copy from before the turn",
                reason="StreamBackTooLarge",
            )
        self.spool.write(data)


def _confined(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo | None:
    # The data filter would strip the leading slash and extract it within the tree: a pod's
    # ``tar -c .`` names no such path, so one is refused as the tampering it is.
    if member.name.startswith("/"):
        raise tarfile.AbsolutePathError(member)
    return tarfile.data_filter(member, destination)


def unpack(spool: IO[bytes], tree: Path) -> None:
    """Replace ``tree`` with the tar in ``spool``, confined to it, or leave ``tree`` as it was.

    Raises:
        SandboxUnavailable: the stream holds an absolute path, a ``..``, a link leading out of
            the tree, a device, or is no tar at all.
    """
    token = secrets.token_hex(4)
    staging = tree.parent / f".{tree.name}.incoming-{token}"
    previous = tree.parent / f".{tree.name}.previous-{token}"
    staging.mkdir(mode=0o700)
    try:
        spool.seek(0)
        with tarfile.open(fileobj=spool, mode="r:") as tar:
            tar.extractall(staging, filter=_confined)
    except (tarfile.TarError, OSError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise SandboxUnavailable(
            f"what the pod left in {tree} was refused ({error}): it was not brought back, and "
            "the worker keeps the copy from before the turn",
            reason="StreamBackRefused",
        ) from None
    existed = tree.exists()
    if existed:
        os.rename(tree, previous)
    os.rename(staging, tree)
    if existed:
        shutil.rmtree(previous, ignore_errors=True)


@contextlib.contextmanager
def spool_beside(tree: Path) -> Iterator[IO[bytes]]:
    """A nameless file on the tree's own file system (the work volume, not a small /tmp)."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=tree.parent) as spool:
        yield spool
