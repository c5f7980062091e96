"""How much disk an Agent's workspace uses, measured so an Agent cannot make measuring costly.

The workspace is written by untrusted code, and may be measured while that code still runs:

- symbolic links are never followed (each entry is ``lstat``-ed and directories are opened with
  ``O_NOFOLLOW`` relative to their parent's descriptor), so a link to ``/`` costs nothing and a
  directory swapped for a link mid-walk is not entered;
- what counts is the disk actually allocated (``st_blocks * 512``) to regular files and
  directories, as ``du`` reports it. ``st_size`` would count a sparse ``truncate -s 1T`` file as
  a terabyte that uses no disk, and would miss a directory grown large by millions of names;
  a file with several hard links in the tree is counted once;
- other file systems mounted inside the tree are not entered (as ``du -x``): their space is not
  the workspace's disk;
- the walk stops as soon as the total passes the limit, so a huge tree costs work in proportion
  to the limit, not to the tree;
- entries that vanish or change while being walked are skipped: the Agent may be deleting them;
- a tree nested deeper than ``MAX_DEPTH`` directories counts as over the limit: walking it
  would hold one open descriptor per level, and no real workspace is that deep;
- a tree of more than ``MAX_ENTRIES`` files and directories counts as over the limit too
  (``crowded``): empty files use no blocks, so without it a million of them would make every
  measurement walk a million names while the total stays zero. A file's apparent size is never
  read, so a sparse file of a terabyte costs one ``stat`` like any other.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_DEPTH = 128
# Far above a real checkout (a large monorepo with its node_modules has a few hundred thousand);
# walking this many takes about a second.
MAX_ENTRIES = 1_000_000
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Errors meaning "this entry is gone or is no longer a directory": the tree changed under us.
_CHANGED = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP}


class _OverLimit(Exception):
    pass


@dataclass(frozen=True)
class Usage:
    """One measurement: ``used`` bytes of disk, the whole usage unless it passed the limit (then
    a lower bound); ``crowded`` when the tree held more than the entries a measurement walks."""

    used: int
    crowded: bool = False

    def over(self, limit: int) -> bool:
        return self.crowded or self.used > limit


class _Walk:
    def __init__(self, device: int, limit: int, max_entries: int) -> None:
        self.device = device
        self.limit = limit
        self.total = 0
        self.entries = 0
        self.max_entries = max_entries
        self.crowded = False
        self.linked: set[tuple[int, int]] = set()

    def seen(self) -> None:
        """One more name walked, of any kind (a million symbolic links cost a walk too)."""
        self.entries += 1
        if self.entries > self.max_entries:
            self.crowded = True
            raise _OverLimit

    def count(self, info: os.stat_result) -> None:
        allocated = info.st_blocks * 512
        if allocated == 0:
            return
        if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
            key = (info.st_dev, info.st_ino)
            if key in self.linked:
                return
            self.linked.add(key)
        self.total += allocated
        if self.total > self.limit:
            raise _OverLimit

    def directory(self, fd: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.total = max(self.total, self.limit + 1)
            raise _OverLimit
        subdirectories: list[str] = []
        # Listing first and descending after keeps one descriptor open per level, not two.
        with os.scandir(fd) as entries:
            for entry in entries:
                self.seen()
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError as error:
                    if error.errno in _CHANGED:
                        continue
                    raise
                if info.st_dev != self.device:
                    continue
                if stat.S_ISREG(info.st_mode):
                    self.count(info)
                elif stat.S_ISDIR(info.st_mode):
                    subdirectories.append(entry.name)
        for name in subdirectories:
            try:
                child = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError as error:
                if error.errno in _CHANGED:
                    continue
                raise
            try:
                info = os.fstat(child)
                # The name may now be another directory than the one listed: count what is open.
                if info.st_dev != self.device:
                    continue
                self.count(info)
                self.directory(child, depth + 1)
            finally:
                os.close(child)


def workspace_size(path: Path, limit: int) -> int:
    """The bytes of disk ``path`` uses, or a number above ``limit`` as soon as that is certain
    (a crowded tree counts as above it); see ``measure``."""
    usage = measure(path, limit)
    return max(usage.used, limit + 1) if usage.crowded else usage.used


def measure(path: Path, limit: int, max_entries: int = MAX_ENTRIES) -> Usage:
    """The bytes of disk ``path`` uses, or a number above ``limit`` as soon as that is certain.

    A ``used <= limit`` that is not ``crowded`` is the tree's whole usage; ``used > limit`` means
    over the bound (and is only a lower bound of the usage); ``crowded`` means the tree holds more
    than ``max_entries`` files and directories, and ``used`` is what the walk counted before it
    stopped. A ``path`` that does not exist uses 0 bytes.

    Raises:
        OSError: ``path`` is not a directory, or a directory in it cannot be read (permission):
            the size is unknown, and the caller decides what that means for the launch.
    """
    try:
        fd = os.open(path, _OPEN_DIR)
    except FileNotFoundError:
        return Usage(0)
    try:
        info = os.fstat(fd)
        walk = _Walk(info.st_dev, limit, max_entries)
        try:
            walk.count(info)
            walk.directory(fd, 1)
        except _OverLimit:
            pass
        return Usage(walk.total, walk.crowded)
    finally:
        os.close(fd)
