"""Typed Feishu events, the seams that consume them, and the pure parser from Feishu's JSON.

Both ingress paths (webhook and long connection) produce the same plaintext schema 2.0
payloads; :func:`parse_event` turns one into a :class:`MessageEvent`, :class:`CardAction`,
:class:`CommentEvent` or :class:`OtherEvent`. Parsing is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from bot.feishu.content import INTERACTIVE, MERGE_FORWARD, READ_AS_TEXT, card_text, shared_text

MESSAGE_RECEIVE = "im.message.receive_v1"
CARD_ACTION = "card.action.trigger"
MESSAGE_RECALLED = "im.message.recalled_v1"
# A comment or reply added in a cloud document the bot is told of (it was @mentioned).
COMMENT_ADD = "drive.notice.comment_add_v1"
# Types amux subscribes to besides messages and card clicks; they reach EventSink.on_event.
OTHER_SUBSCRIBED = frozenset(
    {
        "im.chat.member.bot.added_v1",
        "im.chat.member.bot.deleted_v1",
        "im.chat.disbanded_v1",
        "im.message.message_read_v1",
        MESSAGE_RECALLED,
        "im.chat.access_event.bot_p2p_chat_entered_v1",
        "application.bot.menu_v6",
    }
)


@dataclass(frozen=True)
class UserIds:
    """A user's ids: ``open_id`` is per app, ``union_id`` per developer, ``user_id`` opt-in and
    unique only inside ``tenant_key``, the user's own tenant (empty when Feishu left it out)."""

    open_id: str = ""
    union_id: str = ""
    user_id: str = ""
    tenant_key: str = ""


@dataclass(frozen=True)
class Mention:
    key: str
    name: str
    ids: UserIds


@dataclass(frozen=True)
class Attachment:
    """An image, file, voice message (``audio``) or video of a message.

    Stickers are not attachments: Feishu serves no sticker's file to an app."""

    kind: Literal["image", "file", "audio", "video"]
    key: str
    name: str = ""

    @property
    def resource_type(self) -> str:
        """The resource type Feishu serves it as: audio and video are files to its API."""
        return "image" if self.kind == "image" else "file"


@dataclass(frozen=True)
class Forwarded:
    """Something a message carries that its sender did not write: one message of a forwarded
    chat, or a forwarded card. Who wrote it is ``sender_open_id`` / ``sender_name`` (empty when
    Feishu does not say, as for a card); ``sender_type`` is Feishu's (user, app)."""

    text: str
    sender_open_id: str = ""
    sender_name: str = ""
    sender_type: str = ""
    create_time_ms: int = 0
    message_type: str = ""


@dataclass(frozen=True)
class MessageEvent:
    """A message someone sent the bot (private chat) or wrote in a group the bot is in."""

    event_id: str
    sender: UserIds
    sender_type: str
    chat_id: str
    chat_type: str
    message_id: str
    message_type: str
    text: str
    root_id: str = ""
    parent_id: str = ""
    thread_id: str = ""
    mentions_bot: bool = False
    mentions: tuple[Mention, ...] = ()
    create_time_ms: int = 0
    attachments: tuple[Attachment, ...] = ()
    # The tenant and app the event was delivered for (its header's).
    tenant_key: str = ""
    app_id: str = ""
    # What the message carries of other people's (a forwarded card); a forwarded chat's
    # messages are not in the event, they are read when its turn starts (``bot.forwards``).
    forwarded: tuple[Forwarded, ...] = ()

    @property
    def is_private(self) -> bool:
        return self.chat_type == "p2p"

    @property
    def is_forward(self) -> bool:
        """A forwarded chat, whose messages are read from Feishu."""
        return self.message_type == MERGE_FORWARD

    @property
    def readable(self) -> bool:
        """Whether the message has anything for an Agent: words, files or forwarded content."""
        return bool(self.text.strip() or self.attachments or self.forwarded or self.is_forward)

    @property
    def conversation_key(self) -> str:
        """One Session per topic: the thread, else the root message, else this message."""
        return self.thread_id or self.root_id or self.message_id


