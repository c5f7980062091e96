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
  would hold one open descriptor per level, and no real workspace is that deep.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_DEPTH = 128
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Errors meaning "this entry is gone or is no longer a directory": the tree changed under us.
_CHANGED = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP}


class _OverLimit(Exception):
    pass


class _Walk:
    def __init__(self, device: int, limit: int) -> None:
        self.device = device
        self.limit = limit
        self.total = 0
        self.linked: set[tuple[int, int]] = set()

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
    """The bytes of disk ``path`` uses, or a number above ``limit`` as soon as that is certain.

    A result ``<= limit`` is the tree's whole usage; a result ``> limit`` means over the bound
    (and is only a lower bound of the usage). A ``path`` that does not exist uses 0 bytes.

    Raises:
        OSError: ``path`` is not a directory, or a directory in it cannot be read (permission):
            the size is unknown, and the caller decides what that means for the launch.
    """
    try:
        fd = os.open(path, _OPEN_DIR)
    except FileNotFoundError:
        return 0
    try:
        info = os.fstat(fd)
        walk = _Walk(info.st_dev, limit)
        try:
            walk.count(info)
            walk.directory(fd, 1)
        except _OverLimit:
            pass
        return walk.total
    finally:
        os.close(fd)
