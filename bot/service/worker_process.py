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
from typing import TYPE_CHECKING, Any

from bot.service.logs import LogSettings
from hub.errors import InvalidArgument, Unavailable

if TYPE_CHECKING:
    from hub.client import HubClient
    from runtime_bridge.worker import Worker

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
# The start-up handshake on the child's standard output and input.
READY = b"ready\n"
REFUSED = b"refused "
GO = b"go\n"
READY_SECONDS = 60.0
# EX_CONFIG: the worker refused its settings.
REFUSED_STATUS = 78


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The serve process's environment less what only the Hub and the bot may hold."""
    return {
        key: value
        for key, value in environ.items()
        if key not in WITHHELD and not key.startswith(WITHHELD_PREFIXES)
    }


class WorkerProcess:
    """Runs and supervises the child worker until ``stop``.

    The child reads its boot line, builds its worker (which checks the runtime settings and
    refuses bad ones, as a worker inside the Hub's process did at the Hub's start) and says
    ``ready`` or why it refuses, on its standard output; it starts claiming turns only once told
    ``go``, when the Hub listens.
    """

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
        self._boot = (
            json.dumps(
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
            + b"\n"
        )
        # Its log lines go where the Hub's go (stderr unless the Hub's log was sent elsewhere).
        self._log_stream = log_stream
        self._process: asyncio.subprocess.Process | None = None
        self._stopping = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        # Set when a child runs: tests and the benchmark read its pid.
        self.started = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Start the child and wait until it has checked its settings.

        Raises:
            InvalidArgument: the worker refuses its settings (the reason, in one line).
            Unavailable: it could not be started, or said nothing in time.
        """
        process = await self._spawn()
        refusal = await self._checked(process)
        if refusal is not None:
            await process.wait()
            raise InvalidArgument(refusal)

    def go(self) -> None:
        """Let the started child claim turns (the Hub listens), and keep one running."""
        self._supervisor = asyncio.create_task(self._supervise(), name="amux-worker-process")

    async def _supervise(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            began = loop.time()
            try:
                process = self._process
                if process is None or process.returncode is not None:
                    process = await self._spawn()
                    refusal = await self._checked(process)
                    if refusal is not None:
                        # Settings do not change while the Hub runs: no point in trying again.
                        logger.error("the local worker refuses to start: %s", refusal)
                        return
                status: int | None = await self._run(process)
            except (OSError, Unavailable) as error:
                status = None
                logger.error("the local worker could not start: %s", error)
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

    async def _spawn(self) -> asyncio.subprocess.Process:
        self._process = process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.service.worker_process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log_stream,
            env=worker_environment(os.environ),
        )
        assert process.stdin is not None
        # The credential travels only through this pipe.
        process.stdin.write(self._boot)
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        return process

    async def _checked(self, process: asyncio.subprocess.Process) -> str | None:
        """None once ``process`` says it is ready; else why it refuses its settings."""
        assert process.stdout is not None
        try:
            said = await asyncio.wait_for(process.stdout.readline(), READY_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise Unavailable(
                f"the local worker did not start within {READY_SECONDS:.0f} s"
            ) from None
        if said == READY:
            return None
        if said.startswith(REFUSED):
            return said[len(REFUSED) :].decode(errors="replace").strip()
        await process.wait()
        raise Unavailable(
            f"the local worker ended as it started (exit status {process.returncode})"
        )

    async def _run(self, process: asyncio.subprocess.Process) -> int:
        assert process.stdin is not None
        process.stdin.write(GO)
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


def _build(boot: dict[str, Any]) -> tuple[HubClient, Worker]:
    """The worker as the boot line says; raises what its settings' checks refuse."""
    from hub.client import HubClient
    from runtime_bridge.config import RuntimeSettings
    from runtime_bridge.launchers import configured_launcher
    from runtime_bridge.worker import Worker

    settings = RuntimeSettings(**boot["settings"])
    url = boot["hub_url"]
    hub = HubClient(url, boot["token"], timeout=60)
    worker = Worker(
        hub,
        url,
        settings,
        Path(boot["work_dir"]),
        amux_home=Path(boot["amux_home"]),
        launcher=configured_launcher(settings),
    )
    return hub, worker


async def _work(boot: dict[str, Any]) -> int:
    from hub.errors import AmuxError

    try:
        hub, worker = _build(boot)
    except AmuxError as error:
        _say(REFUSED + error.message.encode())
        return REFUSED_STATUS
    _say(READY)
    # Until the Hub listens; an end of file is a Hub that stopped first.
    if await asyncio.to_thread(sys.stdin.buffer.readline) != GO:
        await hub.close()
        return 0
    stop = asyncio.Event()
    async with hub:
        task = asyncio.create_task(worker.run_forever(stop))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # The Hub hands its running turns back before it stops this worker, so their Agents
            # are ended at once (as a worker inside the Hub's process was), not drained.
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return 0


def _say(line: bytes) -> None:
    sys.stdout.buffer.write(line.rstrip(b"\n").replace(b"\n", b" ") + b"\n")
    sys.stdout.buffer.flush()


def main() -> None:
    boot = json.loads(sys.stdin.buffer.readline())
    _die_with_parent(boot["parent"])
    from bot.service import logs

    logs.configure(
        logs.LogSettings(format=boot["log_format"], level=boot["log_level"]),
        secrets=[boot["token"]],
    )
    # Its launches' doors hold files in this process: it inherits the open-file limit the Hub
    # raised (and said) before starting it.
    raise SystemExit(asyncio.run(_work(boot)))


if __name__ == "__main__":
    main()
