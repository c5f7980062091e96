"""What a received message's ``content`` says, for the kinds beyond text and rich text.

The SDK's normalizers (``lark_oapi.channel``, imported through ``bot.feishu.sdk``) parse each
kind and flatten it to text; this module puts them behind amux's own vocabulary and fills the
gaps they leave:

- shares, locations, todos, calendar events, video meetings, votes and the like are read as
  text the sender sent (the SDK's rendering, e.g. ``<group_card id="oc_…"/>`` or
  ``<todo>…</todo>``);
- a card (``interactive``) is read as text someone else wrote: the SDK walks the cards apps
  send (``header`` / ``body``), and Feishu delivers a received card reduced to a ``title`` and
  rows of ``elements``, which the SDK leaves as ``[interactive]``: those are walked here;
- a forwarded chat's messages (one ``GET`` of the forward, see ``bot.forwards``) are expanded
  by the SDK's expander and each flattened here, their ``@_user_N`` placeholders named.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bot.feishu.sdk import (
    InteractiveContent,
    MergeForwardItem,
    extract_mentions,
    flatten_content,
    parse_message_content,
    resolve_mentions,
)

MERGE_FORWARD = "merge_forward"
INTERACTIVE = "interactive"
STICKER = "sticker"
# Kinds whose content the sender composed and that read as text.
READ_AS_TEXT = frozenset(
    {
        "share_chat",
        "share_user",
        "location",
        "todo",
        "calendar",
        "general_calendar",
        "share_calendar_event",
        "video_chat",
        "vote",
        "folder",
        "hongbao",
        "system",
    }
)
# What the SDK renders a card as when it found no text in it.
_NO_CARD_TEXT = frozenset({"", "[interactive]"})
# Elements of a received card's rows that carry words.
_CARD_TEXT_TAGS = frozenset(
    {"text", "a", "md", "lark_md", "markdown", "plain_text", "button", "note", "code_block"}
)


def shared_text(message_type: str, content: str) -> str:
    """The text of a share, location, todo, calendar event and the like (``READ_AS_TEXT``)."""
    if message_type not in READ_AS_TEXT:
        return ""
    text, _ = flatten_content(parse_message_content(message_type, content))
    return str(text).strip()


def card_text(content: str | dict[str, Any]) -> str:
    """The words of a card, title first; empty when it has none."""
    parsed = parse_message_content(INTERACTIVE, content)
    assert isinstance(parsed, InteractiveContent)
    text = str(flatten_content(parsed)[0]).strip()
    if text not in _NO_CARD_TEXT:
        return text
    return _received_card_text(parsed.card)


def _received_card_text(card: dict[str, Any]) -> str:
    """A card as Feishu delivers it to a receiver: ``{"title", "elements": [[element, ...]]}``
    (rows of post-like elements), or a 1.0 card's ``header`` and flat ``elements``."""
    lines: list[str] = []
    title = card.get("title")
    header = card.get("header")
    if isinstance(title, str) and title.strip():
        lines.append(title.strip())
    elif isinstance(header, dict):
        lines.extend(_words(header.get("title")))
    for row in card.get("elements") or []:
        words = _words(row)
        if words:
            lines.append(" ".join(words))
    return "\n".join(lines)


def _words(node: Any, depth: int = 0) -> list[str]:
    """The text leaves below ``node``, in order (bounded depth: a card is untrusted input)."""
    if depth > 12:
        return []
    if isinstance(node, list):
        return [w for item in node for w in _words(item, depth + 1)]
    if not isinstance(node, dict):
        return []
    found: list[str] = []
    tag = node.get("tag")
    for key in ("text", "content"):
        value = node.get(key)
        if isinstance(value, str) and value.strip() and tag in _CARD_TEXT_TAGS:
            found.append(value.strip())
        elif isinstance(value, dict | list):
            found.extend(_words(value, depth + 1))
    if tag == "at":
        name = node.get("user_name") or node.get("user_id")
        if isinstance(name, str) and name:
            found.append(f"@{name}")
    for key in ("elements", "fields", "actions", "columns"):
        if key in node:
            found.extend(_words(node[key], depth + 1))
    return found


def forwarded_item_text(item: MergeForwardItem) -> str:
    """One message of a forwarded chat as text: a nested forward as the SDK renders it (each
    of its messages headed by time and sender), a card by its words, mentions by name."""
    content = item.content
    if content is None:
        return ""
    if isinstance(content, InteractiveContent):
        text = card_text(content.raw or content.card)
    else:
        text, _ = flatten_content(content)
    mentions = item.raw.get("mentions") if isinstance(item.raw, dict) else None
    return str(resolve_mentions(text, extract_mentions(_mentions(mentions)))).strip()


def _mentions(raw: Any) -> Iterable[dict[str, Any]]:
    """A listed message's mentions (``id`` a string there) in the event's shape the SDK reads."""
    for mention in raw if isinstance(raw, list) else []:
        if not isinstance(mention, dict):
            continue
        ident = mention.get("id")
        if isinstance(ident, str):
            kind = str(mention.get("id_type") or "open_id")
            yield {**mention, "id": {kind: ident}}
        else:
            yield mention