@dataclass(frozen=True)
class CardAction:
    """A click (or form submission) on an interactive card."""

    event_id: str
    operator: UserIds
    open_message_id: str
    chat_id: str
    value: dict[str, Any]
    form_value: dict[str, Any] | None = None
    checked: bool | None = None
    tag: str = ""
    name: str = ""
    # The callback token allows a delayed card update (30 min, twice); never log it.
    token: str = field(default="", repr=False)
    # The tenant and app the click was delivered for (its header's).
    tenant_key: str = ""
    app_id: str = ""

    @property
    def action(self) -> str:
        return str(self.value.get("action", ""))


@dataclass(frozen=True)
class OtherEvent:
    """Any other subscribed event, kept as its plaintext ``event`` object."""

    event_id: str
    event_type: str
    event: dict[str, Any]
    tenant_key: str = ""
    app_id: str = ""


@dataclass(frozen=True)
class Recall:
    """A message taken back in Feishu: ``recall_type`` says by whom (``message_owner``, its
    sender; ``group_owner``, ``group_manager`` or ``enterprise_manager``); Feishu names no
    operator beyond that."""

    message_id: str
    chat_id: str
    recall_type: str

    @property
    def by_sender(self) -> bool:
        return self.recall_type == "message_owner"


def recall_of(event: OtherEvent) -> Recall | None:
    """The recall an ``im.message.recalled_v1`` event reports; None for any other event or one
    naming no message."""
    if event.event_type != MESSAGE_RECALLED:
        return None
    message_id = event.event.get("message_id")
    if not isinstance(message_id, str) or not message_id:
        return None
    chat_id = event.event.get("chat_id")
    recall_type = event.event.get("recall_type")
    return Recall(
        message_id,
        chat_id if isinstance(chat_id, str) else "",
        recall_type if isinstance(recall_type, str) else "",
    )


@dataclass(frozen=True)
class CommentEvent:
    """A comment, or a reply in a comment thread, added in a Feishu cloud document.

    Feishu names the document (``file_token``, ``file_type``), the thread (``comment_id``), the
    reply that was added (``reply_id``; the thread's first reply for a new comment), who wrote
    it (``author``) and whether it @mentions the bot; what it says is read from the comment API.
    ``reply_id`` is empty when Feishu left it out: the author's latest reply is then meant.
    """

    event_id: str
    file_token: str
    file_type: str
    comment_id: str
    reply_id: str
    author: UserIds
    mentions_bot: bool
    author_type: str = ""
    create_time_ms: int = 0
    tenant_key: str = ""
    app_id: str = ""

    @property
    def conversation_key(self) -> str:
        """One Session per comment thread, as one per topic."""
        return f"{self.file_token}:{self.comment_id}"

    @property
    def seen_key(self) -> str:
        """What de-duplication remembers: a reply is run once, whatever event carried it."""
        return f"comment:{self.file_token}:{self.comment_id}:{self.reply_id}"


@dataclass(frozen=True)
class UrlVerification:
    challenge: str


@dataclass(frozen=True)
class CardResponse:
    """The synchronous answer to a card click: replace the card in place and/or show a toast."""

    card: dict[str, Any] | None = None
    toast: str = ""
    toast_type: Literal["success", "info", "warning", "error"] = "info"

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.toast:
            body["toast"] = {"type": self.toast_type, "content": self.toast}
        if self.card is not None:
            body["card"] = {"type": "raw", "data": self.card}
        return body


Event = MessageEvent | CardAction | CommentEvent | OtherEvent


class EventSink(Protocol):
    """Where parsed events go; the composition root plugs the bot's handlers in here."""

    async def on_message(self, event: MessageEvent) -> None:
        """Handle a message; runs after Feishu was answered."""

    async def on_card_action(self, action: CardAction) -> CardResponse | None:
        """Answer a click with the card to show in its place (and a toast).

        Feishu waits at most 3 s. Slower work should return ``None`` (or a "working" card) at
        once and update later with ``FeishuClient.update_card(action.open_message_id, ...)`` or
        ``FeishuClient.delayed_update(action.token, ...)``.
        """

    async def on_comment(self, event: CommentEvent) -> None:
        """Handle a comment added in a document; runs after Feishu was answered."""

    async def on_event(self, event: OtherEvent) -> None:
        """Handle any other subscribed event (bot added to a chat, menu click, ...)."""


