"""The exclusive lock that makes one Hub the sole online writer of a memory root."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from hub.errors import Unavailable

LOCK_NAME = ".hub.lock"


class RootLock:
    """An advisory ``flock`` on ``<root>/.hub.lock``, held for the Hub's lifetime."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises: Unavailable: another Hub process holds this memory root."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise Unavailable(
                f"another amux Hub (pid {holder}) already serves the memory root "
                f"{self.path.parent}; stop it or point AMUX_HOME elsewhere"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None
