"""Events and card callbacks built, encrypted and signed exactly as Feishu sends them.

Scheme: body ``{"encrypt": base64(iv + AES-256-CBC(key=sha256(encrypt_key), PKCS7))}``;
headers ``X-Lark-Request-Timestamp``, ``X-Lark-Request-Nonce`` and ``X-Lark-Signature =
sha256_hex(timestamp + nonce + encrypt_key + raw_body)``; the verification token sits in the
plaintext (``header.token`` for schema 2.0, top-level ``token`` for url_verification).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from Crypto.Cipher import AES
from pydantic import SecretStr

from bot.config import FeishuSettings
from bot.feishu.events import (
    CardAction,
    CardResponse,
    CommentEvent,
    MessageEvent,
    OtherEvent,
)

if TYPE_CHECKING:
    from tests.fakes.feishu import FakeFeishu

_ids = itertools.count(1)


def encrypt(plaintext: str, encrypt_key: str) -> str:
    key = hashlib.sha256(encrypt_key.encode("utf-8")).digest()
    iv = os.urandom(16)
    data = plaintext.encode("utf-8")
    pad = 16 - len(data) % 16
    cipher = AES.new(key, AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(data + bytes([pad]) * pad)).decode("ascii")


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode("utf-8") + body).hexdigest()


@dataclass
class FeishuSigner:
    """Builds what Feishu would POST to the webhook for one app."""

    encrypt_key: str = "ek_test"
    verification_token: str = "vt_test"
    app_id: str = "cli_test"
    tenant_key: str = "tenant_1"

    def settings(self, feishu: FakeFeishu, **overrides: Any) -> FeishuSettings:
        """The bot's settings for this app against ``feishu``, in English unless overridden."""
        chosen: dict[str, Any] = {"language": "en_us", **overrides}
        return FeishuSettings(
            app_id=self.app_id,
            app_secret=SecretStr(feishu.app_secret),
            encrypt_key=SecretStr(self.encrypt_key),
            verification_token=SecretStr(self.verification_token),
            domain=feishu.url,
            **chosen,
        )

    def sign(
        self,
        payload: dict[str, Any],
        timestamp: int | None = None,
        nonce: str | None = None,
        encrypted: bool = True,
    ) -> tuple[bytes, dict[str, str]]:
        """The raw body and headers of the POST carrying ``payload``."""
        plaintext = json.dumps(payload, ensure_ascii=False)
        body = (
            json.dumps({"encrypt": encrypt(plaintext, self.encrypt_key)}).encode("utf-8")
            if encrypted
            else plaintext.encode("utf-8")
        )
        ts = str(int(time.time()) if timestamp is None else timestamp)
        nonce = nonce or f"nonce{next(_ids)}"
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "X-Lark-Request-Timestamp": ts,
            "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": signature(ts, nonce, self.encrypt_key, body),
        }
        return body, headers

    def _header(self, event_type: str, event_id: str | None, token: str | None) -> dict[str, Any]:
        return {
            "event_id": event_id or f"ev_{next(_ids)}",
            "token": self.verification_token if token is None else token,
            "create_time": str(int(time.time() * 1000)),
            "event_type": event_type,
            "tenant_key": self.tenant_key,
            "app_id": self.app_id,
        }

    def url_verification(self, challenge: str, token: str | None = None) -> dict[str, Any]:
        return {
            "challenge": challenge,
            "token": self.verification_token if token is None else token,
            "type": "url_verification",
        }

    def message(
        self,
        text: str,
        *,
        chat_type: str = "p2p",
        chat_id: str = "oc_chat1",
        sender_open_id: str = "ou_user1",
        sender_union_id: str = "on_user1",
        sender_user_id: str | None = "u_user1",
        message_id: str | None = None,
        root_id: str = "",
        thread_id: str = "",
        mentions: list[dict[str, Any]] | None = None,
        event_id: str | None = None,
        token: str | None = None,
        message_type: str = "text",
        content: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An ``im.message.receive_v1`` event; mention placeholders go in ``text`` as @_user_N."""
        sender_id = {"open_id": sender_open_id, "union_id": sender_union_id}
        if sender_user_id:
            sender_id["user_id"] = sender_user_id
        message: dict[str, Any] = {
            "message_id": message_id or f"om_in_{next(_ids)}",
            "create_time": str(int(time.time() * 1000)),
            "chat_id": chat_id,
            "chat_type": chat_type,
            "message_type": message_type,
            "content": json.dumps(
                content if content is not None else {"text": text}, ensure_ascii=False
            ),
        }
        if root_id:
            message["root_id"] = root_id
            message["parent_id"] = root_id
        if thread_id:
            message["thread_id"] = thread_id
        if mentions:
            message["mentions"] = mentions
        return {
            "schema": "2.0",
            "header": self._header("im.message.receive_v1", event_id, token),
            "event": {
                "sender": {
                    "sender_id": sender_id,
                    "sender_type": "user",
                    "tenant_key": self.tenant_key,
                },
                "message": message,
            },
        }

    def recall(
        self,
        message_id: str,
        *,
        chat_id: str = "oc_chat1",
        recall_type: str = "message_owner",
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """An ``im.message.recalled_v1`` event: Feishu names the message and how it was recalled
        (by its sender, or a group owner or manager), not who did it."""
        return {
            "schema": "2.0",
            "header": self._header("im.message.recalled_v1", event_id, None),
            "event": {
                "message_id": message_id,
                "chat_id": chat_id,
                "recall_time": str(int(time.time() * 1000)),
                "recall_type": recall_type,
            },
        }

    def comment(
        self,
        file_token: str,
        comment_id: str,
        reply_id: str,
        *,
        author_open_id: str = "ou_user1",
        author_union_id: str = "on_user1",
        author_user_id: str = "u_user1",
        file_type: str = "docx",
        mentioned: bool = True,
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """A ``drive.notice.comment_add_v1`` event: Feishu names the document, the thread, the
        reply added and its author, and whether it @mentions the bot; not what it says."""
        author = {"open_id": author_open_id, "union_id": author_union_id}
        if author_user_id:
            author["user_id"] = author_user_id
        return {
            "schema": "2.0",
            "header": self._header("drive.notice.comment_add_v1", event_id, None),
            "event": {
                "comment_id": comment_id,
                "reply_id": reply_id,
                "is_mentioned": mentioned,
                "notice_meta": {
                    "file_token": file_token,
                    "file_type": file_type,
                    "from_user_id": author,
                    "to_user_id": {"open_id": "ou_bot"},
                    "notice_type": "comment_add",
                    "timestamp": str(int(time.time() * 1000)),
                },
            },
        }

    @staticmethod
    def mention(key: str, open_id: str, name: str, union_id: str = "") -> dict[str, Any]:
        return {
            "key": key,
            "id": {"open_id": open_id, "union_id": union_id or f"on_{open_id}", "user_id": ""},
            "name": name,
            "tenant_key": "tenant_1",
        }

    def card_action(
        self,
        value: dict[str, Any],
        *,
        open_message_id: str = "om_card1",
        open_chat_id: str = "oc_chat1",
        operator_open_id: str = "ou_user1",
        operator_union_id: str = "on_user1",
        operator_user_id: str | None = "u_user1",
        form_value: dict[str, Any] | None = None,
        checked: bool | None = None,
        tag: str = "button",
        name: str = "",
        event_id: str | None = None,
        token: str | None = None,
        callback_token: str = "c-callback-token",
    ) -> dict[str, Any]:
        """A ``card.action.trigger`` callback (schema 2.0)."""
        operator: dict[str, Any] = {
            "open_id": operator_open_id,
            "union_id": operator_union_id,
            "tenant_key": self.tenant_key,
        }
        if operator_user_id:
            operator["user_id"] = operator_user_id
        action: dict[str, Any] = {"tag": tag, "value": value}
        if name:
            action["name"] = name
        if form_value is not None:
            action["form_value"] = form_value
        if checked is not None:
            action["checked"] = checked
        return {
            "schema": "2.0",
            "header": self._header("card.action.trigger", event_id, token),
            "event": {
                "operator": operator,
                "token": callback_token,
                "action": action,
                "host": "im_message",
                "context": {"open_message_id": open_message_id, "open_chat_id": open_chat_id},
            },
        }


class RecordingSink:
    """An EventSink that records what it receives and lets tests wait for it.

    With ``hold_cards`` set, card handlers block until ``release_cards`` is set, to test what
    Feishu gets when a handler is slower than its 3 s budget.
    """

    def __init__(self, card_response: CardResponse | None = None, hold_cards: bool = False) -> None:
        self.messages: list[MessageEvent] = []
        self.card_actions: list[CardAction] = []
        self.others: list[OtherEvent] = []
        self.comments: list[CommentEvent] = []
        self.card_response = card_response
        self.hold_cards = hold_cards
        self.release_cards = asyncio.Event()
        self.cards_finished = 0
        self.changed = asyncio.Condition()

    async def _note(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def on_message(self, event: MessageEvent) -> None:
        self.messages.append(event)
        await self._note()

    async def on_card_action(self, action: CardAction) -> CardResponse | None:
        self.card_actions.append(action)
        await self._note()
        if self.hold_cards:
            await self.release_cards.wait()
        self.cards_finished += 1
        await self._note()
        return self.card_response

    async def on_comment(self, event: CommentEvent) -> None:
        self.comments.append(event)
        await self._note()

    async def on_event(self, event: OtherEvent) -> None:
        self.others.append(event)
        await self._note()

    async def wait_for(
        self, predicate: Callable[[RecordingSink], bool], within_seconds: float = 5.0
    ) -> None:
        """Wait until ``predicate(self)`` holds (no sleeping)."""
        async with asyncio.timeout(within_seconds):
            async with self.changed:
                await self.changed.wait_for(lambda: predicate(self))
