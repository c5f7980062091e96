"""The Feishu adapter assembled from settings: the composition root's one handle on Feishu.

Wiring (``bot/service/feishu_app.py``)::

    adapter = FeishuAdapter(settings, sink, state_dir=hub_settings.home)
    app.add_routes(adapter.routes())   # webhook mode: POST /feishu/events
    await adapter.start()              # once the Hub is open: bot identity, long connection
    await adapter.stop()               # at shutdown (``adapter.context`` pairs the two for
                                       # ``app.cleanup_ctx``)

``sink`` is the bot's :class:`~bot.feishu.events.EventSink`; it answers through
``adapter.client`` (send, reply in topic, update card) and ``adapter.cards`` (throttled
streaming updates of progress cards).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from bot.config import FeishuSettings
from bot.feishu.catchup import CATCH_UP_FILE, CatchUp, CatchUpStore
from bot.feishu.client import FeishuClient
from bot.feishu.dedup import SqliteEventDedup
from bot.feishu.dispatcher import EventDispatcher
from bot.feishu.events import EventSink
from bot.feishu.ingress import WebhookIngress
from bot.feishu.liveness import LinkHealth
from bot.feishu.longconn import LongConnection
from bot.feishu.throttle import CardUpdateThrottle
from bot.feishu.verifier import WebhookVerifier
from hub.errors import AmuxError, InvalidArgument

logger = logging.getLogger(__name__)

DEDUP_FILE = "feishu-events.sqlite3"


class FeishuAdapter:
    """Client, ingress (webhook or long connection), de-duplication and card throttle."""

    def __init__(
        self,
        settings: FeishuSettings,
        sink: EventSink,
        state_dir: Path,
        *,
        client: FeishuClient | None = None,
        identity_retry_seconds: float = 30.0,
        body_seconds: float = 10.0,
    ) -> None:
        """Build everything without I/O beyond opening the dedup database; a webhook request's
        body must arrive within ``body_seconds``.

        Raises:
            InvalidArgument: the bot is not configured, or webhook mode lacks its secrets
                (``FeishuSettings.webhook_secrets_missing``).
        """
        if not settings.enabled:
            raise InvalidArgument("Feishu is not configured (AMUX_FEISHU_APP_ID is empty)")
        problem = settings.startup_problem()
        if problem is not None:
            raise InvalidArgument(problem)
        self.settings = settings
        self._identity_retry = identity_retry_seconds
        self.client = client or FeishuClient(settings)
        verifier = (
            WebhookVerifier(
                encrypt_key=settings.encrypt_key.get_secret_value(),
                verification_token=settings.verification_token.get_secret_value(),
                max_skew_seconds=settings.max_clock_skew_seconds,
            )
            if settings.mode == "webhook"
            else None
        )
        state_dir.mkdir(parents=True, exist_ok=True)
        self.dedup = SqliteEventDedup(
            state_dir / DEDUP_FILE, retention_seconds=settings.dedup_hours * 3600
        )
        self.dispatcher = EventDispatcher(sink, self.dedup)
        self.cards = CardUpdateThrottle(
            self.client.update_card, settings.card_update_interval_seconds
        )
        self._webhook = (
            WebhookIngress(verifier, self.dispatcher, body_seconds=body_seconds)
            if verifier
            else None
        )
        self._longconn = (
            LongConnection(settings, self.dispatcher)
            if settings.mode == "long_connection"
            else None
        )
        self._identity_task: asyncio.Task[None] | None = None
        self.identity_known = asyncio.Event()
        try:
            self._catch_up_store = CatchUpStore(state_dir / CATCH_UP_FILE)
        except BaseException:
            self.dedup.close()
            raise
        self.catch_up = CatchUp(
            settings, self._catch_up_store, self.client, self.dispatcher, self.identity_known
        )

    def routes(self) -> list[web.RouteDef]:
        """The webhook route in webhook mode; nothing for the long connection."""
        return self._webhook.routes() if self._webhook else []

    @property
    def link_health(self) -> LinkHealth | None:
        """The long connection's liveness; None in webhook mode."""
        return self._longconn.health if self._longconn is not None else None

    @property
    def bot_open_id(self) -> str:
        return self.dispatcher.bot_open_id

    async def start(self) -> None:
        """Learn the bot's identity (retrying in the background) and open the long connection."""
        logger.info(self.settings.describe())
        self._identity_task = asyncio.get_running_loop().create_task(
            self._learn_identity(), name="feishu-bot-identity"
        )
        if self._longconn is None:
            # Feishu retries a webhook's events for hours, but not ones it gave up on meanwhile.
            self.catch_up.start()
        else:
            # Whenever the connection is (re)established, the first time included.
            self.catch_up.listen(self._longconn.health)
            self._longconn.start()
            try:
                await self._longconn.wait_connected()
            except AmuxError as error:
                # The SDK keeps reconnecting on its own; refused credentials need the operator.
                logger.error("Feishu long connection: %s", error.message)

    async def _learn_identity(self) -> None:
        while True:
            try:
                info = await self.client.bot_info()
            except AmuxError as error:
                logger.warning("cannot read the Feishu bot's identity yet: %s", error.message)
                await asyncio.sleep(self._identity_retry)
                continue
            self.dispatcher.bot_open_id = info.open_id
            self.identity_known.set()
            logger.info("Feishu bot identity known (%s)", info.name or "unnamed")
            return

    async def stop(self) -> None:
        """Stop taking events, finish handlers and card updates, release resources."""
        if self._longconn is not None:
            await self._longconn.stop()
        if self._identity_task is not None:
            self._identity_task.cancel()
            await asyncio.gather(self._identity_task, return_exceptions=True)
        await self.catch_up.stop()
        await self.dispatcher.drain()
        await self.cards.close()
        await self.client.close()
        self.dedup.close()
        self._catch_up_store.close()

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        """For ``app.cleanup_ctx``: start with the app, stop with it."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()
