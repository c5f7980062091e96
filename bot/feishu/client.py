"""Outbound Feishu calls on one pooled session, with bounded retries.

Every call, the tenant token fetch included, goes out through the process's pooled
``httpx.AsyncClient`` (``bot.feishu.transport``): kept-alive connections, at most a few at once,
instead of lark-oapi's connection per call. lark-oapi still supplies the token request and its
answer's model, the JSON encoding of bodies and its cache of tenant tokens, shared with the SDK.
Downloads are streamed, cut off past their byte cap. Retries happen only on HTTP 429, Feishu's
rate-limit codes, 5xx answers and connection errors; an invalid cached tenant token is dropped
and fetched again once; anything else fails at once with a typed error that carries Feishu's
code but never a credential.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from bot.config import FeishuSettings
from bot.feishu.errors import FeishuApiError, ResourceTooLarge
from bot.feishu.observer import FeishuObserver, NoObserver
from bot.feishu.ratelimit import Pacer
from bot.feishu.sdk import (
    JSON,
    AccessTokenResponse,
    CreateSelfTenantTokenRequest,
    CreateTokenRequestBody,
    HttpMethod,
    ObtainAccessTokenException,
    TokenManager,
    build_user_agent,
    lark,
)
from bot.feishu.transport import (
    DEFAULT_CONNECTIONS,
    call_timeout,
    direct_transport,
    pooled_session,
)
from hub.errors import Unavailable

logger = logging.getLogger(__name__)

# 11232: the tenant as a whole creates messages too fast (HTTP 400), which passes with time too.
RATE_LIMIT_CODES = frozenset({99991400, 99991402, 230020, 11020, 11021, 11232})
# The tenant token the SDK cached was rejected (expired early, revoked, or from another server).
TOKEN_INVALID_CODES = frozenset({99991661, 99991663, 99991668, 99991677})
# Where lark-oapi's TokenManager caches an app's tenant token; not a public API of the SDK.
TENANT_TOKEN_CACHE_KEY = "self_tenant_token:{app_id}"

# Where a binary download's bytes travel in the answer ``_call`` returns.
_BYTES = "bytes"
# A download is read in pieces this large, so its cap is checked as the bytes arrive.
_DOWNLOAD_CHUNK = 64 * 1024
# Feishu's JSON answers are a few hundred bytes; a download's error answer is read to this.
_ANSWER_CAP = 64 * 1024

ReceiveIdType = Literal["chat_id", "open_id", "union_id", "user_id", "email"]
Verdict = Literal["ok", "retry", "refresh_token", "fail"]


def classify(http_status: int, feishu_code: int | None) -> Verdict:
    """What to do with one answer: accept it, retry later, refresh the token once, or fail."""
    if http_status == 429 or feishu_code in RATE_LIMIT_CODES:
        return "retry"
    if feishu_code in TOKEN_INVALID_CODES:
        return "refresh_token"
    if http_status >= 500:
        return "retry"
    if http_status >= 400 or feishu_code not in (None, 0):
        return "fail"
    return "ok"


def default_backoff(attempt: int) -> float:
    """Seconds after failed attempt ``attempt`` (1-based): exponential back-off from 0.5 s,
    capped at 8 s, with jitter so retries do not align."""
    exponent = min(attempt - 1, 16)
    return float(min(8.0, 0.5 * 2.0**exponent) + random.uniform(0, 0.5))


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class SentMessage:
    """Where a message landed; ``thread_id`` is set for topic replies."""

    message_id: str
    chat_id: str = ""
    root_id: str = ""
    thread_id: str = ""


@dataclass(frozen=True)
class AppConfig:
    """What the app is granted and subscribed to, as its own configuration says."""

    scopes: frozenset[str]
    events: frozenset[str]
    callbacks: frozenset[str]


@dataclass(frozen=True)
class BotInfo:
    open_id: str
    name: str = ""


def _retry_after(headers: dict[str, str]) -> float | None:
    for name in ("x-ogw-ratelimit-reset", "Retry-After"):
        for key, value in headers.items():
            if key.lower() == name.lower():
                try:
                    return max(0.0, float(value))
                except ValueError:
                    return None
    return None


class FeishuClient:
    """The bot's outbound Feishu API: messages, topic replies, card updates, bot info."""

    def __init__(
        self,
        settings: FeishuSettings,
        *,
        attempts: int = 5,
        backoff: Callable[[int], float] | None = None,
        max_retry_after: float = 30.0,
        timeout: float = 10.0,
        connections: int = DEFAULT_CONNECTIONS,
        pacer: Pacer | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """``http`` is the session to send on, which its giver closes; without one the client
        makes its own of ``connections`` and closes it in :meth:`close`."""
        self._settings = settings
        self._pacer = pacer or Pacer()
        self.observer: FeishuObserver = NoObserver()
        # Built only so lark-oapi vets the domain (https, an origin, no credentials in it).
        client = (
            lark.Client.builder()
            .app_id(settings.app_id)
            .app_secret(settings.app_secret.get_secret_value())
            .domain(settings.domain)
            .timeout(timeout)
            .log_level(lark.LogLevel.WARNING)
            .build()
        )
        assert client.config is not None, "the client is built with a config"
        self._domain: str = client.config.domain
        self._user_agent = build_user_agent()
        self._timeout = call_timeout(timeout)
        self._owns_http = http is None
        self.http = http if http is not None else pooled_session(connections=connections)
        self._attempts = attempts
        self._backoff = backoff or default_backoff
        self._max_retry_after = max_retry_after
        # One fetch of the tenant token at a time: the calls waiting on it all use its answer.
        self._token_lock = asyncio.Lock()
        self._sending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def close(self) -> None:
        """Wait for the requests on the wire, then close the session if it is this client's."""
        await self._idle.wait()
        if self._owns_http:
            await self.http.aclose()

    # -- public API ------------------------------------------------------------------------

    async def send_card(
        self,
        receive_id: str,
        card: dict[str, Any],
        receive_id_type: ReceiveIdType = "chat_id",
        *,
        idempotency_key: str | None = None,
    ) -> SentMessage:
        """Send a new card message to a chat or a user; ``idempotency_key`` (Feishu's
        ``uuid``) is fixed by a caller that may send the same message again: Feishu posts it
        once and answers the repeat with the first message."""
        return await self._send(receive_id, receive_id_type, "interactive", card, idempotency_key)

    async def send_text(
        self, receive_id: str, text: str, receive_id_type: ReceiveIdType = "chat_id"
    ) -> SentMessage:
        return await self._send(receive_id, receive_id_type, "text", {"text": text})

    async def reply(
        self,
        message_id: str,
        *,
        card: dict[str, Any] | None = None,
        text: str | None = None,
        in_thread: bool = True,
        idempotency_key: str | None = None,
    ) -> SentMessage:
        """Reply to ``message_id``; ``in_thread`` opens (or continues) its topic.

        ``idempotency_key`` (Feishu's ``uuid``) is fixed by a caller that may send the same reply
        again later, from another process even: Feishu shows it once.
        """
        msg_type, content = _content(card, text)
        return await self._post_reply(
            message_id, msg_type, content, in_thread, idempotency_key or str(uuid.uuid4())
        )

    async def _post_reply(
        self, message_id: str, msg_type: str, content: str, in_thread: bool, key: str
    ) -> SentMessage:
        data = await self._call(
            "reply",
            HttpMethod.POST,
            "/open-apis/im/v1/messages/:message_id/reply",
            paths={"message_id": message_id},
            receiver=message_id,
            body={
                "msg_type": msg_type,
                "content": content,
                "reply_in_thread": in_thread,
                # Same uuid on every retry: Feishu posts it once even if an earlier try landed.
                "uuid": key,
            },
        )
        return _sent(data)

    async def update_card(self, message_id: str, card: dict[str, Any]) -> None:
        """Replace the card of a message the bot sent (needs ``update_multi`` for everyone)."""
        await self._call(
            "update_card",
            HttpMethod.PATCH,
            "/open-apis/im/v1/messages/:message_id",
            paths={"message_id": message_id},
            receiver=message_id,
            body={"content": json.dumps(card, ensure_ascii=False)},
        )

    async def thread_messages(self, thread_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """A topic's messages, newest first (``im.v1.message.list``, by thread)."""
        data = await self._call(
            "message_list",
            HttpMethod.GET,
            "/open-apis/im/v1/messages",
            queries=[
                ("container_id_type", "thread"),
                ("container_id", thread_id),
                ("sort_type", "ByCreateTimeDesc"),
                ("page_size", str(limit)),
            ],
        )
        items = (data.get("data") or {}).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    async def message_items(self, message_id: str) -> dict[str, Any]:
        """A message as ``im.v1.message.get`` answers (``{"data": {"items": [...]}}``): for a
        forwarded chat, the forward and every message in it, each naming the forward it sits in
        as ``upper_message_id``."""
        data = await self._call(
            "message_get",
            HttpMethod.GET,
            "/open-apis/im/v1/messages/:message_id",
            paths={"message_id": message_id},
            queries=[("user_id_type", "open_id")],
        )
        items = (data.get("data") or {}).get("items") or []
        return {"data": {"items": [item for item in items if isinstance(item, dict)]}}

    async def messages_since(
        self,
        container_type: str,
        container_id: str,
        start_time: int,
        *,
        page_token: str = "",
        page_size: int = 50,
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of a chat's (``container_type`` chat) or topic's (thread) messages created
        from ``start_time`` (Unix seconds) on, oldest first, and the next page's token ("" at
        the end) (``im.v1.message.list``)."""
        queries = [
            ("container_id_type", container_type),
            ("container_id", container_id),
            ("start_time", str(start_time)),
            ("sort_type", "ByCreateTimeAsc"),
            ("page_size", str(page_size)),
        ]
        if page_token:
            queries.append(("page_token", page_token))
        data = (
            await self._call(
                "message_list", HttpMethod.GET, "/open-apis/im/v1/messages", queries=queries
            )
        ).get("data") or {}
        items = [item for item in data.get("items") or [] if isinstance(item, dict)]
        more = bool(data.get("has_more")) and bool(data.get("page_token"))
        return items, str(data.get("page_token") or "") if more else ""

    async def user_names(self, open_ids: Sequence[str]) -> dict[str, str]:
        """Display names of users by open_id (``contact.v3.user.batch``); needs a contact scope."""
        if not open_ids:
            return {}
        data = await self._call(
            "user_batch",
            HttpMethod.GET,
            "/open-apis/contact/v3/users/batch",
            queries=[("user_id_type", "open_id"), *(("user_ids", i) for i in open_ids)],
        )
        items = (data.get("data") or {}).get("items") or []
        return {
            str(item.get("open_id")): str(item.get("name"))
            for item in items
            if isinstance(item, dict) and item.get("open_id") and item.get("name")
        }

    async def user_time_zone(self, open_id: str) -> str:
        """The IANA time zone a user set in Feishu, "" when Feishu gives none
        (``contact.v3.user.batch``, the same contact scope as names)."""
        data = await self._call(
            "user_batch",
            HttpMethod.GET,
            "/open-apis/contact/v3/users/batch",
            queries=[("user_id_type", "open_id"), ("user_ids", open_id)],
        )
        for item in (data.get("data") or {}).get("items") or []:
            if isinstance(item, dict) and item.get("open_id") == open_id:
                zone = item.get("time_zone")
                return zone if isinstance(zone, str) else ""
        return ""

    async def comment(self, file_token: str, file_type: str, comment_id: str) -> dict[str, Any]:
        """A document comment as ``drive.v1.file.comment.get`` answers it (its ``quote`` and
        first replies, authors by open_id), with the bot's own token."""
        data = await self._call(
            "comment_get",
            HttpMethod.GET,
            "/open-apis/drive/v1/files/:file_token/comments/:comment_id",
            paths={"file_token": file_token, "comment_id": comment_id},
            queries=[("file_type", file_type), ("user_id_type", "open_id")],
        )
        found = data.get("data")
        return found if isinstance(found, dict) else {}

    async def comment_replies(
        self, file_token: str, file_type: str, comment_id: str, limit: int = 100
    ) -> list[dict[str, Any]]:
        """A comment thread's replies, oldest first, at most ``limit`` of them
        (``drive.v1.file.comment.reply.list``)."""
        replies: list[dict[str, Any]] = []
        page_token = ""
        while len(replies) < limit:
            queries = [
                ("file_type", file_type),
                ("user_id_type", "open_id"),
                ("page_size", str(min(100, limit - len(replies)))),
            ]
            if page_token:
                queries.append(("page_token", page_token))
            data = (
                await self._call(
                    "comment_replies",
                    HttpMethod.GET,
                    "/open-apis/drive/v1/files/:file_token/comments/:comment_id/replies",
                    paths={"file_token": file_token, "comment_id": comment_id},
                    queries=queries,
                )
            ).get("data") or {}
            replies += [item for item in data.get("items") or [] if isinstance(item, dict)]
            page_token = str(data.get("page_token") or "")
            if not data.get("has_more") or not page_token:
                break
        return replies[:limit]

    async def reply_comment(
        self, file_token: str, file_type: str, comment_id: str, text: str
    ) -> str:
        """Add a reply of the bot's, plain text, to a comment thread; its reply id."""
        elements = [{"type": "text_run", "text_run": {"text": text}}]
        data = await self._call(
            "comment_reply",
            HttpMethod.POST,
            "/open-apis/drive/v1/files/:file_token/comments/:comment_id/replies",
            paths={"file_token": file_token, "comment_id": comment_id},
            queries=[("file_type", file_type)],
            body={"content": {"elements": elements}},
        )
        return str((data.get("data") or {}).get("reply_id") or "")

    async def message_resource(self, message_id: str, key: str, kind: str, *, limit: int) -> bytes:
        """An image or file of a message (``im.v1.message_resource.get``; ``kind`` image|file) of
        at most ``limit`` bytes: no more than ``limit + 1`` are ever read.

        Raises:
            ResourceTooLarge: it is over ``limit`` bytes; ``received`` says how many were read.
        """
        data = await self._call(
            "message_resource",
            HttpMethod.GET,
            "/open-apis/im/v1/messages/:message_id/resources/:file_key",
            paths={"message_id": message_id, "file_key": key},
            queries=[("type", kind)],
            binary=True,
            limit=limit,
        )
        content = data.get(_BYTES)
        if not isinstance(content, bytes):
            raise FeishuApiError("Feishu sent no file content", operation="message_resource")
        return content

    async def upload(self, name: str, content: bytes, *, image: bool) -> str:
        """Upload an image (``im.v1.image.create``) or a file (``im.v1.file.create``); its key."""
        if image:
            data = await self._call(
                "image_upload",
                HttpMethod.POST,
                "/open-apis/im/v1/images",
                body={"image_type": "message"},
                files={"image": (name, content)},
            )
            key = (data.get("data") or {}).get("image_key")
        else:
            data = await self._call(
                "file_upload",
                HttpMethod.POST,
                "/open-apis/im/v1/files",
                body={"file_type": "stream", "file_name": name},
                files={"file": (name, content)},
            )
            key = (data.get("data") or {}).get("file_key")
        if not key:
            raise FeishuApiError("Feishu returned no key for an upload", operation="upload")
        return str(key)

    async def reply_upload(
        self, message_id: str, key: str, *, image: bool, idempotency_key: str
    ) -> SentMessage:
        """Post an uploaded image or file in ``message_id``'s topic."""
        content = {"image_key": key} if image else {"file_key": key}
        msg_type = "image" if image else "file"
        return await self._post_reply(
            message_id, msg_type, json.dumps(content), True, idempotency_key
        )

    # -- CardKit card entities (the endpoints of lark-oapi's ``cardkit.v1``) ----------------

    async def create_card_entity(self, card: dict[str, Any]) -> str:
        """Create a card entity from card JSON 2.0; returns its ``card_id``."""
        data = await self._call(
            "cardkit_create",
            HttpMethod.POST,
            "/open-apis/cardkit/v1/cards",
            body={"type": "card_json", "data": json.dumps(card, ensure_ascii=False)},
        )
        card_id = str((data.get("data") or {}).get("card_id") or "")
        if not card_id:
            raise FeishuApiError("Feishu created a card without an id", operation="cardkit_create")
        return card_id

    async def reply_card_entity(self, message_id: str, card_id: str) -> SentMessage:
        """Reply in ``message_id``'s topic with the card entity ``card_id``."""
        content = json.dumps({"type": "card", "data": {"card_id": card_id}})
        return await self._post_reply(message_id, "interactive", content, True, str(uuid.uuid4()))

    async def stream_card_text(
        self, card_id: str, element_id: str, content: str, sequence: int
    ) -> None:
        """Show ``content`` (the whole text so far) in a streaming card's element."""
        await self._call(
            "cardkit_content",
            HttpMethod.PUT,
            "/open-apis/cardkit/v1/cards/:card_id/elements/:element_id/content",
            paths={"card_id": card_id, "element_id": element_id},
            receiver=card_id,
            body={"content": content, "sequence": sequence, "uuid": str(uuid.uuid4())},
        )

    async def finish_card_entity(
        self, card_id: str, card: dict[str, Any], sequence: int, key: str
    ) -> None:
        """Close streaming mode, then replace the whole card, under ``sequence`` and the next.

        ``key`` makes both calls idempotent, so repeating them after a failure is safe.
        """
        await self._call(
            "cardkit_settings",
            HttpMethod.PATCH,
            "/open-apis/cardkit/v1/cards/:card_id/settings",
            paths={"card_id": card_id},
            receiver=card_id,
            body={
                "settings": json.dumps({"config": {"streaming_mode": False}}),
                "sequence": sequence,
                "uuid": f"{key}-close",
            },
        )
        await self._call(
            "cardkit_update",
            HttpMethod.PUT,
            "/open-apis/cardkit/v1/cards/:card_id",
            paths={"card_id": card_id},
            receiver=card_id,
            body={
                "card": {"type": "card_json", "data": json.dumps(card, ensure_ascii=False)},
                "sequence": sequence + 1,
                "uuid": f"{key}-card",
            },
        )

    async def delayed_update(self, callback_token: str, card: dict[str, Any]) -> None:
        """Update a card after its callback was answered (token valid 30 min, twice)."""
        await self._call(
            "delayed_update",
            HttpMethod.POST,
            "/open-apis/interactive/v1/card/update",
            body={"token": callback_token, "card": card},
        )

    async def app_config(self) -> AppConfig:
        """The scopes, events and callbacks this app has (``application.v6.application.get``)."""
        data = await self._call(
            "application_get",
            HttpMethod.GET,
            "/open-apis/application/v6/applications/:app_id",
            paths={"app_id": self._settings.app_id},
            queries=[("lang", "en_us")],
        )
        app = (data.get("data") or {}).get("app") or {}
        scopes = app.get("scopes") or []
        events = (app.get("event") or {}).get("subscribed_events") or []
        callbacks = (app.get("callback") or {}).get("subscribed_callbacks") or []
        return AppConfig(
            scopes=frozenset(
                str(s.get("scope")) for s in scopes if isinstance(s, dict) and s.get("scope")
            ),
            events=frozenset(str(e) for e in events),
            callbacks=frozenset(str(c) for c in callbacks),
        )

    async def bot_info(self) -> BotInfo:
        """The bot's own identity (its open_id is what group mentions point at)."""
        data = await self._call("bot_info", HttpMethod.GET, "/open-apis/bot/v3/info")
        bot = data.get("bot") or {}
        return BotInfo(open_id=str(bot.get("open_id", "")), name=str(bot.get("app_name", "")))

    # -- plumbing --------------------------------------------------------------------------

    async def _send(
        self,
        receive_id: str,
        receive_id_type: str,
        msg_type: str,
        payload: dict[str, Any],
        idempotency_key: str | None = None,
    ) -> SentMessage:
        data = await self._call(
            "send",
            HttpMethod.POST,
            "/open-apis/im/v1/messages",
            queries=[("receive_id_type", receive_id_type)],
            receiver=receive_id,
            body={
                "receive_id": receive_id,
                "msg_type": msg_type,
                "content": json.dumps(payload, ensure_ascii=False),
                "uuid": idempotency_key or str(uuid.uuid4()),
            },
        )
        return _sent(data)

    def _wait(self, attempt: int, error: _Retryable) -> float:
        """Seconds before the attempt after ``attempt`` (1-based), which failed with ``error``."""
        backoff = self._backoff(attempt)
        if error.retry_after is not None:
            return max(backoff, min(error.retry_after, self._max_retry_after))
        return backoff

    async def _call(
        self,
        operation: str,
        method: HttpMethod,
        uri: str,
        *,
        paths: dict[str, str] | None = None,
        queries: Sequence[tuple[str, str]] = (),
        body: dict[str, Any] | None = None,
        receiver: str = "",
        files: dict[str, Any] | None = None,
        binary: bool = False,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One API call, retried as the module says; ``limit`` streams a download and caps it.

        A plain loop rather than a retry library's: every card update passes here, and the
        library's per-call set-up cost more than the rest of the call's own Python.
        """
        url = self._url(uri, paths)
        request = _Request(operation, method.name, url, [*queries], body, files)
        ok = False
        try:
            for attempt in range(1, self._attempts + 1):
                try:
                    await self._pacer.wait(receiver, api=operation)
                    self._sending += 1
                    self._idle.clear()
                    try:
                        result = await self._call_once(request, binary=binary, limit=limit)
                    finally:
                        self._sending -= 1
                        if not self._sending:
                            self._idle.set()
                except _Retryable as error:
                    if attempt >= self._attempts:
                        raise Unavailable(
                            f"Feishu {operation} failed after {self._attempts} attempts: "
                            f"{error.reason}",
                            operation=operation,
                        ) from None
                    self.observer.feishu_retry(operation)
                    await asyncio.sleep(self._wait(attempt, error))
                    continue
                ok = True
                return result
        finally:
            self.observer.feishu_call(operation, ok)
        raise AssertionError("unreachable")  # pragma: no cover

    def _url(self, uri: str, paths: dict[str, str] | None) -> str:
        for name, value in (paths or {}).items():
            # Quoted whole: an id holding "/", "?" or "#" cannot reach another path or query.
            uri = uri.replace(f":{name}", urllib.parse.quote(str(value), safe=""))
        return self._domain + uri

    async def _call_once(
        self, request: _Request, *, binary: bool = False, limit: int | None = None
    ) -> dict[str, Any]:
        operation = request.operation
        for refreshed in (False, True):
            token = ""
            try:
                token = await self._tenant_token()
                raw = (
                    await self._exchange(request, token)
                    if limit is None
                    else await self._download(request, token, limit)
                )
            except ObtainAccessTokenException as error:
                if classify(200, error.code) == "retry":
                    raise _Retryable(f"token rate limited ({error.code})") from None
                raise FeishuApiError(
                    f"Feishu refused the app credentials ({error.code}: {error.msg})",
                    feishu_code=error.code,
                    operation=operation,
                ) from None
            except httpx.HTTPError as error:
                raise _Retryable(f"connection error ({type(error).__name__})") from None
            status = raw.status
            content_type = raw.headers.get("content-type", "")
            if binary and 200 <= status < 300 and "json" not in content_type:
                return {_BYTES: raw.content}
            try:
                data: Any = json.loads(raw.content or b"{}")
            except ValueError:
                data = None
            if not isinstance(data, dict):
                if status >= 500:
                    raise _Retryable(f"HTTP {status}")
                if 200 <= status < 300:
                    return {}
                raise FeishuApiError(
                    f"Feishu {operation} failed (HTTP {status})",
                    http_status=status,
                    operation=operation,
                )
            code = data.get("code")
            feishu_code = int(code) if isinstance(code, int) else None
            verdict = classify(status, feishu_code)
            if verdict == "ok":
                return data
            if verdict == "retry":
                raise _Retryable(f"HTTP {status}, code {feishu_code}", _retry_after(raw.headers))
            if verdict == "refresh_token" and not refreshed:
                logger.info("Feishu rejected the cached tenant token; fetching a new one")
                self._forget_token(token)
                continue
            raise FeishuApiError(
                f"Feishu {operation} failed: {data.get('msg') or 'error'} (code {feishu_code})",
                feishu_code=feishu_code,
                http_status=status,
                operation=operation,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the tenant token, in the SDK's cache ------------------------------------------------

    def _token_key(self) -> str:
        return TENANT_TOKEN_CACHE_KEY.format(app_id=self._settings.app_id)

    async def _tenant_token(self) -> str:
        """The app's tenant token: the cached one, else one fetched on the pooled session and
        cached as lark-oapi caches it (until ten minutes before Feishu says it expires).

        Raises:
            ObtainAccessTokenException: Feishu refused the credentials or rate limited them.
            httpx.HTTPError: Feishu could not be reached.
        """
        cached = TokenManager.cache.get(self._token_key())
        if cached:
            return str(cached)
        async with self._token_lock:
            cached = TokenManager.cache.get(self._token_key())
            if cached:
                return str(cached)
            request = CreateSelfTenantTokenRequest.builder().build()
            body = (
                CreateTokenRequestBody.builder()
                .app_id(self._settings.app_id)
                .app_secret(self._settings.app_secret.get_secret_value())
                .build()
            )
            answer = await self._exchange(
                _Request("tenant_token", "POST", self._domain + str(request.uri), [], body, None),
                "",
            )
            if answer.status == 429 or answer.status >= 500:
                # As for any other call: Feishu's gateway, not a verdict on the credentials.
                raise _Retryable(f"HTTP {answer.status} to the tenant token request")
            try:
                parsed = JSON.unmarshal(answer.content.decode("utf-8"), AccessTokenResponse)
            except ValueError:
                raise FeishuApiError(
                    f"Feishu answered the tenant token request unreadably (HTTP {answer.status})",
                    http_status=answer.status,
                    operation="tenant_token",
                ) from None
            if not parsed.success():
                raise ObtainAccessTokenException(
                    "obtain self tenant access token failed", parsed.code, parsed.msg
                )
            token = str(parsed.tenant_access_token or "")
            expires = int(time.time() + int(parsed.expire or 0) - 10 * 60)
            TokenManager.cache.set(self._token_key(), token, expires)
            return token

    def _forget_token(self, rejected: str) -> None:
        # Only the token Feishu refused: another call may have cached a fresh one meanwhile.
        # The SDK's cache has no delete; an empty value forces a fetch.
        if TokenManager.cache.get(self._token_key()) == rejected:
            TokenManager.cache.set(self._token_key(), "", 0)

    # -- the wire ---------------------------------------------------------------------------

    def _headers(self, token: str) -> dict[str, str]:
        headers = {"User-Agent": self._user_agent}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def _exchange(self, request: _Request, token: str) -> _Answer:
        """``request`` on the pooled session, its answer read whole (Feishu's are small)."""
        headers = self._headers(token)
        if request.files:
            # Multipart: the body's fields as text beside the files.
            fields = {k: str(v) for k, v in (request.body or {}).items()}
            uploads = {
                field: (file_name, content, "application/octet-stream")
                for field, (file_name, content) in request.files.items()
            }
            response = await self.http.request(
                request.method,
                request.url,
                params=request.queries,
                headers=headers,
                data=fields,
                files=uploads,
                timeout=self._timeout,
            )
        else:
            headers["Content-Type"] = "application/json; charset=utf-8"
            encoded = JSON.marshal(request.body)
            content = encoded.encode("utf-8") if encoded is not None else None
            direct = direct_transport(self.http, request.url)
            if direct is not None:
                status, answered, body = await direct.exchange(
                    request.method, request.url, request.queries, headers, content, self._timeout
                )
                return _Answer(status, answered, body)
            response = await self.http.request(
                request.method,
                request.url,
                params=request.queries,
                headers=headers,
                content=content,
                timeout=self._timeout,
            )
        return _Answer(response.status_code, dict(response.headers), response.content)

    async def _download(self, request: _Request, token: str, limit: int) -> _Answer:
        """``request``'s answer read in pieces, abandoned as soon as it is over ``limit`` bytes.

        Raises:
            ResourceTooLarge: the answer says or shows it is over ``limit`` bytes.
            httpx.HTTPError: as any other call.
        """
        operation = request.operation
        headers = self._headers(token)
        # The cap counts bytes as they arrive; a compressed answer would count only after
        # inflating them.
        headers["Accept-Encoding"] = "identity"
        async with self.http.stream(
            request.method,
            request.url,
            params=request.queries,
            headers=headers,
            timeout=self._timeout,
        ) as response:
            status = response.status_code
            # Only a successful binary answer is the file; an error is JSON, and small.
            content_type = response.headers.get("Content-Type", "")
            is_file = 200 <= status < 300 and "json" not in content_type
            cap = limit if is_file else _ANSWER_CAP
            declared = response.headers.get("Content-Length", "")
            if is_file and declared.isdigit() and int(declared) > limit:
                raise ResourceTooLarge(
                    f"Feishu {operation} is over {limit} bytes", operation=operation, received=0
                )
            chunks: list[bytes] = []
            received = 0
            # One byte past the cap tells "exactly the cap" from "over it"; nothing past that is
            # kept, and leaving the stream unread closes its connection instead of reusing it.
            async for piece in response.aiter_bytes():
                kept = piece[: cap + 1 - received]
                received += len(kept)
                chunks.append(kept)
                if received > cap:
                    break
            if received > cap and is_file:
                raise ResourceTooLarge(
                    f"Feishu {operation} is over {limit} bytes",
                    operation=operation,
                    received=received,
                )
            if received > cap:
                raise FeishuApiError(
                    f"Feishu {operation} answered with an error over {cap} bytes",
                    http_status=status,
                    operation=operation,
                )
            return _Answer(status, dict(response.headers), b"".join(chunks))


@dataclass(frozen=True)
class _Request:
    """One call as it goes on the wire: the same for every attempt of it."""

    operation: str
    method: str
    url: str
    queries: list[tuple[str, str | int | float | bool | None]]
    body: Any
    files: dict[str, Any] | None


@dataclass(frozen=True)
class _Answer:
    """Feishu's answer: status, headers (names lower-cased) and body."""

    status: int
    headers: dict[str, str]
    content: bytes


def _content(card: dict[str, Any] | None, text: str | None) -> tuple[str, str]:
    if (card is None) == (text is None):
        raise ValueError("pass exactly one of card or text")
    if card is not None:
        return "interactive", json.dumps(card, ensure_ascii=False)
    return "text", json.dumps({"text": text}, ensure_ascii=False)


def _sent(data: dict[str, Any]) -> SentMessage:
    body = data.get("data") or {}
    return SentMessage(
        message_id=str(body.get("message_id", "")),
        chat_id=str(body.get("chat_id", "")),
        root_id=str(body.get("root_id", "") or ""),
        thread_id=str(body.get("thread_id", "") or ""),
    )
