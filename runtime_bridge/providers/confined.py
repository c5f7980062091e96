"""Writes beneath a launch's directories that never follow a link the Agent could have planted.

An Agent owns its Session's home, and with ``AMUX_RUNTIME_RUN_AS`` the worker runs as root: any
root-side ``mkdir``, copy, ``chown`` or ``chmod`` that resolves a path through a directory the
Agent controls could be redirected by a symlink (say ``home -> /etc``) onto a file of root's. So
every step below a launch root is made relative to a directory file descriptor, each component is
opened with ``O_NOFOLLOW``, an entry of the wrong kind is replaced rather than followed, files are
created afresh with ``O_EXCL``, and ownership is given with ``fchown`` on what was opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

Owner = tuple[int, int] | None

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_entry(parent: int, name: str) -> None:
    """Remove whatever ``name`` is in ``parent`` without following it."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        try:
            for entry in os.listdir(fd):
                _remove_entry(fd, entry)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)


def remove_entry(parent: int, name: str) -> None:
    """Remove whatever ``name`` is in ``parent``, if anything, without following it."""
    _remove_entry(parent, name)


def _open_child_dir(parent: int, name: str, owner: Owner) -> int:
    """The directory ``name`` in ``parent``, created (0700) or recreated if it is not one."""
    if name in ("", ".", "..") or "/" in name:
        raise ValueError(f"not a single path component: {name!r}")
    for _ in range(2):
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            _remove_entry(parent, name)  # A link or a file where a directory belongs.
            continue
        if owner is not None:
            os.fchown(fd, *owner)
        return fd
    raise OSError(errno.ELOOP, f"{name} keeps being replaced")


@contextlib.contextmanager
def open_root(root: Path) -> Iterator[int]:
    """A launch root (created by the worker in a directory of its own), as a descriptor."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_dir(root: int, relative: Path, owner: Owner) -> Iterator[int]:
    """The directory ``relative`` below ``root``, each component made safely as needed."""
    fd = os.dup(root)
    try:
        for part in relative.parts:
            child = _open_child_dir(fd, part, owner)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def write_file(directory: int, name: str, data: bytes, mode: int, owner: Owner) -> None:
    """Create ``name`` afresh in ``directory`` (whatever stood there is removed, not followed)."""
    _remove_entry(directory, name)
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        mode,
        dir_fd=directory,
    )
    try:
        os.fchmod(fd, mode)
        if owner is not None:
            os.fchown(fd, *owner)
        with os.fdopen(os.dup(fd), "wb") as handle:
            handle.write(data)
    finally:
        os.close(fd)


def copy_into(
    source: Path, directory: int, name: str, owner: Owner, exclude: tuple[str, ...] = ()
) -> None:
    """Copy ``source`` (trusted: the operator's) to ``name`` in ``directory``; links resolved."""
    if source.is_dir():
        with open_dir(directory, Path(name), owner) as target:
            ignored = shutil.ignore_patterns(*exclude)(str(source), os.listdir(source))
            for entry in sorted(os.listdir(source)):
                if entry not in ignored:
                    copy_into(source / entry, target, entry, owner, exclude)
        return
    write_file(directory, name, source.read_bytes(), 0o600, owner)


def relative_to_root(path: Path, roots: tuple[Path, ...]) -> tuple[Path, Path]:
    """(root, path below it) for the launch root that holds ``path``.

    Raises:
        ValueError: no root holds it (the plan would write outside its launch).
    """
    for root in roots:
        if path == root or root in path.parents:
            return root, path.relative_to(root)
    raise ValueError(f"{path} is outside the launch's directories")
