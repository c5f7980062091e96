"""A fake Feishu OpenAPI server on a random loopback port, recording every request.

It serves what amux calls through lark-oapi (tenant token, messages, replies, card patches,
delayed card updates, bot info, the app's own configuration) and the long-connection bootstrap:
the endpoint discovery POST and a WebSocket speaking the SDK's protobuf frames, so tests can push
events and card clicks to ``lark.ws.Client`` and read its acknowledgements.

Resources: ``resources`` holds a message's images and files as bytes; ``large_resources`` holds
ones streamed in pieces, never whole, each counting the bytes that went out before the client
stopped reading.

Connections: ``connections`` counts the TCP connections the API calls arrived on (each client
port seen once), so a test can tell a pooled client from one that connects for every call.

Failure injection: ``fail_next(n, status=429, code=99991400)`` makes the next ``n`` matching
API calls answer with that HTTP status and Feishu error code; ``go_down()`` refuses connections
(and drops kept-alive ones) until ``come_back()``. Replies with a ``uuid`` already seen answer
with the message it created, as Feishu's idempotency key does.

Forwarded chats: ``add_forward`` stores a ``merge_forward`` message and the messages in it;
``GET /open-apis/im/v1/messages/{id}`` answers as Feishu does, the message itself first, then,
for a forward, every message in it (nested forwards' too), each naming the forward it sits in as
``upper_message_id``.

Document comments: ``add_comment`` starts a comment thread on a document's passage and
``add_comment_reply`` adds a person's reply to it; the drive comment API (get a comment, list a
thread's replies, add a reply) answers from them, and a reply the bot adds is stored in its
thread as the bot's (``bot_open_id``). A whole-document or resolved comment takes no reply, and
a reply over ``COMMENT_REPLY_CHARS`` is refused, as Feishu refuses them.

Size: a card over Feishu's limit (``CARD_LIMIT_BYTES`` of JSON) is refused with code 230025, as
Feishu refuses it, wherever a card is sent (a message, a reply, a card update, a CardKit entity
created or replaced, a delayed update); so is a text message over ``TEXT_LIMIT_BYTES``. Nothing of
a refused call is stored.

CardKit: card entities are created, sent by ``card_id``, streamed (element content), re-configured
and replaced; each change must carry a ``sequence`` larger than the card's last one (else code
300317, as Feishu refuses an older update), a repeated ``uuid`` is answered without applying it
again, and ``cardkit_refused`` makes creating one answer "no permission". A message showing an
entity records each of its states in ``updates``.
"""

from __future__ import annotations

import asyncio
import base64
import email.parser
import email.policy
import itertools
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from bot.feishu import app_manifest

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
# OAuth for a person's own user access token (the device flow, and refreshing what it gave).
DEVICE_AUTHORIZATION_PATH = "/open-apis/authen/v2/oauth/device_authorization"
OAUTH_TOKEN_PATH = "/open-apis/authen/v2/oauth/token"
# Token revocation, on Feishu's accounts site (the fake serves both sites).
OAUTH_REVOKE_PATH = "/oauth/v1/revoke"
# Paths called without a bearer token: they are how one is obtained.
_UNAUTHENTICATED = (TOKEN_PATH, DEVICE_AUTHORIZATION_PATH, OAUTH_TOKEN_PATH)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    at: float = 0.0  # time.monotonic() on arrival


@dataclass
class LargeResource:
    """A resource of ``size`` zero bytes, streamed (chunked unless ``declare_length``)."""

    size: int
    declare_length: bool = False
    sent: int = 0  # bytes handed to the connection before it ended


@dataclass
class Failure:
    remaining: int
    status: int
    code: int
    path_contains: str
    headers: dict[str, str] = field(default_factory=dict)


SEQUENCE_STALE = 300317
NO_PERMISSION = 99991672
TOO_LARGE = 230025
CARD_LIMIT_BYTES = 30 * 1024
COMMENT_REPLY_CHARS = 10_000
TEXT_LIMIT_BYTES = 150 * 1024


def _is_document_path(path: str) -> bool:
    """A call a user access token may make: reading and searching documents, wikis and
    sheets."""
    return path.startswith(
        (
            "/open-apis/docx/",
            "/open-apis/wiki/",
            "/open-apis/sheets/",
            "/open-apis/bitable/",
            "/open-apis/suite/docs-api/search/",
            "/open-apis/drive/v1/files/",
        )
    )


def _too_large(msg_type: str, content: str) -> web.Response | None:
    """Feishu's refusal of a message body over its size limit, or None when it fits."""
    limit = CARD_LIMIT_BYTES if msg_type == "interactive" else TEXT_LIMIT_BYTES
    if len(content.encode("utf-8")) <= limit:
        return None
    return web.json_response(
        {"code": TOO_LARGE, "msg": f"message content is over {limit} bytes"}, status=400
    )


@dataclass
class DeviceGrant:
    """One device-flow start: its codes, the scopes asked, and whom it was granted to (the
    ``open_id`` of the person who entered the code), None while nobody has."""

    device_code: str
    user_code: str
    scope: str
    open_id: str | None = None
    denied: bool = False


@dataclass
class FakeDocument:
    """A document in the fake: its kind (``docx`` or ``sheet``), title, revision, content (text
    for a docx, rows for a sheet), and who may read it: the ``open_id``s of people, and whether
    the app's tenant token may. A docx's ``blocks`` (``docx_blocks``) are what its block list
    answers; without them it is one paragraph of its text."""

    kind: str
    title: str
    content: Any
    readers: set[str] = field(default_factory=set)
    app_may_read: bool = False
    revision: int = 7
    blocks: list[dict[str, Any]] | None = None


_HEADINGS = {f"h{level}": (2 + level, f"heading{level}") for level in range(1, 10)}
_LIST_KINDS = {"bullet": (12, "bullet"), "ordered": (13, "ordered"), "todo": (17, "todo")}


