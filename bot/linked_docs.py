"""Feishu documents linked in a message, read as the person who sent it and given to the Agent
as context.

A docx, wiki, sheet or bitable link is read with the sender's own user access token
(``bot.feishu_accounts``), never the bot's tenant token nor anyone else's: what reaches the
prompt is only what the sender could open themselves. Each is converted to Markdown, bounded
per link and per turn, and goes inside the untrusted fence (``bot.topic_context.with_context``)
with its title, URL and revision. A document longer than the per-link bound is saved whole as a
file in the conversation's working directory (``keep``: ``inbox/<message>/feishu/``), and the
fence holds only its beginning and the file's path, so the Agent reads the rest when it needs
it. A link that cannot be read as the sender (not connected, no access, a kind not read) gets
one line on the turn's card saying which and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bot import feishu_docx
from cards.catalogue import text as catalogue_text
from cards.models import Lang

logger = logging.getLogger("amux.bot")

# Feishu's and Lark's document hosts (a tenant's own subdomain of one of them).
LINK = re.compile(
    r"https://[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?:feishu\.cn|larksuite\.com|larkoffice\.com)"
    r"/(docx|wiki|sheets|base)/([A-Za-z0-9]{8,64})"
)
# More links than this in one message are left out, each told.
MAX_LINKS = 5
# The rows and columns of a sheet read: its first sheet's top-left corner.
SHEET_RANGE = "A1:Z200"
# The records of a bitable read: its first table's first page.
BITABLE_ROWS = 200
# A docx's blocks are listed this many to a page, and at most this many pages are read: a
# document longer than that gives what was read (it is far past the prompt's bound anyway).
DOCX_BLOCK_PAGE = 500
DOCX_BLOCK_PAGES = 20
# A document saved as a file shows this much of its beginning in the prompt.
HEAD_BYTES = 2048
# Each request, from connecting to the last byte of its answer.
_TIMEOUT_SECONDS = 20.0
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")

# Saves a long document's whole Markdown under a file name; the path the Agent opens it by
# (relative to its working directory), None when it could not be saved.
Keep = Callable[[str, str], Awaitable[str | None]]


@dataclass(frozen=True)
class LinkedDocument:
    """One document as the Agent sees it: ``markdown`` is the sender's view, cut to the bound
    (``truncated`` then says so)."""

    url: str
    kind: str
    title: str
    revision: str
    markdown: str
    truncated: bool = False
    # Where the whole document was saved, when ``markdown`` is only its beginning.
    file: str | None = None

    def line(self) -> dict[str, object]:
        line: dict[str, object] = {
            "document": self.kind,
            "title": self.title,
            "url": self.url,
            "revision": self.revision,
            "text": self.markdown,
        }
        if self.truncated:
            line["truncated"] = True
        if self.file is not None:
            line["file"] = self.file
        return line


@dataclass(frozen=True)
class Linked:
    """What a message's links gave: the documents read, and one line per link that was not."""

    documents: tuple[LinkedDocument, ...] = ()
    unread: tuple[str, ...] = ()


class Unreadable(Exception):
    """Feishu would not give this document to the sender (``reason`` says why, for the card)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def links_in(text: str) -> list[tuple[str, str, str]]:
    """(url, kind, token) of each distinct document link in ``text``, in order."""
    found: dict[str, tuple[str, str, str]] = {}
    for match in LINK.finditer(text):
        found.setdefault(match.group(2), (match.group(0), match.group(1), match.group(2)))
    return list(found.values())


class LinkedDocs:
    """Reads the documents a message links, as its sender."""

    def __init__(
        self,
        access_token: Callable[[str], Awaitable[str | None]],
        domain: str,
        lang: Lang,
        *,
        link_bytes: int,
        turn_bytes: int,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """``http`` is the process's pooled Feishu session; without one each read opens its own."""
        self._access_token = access_token
        self._http = http
        self._domain = domain.rstrip("/")
        self._lang = lang
        self._link_bytes = link_bytes
        self._turn_bytes = turn_bytes

    async def read(self, text: str, principal_id: str, keep: Keep | None = None) -> Linked:
        """The documents ``text`` links, read as ``principal_id``; one longer than its bound is
        handed to ``keep`` whole when there is one, and only its beginning is shown."""
        links = links_in(text)
        if not links:
            return Linked()
        token = await self._access_token(principal_id)
        if token is None:
            # Never the bot's token, never anyone else's: without the sender's, nothing is read.
            urls = ", ".join(url for url, _, _ in links)
            return Linked(unread=(catalogue_text(self._lang, "document.not_connected", urls=urls),))
        documents: list[LinkedDocument] = []
        unread: list[str] = []
        left = self._turn_bytes
        async with session(self._http) as http:
            reader = Reader(http, self._domain, token)
            for index, (url, kind, doc_token) in enumerate(links):
                if index >= MAX_LINKS or left <= 0:
                    unread.append(catalogue_text(self._lang, "document.over_bound", url=url))
                    continue
                try:
                    title, revision, markdown = await reader.read(kind, doc_token)
                except Unreadable as refused:
                    logger.info("a linked %s could not be read as its sender: %s", kind, refused)
                    unread.append(
                        catalogue_text(
                            self._lang, "document.unreadable", url=url, reason=refused.reason
                        )
                    )
                    continue
                bound = min(self._link_bytes, left)
                saved = None
                if keep is not None and len(markdown.encode()) > bound:
                    saved = await keep(_file_name(title, doc_token), markdown)
                shown = bound if saved is None else min(HEAD_BYTES, bound)
                kept, truncated = _cut(markdown, shown)
                left -= len(kept.encode())
                documents.append(
                    LinkedDocument(url, kind, title, revision, kept, truncated, file=saved)
                )
        return Linked(tuple(documents), tuple(unread))



