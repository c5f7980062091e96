"""Codex's empty databases, made once per worker, for each new conversation's ``CODEX_HOME``.

Every conversation has a ``CODEX_HOME`` of its own, and Codex's first start in a new one creates
its SQLite databases and runs their migrations (about 100 ms of CPU before it answers
``initialize``, most of a Codex launch's share). The worker makes them once in the background:
``codex app-server`` answers ``initialize`` in a home of the seed's own, inside the sandbox a launch
gets (the system and Codex's installation read-only, amux's state hidden) with no network and
nothing writable but that home, and its ``*.sqlite`` files, checkpointed, are copied
into a conversation's home when a launch makes that home. They hold only Codex's migrations and
its bookkeeping of an empty home: no installation id, no thread, no log line.

The seed is for the executable that made it: a changed executable (an upgrade, a downgrade whose
migrations would not match) gets none, and the home is left for Codex to fill as before. Without
bubblewrap, or when the run fails, there is no seed and nothing else changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
from pathlib import Path

from runtime_bridge.providers.errors import ExecutableMissing
from runtime_bridge.sandbox import SandboxLayout, bwrap_argv, find_installations, service_hidden

logger = logging.getLogger("amux.worker")

SEED_SECONDS = 60.0
CLIENT_INFO = {"name": "amux", "title": "amux", "version": "0.1.0"}
DIRECTORY = "codex-seed"
# The environment of the seed's run: nothing of the worker's (its tokens, the provider keys).
KEPT_ENV = ("PATH", "LANG", "LC_ALL")


def _identity(executable: str) -> tuple[str, int, int, int] | None:
    """What names one installed executable: its real path, inode, size and modification time."""
    try:
        real = os.path.realpath(executable)
        found = os.stat(real)
    except OSError:
        return None
    return real, found.st_ino, found.st_size, found.st_mtime_ns


def seed_command(
    bwrap: str, executable: str, home: Path, path: str, hidden: tuple[Path, ...]
) -> list[str]:
    """``codex app-server`` in a launch's kind of sandbox: the system and Codex's installation
    read-only, ``home`` writable, amux's state and the host's homes hidden, no network."""
    layout = SandboxLayout(
        cwd=home,
        installations=find_installations([executable], path, hidden),
        hidden=hidden,
        writable=(home,),
        user_namespace=os.geteuid() != 0,
        own_network=True,
    )
    # By its real path: a link to it may sit where the sandbox shows nothing.
    return [*bwrap_argv(bwrap, layout), os.path.realpath(executable), "app-server"]


def _checkpointed(home: Path) -> tuple[Path, ...]:
    """The home's databases, each with its write-ahead log folded in (copied without it)."""
    databases = tuple(sorted(home.glob("*.sqlite")))
    for database in databases:
        connection = sqlite3.connect(database)
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            connection.close()
    return databases


class CodexSeed:
    """The empty databases of one Codex executable, under ``work_dir``; none until made."""

    def __init__(
        self,
        executable: str | None,
        work_dir: Path,
        path: str | None = None,
        hidden: tuple[Path, ...] | None = None,
    ) -> None:
        self._executable = executable
        # Looked up as a launch looks it up: on the worker's PATH, which launches are given.
        self._path = path if path is not None else os.environ.get("PATH", "")
        self._hidden = (
            hidden if hidden is not None else service_hidden(amux_home=None, work_dir=work_dir)
        )
        self._directory = work_dir / DIRECTORY
        self._identity: tuple[str, int, int, int] | None = None
        self._found: str | None = None
        self._files: tuple[Path, ...] = ()

    def files(self) -> tuple[Path, ...]:
        """The databases to copy into a new ``CODEX_HOME``; none if the executable changed."""
        if not self._files or self._found is None:
            return ()
        if _identity(self._found) != self._identity:
            return ()
        return self._files

    async def make(self) -> None:
        """Run Codex once in a home of the seed's own and keep its databases; on any failure,
        log it and keep none."""
        executable = self._executable and shutil.which(self._executable, path=self._path)
        bwrap = shutil.which("bwrap")
        if not executable or not bwrap:
            return
        identity = _identity(executable)
        shutil.rmtree(self._directory, ignore_errors=True)
        home = self._directory / "home"
        self._directory.parent.mkdir(parents=True, exist_ok=True)
        self._directory.mkdir(mode=0o700)
        home.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if k in KEPT_ENV}
        env.update({"HOME": str(home), "CODEX_HOME": str(home)})
        try:
            process = await asyncio.create_subprocess_exec(
                *seed_command(bwrap, executable, home, self._path, self._hidden),
                cwd=home,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except (OSError, ExecutableMissing) as error:
            logger.info("no Codex seed (%s): new conversations' homes are made by Codex", error)
            shutil.rmtree(self._directory, ignore_errors=True)
            return
        files: tuple[Path, ...] = ()
        try:
            async with asyncio.timeout(SEED_SECONDS):
                await self._initialize(process)
            files = await asyncio.to_thread(_checkpointed, home)
        except (OSError, TimeoutError, ValueError, sqlite3.Error) as error:
            logger.info("no Codex seed (%s): new conversations' homes are made by Codex", error)
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if not files:
            shutil.rmtree(self._directory, ignore_errors=True)
            return
        self._identity, self._found, self._files = identity, executable, files

    @staticmethod
    async def _initialize(process: asyncio.subprocess.Process) -> None:
        """``initialize`` answered, then stdin closed (Codex's orderly exit) and the exit."""
        assert process.stdin is not None and process.stdout is not None
        request = {"id": 1, "method": "initialize", "params": {"clientInfo": CLIENT_INFO}}
        process.stdin.write((json.dumps(request) + "\n").encode())
        await process.stdin.drain()
        while line := await process.stdout.readline():
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict) and answer.get("id") == 1:
                if "result" not in answer:
                    raise ValueError(f"codex refused initialize: {answer.get('error')}")
                break
        else:
            raise ValueError("codex app-server exited before answering initialize")
        process.stdin.close()
        if await process.wait() != 0:
            raise ValueError(f"codex app-server exited with status {process.returncode}")

    def remove(self) -> None:
        self._files = ()
        shutil.rmtree(self._directory, ignore_errors=True)
