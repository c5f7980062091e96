"""One Hub per memory root: a second holder is refused with the reason; a crash frees the root."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.errors import Unavailable
from hub.rootlock import LOCK_NAME, RootLock

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from hub.rootlock import RootLock

    lock = RootLock(Path(sys.argv[1]))
    lock.acquire()
    print("held", flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def lock_holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock on ``tmp_path / 'memory'``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "memory")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_a_second_holder_is_refused_with_the_reason_and_the_first_holders_pid(
    tmp_path: Path, lock_holder: subprocess.Popen[str]
) -> None:
    lock = RootLock(tmp_path / "memory")
    with pytest.raises(Unavailable) as caught:
        lock.acquire()
    message = caught.value.message
    assert f"pid {lock_holder.pid}" in message
    assert str(tmp_path / "memory") in message
    assert "AMUX_HOME" in message
    assert not lock.held


def test_a_killed_holder_frees_the_root_for_the_next_hub(
    tmp_path: Path, lock_holder: subprocess.Popen[str]
) -> None:
    lock_holder.kill()
    lock_holder.wait()
    lock = RootLock(tmp_path / "memory")
    lock.acquire()
    try:
        assert lock.held
        assert (tmp_path / "memory" / LOCK_NAME).read_text().strip() == str(os.getpid())
    finally:
        lock.release()


def test_two_locks_in_one_process_exclude_each_other_until_released(tmp_path: Path) -> None:
    first = RootLock(tmp_path / "memory")
    first.acquire()
    second = RootLock(tmp_path / "memory")
    with pytest.raises(Unavailable):
        second.acquire()
    first.release()
    assert not first.held
    second.acquire()
    second.release()


def test_the_lock_file_is_private_and_hidden_from_memory_paths(tmp_path: Path) -> None:
    lock = RootLock(tmp_path / "memory")
    lock.acquire()
    try:
        assert LOCK_NAME.startswith(".")
        assert (tmp_path / "memory" / LOCK_NAME).stat().st_mode & 0o077 == 0
    finally:
        lock.release()
