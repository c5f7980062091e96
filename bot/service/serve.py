"""Running ``amux serve``: listen, wait for a stop or restart, drain, and restart in place.

The drain keeps the promise the restart card and ``amux system restart`` make: no new turn is
claimed, running turns get ``AMUX_DRAIN_SECONDS`` to finish (their cards update to the end), and
turns still running then are handed back to the queue, visibly, to run again after the restart.
A stop (SIGTERM, SIGINT) hands running turns back at once. Only then are long polls released
and in-flight requests drained.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import signal
import sys
from enum import Enum
from pathlib import Path

from aiohttp import web

from bot.config import FeishuSettings
from bot.feishu import saved_app
from bot.service.app import create_app
from bot.service.heap import freeze_startup_heap
from bot.service.logs import AccessLogger
from hub.config import HubSettings
from hub.errors import Unavailable
from hub.middleware import DRAIN
from hub.rpc import HUB
from runtime_bridge.config import RuntimeSettings

logger = logging.getLogger("amux.serve")

# systemd units treat this exit status as "restart me" (RestartForceExitStatus=75).
RESTART_EXIT_STATUS = 75
# In-flight HTTP requests (not turns) get this long once turns have drained.
REQUEST_DRAIN_SECONDS = 30.0
# Below this many open files a busy Hub (its connections, its worker's doors and launches, its
# databases) can run out and stop answering everyone.
LOW_OPEN_FILES = 4096
NR_OPEN = Path("/proc/sys/fs/nr_open")


def raise_open_files() -> int:
    """Raise this process's soft open-file limit to its hard limit; the limit it now has.

    A service manager's default soft limit (systemd: 1,024) is far below what the kernel lets
    the process take, and every request, door and launch holds files in this one process.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard
    if hard == resource.RLIM_INFINITY:
        try:
            wanted = int(NR_OPEN.read_text())
        except (OSError, ValueError):
            wanted = soft
    if soft != resource.RLIM_INFINITY and wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError) as error:
            logger.warning("cannot raise the open-file limit from %d: %s", soft, error)
    if soft != resource.RLIM_INFINITY and soft < LOW_OPEN_FILES:
        logger.warning(
            "open files limited to %d: a busy Hub may run out and stop answering; raise the "
            "hard limit (systemd: LimitNOFILE=65536, as deploy/systemd/amux.service sets)",
            soft,
        )
    else:
        logger.info("open files: up to %d", soft)
    return soft


def local_url(host: str, port: int) -> str:
    """How a worker in this process reaches the Hub it runs beside."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def cannot_listen(host: str, port: int, error: OSError) -> Unavailable:
    """Why ``amux serve`` cannot listen on ``host:port``, and what to change."""
    where = f"cannot listen on {host}:{port}"
    if error.errno == errno.EADDRINUSE:
        said = (
            f"{where}: the port is in use (another amux serve?); stop what listens there, or "
            "choose another port with --port or AMUX_PORT"
        )
    elif error.errno == errno.EACCES:
        said = f"{where}: permission denied; choose another port with --port or AMUX_PORT"
    else:
        said = (
            f"{where}: {error.strerror or error}; choose another address with --host or "
            "AMUX_HOST, or another port with --port or AMUX_PORT"
        )
    return Unavailable(said, host=host, port=port)


class Outcome(Enum):
    STOP = "stop"
    RESTART = "restart"


async def serve(settings: HubSettings) -> Outcome:
    """Serve until SIGTERM/SIGINT or an owner's restart request, then drain in-flight work."""
    raise_open_files()
    runtime = RuntimeSettings()
    # The app `amux feishu setup` saved, unless AMUX_FEISHU_APP_ID names one.
    feishu, saved, source = saved_app.resolve(settings.home, FeishuSettings())
    if source:
        logger.info(source)
    warning = runtime.unsandboxed_warning() if runtime.in_process else None
    if warning is not None:
        logger.warning(warning)
    worker_url = local_url(settings.host, settings.port) if runtime.in_process else None
    listening = asyncio.Event()
    app = create_app(
        settings,
        runtime,
        worker_url=worker_url,
        feishu_settings=feishu,
        hub_listening=listening,
        feishu_owner=saved.owner_open_id if saved is not None else "",
        worker_process=True,
    )
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=1.0, access_log_class=AccessLogger
    )
    await runner.setup()
    freeze_startup_heap()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        try:
            await site.start()
        except OSError as error:
            raise cannot_listen(settings.host, settings.port, error) from None
        listening.set()
        logger.info("amux Hub listening on http://%s:%d", settings.host, settings.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        restart = app[HUB].restart_requested
        waiters = {
            asyncio.create_task(stop.wait()): Outcome.STOP,
            asyncio.create_task(restart.wait()): Outcome.RESTART,
        }
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        outcome = waiters[done.pop()]
        executions = app[HUB].executions
        executions.stop_claiming()
        running = executions.running_count()
        # A restart was promised a drain; a stop (SIGTERM) hands running turns back at once, so
        # the next start runs them instead of waiting for their leases to expire.
        drain_seconds = settings.drain_seconds if outcome is Outcome.RESTART else 0.0
        logger.info(
            "draining before %s: no new turns; %d running, waiting up to %.0fs for them",
            outcome.value,
            running,
            drain_seconds,
        )
        if not await executions.wait_until_idle(drain_seconds):
            handed = await executions.hand_back()
            logger.warning(
                "%d turns still running after %.0fs were handed back; they run again after the %s",
                len(handed),
                drain_seconds,
                outcome.value,
            )
        # Long polls end next so they do not hold the request drain open.
        await executions.close()
        if not await app[DRAIN].wait_idle(REQUEST_DRAIN_SECONDS):
            logger.warning(
                "requests still running after %.0fs; stopping anyway", REQUEST_DRAIN_SECONDS
            )
        return outcome
    finally:
        await runner.cleanup()


def run(settings: HubSettings) -> None:
    """Serve, and after a restart request come back as a fresh process with the same arguments."""
    outcome = asyncio.run(serve(settings))
    if outcome is Outcome.RESTART:
        if settings.restart_mode == "exit":
            logger.info("exiting for the supervisor to restart the Hub")
            raise SystemExit(RESTART_EXIT_STATUS)
        logger.info("restarting in place")
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)
