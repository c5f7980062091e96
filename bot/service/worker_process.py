"""The local Runtime worker of ``amux serve``, run as a process of its own beside the Hub.

A turn's launch (directories, sandbox layout, cgroup, spawn, workspace watch, the Agent's output)
costs more CPU than anything else a turn does, and in the Hub's process it queued the Feishu
webhook, the cards and every Hub call behind it. As a child process it runs on the other cores;
it reaches the Hub over loopback HTTP like any remote worker, with a credential the Hub issued it
at this start, handed over on its standard input (never in its arguments or environment, which
other processes of the same user can read). It holds none of the bot's secrets: the Feishu app's
variables and the owner's token are left out of its environment.

The child ends with the Hub: the Hub stops it at shutdown, and the kernel sends it SIGTERM if the
Hub dies first. If it dies on its own, the Hub starts it again after a short, growing pause; the
turns it was running are retried once their leases run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.service.logs import LogSettings

logger = logging.getLogger("amux.serve")

# A pause between restarts of a worker that keeps dying, so a broken set-up is not a busy loop.
RESTART_SECONDS = (1.0, 2.0, 5.0, 15.0, 30.0)
# A run this long resets the pauses: it was not dying at start.
HEALTHY_SECONDS = 60.0
# How long a stopping worker gets to end its turns' Agents before it is killed.
STOP_SECONDS = 10.0
# The bot's secrets and the operator's own token: nothing the worker does needs them.
WITHHELD_PREFIXES = ("AMUX_FEISHU_",)
WITHHELD = frozenset({"AMUX_TOKEN"})
PR_SET_PDEATHSIG = 1


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The serve process's environment less what only the Hub and the bot may hold."""
    return {
        key: value
        for key, value in environ.items()
        if key not in WITHHELD and not key.startswith(WITHHELD_PREFIXES)
    }


class WorkerProcess:
    """Runs and supervises the child worker until ``stop``."""

    def __init__(
        self,
        hub_url: str,
        token: str,
        settings: dict[str, Any],
        work_dir: Path,
        amux_home: Path,
        log_settings: LogSettings,
        log_stream: int | None = None,
    ) -> None:
        self._boot = json.dumps(
            {
                "hub_url": hub_url,
                "token": token,
                "settings": settings,
                "work_dir": str(work_dir),
                "amux_home": str(amux_home),
                "log_format": log_settings.format,
                "log_level": log_settings.level,
                "parent": os.getpid(),
            }
        ).encode()
        # Its log lines go where the Hub's go (stderr unless the Hub's log was sent elsewhere).
        self._log_stream = log_stream
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        # Set when a child is up: tests and the benchmark read its pid.
        self.started = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        self._supervisor = asyncio.create_task(self._supervise(), name="amux-worker-process")

    async def _supervise(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            began = loop.time()
            try:
                status = await self._run_once()
            except OSError as error:
                status = None
                logger.error("the local worker could not start: %s", error.strerror or error)
            if self._stopping.is_set():
                return
            if loop.time() - began >= HEALTHY_SECONDS:
                failures = 0
            pause = RESTART_SECONDS[min(failures, len(RESTART_SECONDS) - 1)]
            failures += 1
            logger.warning(
                "the local worker ended (%s); starting it again in %.0f s; the turns it ran are "
                "retried when their leases run out",
                f"exit status {status}" if status is not None else "not started",
                pause,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), pause)

    async def _run_once(self) -> int:
        self._process = process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.service.worker_process",
            stdin=asyncio.subprocess.PIPE,
            stderr=self._log_stream,
            env=worker_environment(os.environ),
        )
        assert process.stdin is not None
        process.stdin.write(self._boot)
        # The credential travels only through this pipe, closed once it is read.
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        process.stdin.close()
        self.started.set()
        return await process.wait()

    async def stop(self) -> None:
        """End the worker: SIGTERM ends its turns' Agents; a worker that hangs is killed."""
        self._stopping.set()
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_SECONDS)
            except TimeoutError:
                logger.warning("the local worker did not stop in %.0f s; killing it", STOP_SECONDS)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._supervisor is not None:
            await self._supervisor


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the Hub's process ends, however it ends (it may already have)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(0)


async def _work(boot: dict[str, Any]) -> None:
    from hub.client import HubClient
    from runtime_bridge.config import RuntimeSettings
    from runtime_bridge.launchers import configured_launcher
    from runtime_bridge.worker import Worker

    settings = RuntimeSettings(**boot["settings"])
    url = boot["hub_url"]
    stop = asyncio.Event()
    async with HubClient(url, boot["token"], timeout=60) as hub:
        worker = Worker(
            hub,
            url,
            settings,
            Path(boot["work_dir"]),
            amux_home=Path(boot["amux_home"]),
            launcher=configured_launcher(settings),
        )
        task = asyncio.create_task(worker.run_forever(stop))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # The Hub hands its running turns back before it stops this worker, so their Agents
            # are ended at once (as a worker inside the Hub's process was), not drained.
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task


def main() -> None:
    boot = json.loads(sys.stdin.buffer.read())
    _die_with_parent(boot["parent"])
    from bot.service import logs
    from bot.service.serve import raise_open_files

    logs.configure(
        logs.LogSettings(format=boot["log_format"], level=boot["log_level"]),
        secrets=[boot["token"]],
    )
    # Its launches' doors hold files in this process.
    raise_open_files()
    asyncio.run(_work(boot))


if __name__ == "__main__":
    main()
