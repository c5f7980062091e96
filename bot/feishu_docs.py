"""The Hub's ``FeishuDocsReader`` (``hub.feishu_docs``): Feishu read and searched as one person,
with their own user access token (``bot.feishu_accounts``), for the Agent's Feishu tools.

Reading goes through the reader linked documents use (``bot.linked_docs.Reader``), so a document
reads the same whether its link was in a message or the Agent asked for it. Searching is
Feishu's document search, which answers only what that person may open. The token stays in this
process: the Agent gets the Markdown, never the token.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from bot.linked_docs import Reader, Unreadable, links_in, session
from hub.errors import FeishuNotConnected, FeishuRefused, InvalidArgument
from hub.feishu_docs import CONNECT_ADVICE, FeishuDocument, FeishuHit

logger = logging.getLogger("amux.bot")

SEARCH_PATH = "/open-apis/suite/docs-api/search/object"
# A bare token's kind as the Agent may name it (search results say ``sheet`` and ``bitable``,
# links say ``sheets`` and ``base``) -> the kind ``Reader.read`` takes.
KINDS = {
    # Feishu's search says ``doc`` for every document, new ones (docx) included.
    "doc": "docx",
    "docx": "docx",
    "wiki": "wiki",
    "sheet": "sheets",
    "sheets": "sheets",
    "bitable": "base",
    "base": "base",
}
# What the Agent is shown as a document's kind.
SHOWN = {"docx": "docx", "wiki": "wiki", "sheets": "sheet", "base": "bitable"}
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def target(document: str, kind: str | None) -> tuple[str, str, str]:
    """(url, reader kind, token) that ``document`` (a document URL or a bare token) names.

    Raises: InvalidArgument: neither a Feishu document URL nor a token of a kind read.
    """
    links = links_in(document)
    if links:
        return links[0]
    if "/" in document or not 8 <= len(document) <= 64 or not set(document) <= _TOKEN_CHARS:
        raise InvalidArgument(
            "document must be a Feishu document URL (docx, wiki, sheets or base) "
            "or a document token"
        )
    chosen = KINDS.get((kind or "docx").lower())
    if chosen is None:
        raise InvalidArgument(f"kind must be one of {', '.join(sorted(KINDS))}")
    return "", chosen, document


class FeishuDocs:
    """Reads and searches Feishu as the person named by each call."""

    def __init__(
        self,
        access_token: Callable[[str], Awaitable[str | None]],
        domain: str,
        *,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._access_token = access_token
        self._domain = domain.rstrip("/")
        self._http = http

    async def _token(self, principal_id: str) -> str:
        token = await self._access_token(principal_id)
        if token is None:
            # Never the bot's token, never anyone else's: without theirs, nothing is read.
            raise FeishuNotConnected(
                "Feishu is read only as the person this turn is for, and their own Feishu "
                f"account is not connected: {CONNECT_ADVICE}"
            )
        return token

    async def read(
        self, principal_id: str, document: str, kind: str | None, cells: str | None = None
    ) -> FeishuDocument:
        url, reader_kind, doc_token = target(document, kind)
        if cells is not None and reader_kind not in ("sheets", "wiki"):
            raise InvalidArgument("a range is read only from a sheet")
        token = await self._token(principal_id)
        async with session(self._http) as http:
            try:
                title, revision, text = await Reader(http, self._domain, token).read(
                    reader_kind, doc_token, cells
                )
            except Unreadable as refused:
                logger.info("an Agent's Feishu read was refused: %s", refused.reason)
                raise FeishuRefused(
                    f"Feishu would not give you this document: {refused.reason}"
                ) from None
        return FeishuDocument(SHOWN[reader_kind], doc_token, title, revision, text, url)

    async def comment(self, principal_id: str, document: str, text: str) -> dict[str, Any]:
        url, reader_kind, doc_token = target(document, None)
        if reader_kind != "docx":
            raise InvalidArgument("comments are added to docx documents only")
        token = await self._token(principal_id)
        body = {
            "reply_list": {
                "replies": [
                    {"content": {"elements": [{"type": "text_run", "text_run": {"text": text}}]}}
                ]
            }
        }
        async with session(self._http) as http:
            try:
                made = await Reader(http, self._domain, token).post(
                    f"/open-apis/drive/v1/files/{doc_token}/comments", body, file_type="docx"
                )
            except Unreadable as refused:
                logger.info("an Agent's Feishu comment was refused: %s", refused.reason)
                raise FeishuRefused(
                    f"Feishu would not take your comment: {refused.reason}"
                ) from None
        return {"comment_id": str(made.get("comment_id") or "")}

    async def search(self, principal_id: str, query: str, limit: int) -> list[FeishuHit]:
        token = await self._token(principal_id)
        async with session(self._http) as http:
            try:
                found = await Reader(http, self._domain, token).post(
                    SEARCH_PATH, {"search_key": query, "count": limit, "offset": 0}
                )
            except Unreadable as refused:
                logger.info("an Agent's Feishu search was refused: %s", refused.reason)
                raise FeishuRefused(f"Feishu would not search for you: {refused.reason}") from None
        hits: list[FeishuHit] = []
        for entity in found.get("docs_entities") or []:
            if not isinstance(entity, dict) or not entity.get("docs_token"):
                continue
            hits.append(
                FeishuHit(
                    str(entity.get("docs_type") or ""),
                    str(entity["docs_token"]),
                    str(entity.get("title") or ""),
                )
            )
        return hits