class EventDedup(Protocol):
    """Remembers event ids so Feishu's retries are processed once."""

    async def first_time(self, event_id: str) -> bool:
        """Record ``event_id``; true only the first time it is seen."""


class MalformedEvent(ValueError):
    """The payload is not a Feishu event amux understands."""


_PLACEHOLDER = re.compile(r"(@_user_\d+|@_all)( ?)")


def _ids(raw: Any, tenant_key: Any = "") -> UserIds:
    raw = raw if isinstance(raw, dict) else {}
    return UserIds(
        open_id=str(raw.get("open_id") or ""),
        union_id=str(raw.get("union_id") or ""),
        user_id=str(raw.get("user_id") or ""),
        tenant_key=str(tenant_key or raw.get("tenant_key") or ""),
    )


def _post_text(content: dict[str, Any]) -> str:
    # Received rich-text posts are {"title", "content": [[elements]]}, sometimes under a locale.
    if "content" not in content:
        for value in content.values():
            if isinstance(value, dict) and "content" in value:
                content = value
                break
    lines: list[str] = []
    title = content.get("title")
    if isinstance(title, str) and title:
        lines.append(title)
    for paragraph in content.get("content") or []:
        parts: list[str] = []
        for element in paragraph if isinstance(paragraph, list) else []:
            tag = element.get("tag") if isinstance(element, dict) else None
            if tag in ("text", "a", "code_block", "md"):
                parts.append(str(element.get("text", "")))
            elif tag == "at":
                parts.append(str(element.get("user_id", "")))
            elif tag == "emotion":
                parts.append(f":{element.get('emoji_type') or ''}:")
        lines.append("".join(parts))
    return "\n".join(lines)


def message_text(message_type: str, content: str) -> str:
    """The plain text the sender wrote or shared in a received message's ``content`` JSON
    (mention placeholders kept); empty for kinds that carry none (files, cards, forwards)."""
    if message_type in READ_AS_TEXT:
        return shared_text(message_type, content)
    try:
        parsed = json.loads(content) if content else {}
    except ValueError:
        return ""
    if not isinstance(parsed, dict):
        return ""
    if message_type == "text":
        return str(parsed.get("text", ""))
    if message_type == "post":
        return _post_text(parsed)
    return ""


def attachments_of(message_type: str, content: str) -> tuple[Attachment, ...]:
    """The images and files a message carries (a rich-text post's inline images included)."""
    try:
        parsed = json.loads(content) if content else {}
    except ValueError:
        return ()
    if not isinstance(parsed, dict):
        return ()
    if message_type == "image" and parsed.get("image_key"):
        return (Attachment("image", str(parsed["image_key"])),)
    if message_type == "file" and parsed.get("file_key"):
        return (Attachment("file", str(parsed["file_key"]), str(parsed.get("file_name") or "")),)
    if message_type == "audio" and parsed.get("file_key"):
        return (Attachment("audio", str(parsed["file_key"])),)
    if message_type in ("media", "video") and parsed.get("file_key"):
        return (Attachment("video", str(parsed["file_key"]), str(parsed.get("file_name") or "")),)
    if message_type == "post":
        found: list[Attachment] = []
        body = (
            parsed
            if "content" in parsed
            else next((v for v in parsed.values() if isinstance(v, dict) and "content" in v), {})
        )
        for paragraph in body.get("content") or []:
            for element in paragraph if isinstance(paragraph, list) else []:
                if isinstance(element, dict) and element.get("tag") == "img":
                    found.append(Attachment("image", str(element.get("image_key") or "")))
                elif isinstance(element, dict) and element.get("tag") == "media":
                    found.append(Attachment("video", str(element.get("file_key") or "")))
        return tuple(a for a in found if a.key)
    return ()


