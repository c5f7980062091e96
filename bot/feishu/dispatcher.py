"""Hands parsed Feishu events to the :class:`EventSink`, once each, after answering Feishu.

Shared by the webhook and the long connection. Before the answer only the parse and the
de-duplication record run: that record is what makes a retry of an acknowledged event a no-op.
Messages and other events become tracked background handlers, which start only once the ingress
says their answer went out (:meth:`EventDispatcher.accept`), in the order they were accepted,
one per turn of the event loop. A handler's first steps (a newcomer's enrolment, a card to
build) run on the loop, and a burst of them started at once would hold back the answers to
requests that arrived meanwhile. A card click waits for the sink's in-place response for at
most ``card_timeout`` (Feishu gives up after 3 s) and keeps running after that: its answer is
the response.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from bot.feishu.events import (
    CardAction,
    CardResponse,
    CommentEvent,
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


@dataclass
class _Owed:
    """An accepted event whose handler has not started yet."""

    event_id: str
    work: Callable[[], Coroutine[Any, Any, Any]]
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    # The accepting request's, so the handler's log lines carry its request id.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


@dataclass(frozen=True)
class Accepted:
    """The body Feishu should receive, and how to say it went out.

    Call :meth:`answered` once the body is written, or failed to be: the event is recorded as
    seen either way, so a retry would be dropped and only this handler will ever run it.
    """

    answer: dict[str, Any]
    _owed: _Owed | None = None

    @property
    def handled(self) -> bool:
        """Whether a handler will run for it (false for duplicates and verification)."""
        return self._owed is not None

    def answered(self) -> None:
        if self._owed is not None:
            self._owed.answered.set()


class MessageDedup(EventDedup, Protocol):
    """Also remembers message ids: a message listed by catch-up carries no event id of Feishu's."""

    async def first_message(self, message_id: str) -> bool:
        """Record ``message_id``; true only the first time it is seen."""


def _nobody(event: MessageEvent) -> None:
    pass


class EventDispatcher:
    """Parse → de-duplicate → hand to the sink; returns the body Feishu should receive."""

    def __init__(
        self,
        sink: EventSink,
        dedup: MessageDedup,
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
        # Accepted events whose handlers have not started, oldest first.
        self._owed: deque[_Owed] = deque()
        self._starter: asyncio.Task[None] | None = None
        self.observer: FeishuObserver = NoObserver()
        # Told of each message about to be handled (catch-up keeps where each chat got to).
        self.seen: Callable[[MessageEvent], None] = _nobody

    @property
    def pending(self) -> int:
        """Background handlers not yet started or still running."""
        return len(self._owed) + len(self._tasks)

    async def dispatch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """:meth:`accept`, for a caller that does not write the answer itself: the handler may
        start as soon as this returns.

        Raises:
            InvalidArgument: the payload is not a Feishu event.
        """
        accepted = await self.accept(payload)
        accepted.answered()
        return accepted.answer

    async def accept(self, payload: dict[str, Any]) -> Accepted:
        """Handle one authenticated plaintext payload up to its answer.

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
            return Accepted({"challenge": event.challenge})
        if not await self._first_time(event.event_id):
            self.observer.feishu_event("deduplicated")
            logger.info("duplicate Feishu event %s ignored", event.event_id)
            return Accepted({} if isinstance(event, CardAction) else ACK)
        if isinstance(event, MessageEvent) and not await self._first_message(event.message_id):
            self.observer.feishu_event("deduplicated")
            logger.info("message %s of event %s ran already", event.message_id, event.event_id)
            return Accepted(ACK)
        if (
            isinstance(event, CommentEvent)
            and event.reply_id
            and not await self._first_message(event.seen_key)
        ):
            # Feishu may notify one reply twice under two event ids; it runs once.
            self.observer.feishu_event("deduplicated")
            logger.info("comment reply of event %s ran already", event.event_id)
            return Accepted(ACK)
        self.observer.feishu_event("received")
        if isinstance(event, CardAction):
            return Accepted(await self._card(event))
        sink = self._sink
        if isinstance(event, MessageEvent):
            message = event
            try:
                self.seen(message)
            except Exception:
                logger.exception("could not note where chat %s got to", message.chat_id)
            owed = _Owed(event.event_id, lambda: sink.on_message(message))
        elif isinstance(event, CommentEvent):
            comment = event
            owed = _Owed(event.event_id, lambda: sink.on_comment(comment))
        else:
            other = event
            owed = _Owed(event.event_id, lambda: sink.on_event(other))
        self._owed.append(owed)
        if self._starter is None or self._starter.done():
            self._starter = asyncio.get_running_loop().create_task(
                self._start_owed(), name="feishu-event-starter"
            )
        return Accepted(ACK, owed)

    async def _start_owed(self) -> None:
        while self._owed:
            owed = self._owed[0]
            await owed.answered.wait()
            self._owed.popleft()
            self._spawn(owed.work(), owed.event_id, owed.context)
            # The handler's first steps run on the next turn; answers that arrive meanwhile go
            # out before the one after it starts.
            await asyncio.sleep(0)

    async def _first_time(self, event_id: str) -> bool:
        try:
            return await self._dedup.first_time(event_id)
        except Exception:
            # Losing de-duplication is better than losing the event.
            logger.exception("event de-duplication failed; processing %s anyway", event_id)
            return True

    async def _first_message(self, message_id: str) -> bool:
        try:
            return await self._dedup.first_message(message_id)
        except Exception:
            logger.exception("message de-duplication failed; processing %s anyway", message_id)
            return True

    async def _card(self, action: CardAction) -> dict[str, Any]:
        task = self._spawn(self._sink.on_card_action(action), action.event_id)
        done, _ = await asyncio.wait({task}, timeout=self._card_timeout)
        if not done or task.cancelled() or task.exception() is not None:
            # Feishu keeps the card as it is; the handler may still update it later.
            return {}
        response = task.result()
        return response.to_wire() if isinstance(response, CardResponse) else {}

    def _spawn(
        self,
        work: Coroutine[Any, Any, Any],
        event_id: str,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(
            work, name=f"feishu-event-{event_id}", context=context
        )
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
        """Start every accepted handler, wait for them (graceful shutdown), then cancel what is
        left."""
        # Their answers are out, or the requests are gone with their connections.
        for owed in self._owed:
            owed.answered.set()
        if self._starter is not None:
            await self._starter
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace_seconds)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
