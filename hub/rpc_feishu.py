"""Hub RPC methods an Agent's Feishu tools call: reading and searching Feishu as the person its
turn is for (``hub.feishu_docs`` decides who; the bot's reader does the reading)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pydantic import Field

from hub.feishu_docs import (
    DEFAULT_SEARCH_RESULTS,
    MAX_SEARCH_RESULTS,
    acting_person,
    read_page,
    reader_of,
)
from hub.rpc import Call, Method, Methods, Params, text_field


class ReadParams(Params):
    # A Feishu document URL or a bare document token.
    document: str = text_field(2048)
    # A bare token's kind; a URL says its own.
    kind: str | None = text_field(16, None)
    offset: int = Field(0, ge=0, description="a non-negative integer (a next_offset)")


async def feishu_read(call: Call, params: ReadParams) -> dict[str, Any]:
    reader = reader_of(call.hub.feishu_docs)
    person = acting_person(call.actor, call.hub.state, call.hub.executions)
    document = await reader.read(person, params.document.strip(), params.kind)
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


FEISHU_METHODS: Methods = MappingProxyType(
    {
        "feishu.read": Method(ReadParams, feishu_read),
        "feishu.search": Method(FeishuSearchParams, feishu_search),
    }
)
