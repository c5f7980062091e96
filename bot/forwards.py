"""A forwarded chat's messages, read for the turn its forward starts.

A forwarded chat (``merge_forward``) arrives as an event with no content of its own; its messages
are read with one ``im.v1.message.get`` of the forward, which lists the forward and every message
in it (nested forwards included, each naming the forward it sits in). The SDK's expander rebuilds
the tree from that one answer; each message becomes a :class:`~bot.feishu.events.Forwarded` with
its sender's display name (read as topic context reads them: the contact API, cleaned, a short id
when names cannot be read) and its time.

The messages were written by other people: the prompt shows them inside the same fence as a
topic's context (``bot.topic_context.with_context``), never as the requester's words.

Bounds: at most ``MAX_ITEMS`` messages per forward (the expander's, nested ones rendered inside
their forward), each at most ``MAX_TEXT_CHARS`` of text, and ``MAX_BYTES`` in all; what is left
out is counted, and the prompt says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.feishu.client import FeishuClient
from bot.feishu.content import forwarded_item_text
from bot.feishu.events import Forwarded, MessageEvent
from bot.feishu.sdk import MergeForwardExpander
from bot.topic_context import clean_name
from hub.errors import AmuxError

logger = logging.getLogger("amux.bot")

MAX_ITEMS = 50
MAX_DEPTH = 3
MAX_TEXT_CHARS = 4000
MAX_BYTES = 32 * 1024
MAX_NAMES = 50


@dataclass(frozen=True)
class Forwards:
    messages: tuple[Forwarded, ...] = ()
    left_out: int = 0
    unavailable: str | None = None


class ForwardReader:
    """Reads forwarded chats through the bot's Feishu client."""

    def __init__(self, client: FeishuClient) -> None:
        self._client = client

    async def read(self, event: MessageEvent) -> Forwards:
        """The messages of ``event``'s forwarded chat (none for any other message)."""
        if not event.is_forward:
            return Forwards()
        try:
            payload = await self._client.message_items(event.message_id)
        except AmuxError as error:
            logger.warning("forward %s could not be read: %s", event.message_id, error.message)
            return Forwards(unavailable=error.message)
        items = payload["data"]["items"]
        people = sorted(
            {
                str(item["sender"].get("id") or "")
                for item in items
                if isinstance(item.get("sender"), dict)
                and item["sender"].get("sender_type") == "user"
            }
            - {""}
        )

        async def fetch(_message_id: str) -> dict[str, Any]:
            return payload

        async def names(_open_ids: Sequence[str]) -> dict[str, str]:
            # Only people have names in the contact API; apps are shown by their id.
            if not people:
                return {}
            try:
                # The contact API takes at most MAX_NAMES ids a call; the rest go by their id.
                return await self._client.user_names(people[:MAX_NAMES])
            except AmuxError as error:
                # Names are a courtesy: without the contact scope the messages still go out.
                logger.info("sender names unavailable: %s", error.message)
                return {}

        expander = MergeForwardExpander(fetch, names, max_depth=MAX_DEPTH, max_items=MAX_ITEMS)
        expanded = await expander.expand(event.message_id)
        kept: list[Forwarded] = []
        used = 0
        left_out = 0
        for item in expanded.items:
            raw = item.raw if isinstance(item.raw, dict) else {}
            if raw.get("deleted"):
                continue
            text = forwarded_item_text(item)[:MAX_TEXT_CHARS]
            size = len(text.encode("utf-8", "surrogatepass"))
            if used + size > MAX_BYTES:
                left_out += 1
                continue
            used += size
            sender = raw.get("sender") if isinstance(raw.get("sender"), dict) else {}
            assert isinstance(sender, dict)
            kept.append(
                Forwarded(
                    text,
                    sender_open_id=item.sender_open_id or "",
                    sender_name=clean_name(item.sender_name or ""),
                    sender_type=str(sender.get("sender_type") or ""),
                    create_time_ms=item.create_time or 0,
                    message_type=str(raw.get("msg_type") or ""),
                )
            )
        if expanded.truncated:
            inside = [
                i
                for i in items
                if (i.get("upper_message_id") or event.message_id) == event.message_id
                and i.get("message_id") != event.message_id
            ]
            left_out += max(0, len(inside) - len(expanded.items))
        if not kept and not left_out:
            return Forwards(unavailable="Feishu listed no messages in it")
        return Forwards(tuple(kept), left_out)
