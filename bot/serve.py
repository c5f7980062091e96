"""Running ``amux serve``: listen, wait for a stop or restart, drain, and restart in place."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from enum import Enum

from aiohttp import web

from bot.app import create_app
from bot.logs import AccessLogger
from hub.config import HubSettings
from hub.middleware import DRAIN
from hub.rpc import HUB
from runtime_bridge.config import RuntimeSettings

logger = logging.getLogger("amux.serve")

# systemd units treat this exit status as "restart me" (RestartForceExitStatus=75).
RESTART_EXIT_STATUS = 75
DRAIN_SECONDS = 30.0


def local_url(host: str, port: int) -> str:
    """How a worker in this process reaches the Hub it runs beside."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class Outcome(Enum):
    STOP = "stop"
    RESTART = "restart"


async def serve(settings: HubSettings) -> Outcome:
    """Serve until SIGTERM/SIGINT or an owner's restart request, then drain in-flight work."""
    runtime = RuntimeSettings()
    warning = runtime.unsandboxed_warning() if runtime.in_process else None
    if warning is not None:
        logger.warning(warning)
    worker_url = local_url(settings.host, settings.port) if runtime.in_process else None
    listening = asyncio.Event()
    app = create_app(settings, runtime, worker_url=worker_url, hub_listening=listening)
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=1.0, access_log_class=AccessLogger
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
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
        logger.info("draining before %s", outcome.value)
        # Long polls end first so they do not hold the drain open.
        await app[HUB].executions.close()
        if not await app[DRAIN].wait_idle(DRAIN_SECONDS):
            logger.warning("requests still running after %.0fs; stopping anyway", DRAIN_SECONDS)
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
