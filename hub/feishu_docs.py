"""Feishu documents an Agent reads through amux's tools, always as the person its turn is for.

The Hub holds no Feishu client and no Feishu credential of its own. When a Feishu app runs beside
it, the bot supplies a ``FeishuDocsReader`` (``Hub.feishu_docs``) that reads with one person's own
user access token, refreshed as needed; without one every call answers ``feishu_unavailable``.
The Agent presents only its turn's delegated credential: ``acting_person`` decides from the
Hub's own records whose Feishu account that credential may read as, and nothing the Agent sends
can name anyone else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hub.contract import Execution
from hub.errors import FeishuUnavailable, Forbidden, NotFound
from hub.executions import Executions
from hub.identity import Actor
from hub.state import State

# The RPC methods the Feishu tools call (``hub.rpc_feishu``), as ``system.capabilities`` lists them.
METHODS = ("feishu.read", "feishu.search", "feishu.comment")
# One read's text; a longer document continues from ``next_offset``.
READ_CHARS = 24_000
MAX_SEARCH_RESULTS = 20
DEFAULT_SEARCH_RESULTS = 10
# What a person who has not connected is told to do, wherever they meet it.
CONNECT_ADVICE = (
    "send /amux connect in your private chat with the amux bot to connect your own Feishu "
    "account, then ask again"
)


@dataclass(frozen=True)
class FeishuDocument:
    """One document as the person it was read as sees it, converted to Markdown."""

    kind: str
    token: str
    title: str
    revision: str
    text: str
    url: str = ""


@dataclass(frozen=True)
class FeishuHit:
    """One search result: enough to read it with ``feishu.read`` (its kind and token)."""

    kind: str
    token: str
    title: str
    url: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "token": self.token, "title": self.title, "url": self.url}


# A sheet's cells as Feishu's values API names them: an optional sheet id, then A1 notation.
_CELL = r"[A-Z]{1,3}[1-9][0-9]{0,6}"
SHEET_RANGE_PATTERN = rf"^(?:[A-Za-z0-9]{{1,32}}!)?{_CELL}(?::{_CELL})?$"


class FeishuDocsReader(Protocol):
    """Reads Feishu as one person, with that person's own user token.

    Each method raises ``FeishuNotConnected`` for a person without a usable token,
    ``FeishuRefused`` for what Feishu will not give them, ``InvalidArgument`` for a document
    reference it cannot parse and ``FeishuUnavailable`` when Feishu does not answer.
    """

    async def read(
        self, principal_id: str, document: str, kind: str | None, cells: str | None = None
    ) -> FeishuDocument:
        """``document`` is a Feishu document URL or a bare token (of ``kind``; docx if None);
        ``cells``, a sheet's range (``A1:D50``, or ``<sheet id>!A1:D50``) read instead of its
        first sheet's top-left corner."""
        ...

    async def search(self, principal_id: str, query: str, limit: int) -> list[FeishuHit]: ...

    async def comment(self, principal_id: str, document: str, text: str) -> dict[str, Any]:
        """Add ``text`` as a new comment on the docx ``document`` (a URL or token); what Feishu
        answered of it (its ``comment_id``)."""
        ...


def acting_person(actor: Actor, state: State, executions: Executions) -> str:
    """The Principal id whose Feishu account a call with ``actor``'s credential reads as (see
    ``acting_turn``)."""
    return acting_turn(actor, state, executions)[0]


def acting_turn(actor: Actor, state: State, executions: Executions) -> tuple[str, Execution | None]:
    """Whose Feishu account a call with ``actor``'s credential acts as, and the running turn its
    credential was issued for (None for a person's own credential).

    A person's own credential acts as them. A turn's delegated credential acts as the person
    the turn runs for (in a project group, whose turns run as the project, the person who sent
    it), and only while that turn runs: a credential left behind in a shared workspace must not
    let a later turn read as someone else.

    Raises:
        Forbidden: a service credential, or a delegated credential of no running turn.
    """
    principal = actor.principal
    if not actor.delegated:
        if principal.kind != "user":
            raise Forbidden("Feishu tools read as a person; a service credential has no account")
        return principal.id, None
    launch = state.credential_launch(actor.credential.id)
    if launch is None or launch[1] is None:
        raise Forbidden("this Agent credential was not issued for a turn; Feishu tools need one")
    try:
        execution = executions.describe(launch[1])
    except NotFound:
        raise Forbidden("the turn this Agent credential was issued for is gone") from None
    if execution.finished:
        raise Forbidden("the turn this Agent credential was issued for has ended")
    if principal.kind == "user":
        return principal.id, execution
    sender = state.principal(execution.submitted_by) if execution.submitted_by else None
    if sender is None or sender.kind != "user":
        raise Forbidden("this turn was not sent by a person; Feishu tools read as one")
    return sender.id, execution


def reader_of(reader: FeishuDocsReader | None) -> FeishuDocsReader:
    """Raises: FeishuUnavailable: no Feishu app runs beside this Hub."""
    if reader is None:
        raise FeishuUnavailable(
            "Feishu documents are unavailable: no Feishu app runs beside this amux Hub"
        )
    return reader


def read_page(document: FeishuDocument, offset: int) -> dict[str, Any]:
    """The part of ``document``'s text from ``offset`` (in characters) a read answers."""
    text = document.text[offset : offset + READ_CHARS]
    end = offset + len(text)
    return {
        "kind": document.kind,
        "token": document.token,
        "title": document.title,
        "revision": document.revision,
        "url": document.url,
        "text": text,
        "offset": offset,
        "next_offset": end if end < len(document.text) else None,
        "total_chars": len(document.text),
    }
