"""Hub RPC methods an Agent's Feishu tools call: reading and searching Feishu as the person its
turn is for (``hub.feishu_docs`` decides who; the bot's reader does the reading)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pydantic import Field

from hub.contract import DENY, Approval, Execution
from hub.errors import Conflict, Forbidden, InvalidArgument
from hub.feishu_docs import (
    DEFAULT_SEARCH_RESULTS,
    MAX_SEARCH_RESULTS,
    SHEET_RANGE_PATTERN,
    acting_person,
    acting_turn,
    read_page,
    reader_of,
)
from hub.rpc import Call, Method, Methods, Params, text_field
from hub.services import Hub


class ReadParams(Params):
    # A Feishu document URL or a bare document token.
    document: str = text_field(2048)
    # A bare token's kind; a URL says its own.
    kind: str | None = text_field(16, None)
    offset: int = Field(0, ge=0, description="a non-negative integer (a next_offset)")
    # A sheet's cells: ``A1:D50`` on its first sheet, or ``<sheet id>!A1:D50``.
    range: str | None = Field(
        None,
        pattern=SHEET_RANGE_PATTERN,
        description="a sheet range such as A1:D50 or <sheet id>!A1:D50",
    )


async def feishu_read(call: Call, params: ReadParams) -> dict[str, Any]:
    reader = reader_of(call.hub.feishu_docs)
    person = acting_person(call.actor, call.hub.state, call.hub.executions)
    document = await reader.read(person, params.document.strip(), params.kind, params.range)
    return read_page(document, params.offset)


class FeishuSearchParams(Params):
    query: str = Field(min_length=1, max_length=200, description="1 to 200 characters")
    limit: int = Field(
        DEFAULT_SEARCH_RESULTS,
        ge=1,
        le=MAX_SEARCH_RESULTS,
        description=f"an integer from 1 to {MAX_SEARCH_RESULTS}",
    )


async def feishu_search(call: Call, params: FeishuSearchParams) -> dict[str, Any]:
    reader = reader_of(call.hub.feishu_docs)
    person = acting_person(call.actor, call.hub.state, call.hub.executions)
    hits = await reader.search(person, params.query, params.limit)
    return {"results": [hit.to_wire() for hit in hits[: params.limit]]}


# -- writing ------------------------------------------------------------------------------------

COMMENT_TOOL = "feishu_comment"
MAX_COMMENT_CHARS = 4000
# One call's wait for a person's answer; the Agent's tool asks again with the request's id.
MAX_DECISION_WAIT = 8.0


class CommentParams(Params):
    document: str = text_field(2048)
    text: str = Field(
        min_length=1,
        max_length=MAX_COMMENT_CHARS,
        description=f"1 to {MAX_COMMENT_CHARS} characters",
    )
    # The permission request an earlier call made for this very comment, still awaited.
    request_id: str | None = text_field(64, None)
    wait_seconds: float = Field(
        0.0, ge=0, le=MAX_DECISION_WAIT, allow_inf_nan=False, description="0 to 8 seconds"
    )


def turn_policy(hub: Hub, turn: Execution) -> str:
    """The permission policy ``turn`` runs under: its project's own, else the Hub's."""
    session = hub.executions.session(turn.session_id)
    project = hub.projects.find(session.project) if session.project else None
    return (project.permissions if project is not None else None) or hub.config.permissions


async def _allowed(hub: Hub, turn: Execution, params: CommentParams) -> Approval:
    """The person's answer to this comment, asked as any edit of the turn is (a card with the
    exact text under ``ask``); still pending after the call's wait."""
    row = hub.executions.db.execute(
        "SELECT worker_id FROM executions WHERE id = ?", (turn.id,)
    ).fetchone()
    worker = row["worker_id"] if row is not None else None
    if not worker:
        raise Conflict("this turn is not running on a worker; nobody can be asked")
    subject = f"comment on {params.document.strip()}"
    if params.request_id is None:
        approval = await hub.approvals.ask(
            turn.id, worker, tool=COMMENT_TOOL, action="tool", subject=subject, detail=params.text
        )
    else:
        approval = hub.approvals.get(turn.id, params.request_id)
        # The answer holds for what the person was shown, word for word, and nothing else.
        if (approval.tool, approval.subject, approval.detail) != (
            COMMENT_TOOL,
            subject,
            params.text,
        ):
            raise InvalidArgument("request_id was asked for another comment; ask anew")
    if approval.pending:
        approval = await hub.approvals.decision(
            turn.id, worker, approval.request_id, params.wait_seconds
        )
    return approval


async def feishu_comment(call: Call, params: CommentParams) -> dict[str, Any]:
    """Add a comment to a docx as the person the turn is for, once the permission policy lets
    it: under ``ask`` only after that person (or the owner) allows it on the turn's card."""
    hub = call.hub
    reader = reader_of(hub.feishu_docs)
    person, turn = acting_turn(call.actor, hub.state, hub.executions)
    request_id = None
    if turn is not None:
        policy = turn_policy(hub, turn)
        if policy == "read-only":
            raise Forbidden("this turn runs read-only: it may not comment in Feishu")
        if policy != "auto":
            approval = await _allowed(hub, turn, params)
            if approval.pending:
                return {"pending": True, "request_id": approval.request_id}
            if approval.decision == DENY:
                reason = approval.reason or "denied"
                raise Forbidden(f"the comment was not allowed: {reason}")
            if approval.decided_by != person:
                # The owner may answer anyone's requests, but words go out in this person's name
                # only on their own say-so.
                raise Forbidden(
                    "only the person a comment is made as may allow it; nothing was added"
                )
            request_id = approval.request_id
            if request_id in hub.feishu_comments_made:
                raise Conflict("this comment was already added; ask anew for another")
            hub.feishu_comments_made.add(request_id)
    answer = await reader.comment(person, params.document.strip(), params.text)
    return {"commented": True, "request_id": request_id, **answer}


FEISHU_METHODS: Methods = MappingProxyType(
    {
        "feishu.read": Method(ReadParams, feishu_read),
        "feishu.search": Method(FeishuSearchParams, feishu_search),
        "feishu.comment": Method(CommentParams, feishu_comment),
    }
)
