"""Small real file systems for tests of full and read-only disks: a tmpfs of a chosen size, and a
read-only bind mount of a directory. Mounting needs root; a test skips, saying why, when refused."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    if shutil.which("mount") is None:
        pytest.skip("no mount command on this host")
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"mounting is refused here: {done.stderr.strip() or done.returncode}")


def _unmount(path: Path) -> None:
    done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        # Something still holds a file open there; detach it so no mount outlives the test.
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``64k``, ``1g``) mounted on ``path`` (made if missing), mode 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _mount(
        "-t", "tmpfs", "-o", ",".join([f"size={size}", "mode=0700", *options]), "tmpfs", str(path)
    )
    try:
        yield path
    finally:
        _unmount(path)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` bound onto itself read-only: writes below it fail with EROFS, reads work."""
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", "remount,bind,ro", str(path))
        yield path
    finally:
        _unmount(path)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its disk is full; remove the file returned for room."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                return filler
    finally:
        os.close(fd)