@contextlib.asynccontextmanager
async def session(shared: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    """``shared`` (the bot's pooled connections to Feishu), else a session of its own for the
    duration."""
    if shared is not None:
        yield shared
        return
    async with httpx.AsyncClient(timeout=None, follow_redirects=True) as http:
        yield http


class Reader:
    """Reads Feishu with one person's user access token; shared by linked documents and the
    Agent's Feishu tools (``bot.feishu_docs``)."""

    def __init__(self, http: httpx.AsyncClient, domain: str, token: str) -> None:
        self._http = http
        self._domain = domain
        self._headers = {"Authorization": f"Bearer {token}"}

    async def _get(self, path: str, **query: str) -> dict[str, Any]:
        return await self._call("GET", path, None, query)

    async def post(self, path: str, body: dict[str, Any], **query: str) -> dict[str, Any]:
        """Like ``_get``, for Feishu's calls that take a JSON body."""
        return await self._call("POST", path, body, query)

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, query: dict[str, str]
    ) -> dict[str, Any]:
        """Feishu's ``data`` of one call; Unreadable for anything short of code 0."""
        try:
            async with asyncio.timeout(_TIMEOUT_SECONDS):
                response = await self._http.request(
                    method, self._domain + path, params=query, json=body, headers=self._headers
                )
            answer = response.json()
        except (httpx.HTTPError, TimeoutError, ValueError) as error:
            raise Unreadable(f"Feishu did not answer: {type(error).__name__}") from None
        if not isinstance(answer, dict):
            raise Unreadable("Feishu answered nothing readable")
        code = answer.get("code")
        if code != 0:
            raise Unreadable(f"Feishu code {code}: {str(answer.get('msg') or '')[:120]}")
        data = answer.get("data")
        return data if isinstance(data, dict) else {}

    async def read(self, kind: str, token: str, cells: str | None = None) -> tuple[str, str, str]:
        """(title, revision, Markdown) of one document; ``cells`` chooses a sheet's range."""
        if kind == "wiki":
            node = (await self._get("/open-apis/wiki/v2/spaces/get_node", token=token)).get(
                "node"
            ) or {}
            obj_type, obj_token = str(node.get("obj_type") or ""), str(node.get("obj_token") or "")
            if obj_type == "docx":
                return await self._docx(obj_token)
            if obj_type == "sheet":
                return await self._sheet(obj_token, cells)
            if cells is not None:
                raise Unreadable("a range is read only from a sheet")
            raise Unreadable(f"a wiki page of kind {obj_type or 'unknown'} is not read")
        if kind == "docx":
            return await self._docx(token)
        if kind == "sheets":
            return await self._sheet(token, cells)
        return await self._bitable(token)

    async def _docx(self, token: str) -> tuple[str, str, str]:
        document = (await self._get(f"/open-apis/docx/v1/documents/{token}")).get("document") or {}
        return (
            str(document.get("title") or ""),
            str(document.get("revision_id") or ""),
            await self._docx_markdown(token),
        )

    async def _docx_markdown(self, token: str) -> str:
        """The docx as Markdown from its blocks; its plain text when they cannot be listed."""
        try:
            shown = feishu_docx.markdown(await self._docx_blocks(token))
        except Unreadable as refused:
            logger.info("a linked docx's blocks could not be read, its text is: %s", refused)
            shown = ""
        if shown:
            return shown
        raw = await self._get(f"/open-apis/docx/v1/documents/{token}/raw_content")
        return str(raw.get("content") or "")

    async def _docx_blocks(self, token: str) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        query = {"page_size": str(DOCX_BLOCK_PAGE), "document_revision_id": "-1"}
        for _ in range(DOCX_BLOCK_PAGES):
            page = await self._get(f"/open-apis/docx/v1/documents/{token}/blocks", **query)
            items = page.get("items")
            blocks += [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []
            following = str(page.get("page_token") or "")
            if not page.get("has_more") or not following:
                break
            query["page_token"] = following
        return blocks

    async def _bitable(self, token: str) -> tuple[str, str, str]:
        """A bitable's first table, its records as rows (the first page of them)."""
        base = f"/open-apis/bitable/v1/apps/{token}"
        app = (await self._get(base)).get("app") or {}
        tables = (await self._get(f"{base}/tables")).get("items") or []
        title, revision = str(app.get("name") or ""), str(app.get("revision") or "")
        if not tables:
            return title, revision, ""
        table = str(tables[0].get("table_id") or "")
        records = await self._get(f"{base}/tables/{table}/records", page_size=str(BITABLE_ROWS))
        items = [i.get("fields") or {} for i in records.get("items") or [] if isinstance(i, dict)]
        columns: list[str] = []
        for fields in items:
            columns += [name for name in fields if name not in columns]
        rows = [columns, *([_field(fields.get(name)) for name in columns] for fields in items)]
        return title, revision, _table(rows) if columns else ""

    async def _sheet(self, token: str, cells: str | None = None) -> tuple[str, str, str]:
        """A sheet's values as a table: ``cells`` (``A1:D50`` of its first sheet, or
        ``<sheet id>!A1:D50``), else its first sheet's ``SHEET_RANGE``."""
        base = f"/open-apis/sheets/v3/spreadsheets/{token}"
        sheet = (await self._get(base)).get("spreadsheet") or {}
        named, _, corner = (cells or SHEET_RANGE).rpartition("!")
        if not named:
            sheets = (await self._get(f"{base}/sheets/query")).get("sheets") or []
            if not sheets:
                return str(sheet.get("title") or ""), "", ""
            named = str(sheets[0].get("sheet_id") or "")
        values = await self._get(
            f"/open-apis/sheets/v2/spreadsheets/{token}/values/{named}!{corner}"
        )
        value_range = values.get("valueRange") or {}
        rows = value_range.get("values") or []
        revision = str(values.get("revision") or value_range.get("revision") or "")
        return str(sheet.get("title") or ""), revision, _table(rows)


def _field(value: object) -> str:
    """A bitable field as text: rich text and options are lists of pieces."""
    if isinstance(value, list):
        return " ".join(_field(piece) for piece in value)
    if isinstance(value, dict):
        return str(value.get("text") or value.get("name") or value.get("link") or "")
    return "" if value is None else str(value)


def _cell(value: object) -> str:
    if value is None:
        return ""
    shown = value if isinstance(value, str) else str(value)
    return " ".join(shown.split()).replace("|", "\\|")


def _table(rows: list[Any]) -> str:
    """A sheet's rows as a Markdown table, the first row its header."""
    kept = [[_cell(v) for v in row] for row in rows if isinstance(row, list)]
    if not kept:
        return ""
    width = max(len(row) for row in kept)
    kept = [row + [""] * (width - len(row)) for row in kept]
    lines = ["| " + " | ".join(kept[0]) + " |", "|" + " --- |" * width]
    lines += ["| " + " | ".join(row) + " |" for row in kept[1:]]
    return "\n".join(lines)


def _file_name(title: str, token: str) -> str:
    """A file name for a saved document: its title's safe characters, then its token (two
    documents of one title stay apart)."""
    slug = _UNSAFE_NAME.sub("-", title).strip(".-")[:60].strip(".-")
    safe_token = _UNSAFE_NAME.sub("", token)[:64] or "document"
    return f"{slug}-{safe_token}.md" if slug else f"{safe_token}.md"


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """``text`` to at most ``limit`` UTF-8 bytes, whole characters only; whether it was cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text, False
    return raw[:limit].decode(errors="ignore"), True