def strip_mentions(text: str, mentions: tuple[Mention, ...], bot_open_id: str) -> tuple[str, bool]:
    """Drop the bot's own mention and spell out the others as ``@name``.

    Returns the text and whether the bot was mentioned.
    """
    by_key = {m.key: m for m in mentions}
    mentioned_bot = False

    def replace(match: re.Match[str]) -> str:
        nonlocal mentioned_bot
        mention = by_key.get(match.group(1))
        if mention is None:
            return match.group(0)
        if bot_open_id and mention.ids.open_id == bot_open_id:
            mentioned_bot = True
            # Drop the space after the mention too; other spacing (code indentation) stays.
            return ""
        return f"@{mention.name}{match.group(2)}"

    return _PLACEHOLDER.sub(replace, text).strip(), mentioned_bot


def event_id_of(payload: dict[str, Any]) -> str:
    header = payload.get("header")
    if isinstance(header, dict) and header.get("event_id"):
        return str(header["event_id"])
    return str(payload.get("uuid") or "")


def event_type_of(payload: dict[str, Any]) -> str:
    header = payload.get("header")
    if isinstance(header, dict) and header.get("event_type"):
        return str(header["event_type"])
    if payload.get("type") == "url_verification":
        return "url_verification"
    event = payload.get("event")
    return str(event.get("type", "")) if isinstance(event, dict) else ""


def delivered_for(payload: dict[str, Any]) -> tuple[str, str]:
    """The (tenant_key, app_id) an event was delivered for: the schema 2.0 header's, else the
    older shapes' top-level or event fields."""
    header = payload.get("header")
    if isinstance(header, dict):
        return str(header.get("tenant_key") or ""), str(header.get("app_id") or "")
    event = payload.get("event")
    source = event if isinstance(event, dict) and "tenant_key" in event else payload
    return str(source.get("tenant_key") or ""), str(source.get("app_id") or "")


def token_of(payload: dict[str, Any]) -> str:
    """The verification token: ``header.token`` in schema 2.0, top-level ``token`` otherwise."""
    header = payload.get("header")
    if isinstance(header, dict) and "token" in header:
        return str(header.get("token") or "")
    return str(payload.get("token") or "")


def parse_event(payload: dict[str, Any], bot_open_id: str = "") -> Event | UrlVerification:
    """Parse one plaintext Feishu payload.

    Raises:
        MalformedEvent: required fields are missing or of the wrong shape.
    """
    event_type = event_type_of(payload)
    if event_type == "url_verification":
        return UrlVerification(challenge=str(payload.get("challenge", "")))
    tenant_key, app_id = delivered_for(payload)
    if "header" not in payload and isinstance(payload.get("action"), dict):
        return replace(_legacy_card_action(payload), tenant_key=tenant_key, app_id=app_id)
    event_id = event_id_of(payload)
    event = payload.get("event")
    if not event_id or not isinstance(event, dict):
        raise MalformedEvent("event without id or body")
    parsed: Event
    if event_type == MESSAGE_RECEIVE:
        parsed = _message(event_id, event, bot_open_id)
    elif event_type == CARD_ACTION:
        parsed = _card_action(event_id, event)
    elif event_type == COMMENT_ADD:
        parsed = _comment(event_id, event)
    else:
        parsed = OtherEvent(event_id=event_id, event_type=event_type, event=event)
    return replace(parsed, tenant_key=tenant_key, app_id=app_id)