def docx_blocks(document_id: str, *described: tuple[Any, ...]) -> list[dict[str, Any]]:
    """A docx's blocks as Feishu lists them (the page first, every block after its parent),
    from a short description, one tuple a block:

    ``("h1", text)`` .. ``("h9", text)``, ``("text", text)``, ``("quote", text)``,
    ``("bullet" | "ordered", text, [children])``, ``("todo", text, done)``,
    ``("code", language_number, source)``, ``("divider",)``, ``("table", [[cell, ...], ...])``.
    A text in backticks (```` `x` ````) is one inline-code run."""
    ids = itertools.count(1)
    out: list[dict[str, Any]] = []

    def elements(words: str) -> list[dict[str, Any]]:
        # Split on backticks: every other piece is inline code.
        pieces = words.split("`")
        return [
            {"text_run": {"content": piece, "text_element_style": {"inline_code": odd % 2 == 1}}}
            for odd, piece in enumerate(pieces)
            if piece
        ]

    def add(parent: str, item: tuple[Any, ...]) -> str:
        block_id = f"blk{next(ids)}"
        kind, *rest = item
        block: dict[str, Any] = {"block_id": block_id, "parent_id": parent}
        out.append(block)
        if kind in _HEADINGS or kind in ("text", "quote"):
            number, key = _HEADINGS.get(kind) or ((2, "text") if kind == "text" else (15, "quote"))
            block |= {"block_type": number, key: {"elements": elements(rest[0]), "style": {}}}
        elif kind in _LIST_KINDS:
            number, key = _LIST_KINDS[kind]
            style = {"done": bool(rest[1])} if kind == "todo" else {}
            block |= {"block_type": number, key: {"elements": elements(rest[0]), "style": style}}
            if kind != "todo" and len(rest) > 1:
                block["children"] = [add(block_id, child) for child in rest[1]]
        elif kind == "code":
            runs = [{"text_run": {"content": rest[1], "text_element_style": {}}}]
            block |= {"block_type": 14, "code": {"elements": runs, "style": {"language": rest[0]}}}
        elif kind == "divider":
            block |= {"block_type": 22, "divider": {}}
        elif kind == "table":
            rows: list[list[str]] = rest[0]
            cells = []
            for row in rows:
                for words in row:
                    cell = f"blk{next(ids)}"
                    cell_block: dict[str, Any] = {
                        "block_id": cell,
                        "parent_id": block_id,
                        "block_type": 32,
                        "table_cell": {},
                    }
                    out.append(cell_block)
                    cell_block["children"] = [add(cell, ("text", words))]
                    cells.append(cell)
            size = {"row_size": len(rows), "column_size": len(rows[0]) if rows else 0}
            block |= {"block_type": 31, "children": cells}
            block["table"] = {"cells": cells, "property": size}
        else:
            raise ValueError(f"no such block in a description: {kind!r}")
        return block_id

    page: dict[str, Any] = {"block_id": document_id, "block_type": 1, "parent_id": ""}
    out.append(page)
    page["children"] = [add(document_id, item) for item in described]
    page["page"] = {"elements": [], "style": {}}
    return out


@dataclass
class FakeReply:
    """One reply of a comment thread: who wrote it (an ``open_id``) and its content elements."""

    reply_id: str
    user_id: str
    elements: list[dict[str, Any]]
    create_time: int = 0

    @property
    def text(self) -> str:
        """Its text runs, as a reader sees them."""
        return "".join(
            str((e.get("text_run") or {}).get("text") or "")
            for e in self.elements
            if e.get("type") == "text_run"
        )


@dataclass
class FakeComment:
    """A comment thread on a document: the passage it quotes, and its replies in order (the
    first one is the comment itself)."""

    file_token: str
    file_type: str
    comment_id: str
    quote: str
    replies: list[FakeReply] = field(default_factory=list)
    is_whole: bool = False
    is_solved: bool = False


@dataclass
class CardEntity:
    card_id: str
    card: dict[str, Any]
    sequence: int = 0
    messages: list[StoredMessage] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)

    def changed(self) -> None:
        state = json.dumps(self.card, ensure_ascii=False)
        for message in self.messages:
            message.updates.append(state)


@dataclass
class ForwardedChild:
    """A message inside a forwarded chat: who sent it, its kind and content, and for a nested
    forward the messages inside it."""

    sender_id: str
    content: dict[str, Any]
    msg_type: str = "text"
    sender_type: str = "user"
    mentions: list[dict[str, Any]] = field(default_factory=list)
    children: list[ForwardedChild] = field(default_factory=list)


@dataclass
class StoredMessage:
    message_id: str
    chat_id: str
    msg_type: str
    content: str
    root_id: str = ""
    thread_id: str = ""
    updates: list[str] = field(default_factory=list)
    entity: CardEntity | None = None
    sender_open_id: str = ""  # empty: the bot sent it
    create_time_ms: int = 0
    # As the message list shows them: key, id, id_type, name, tenant_key.
    mentions: list[dict[str, str]] = field(default_factory=list)

    @property
    def card(self) -> dict[str, Any]:
        """The card this message currently shows (after any updates)."""
        if self.entity is not None:
            return self.entity.card
        value: dict[str, Any] = json.loads(self.updates[-1] if self.updates else self.content)
        return value


