"""A turn's progress streamed into a CardKit card, with the PATCH card as the fallback.

Rules:

- ``open_streaming`` creates a card entity in streaming mode and replies with it in the topic;
  when CardKit is refused or fails it returns None and the caller uses today's throttled PATCH
  updates of an ordinary card.
- Each update sends the whole text so far under a ``sequence`` larger than any sent before, so an
  update that fails is made good by the next one, and Feishu drops one that arrives after a newer
  one: nothing is lost or shown out of order.
- At most one update per ``interval`` per card; texts offered meanwhile are coalesced, the newest
  kept. Rate-limit answers are retried by the client, honouring their reset time.
- The sequence is the number of milliseconds since the card was created (plus one, and always
  above the last one sent), so a re-attached bot in a new process keeps increasing it without
  storing it. Feishu's 31-bit sequence lasts 24 days at that pace.
- The end of the turn (streaming closed, the card replaced by the first result card) is owed in
  the outbox under the sequence taken when it was owed, with a fixed idempotency key.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.feishu.client import FeishuClient
from cards.models import Lang, ProgressView
from cards.streaming import STREAM_ELEMENT, streaming_card
from hub.errors import AmuxError

logger = logging.getLogger("amux.bot")


def sequence_at(created_at: float, now: float) -> int:
    return max(1, int((now - created_at) * 1000) + 1)


@dataclass(frozen=True)
class Opened:
    message_id: str
    card_id: str


async def open_streaming(
    client: FeishuClient, reply_to: str, view: ProgressView, lang: Lang
) -> Opened | None:
    """The turn's streaming card in the topic, or None when CardKit cannot be used."""
    try:
        card_id = await client.create_card_entity(streaming_card(view, lang))
    except AmuxError as error:
        logger.info("no streaming card (%s); updating an ordinary card instead", error.message)
        return None
    sent = await client.reply_card_entity(reply_to, card_id)
    return Opened(sent.message_id, card_id)


class StreamingCard:
    """Sends the newest text of one streaming card, at most once per ``interval``."""

    def __init__(
        self,
        client: FeishuClient,
        card_id: str,
        created_at: float,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.card_id = card_id
        self._client = client
        self._created_at = created_at
        self._interval = interval
        self._clock = clock
        self._last_sequence = 0
        self._pending: str | None = None
        self._sent: str | None = None
        self._sender: asyncio.Task[None] | None = None

    def next_sequence(self) -> int:
        sequence = max(self._last_sequence + 1, sequence_at(self._created_at, self._clock()))
        self._last_sequence = sequence
        return sequence

    def push(self, content: str) -> None:
        """Show ``content`` soon; a newer push replaces one not sent yet."""
        if content == self._sent:
            return
        self._pending = content
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(
                self._send(), name=f"feishu-stream-{self.card_id}"
            )

    async def _send(self) -> None:
        while self._pending is not None:
            content, self._pending = self._pending, None
            try:
                await self._client.stream_card_text(
                    self.card_id, STREAM_ELEMENT, content, self.next_sequence()
                )
                self._sent = content
            except AmuxError as error:
                # The next push carries the whole text again; the end of the turn is owed anyway.
                logger.warning("streaming update of card %s failed: %s", self.card_id, error)
            await asyncio.sleep(self._interval)

    async def flush(self) -> None:
        """Wait until the newest text pushed has been sent (or failed)."""
        if self._sender is not None:
            await asyncio.gather(self._sender, return_exceptions=True)

    async def close(self) -> None:
        """Stop sending; an update still in flight loses to the final card's later sequence."""
        self._pending = None
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
