"""The composition root of the ``amux serve`` process: one aiohttp application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from bot.config import FeishuSettings
from bot.service import logs
from bot.service.worker_process import WorkerProcess
from hub.bodies import SERVER_ARGS
from hub.client import HubClient
from hub.config import HubSettings
from hub.errors import InvalidArgument, NotFound
from hub.local_transport import LocalTransport
from hub.rpc import HUB
from hub.server import add_hub
from hub.state import State
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launchers import configured_launcher
from runtime_bridge.worker import Worker

if TYPE_CHECKING:
    from bot.feishu.client import FeishuClient

logger = logging.getLogger("amux.serve")

IN_PROCESS_WORKER = "in-process worker"
RUNTIME_PRINCIPAL = "runtime"
# The local worker's child process, when it runs as one.
WORKER_PROCESS = web.AppKey("worker_process", WorkerProcess)


def create_app(
    hub_settings: HubSettings,
    runtime_settings: RuntimeSettings | None = None,
    worker_url: str | None = None,
    feishu_settings: FeishuSettings | None = None,
    feishu_client: FeishuClient | None = None,
    *,
    hub_listening: asyncio.Event | None = None,
    feishu_owner: str = "",
    worker_process: bool = False,
) -> web.Application:
    """Build the service; nothing starts until the application's startup runs.

    With ``worker_url`` (the Hub's own address) an in-process Runtime worker runs beside the
    Hub, so one machine works out of the box. Its own calls go through the in-process transport
    (the same drain, request id, metrics, authentication and dispatch as HTTP, no socket); the
    Agents it launches reach the Hub at ``worker_url``. The application starts before its socket
    listens, so the worker starts once ``hub_listening`` is set when given: its first turn's
    Agent must find the Hub listening. With ``worker_process`` (what ``amux serve`` does) that
    worker runs as a child process instead, reaching the Hub at ``worker_url`` over HTTP, so a
    turn's launch work runs beside the Hub's rather than in its process.
    Settings not given are their defaults (the bot off), never read from the environment: only
    the process's own entry point (``amux serve``) reads that. ``feishu_owner`` is the open_id of
    the person who created the app by scanning its set-up QR code: the owner, unless the Hub has a
    Feishu owner already.
    """
    feishu = feishu_settings if feishu_settings is not None else FeishuSettings.model_construct()
    problem = feishu.startup_problem()
    if problem is not None:
        # Before the Hub takes its lock and opens its state: nothing starts half-configured.
        raise InvalidArgument(problem)
    app = web.Application(client_max_size=hub_settings.max_request_bytes, handler_args=SERVER_ARGS)
    settings = (
        runtime_settings if runtime_settings is not None else RuntimeSettings.model_construct()
    )
    add_hub(app, hub_settings, settings.accepted_providers())
    if worker_url is not None:
        app.cleanup_ctx.append(
            _local_worker(hub_settings, settings, worker_url, hub_listening, worker_process)
        )
    if feishu.enabled:
        # Imported only when the bot is on: lark-oapi takes seconds to import.
        from bot.service.feishu_app import add_feishu

        # The bot reaches Agents' workspaces (files in and out) only beside an in-process worker.
        in_process = settings if worker_url is not None else None
        add_feishu(
            app, hub_settings, feishu, feishu_client, runtime=in_process, owner_open_id=feishu_owner
        )
    else:
        logger.info(feishu.describe())
    return app


def _local_worker(
    hub_settings: HubSettings,
    settings: RuntimeSettings,
    url: str,
    hub_listening: asyncio.Event | None,
    own_process: bool,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        token = _fresh_worker_credential(app[HUB].state)
        work_dir = settings.work_dir_beside(hub_settings.home)
        # What tells the worker to stop claiming before its task is cancelled: a child process
        # is told by its SIGTERM, in ``end``.
        halt: Callable[[], None] = _nothing
        begin: Callable[[], Awaitable[None]]
        end: Callable[[], Awaitable[None]]
        if own_process:
            child = WorkerProcess(
                url,
                token,
                settings.model_dump(mode="json"),
                work_dir,
                hub_settings.home,
                logs.current_settings(),
                logs.current_stream(),
            )
            app[WORKER_PROCESS] = child
            # Its settings are checked now, so a bad one stops the Hub's start with its reason.
            await child.start()

            async def begin() -> None:
                child.go()

            end = child.stop
        else:
            stop = asyncio.Event()
            client = HubClient(url, token, transport=LocalTransport(app))
            worker = Worker(
                client,
                url,
                settings,
                work_dir,
                amux_home=hub_settings.home,
                launcher=configured_launcher(settings),
            )
            halt, end = stop.set, client.close

            async def begin() -> None:
                await worker.run_forever(stop)

        async def run() -> None:
            if hub_listening is not None:
                await hub_listening.wait()
            await begin()

        task = asyncio.create_task(run())

        async def stop_worker(app: web.Application) -> None:
            # Before in-flight requests are drained: the worker's own long poll is one of them.
            # A turn it was running is retried after the restart, when its lease expires.
            halt()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await end()

        app.on_shutdown.append(stop_worker)
        yield
        await stop_worker(app)

    return lifetime


def _nothing() -> None:
    return None


def _fresh_worker_credential(state: State) -> str:
    """A credential per start for the local worker, held only in memory; the previous one is
    revoked."""
    try:
        principal = state.principal_by_name(RUNTIME_PRINCIPAL)
    except NotFound:
        principal = state.add_principal(RUNTIME_PRINCIPAL, "service")
    for credential in state.credentials(principal.id):
        if credential.label == IN_PROCESS_WORKER and credential.revoked_at is None:
            state.revoke_credential(credential.id)
    token, _ = state.issue_credential(principal.id, "cli", label=IN_PROCESS_WORKER)
    return token