def _message(event_id: str, event: dict[str, Any], bot_open_id: str) -> MessageEvent:
    message = event.get("message")
    sender = event.get("sender")
    if not isinstance(message, dict) or not isinstance(sender, dict):
        raise MalformedEvent("message event without message or sender")
    mentions = tuple(
        Mention(
            key=str(m.get("key", "")),
            name=str(m.get("name", "")),
            ids=_ids(m.get("id"), m.get("tenant_key")),
        )
        for m in message.get("mentions") or []
        if isinstance(m, dict)
    )
    message_type = str(message.get("message_type", ""))
    content = str(message.get("content") or "")
    raw_text = message_text(message_type, content)
    # A card reaches a person only as someone else's message (an app's, a bot's): one sent on
    # is forwarded content, never the sender's own words.
    card = card_text(content) if message_type == INTERACTIVE else ""
    text, mentions_bot = strip_mentions(raw_text, mentions, bot_open_id)
    try:
        created = int(message.get("create_time") or 0)
    except (TypeError, ValueError):
        created = 0
    message_id = str(message.get("message_id") or "")
    chat_id = str(message.get("chat_id") or "")
    if not message_id or not chat_id:
        raise MalformedEvent("message event without message_id or chat_id")
    return MessageEvent(
        event_id=event_id,
        sender=_ids(sender.get("sender_id"), sender.get("tenant_key")),
        sender_type=str(sender.get("sender_type", "")),
        chat_id=chat_id,
        chat_type=str(message.get("chat_type", "")),
        message_id=message_id,
        message_type=message_type,
        text=text,
        root_id=str(message.get("root_id") or ""),
        parent_id=str(message.get("parent_id") or ""),
        thread_id=str(message.get("thread_id") or ""),
        mentions_bot=mentions_bot,
        mentions=tuple(m for m in mentions if not (bot_open_id and m.ids.open_id == bot_open_id)),
        create_time_ms=created,
        attachments=attachments_of(message_type, content),
        forwarded=(Forwarded(card, message_type=INTERACTIVE),) if card else (),
    )


def _comment(event_id: str, event: dict[str, Any]) -> CommentEvent:
    # The current shape keeps the author and document under ``notice_meta``; older deliveries
    # put them at the top level (``user_id``, ``is_mention``).
    meta = event.get("notice_meta")
    meta = meta if isinstance(meta, dict) else {}

    def field_of(name: str) -> str:
        value = event.get(name) or meta.get(name)
        return value if isinstance(value, str) else ""

    file_token, file_type = field_of("file_token"), field_of("file_type")
    comment_id, reply_id = field_of("comment_id"), field_of("reply_id")
    author = _ids(meta.get("from_user_id") or event.get("user_id"))
    if not (file_token and file_type and comment_id):
        raise MalformedEvent("comment event without its document or comment")
    if not (author.open_id or author.union_id or author.user_id):
        raise MalformedEvent("comment event without its author")
    mentioned = event.get("is_mentioned")
    if mentioned is None:
        mentioned = meta.get("is_mentioned", event.get("is_mention"))
    created = event.get("create_time") or meta.get("timestamp") or event.get("action_time")
    try:
        created_ms = int(created or 0)
    except (TypeError, ValueError):
        created_ms = 0
    author_type = meta.get("from_user_type")
    return CommentEvent(
        event_id=event_id,
        file_token=file_token,
        file_type=file_type,
        comment_id=comment_id,
        reply_id=reply_id,
        author=author,
        mentions_bot=mentioned is True,
        author_type=author_type if isinstance(author_type, str) else "",
        create_time_ms=created_ms,
    )


def _card_action(event_id: str, event: dict[str, Any]) -> CardAction:
    action = event.get("action")
    if not isinstance(action, dict):
        raise MalformedEvent("card action without action")
    context = event.get("context") if isinstance(event.get("context"), dict) else {}
    assert isinstance(context, dict)
    value = action.get("value")
    if isinstance(value, str):
        # Older cards send the value as a JSON string.
        try:
            value = json.loads(value)
        except ValueError:
            value = {"action": value}
    form_value = action.get("form_value")
    checked = action.get("checked")
    return CardAction(
        event_id=event_id,
        operator=_ids(event.get("operator")),
        open_message_id=str(context.get("open_message_id") or event.get("open_message_id") or ""),
        chat_id=str(context.get("open_chat_id") or event.get("open_chat_id") or ""),
        value=value if isinstance(value, dict) else {},
        form_value=form_value if isinstance(form_value, dict) else None,
        checked=checked if isinstance(checked, bool) else None,
        tag=str(action.get("tag") or ""),
        name=str(action.get("name") or ""),
        token=str(event.get("token") or ""),
    )


def _legacy_card_action(payload: dict[str, Any]) -> CardAction:
    """A card click in the pre-2.0 callback shape (ids and context at the top level)."""
    token = str(payload.get("token") or "")
    if not token:
        raise MalformedEvent("legacy card action without token")
    return _card_action(f"card:{token}", {**payload, "operator": payload})
