"""Hands parsed Feishu events to the :class:`EventSink`, once each, after answering Feishu.

Shared by the webhook and the long connection. Messages and other events run as tracked
background tasks so Feishu gets its answer at once; a card click waits for the sink's in-place
response for at most ``card_timeout`` (Feishu gives up after 3 s) and keeps running after that.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine
from typing import Any

from bot.feishu.events import (
    CardAction,
    CardResponse,
    EventDedup,
    EventSink,
    MalformedEvent,
    MessageEvent,
    UrlVerification,
    parse_event,
)
from bot.feishu.observer import FeishuObserver, NoObserver
from hub.errors import InvalidArgument
from hub.requestid import REQUEST_ID

logger = logging.getLogger(__name__)

ACK: dict[str, Any] = {"msg": "success"}


class EventDispatcher:
    """Parse → de-duplicate → hand to the sink; returns the body Feishu should receive."""

    def __init__(
        self,
        sink: EventSink,
        dedup: EventDedup,
        *,
        bot_open_id: str = "",
        card_timeout: float = 2.5,
    ) -> None:
        self._sink = sink
        self._dedup = dedup
        # Filled in at start-up from /bot/v3/info; needed to strip the bot's own mention.
        self.bot_open_id = bot_open_id
        self._card_timeout = card_timeout
        self._tasks: set[asyncio.Task[Any]] = set()
        self.observer: FeishuObserver = NoObserver()

    @property
    def pending(self) -> int:
        """Background handlers still running."""
        return len(self._tasks)

    async def dispatch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Handle one authenticated plaintext payload.

        Raises:
            InvalidArgument: the payload is not a Feishu event.
        """
        if REQUEST_ID.get() is None:
            # Long-connection events arrive outside any HTTP request; give each its own id.
            REQUEST_ID.set(uuid.uuid4().hex)
        try:
            event = parse_event(payload, self.bot_open_id)
        except MalformedEvent as error:
            raise InvalidArgument(f"malformed Feishu event: {error}") from None
        if isinstance(event, UrlVerification):
            return {"challenge": event.challenge}
        if not await self._first_time(event.event_id):
            self.observer.feishu_event("deduplicated")
            logger.info("duplicate Feishu event %s ignored", event.event_id)
            return {} if isinstance(event, CardAction) else ACK
        self.observer.feishu_event("received")
        if isinstance(event, MessageEvent):
            self._spawn(self._sink.on_message(event), event.event_id)
            return ACK
        if isinstance(event, CardAction):
            return await self._card(event)
        self._spawn(self._sink.on_event(event), event.event_id)
        return ACK

    async def _first_time(self, event_id: str) -> bool:
        try:
            return await self._dedup.first_time(event_id)
        except Exception:
            # Losing de-duplication is better than losing the event.
            logger.exception("event de-duplication failed; processing %s anyway", event_id)
            return True

    async def _card(self, action: CardAction) -> dict[str, Any]:
        task = self._spawn(self._sink.on_card_action(action), action.event_id)
        done, _ = await asyncio.wait({task}, timeout=self._card_timeout)
        if not done or task.cancelled() or task.exception() is not None:
            # Feishu keeps the card as it is; the handler may still update it later.
            return {}
        response = task.result()
        return response.to_wire() if isinstance(response, CardResponse) else {}

    def _spawn(self, work: Coroutine[Any, Any, Any], event_id: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work, name=f"feishu-event-{event_id}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.observer.feishu_event("failed")
            logger.error(
                "Feishu event handler %s failed", task.get_name(), exc_info=task.exception()
            )

    async def drain(self, grace_seconds: float = 10.0) -> None:
        """Wait for running handlers (graceful shutdown), then cancel what is left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace_seconds)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