class FakeFeishu:
    """The fake server; use ``async with FakeFeishu(...) as fake`` and point the SDK at ``url``."""

    def __init__(
        self,
        app_id: str = "cli_test",
        app_secret: str = "secret",
        bot_open_id: str = "ou_bot",
        token_expire: int = 7200,
        ping_interval: int = 120,
        reconnect_count: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ssl_context`` serves it over TLS (``url`` is then https), as the real Feishu is."""
        self._ssl = ssl_context
        self.app_id = app_id
        self.app_secret = app_secret
        self.bot_open_id = bot_open_id
        self.token_expire = token_expire
        self.requests: list[Recorded] = []
        # The (host, port) of each client connection an API call came on.
        self._peers: set[tuple[str, int]] = set()
        self.messages: dict[str, StoredMessage] = {}
        self.card_updates: list[dict[str, Any]] = []
        self.issued_tokens: set[str] = set()
        # Set: the tenant token endpoint answers HTTP 200 with these bytes (a gateway's page).
        self.token_answer: bytes | None = None
        self._failures: list[Failure] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._port = 0
        self._down = False
        self._by_uuid: dict[str, str] = {}
        self.entities: dict[str, CardEntity] = {}
        self._card_uuids: set[str] = set()
        self.cardkit_refused = False
        # The app may not upload files (no im:resource scope): every upload is refused.
        self.uploads_refused = False
        self.message_list_refused = False
        # The app lacks the contact scope: people's names cannot be read.
        self.contact_refused = False
        # (message_id, key) -> bytes of a message's image or file; uploads by key -> (name, bytes).
        self.resources: dict[tuple[str, str], bytes] = {}
        self.large_resources: dict[tuple[str, str], LargeResource] = {}
        self.uploads: dict[str, tuple[str, bytes]] = {}
        self.user_names: dict[str, str] = {}
        # Time zones users set in Feishu, by open_id (the contact API answers them with names).
        self.user_time_zones: dict[str, str] = {}
        # A forward's message id -> the messages in it, as message.get lists them.
        self.forwarded: dict[str, list[dict[str, Any]]] = {}
        # The app's own configuration: what it is granted and subscribed to (all amux asks for,
        # unless a test takes some away), and whether it may read it at all.
        self.app_scopes = set(app_manifest.SCOPES)
        self.app_events = set(app_manifest.EVENTS)
        self.app_callbacks = set(app_manifest.CALLBACKS)
        self.app_config_refused = False
        # Device flow: started grants by device code; user tokens and refresh tokens issued to
        # whom (open_id); those revoked or rotated stop working.
        self.device_grants: dict[str, DeviceGrant] = {}
        self.user_access_tokens: dict[str, str] = {}
        self.user_refresh_tokens: dict[str, str] = {}
        self.user_token_expire = 7200
        # Every user token revoked (access or refresh): refused from then on; and whether
        # revoking is refused (Feishu answering an error), for a disconnect that cannot revoke.
        self.revoked_tokens: list[str] = []
        self.revoke_refused = False
        # Documents by token, wiki nodes (wiki token -> (obj_type, obj_token)), and every read of
        # one: (path, the bearer token it carried).
        self.documents: dict[str, FakeDocument] = {}
        self.wiki_nodes: dict[str, tuple[str, str]] = {}
        # At most this many of a docx's blocks to a page of its block list.
        self.docx_block_page = 4
        self.document_reads: list[tuple[str, str]] = []
        # Comments added: (document token, text, the bearer token it carried).
        self.comments_added: list[tuple[str, str, str]] = []
        # Comment threads by (file_token, comment_id).
        self.comments: dict[tuple[str, str], FakeComment] = {}
        self.url = ""
        # Long connection state.
        self.ws_connected = asyncio.Event()
        self._ws: web.WebSocketResponse | None = None
        self._ws_acks: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.ws_pings = 0
        self.ws_connections = 0
        # The long-connection client config the endpoint hands out (the SDK pings at this pace).
        self.ping_interval = ping_interval
        self.reconnect_count = reconnect_count
        # A connection gone silent stays open but answers nothing, as one a dead path holds.
        self._silent: web.WebSocketResponse | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> FakeFeishu:
        app = web.Application()
        app.router.add_post(TOKEN_PATH, self._token)
        app.router.add_post(DEVICE_AUTHORIZATION_PATH, self._device_authorization)
        app.router.add_post(OAUTH_TOKEN_PATH, self._oauth_token)
        app.router.add_post(OAUTH_REVOKE_PATH, self._oauth_revoke)
        app.router.add_get("/open-apis/docx/v1/documents/{token}", self._docx)
        app.router.add_get("/open-apis/docx/v1/documents/{token}/raw_content", self._docx_raw)
        app.router.add_get("/open-apis/docx/v1/documents/{token}/blocks", self._docx_block_list)
        app.router.add_get("/open-apis/wiki/v2/spaces/get_node", self._wiki_node)
        app.router.add_post("/open-apis/suite/docs-api/search/object", self._search_docs)
        app.router.add_post("/open-apis/drive/v1/files/{token}/comments", self._add_comment)
        app.router.add_get("/open-apis/bitable/v1/apps/{token}", self._bitable)
        app.router.add_get("/open-apis/bitable/v1/apps/{token}/tables", self._bitable_tables)
        app.router.add_get(
            "/open-apis/bitable/v1/apps/{token}/tables/{table}/records", self._bitable_records
        )
        app.router.add_get("/open-apis/sheets/v3/spreadsheets/{token}", self._sheet)
        app.router.add_get("/open-apis/sheets/v3/spreadsheets/{token}/sheets/query", self._sheets)
        app.router.add_get(
            "/open-apis/sheets/v2/spreadsheets/{token}/values/{range}", self._sheet_values
        )
        comment = "/open-apis/drive/v1/files/{file_token}/comments/{comment_id}"
        app.router.add_get(comment, self._comment)
        app.router.add_get(comment + "/replies", self._comment_replies)
        app.router.add_post(comment + "/replies", self._comment_reply)
        app.router.add_post("/open-apis/im/v1/messages", self._create)
        app.router.add_get("/open-apis/im/v1/messages", self._list)
        app.router.add_get("/open-apis/contact/v3/users/batch", self._users)
        app.router.add_get("/open-apis/im/v1/messages/{message_id}", self._get_message)
        app.router.add_get("/open-apis/im/v1/messages/{message_id}/resources/{key}", self._resource)
        app.router.add_post("/open-apis/im/v1/files", self._upload)
        app.router.add_post("/open-apis/im/v1/images", self._upload)
        app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", self._reply)
        app.router.add_patch("/open-apis/im/v1/messages/{message_id}", self._patch)
        app.router.add_get("/open-apis/bot/v3/info", self._bot_info)
        app.router.add_get("/open-apis/application/v6/applications/{app_id}", self._application)
        app.router.add_post("/open-apis/cardkit/v1/cards", self._card_create)
        app.router.add_put("/open-apis/cardkit/v1/cards/{card_id}", self._card_replace)
        app.router.add_patch("/open-apis/cardkit/v1/cards/{card_id}/settings", self._card_settings)
        app.router.add_put(
            "/open-apis/cardkit/v1/cards/{card_id}/elements/{element_id}/content",
            self._card_content,
        )
        app.router.add_post("/open-apis/interactive/v1/card/update", self._card_update)
        app.router.add_post("/callback/ws/endpoint", self._ws_endpoint)
        app.router.add_get("/ws", self._ws_handler)
        app.middlewares.append(self._record)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await self._site.start()
        self._port = self._runner.addresses[0][1]
        scheme = "https" if self._ssl is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self._port}"
        return self

    async def go_down(self) -> None:
        """An outage: connections are refused, and requests on kept-alive ones are dropped."""
        self._down = True
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def come_back(self) -> None:
        """End the outage on the same port; everything stored before is still there."""
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self._port, ssl_context=self._ssl)
        await self._site.start()
        self._down = False

    async def __aexit__(self, *exc: object) -> None:
        for future in self._ws_acks.values():
            future.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- test controls ---------------------------------------------------------------------

    def fail_next(
        self,
        count: int,
        status: int = 429,
        code: int = 99991400,
        path_contains: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``count`` calls whose path contains ``path_contains`` with an error."""
        self._failures.append(Failure(count, status, code, path_contains, dict(headers or {})))

    def failures_left(self) -> int:
        """Injected failures not answered yet."""
        return sum(failure.remaining for failure in self._failures)

    def add_message(
        self, chat_id: str, text: str, *, sender_open_id: str = "ou_user", thread_id: str = ""
    ) -> StoredMessage:
        """A message a user wrote, so the bot can reply to it (and list it in its topic)."""
        body = {"msg_type": "text", "content": json.dumps({"text": text})}
        message = self._store(chat_id, body, thread_id=thread_id)
        message.sender_open_id = sender_open_id
        return message

    def add_forward(
        self,
        chat_id: str,
        children: list[ForwardedChild],
        *,
        sender_open_id: str = "ou_user",
        source_chat_id: str = "oc_forwarded_from",
    ) -> StoredMessage:
        """A forwarded chat a user sent (``merge_forward``), holding ``children`` in order."""
        body = {
            "msg_type": "merge_forward",
            "content": json.dumps({"content": "Merged and Forwarded Message"}),
        }
        message = self._store(chat_id, body)
        message.sender_open_id = sender_open_id
        listed: list[dict[str, Any]] = []
        # Older than the forward, a minute apart, as a chat's messages were before forwarding.
        start = message.create_time_ms - 3_600_000

        def add(upper: str, items: list[ForwardedChild]) -> None:
            for child in items:
                child_id = f"om_{next(self._ids)}"
                created = str(start + 60_000 * len(listed))
                item: dict[str, Any] = {
                    "message_id": child_id,
                    "msg_type": child.msg_type,
                    "create_time": created,
                    "update_time": created,
                    "deleted": False,
                    "updated": False,
                    "chat_id": source_chat_id,
                    "sender": {
                        "id": child.sender_id,
                        "id_type": "open_id" if child.sender_type == "user" else "app_id",
                        "sender_type": child.sender_type,
                        "tenant_key": "tenant_1",
                    },
                    "body": {"content": json.dumps(child.content, ensure_ascii=False)},
                    "upper_message_id": upper,
                }
                if child.mentions:
                    item["mentions"] = child.mentions
                listed.append(item)
                add(child_id, child.children)

        add(message.message_id, children)
        self.forwarded[message.message_id] = listed
        return message

    def _reply_of(self, author_open_id: str, text: str, mention_bot: bool) -> FakeReply:
        elements: list[dict[str, Any]] = []
        if mention_bot:
            elements.append({"type": "person", "person": {"user_id": self.bot_open_id}})
        elements.append({"type": "text_run", "text_run": {"text": text}})
        return FakeReply(f"rp_{next(self._ids)}", author_open_id, elements, int(time.time()))

    def add_comment(
        self,
        file_token: str,
        quote: str,
        text: str,
        *,
        author_open_id: str = "ou_user",
        file_type: str = "docx",
        mention_bot: bool = True,
    ) -> FakeComment:
        """A person's comment on ``quote`` in a document, @mentioning the bot unless told not."""
        comment = FakeComment(file_token, file_type, f"cm_{next(self._ids)}", quote)
        comment.replies.append(self._reply_of(author_open_id, text, mention_bot))
        self.comments[(file_token, comment.comment_id)] = comment
        return comment

    def add_comment_reply(
        self, comment: FakeComment, text: str, *, author_open_id: str, mention_bot: bool = True
    ) -> FakeReply:
        """A person's reply in ``comment``'s thread."""
        reply = self._reply_of(author_open_id, text, mention_bot)
        comment.replies.append(reply)
        return reply

    def grant_device(self, user_code: str, open_id: str) -> None:
        """The person ``open_id`` enters ``user_code`` and grants what it asked."""
        for grant in self.device_grants.values():
            if grant.user_code == user_code:
                grant.open_id = open_id
                return
        raise KeyError(f"no device flow shows the code {user_code!r}")

    def user_tokens_of(self, open_id: str) -> list[str]:
        """The user access tokens issued to ``open_id`` (still valid), oldest first."""
        return [t for t, who in self.user_access_tokens.items() if who == open_id]

    def user_token_for(self, open_id: str) -> str:
        """A user access token for ``open_id``, as if they had just granted the device flow."""
        number = next(self._ids)
        self.user_access_tokens[f"u-{number}"] = open_id
        return f"u-{number}"

    @property
    def connections(self) -> int:
        """How many TCP connections the API calls so far came on."""
        return len(self._peers)

    def calls(self, method: str, path_contains: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and path_contains in r.path]

    # -- HTTP ------------------------------------------------------------------------------

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/ws":
            return await handler(request)  # type: ignore[no-any-return]
        if self._down and request.transport is not None:
            request.transport.abort()
            raise ConnectionResetError("the fake Feishu is down")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer is not None:
            self._peers.add((str(peer[0]), int(peer[1])))
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                dict(request.query),
                dict(request.headers),
                body,
                time.monotonic(),
            )
        )
        for failure in self._failures:
            if failure.remaining > 0 and failure.path_contains in request.path:
                failure.remaining -= 1
                return web.json_response(
                    {"code": failure.code, "msg": "injected failure"},
                    status=failure.status,
                    headers=failure.headers,
                )
        if request.path.startswith("/open-apis/") and request.path not in _UNAUTHENTICATED:
            auth = request.headers.get("Authorization", "")
            bearer = auth.removeprefix("Bearer ")
            if bearer not in self.issued_tokens and not (
                _is_document_path(request.path) and bearer in self.user_access_tokens
            ):
                return web.json_response(
                    {"code": 99991663, "msg": "Invalid access token for authorization"},
                    status=400,
                )
        return await handler(request)  # type: ignore[no-any-return]

    def _body(self, request: web.Request) -> dict[str, Any]:
        body = self.requests[-1].body
        return body if isinstance(body, dict) else {}

    async def _device_authorization(self, request: web.Request) -> web.Response:
        body = self._body(request)
        if body.get("client_id") != self.app_id:
            return web.json_response({"code": 20002, "msg": "invalid client"}, status=400)
        number = next(self._ids)
        grant = DeviceGrant(f"dc-{number}", f"UC-{number:04d}", str(body.get("scope") or ""))
        self.device_grants[grant.device_code] = grant
        return web.json_response(
            {
                "device_code": grant.device_code,
                "user_code": grant.user_code,
                "verification_uri": f"{self.url}/verify",
                "verification_uri_complete": f"{self.url}/verify?code={grant.user_code}",
                "expires_in": 240,
                "interval": 1,
            }
        )

    def _issue_user_token(self, open_id: str, scope: str) -> web.Response:
        number = next(self._ids)
        access, refresh = f"u-{number}", f"ur-{number}"
        self.user_access_tokens[access] = open_id
        self.user_refresh_tokens[refresh] = open_id
        return web.json_response(
            {
                "code": 0,
                "access_token": access,
                "refresh_token": refresh,
                "expires_in": self.user_token_expire,
                "refresh_token_expires_in": 30 * 86400,
                "scope": scope,
                "token_type": "Bearer",
            }
        )

    async def _oauth_token(self, request: web.Request) -> web.Response:
        body = self._body(request)
        if body.get("client_id") != self.app_id or body.get("client_secret") != self.app_secret:
            return web.json_response(
                {"code": 20002, "error": "invalid_client", "msg": "invalid client"}, status=400
            )
        kind = body.get("grant_type")
        if kind == "urn:ietf:params:oauth:grant-type:device_code":
            grant = self.device_grants.get(str(body.get("device_code")))
            if grant is None:
                return web.json_response({"error": "expired_token"}, status=400)
            if grant.denied:
                return web.json_response({"error": "access_denied"}, status=400)
            if grant.open_id is None:
                return web.json_response({"error": "authorization_pending"}, status=400)
            del self.device_grants[grant.device_code]  # a device code is used once
            return self._issue_user_token(grant.open_id, grant.scope)
        if kind == "refresh_token":
            # A refresh token is used once: Feishu hands out a new one with each refresh.
            open_id = self.user_refresh_tokens.pop(str(body.get("refresh_token")), None)
            if open_id is None:
                return web.json_response(
                    {"code": 20026, "error": "invalid_grant", "msg": "refresh token invalid"},
                    status=400,
                )
            return self._issue_user_token(open_id, "")
        return web.json_response({"error": "unsupported_grant_type"}, status=400)

    async def _oauth_revoke(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("client_id") != self.app_id or form.get("client_secret") != self.app_secret:
            return web.json_response(
                {"error": "invalid_client", "error_description": "invalid client"}, status=401
            )
        if self.revoke_refused:
            return web.json_response({"code": 20050, "msg": "system busy"}, status=500)
        token = str(form.get("token") or "")
        # RFC 7009: an unknown token is revoked already, and still a success.
        if self.user_access_tokens.pop(token, None) or self.user_refresh_tokens.pop(token, None):
            self.revoked_tokens.append(token)
        return web.json_response({"code": 0})

    def _document(self, request: web.Request, token: str, kind: str) -> FakeDocument | web.Response:
        """The document if the request's bearer may read it; else Feishu's refusal."""
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.document_reads.append((request.path, bearer))
        document = self.documents.get(token)
        if document is None or document.kind != kind:
            return web.json_response({"code": 1770002, "msg": "not found"}, status=404)
        who = self.user_access_tokens.get(bearer)
        allowed = who in document.readers if who is not None else document.app_may_read
        if not allowed:
            return web.json_response({"code": 1770032, "msg": "forbidden"}, status=403)
        return document

    async def _docx(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "docx")
        if isinstance(document, web.Response):
            return document
        return web.json_response(
            {
                "code": 0,
                "data": {
                    "document": {
                        "document_id": request.match_info["token"],
                        "title": document.title,
                        "revision_id": document.revision,
                    }
                },
            }
        )

    async def _docx_raw(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "docx")
        if isinstance(document, web.Response):
            return document
        return web.json_response({"code": 0, "data": {"content": document.content}})

    async def _docx_block_list(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        document = self._document(request, token, "docx")
        if isinstance(document, web.Response):
            return document
        blocks = document.blocks
        if blocks is None:
            blocks = docx_blocks(token, ("text", str(document.content)))
        # Pages smaller than asked, so a reader that stops after one page misses blocks.
        size = min(int(request.query.get("page_size") or 500), self.docx_block_page)
        start = int(request.query.get("page_token") or 0)
        following = start + size
        more = following < len(blocks)
        data = {
            "items": blocks[start:following],
            "has_more": more,
            "page_token": str(following) if more else "",
        }
        return web.json_response({"code": 0, "data": data})

    async def _search_docs(self, request: web.Request) -> web.Response:
        """Feishu's document search: documents whose title or text holds the key, of those the
        bearer may open (a user token: its person's; the app's: those it may read)."""
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.document_reads.append((request.path, bearer))
        body = self._body(request)
        key = str(body.get("search_key") or "").lower()
        count = int(body.get("count") or 20)
        who = self.user_access_tokens.get(bearer)
        shown = {"docx": "docx", "sheet": "sheet", "bitable": "bitable"}
        found = [
            {"docs_token": token, "docs_type": shown[doc.kind], "title": doc.title}
            for token, doc in self.documents.items()
            if (who in doc.readers if who is not None else doc.app_may_read)
            and (key in doc.title.lower() or key in json.dumps(doc.content).lower())
        ]
        data = {"docs_entities": found[:count], "has_more": len(found) > count, "total": len(found)}
        return web.json_response({"code": 0, "data": data})

    async def _add_comment(self, request: web.Request) -> web.Response:
        """A whole-document comment on a docx, by a person who may read it."""
        document = self._document(request, request.match_info["token"], "docx")
        if isinstance(document, web.Response):
            return document
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        replies = self._body(request).get("reply_list", {}).get("replies", [])
        text = "".join(
            str(element.get("text_run", {}).get("text", ""))
            for reply in replies
            for element in reply.get("content", {}).get("elements", [])
        )
        comment_id = f"cm-{next(self._ids)}"
        self.comments_added.append((request.match_info["token"], text, bearer))
        return web.json_response({"code": 0, "data": {"comment_id": comment_id}})

    async def _wiki_node(self, request: web.Request) -> web.Response:
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.document_reads.append((request.path, bearer))
        node = self.wiki_nodes.get(request.query.get("token", ""))
        if node is None:
            return web.json_response({"code": 131005, "msg": "not found"}, status=404)
        obj_type, obj_token = node
        title = self.documents[obj_token].title if obj_token in self.documents else ""
        return web.json_response(
            {
                "code": 0,
                "data": {"node": {"obj_type": obj_type, "obj_token": obj_token, "title": title}},
            }
        )

    async def _bitable(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "bitable")
        if isinstance(document, web.Response):
            return document
        app = {"name": document.title, "revision": document.revision}
        return web.json_response({"code": 0, "data": {"app": app}})

    async def _bitable_tables(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "bitable")
        if isinstance(document, web.Response):
            return document
        items = [{"table_id": "tbl1", "name": "Table 1"}]
        return web.json_response({"code": 0, "data": {"items": items}})

    async def _bitable_records(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "bitable")
        if isinstance(document, web.Response):
            return document
        items = [{"record_id": f"rec{i}", "fields": f} for i, f in enumerate(document.content)]
        return web.json_response({"code": 0, "data": {"items": items, "has_more": False}})

    async def _sheet(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "sheet")
        if isinstance(document, web.Response):
            return document
        return web.json_response({"code": 0, "data": {"spreadsheet": {"title": document.title}}})

    async def _sheets(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "sheet")
        if isinstance(document, web.Response):
            return document
        return web.json_response(
            {"code": 0, "data": {"sheets": [{"sheet_id": "s1", "title": "Sheet1"}]}}
        )

    async def _sheet_values(self, request: web.Request) -> web.Response:
        document = self._document(request, request.match_info["token"], "sheet")
        if isinstance(document, web.Response):
            return document
        named, _, corner = request.match_info["range"].partition("!")
        if named != "s1":
            return web.json_response({"code": 90215, "msg": "sheet not found"}, status=404)
        value_range = {
            "range": request.match_info["range"],
            "values": _cells(list(document.content), corner),
        }
        return web.json_response(
            {"code": 0, "data": {"revision": document.revision, "valueRange": value_range}}
        )

    def _thread(self, request: web.Request) -> FakeComment | web.Response:
        key = (request.match_info["file_token"], request.match_info["comment_id"])
        comment = self.comments.get(key)
        if comment is None or request.query.get("file_type") != comment.file_type:
            return web.json_response({"code": 1069302, "msg": "comment not found"}, status=404)
        return comment

    @staticmethod
    def _reply_data(reply: FakeReply) -> dict[str, Any]:
        return {
            "reply_id": reply.reply_id,
            "user_id": reply.user_id,
            "create_time": reply.create_time,
            "update_time": reply.create_time,
            "content": {"elements": reply.elements},
        }

    async def _comment(self, request: web.Request) -> web.Response:
        comment = self._thread(request)
        if isinstance(comment, web.Response):
            return comment
        data = {
            "comment_id": comment.comment_id,
            "user_id": comment.replies[0].user_id if comment.replies else "",
            "is_whole": comment.is_whole,
            "is_solved": comment.is_solved,
            "quote": comment.quote,
            # Feishu lists only the first replies here; the rest are paged from ``replies``.
            "has_more": len(comment.replies) > 5,
            "reply_list": {"replies": [self._reply_data(r) for r in comment.replies[:5]]},
        }
        return web.json_response({"code": 0, "msg": "success", "data": data})

    async def _comment_replies(self, request: web.Request) -> web.Response:
        comment = self._thread(request)
        if isinstance(comment, web.Response):
            return comment
        offset = int(request.query.get("page_token") or 0)
        size = int(request.query.get("page_size", "50"))
        page = comment.replies[offset : offset + size]
        more = offset + size < len(comment.replies)
        data: dict[str, Any] = {
            "items": [self._reply_data(r) for r in page],
            "has_more": more,
        }
        if more:
            data["page_token"] = str(offset + size)
        return web.json_response({"code": 0, "msg": "success", "data": data})

    async def _comment_reply(self, request: web.Request) -> web.Response:
        comment = self._thread(request)
        if isinstance(comment, web.Response):
            return comment
        if comment.is_whole or comment.is_solved:
            return web.json_response(
                {"code": 1069303, "msg": "comment does not take replies"}, status=400
            )
        elements = ((self._body(request).get("content") or {}).get("elements")) or []
        reply = FakeReply(f"rp_{next(self._ids)}", self.bot_open_id, elements, int(time.time()))
        if len(reply.text) > COMMENT_REPLY_CHARS:
            return web.json_response({"code": 1069304, "msg": "reply too long"}, status=400)
        comment.replies.append(reply)
        return web.json_response({"code": 0, "msg": "success", "data": self._reply_data(reply)})

    async def _token(self, request: web.Request) -> web.Response:
        if self.token_answer is not None:
            return web.Response(body=self.token_answer, content_type="text/html")
        body = self._body(request)
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        token = f"t-{next(self._ids)}"
        self.issued_tokens.add(token)
        return web.json_response(
            {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": self.token_expire}
        )

    def _store(self, chat_id: str, body: dict[str, Any], **kw: str) -> StoredMessage:
        message_id = f"om_{next(self._ids)}"
        message = StoredMessage(
            message_id, chat_id, str(body.get("msg_type")), str(body.get("content")), **kw
        )
        # Strictly increasing, as a topic's messages are ordered by creation time.
        message.create_time_ms = max(
            int(time.time() * 1000),
            max((m.create_time_ms for m in self.messages.values()), default=0) + 1,
        )
        self.messages[message_id] = message
        return message

    def _message_data(self, message: StoredMessage) -> dict[str, Any]:
        data = {
            "message_id": message.message_id,
            "chat_id": message.chat_id,
            "msg_type": message.msg_type,
            "body": {"content": message.content},
        }
        if message.root_id:
            data["root_id"] = message.root_id
            data["parent_id"] = message.root_id
        if message.thread_id:
            data["thread_id"] = message.thread_id
        return data

    async def _create(self, request: web.Request) -> web.Response:
        body = self._body(request)
        refused = _too_large(str(body.get("msg_type")), str(body.get("content")))
        if refused is not None:
            return refused
        key = str(body.get("uuid") or "")
        if key in self._by_uuid:
            message = self.messages[self._by_uuid[key]]
            return web.json_response(
                {"code": 0, "msg": "success", "data": self._message_data(message)}
            )
        receive_id = str(body.get("receive_id"))
        chat_id = receive_id if receive_id.startswith("oc_") else f"oc_p2p_{receive_id}"
        message = self._store(chat_id, body)
        if key:
            self._by_uuid[key] = message.message_id
        return web.json_response({"code": 0, "msg": "success", "data": self._message_data(message)})

    async def _reply(self, request: web.Request) -> web.Response:
        parent = self.messages.get(request.match_info["message_id"])
        if parent is None:
            return web.json_response({"code": 230011, "msg": "message not found"}, status=400)
        body = self._body(request)
        refused = _too_large(str(body.get("msg_type")), str(body.get("content")))
        if refused is not None:
            return refused
        key = str(body.get("uuid") or "")
        if key in self._by_uuid:
            message = self.messages[self._by_uuid[key]]
            return web.json_response(
                {"code": 0, "msg": "success", "data": self._message_data(message)}
            )
        root = parent.root_id or parent.message_id
        thread = parent.thread_id
        if body.get("reply_in_thread") and not thread:
            thread = f"omt_{next(self._ids)}"
            parent.thread_id = thread
        message = self._store(parent.chat_id, body, root_id=root, thread_id=thread)
        self._attach_entity(message)
        if key:
            self._by_uuid[key] = message.message_id
        return web.json_response({"code": 0, "msg": "success", "data": self._message_data(message)})

    async def _patch(self, request: web.Request) -> web.Response:
        message = self.messages.get(request.match_info["message_id"])
        if message is None:
            return web.json_response({"code": 230011, "msg": "message not found"}, status=400)
        content = str(self._body(request).get("content"))
        refused = _too_large("interactive", content)
        if refused is not None:
            return refused
        message.updates.append(content)
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _list(self, request: web.Request) -> web.Response:
        if self.message_list_refused:
            return web.json_response(
                {"code": NO_PERMISSION, "msg": "Access denied: im:message.group_msg"}, status=400
            )
        kind = request.query.get("container_id_type")
        if kind not in ("thread", "chat"):
            return web.json_response({"code": 230001, "msg": "unsupported container"}, status=400)
        container = request.query.get("container_id", "")
        # A chat lists its messages outside topics, and each topic's first message.

        def inside(m: StoredMessage) -> bool:
            if kind == "thread":
                return m.thread_id == container
            return m.chat_id == container and not (m.thread_id and m.root_id)

        found = sorted(
            (m for m in self.messages.values() if inside(m)),
            key=lambda m: m.create_time_ms,
            reverse=request.query.get("sort_type") == "ByCreateTimeDesc",
        )
        start_ms = int(request.query.get("start_time") or 0) * 1000
        found = [m for m in found if m.create_time_ms >= start_ms]
        offset = int(request.query.get("page_token") or 0)
        size = int(request.query.get("page_size", "20"))
        more = offset + size < len(found)
        found = found[offset : offset + size]
        items = [
            {
                "message_id": m.message_id,
                "thread_id": m.thread_id,
                "msg_type": m.msg_type,
                "create_time": str(m.create_time_ms),
                "chat_id": m.chat_id,
                "sender": {
                    "id": m.sender_open_id or "cli_bot",
                    "id_type": "open_id" if m.sender_open_id else "app_id",
                    "sender_type": "user" if m.sender_open_id else "app",
                },
                "body": {"content": m.content},
            }
            for m in found
        ]
        for item, m in zip(items, found, strict=True):
            if m.root_id:
                item["root_id"] = item["parent_id"] = m.root_id
            if m.mentions:
                item["mentions"] = m.mentions
        data: dict[str, Any] = {"items": items, "has_more": more}
        if more:
            data["page_token"] = str(offset + size)
        return web.json_response({"code": 0, "msg": "success", "data": data})

    async def _get_message(self, request: web.Request) -> web.Response:
        message = self.messages.get(request.match_info["message_id"])
        if message is None:
            return web.json_response({"code": 230011, "msg": "message not found"}, status=400)
        item = {
            "message_id": message.message_id,
            "msg_type": message.msg_type,
            "create_time": str(message.create_time_ms),
            "update_time": str(message.create_time_ms),
            "deleted": False,
            "updated": False,
            "chat_id": message.chat_id,
            "sender": {
                "id": message.sender_open_id or self.app_id,
                "id_type": "open_id" if message.sender_open_id else "app_id",
                "sender_type": "user" if message.sender_open_id else "app",
                "tenant_key": "tenant_1",
            },
            "body": {"content": message.content},
        }
        items = [item, *self.forwarded.get(message.message_id, [])]
        return web.json_response({"code": 0, "msg": "success", "data": {"items": items}})

    async def _users(self, request: web.Request) -> web.Response:
        if self.contact_refused:
            return web.json_response(
                {"code": NO_PERMISSION, "msg": "Access denied: contact:user.base:readonly"},
                status=400,
            )
        ids = request.query.getall("user_ids", [])
        items = [
            {"open_id": i, "name": self.user_names[i], "time_zone": self.user_time_zones.get(i, "")}
            for i in ids
            if i in self.user_names
        ]
        return web.json_response({"code": 0, "msg": "success", "data": {"items": items}})

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("type") not in ("image", "file"):
            # Feishu serves images and files only; voice and video are files to it.
            return web.json_response({"code": 234001, "msg": "invalid resource type"}, status=400)
        where = (request.match_info["message_id"], request.match_info["key"])
        large = self.large_resources.get(where)
        if large is not None:
            return await self._stream(request, large)
        found = self.resources.get(where)
        if found is None:
            return web.json_response({"code": 234003, "msg": "resource not found"}, status=400)
        return web.Response(body=found, content_type="application/octet-stream")

    async def _stream(self, request: web.Request, large: LargeResource) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        if large.declare_length:
            response.content_length = large.size
        await response.prepare(request)
        piece = bytes(64 * 1024)
        try:
            while large.sent < large.size:
                size = min(len(piece), large.size - large.sent)
                await response.write(piece[:size])
                large.sent += size
            await response.write_eof()
        except ConnectionError:
            pass  # The client stopped reading; what it was sent is counted.
        return response

    async def _upload(self, request: web.Request) -> web.Response:
        if self.uploads_refused:
            return web.json_response({"code": NO_PERMISSION, "msg": "no permission"}, status=400)
        # The recording middleware consumed the stream: parse the multipart body it kept.
        raw = self.requests[-1].body
        head = f"Content-Type: {request.headers.get('Content-Type', '')}\r\n\r\n".encode()
        parsed = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            head + (raw if isinstance(raw, bytes) else b"")
        )
        parts: dict[str, tuple[str, bytes]] = {}
        for part in parsed.iter_parts():
            name = str(part.get_param("name", header="content-disposition") or "")
            payload = part.get_payload(decode=True)
            parts[name] = (
                part.get_filename() or "",
                payload if isinstance(payload, bytes) else b"",
            )
        field_name = "image" if request.path.endswith("/images") else "file"
        if field_name not in parts:
            return web.json_response({"code": 234001, "msg": "no file"}, status=400)
        filename, content = parts[field_name]
        given = parts.get("file_name", ("", b""))[1].decode()
        key = f"{field_name}_{next(self._ids)}"
        self.uploads[key] = (given or filename, content)
        return web.json_response({"code": 0, "msg": "success", "data": {f"{field_name}_key": key}})

    def _attach_entity(self, message: StoredMessage) -> None:
        if message.msg_type != "interactive":
            return
        content = json.loads(message.content)
        if content.get("type") == "card":
            entity = self.entities[content["data"]["card_id"]]
            message.entity = entity
            entity.messages.append(message)

    async def _card_create(self, request: web.Request) -> web.Response:
        if self.cardkit_refused:
            return web.json_response(
                {"code": NO_PERMISSION, "msg": "no permission for cardkit"}, status=400
            )
        body = self._body(request)
        refused = _too_large("interactive", str(body.get("data")))
        if refused is not None:
            return refused
        card_id = f"ck_{next(self._ids)}"
        self.entities[card_id] = CardEntity(card_id, json.loads(str(body.get("data"))))
        return web.json_response({"code": 0, "msg": "success", "data": {"card_id": card_id}})

    def _card_change(self, request: web.Request) -> tuple[CardEntity | None, web.Response | None]:
        """The entity a change applies to, or the answer when it must not be applied."""
        entity = self.entities.get(request.match_info["card_id"])
        if entity is None:
            return None, web.json_response({"code": 300301, "msg": "card not found"}, status=400)
        body = self._body(request)
        key = str(body.get("uuid") or "")
        if key and key in self._card_uuids:
            return None, web.json_response({"code": 0, "msg": "success", "data": {}})
        sequence = int(body.get("sequence") or 0)
        if sequence <= entity.sequence:
            return None, web.json_response(
                {"code": SEQUENCE_STALE, "msg": "sequence number compare failed"}, status=400
            )
        if key:
            self._card_uuids.add(key)
        entity.sequence = sequence
        entity.sequences.append(sequence)
        return entity, None

    async def _card_content(self, request: web.Request) -> web.Response:
        entity, refused = self._card_change(request)
        if entity is None:
            assert refused is not None
            return refused
        element_id = request.match_info["element_id"]
        for element in entity.card.get("body", {}).get("elements", []):
            if element.get("element_id") == element_id:
                element["content"] = self._body(request).get("content")
        entity.changed()
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _card_settings(self, request: web.Request) -> web.Response:
        entity, refused = self._card_change(request)
        if entity is None:
            assert refused is not None
            return refused
        settings = json.loads(str(self._body(request).get("settings")))
        entity.card.setdefault("config", {}).update(settings.get("config", {}))
        entity.changed()
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _card_replace(self, request: web.Request) -> web.Response:
        data = str((self._body(request).get("card") or {}).get("data"))
        too_large = _too_large("interactive", data)
        if too_large is not None:
            return too_large
        entity, refused = self._card_change(request)
        if entity is None:
            assert refused is not None
            return refused
        card = self._body(request).get("card") or {}
        entity.card = json.loads(str(card.get("data")))
        entity.changed()
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _bot_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "code": 0,
                "msg": "ok",
                "bot": {"open_id": self.bot_open_id, "app_name": "amux", "activate_status": 2},
            }
        )

    async def _application(self, request: web.Request) -> web.Response:
        if self.app_config_refused:
            return web.json_response(
                {
                    "code": NO_PERMISSION,
                    "msg": "Access denied: application:application:self_manage",
                },
                status=400,
            )
        if request.match_info["app_id"] != self.app_id:
            return web.json_response({"code": 210501, "msg": "app not found"}, status=400)
        app = {
            "app_id": self.app_id,
            "scopes": [{"scope": scope, "level": 1} for scope in sorted(self.app_scopes)],
            "event": {
                "subscription_type": "websocket",
                "subscribed_events": sorted(self.app_events),
            },
            "callback": {
                "callback_type": "websocket",
                "subscribed_callbacks": sorted(self.app_callbacks),
            },
        }
        return web.json_response({"code": 0, "msg": "success", "data": {"app": app}})

    async def _card_update(self, request: web.Request) -> web.Response:
        card = self._body(request).get("card")
        refused = _too_large("interactive", json.dumps(card, ensure_ascii=False))
        if refused is not None:
            return refused
        self.card_updates.append(self._body(request))
        return web.json_response({"code": 0, "msg": "success"})

    # -- long connection -------------------------------------------------------------------

    async def _ws_endpoint(self, request: web.Request) -> web.Response:
        body = self._body(request)
        if body.get("AppID") != self.app_id or body.get("AppSecret") != self.app_secret:
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        ws_url = self.url.replace("http://", "ws://") + "/ws?device_id=dev1&service_id=7"
        config = {
            "ReconnectCount": self.reconnect_count,
            "ReconnectInterval": 1,
            "ReconnectNonce": 0,
            "PingInterval": self.ping_interval,
        }
        return web.json_response({"code": 0, "data": {"URL": ws_url, "ClientConfig": config}})

    async def _ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._ws = ws
        self.ws_connections += 1
        self.ws_connected.set()
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or ws is self._silent:
                continue
            frame = Frame()
            frame.ParseFromString(msg.data)
            headers = {h.key: h.value for h in frame.headers}
            if frame.method == 0 and headers.get("type") == "ping":
                self.ws_pings += 1
                pong = Frame(SeqID=0, LogID=0, service=frame.service, method=0)
                pong.headers.add(key="type", value="pong")
                await ws.send_bytes(pong.SerializeToString())
            elif frame.method == 1:
                future = self._ws_acks.pop(headers.get("message_id", ""), None)
                if future is not None and not future.done():
                    future.set_result(json.loads(frame.payload))
        # A newer connection may have replaced this one already.
        if self._ws is ws:
            self._ws = None
        return ws

    def go_silent(self) -> None:
        """The current long connection stays open but gets no pong, event or answer any more."""
        if self._ws is None:
            raise RuntimeError("no long-connection client is connected")
        self._silent = self._ws

    async def push(self, payload: dict[str, Any], kind: str = "event") -> dict[str, Any]:
        """Send one data frame (``kind`` "event" or "card") and return the client's ack.

        The ack is ``{"code": 200, "data": <the handler's answer>}``, with data decoded.
        """
        if self._ws is None:
            raise RuntimeError("no long-connection client is connected")
        message_id = f"msg_{next(self._ids)}"
        frame = Frame(SeqID=next(self._ids), LogID=0, service=7, method=1)
        for key, value in (
            ("type", kind),
            ("message_id", message_id),
            ("trace_id", f"trace_{message_id}"),
            ("sum", "1"),
            ("seq", "0"),
        ):
            frame.headers.add(key=key, value=value)
        frame.payload = json.dumps(payload).encode("utf-8")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._ws_acks[message_id] = future
        await self._ws.send_bytes(frame.SerializeToString())
        ack = await future
        if isinstance(ack.get("data"), str):
            ack["data"] = json.loads(base64.b64decode(ack["data"]))
        return ack


def _cells(rows: list[Any], corner: str) -> list[Any]:
    """The rows and columns of ``rows`` an A1 range (``B2:C3``, or one cell) names."""
    ends = []
    for cell in corner.split(":"):
        letters = cell.rstrip("0123456789")
        column = 0
        for letter in letters:
            column = column * 26 + ord(letter) - ord("A") + 1
        ends.append((int(cell[len(letters):]) - 1, column - 1))
    (top, left), (bottom, right) = ends[0], ends[-1]
    return [list(row)[left : right + 1] for row in rows[top : bottom + 1]]
