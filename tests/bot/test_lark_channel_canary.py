"""Canary: the SDK's message normalizers amux reads Feishu messages with are still where
``bot/feishu/sdk.py`` imports them from, with the same shape and behaviour.

``lark_oapi.channel`` is young and its authors mean to move it to a package of its own
(``lark_channel``); an upgrade that moves or changes it fails here, naming what changed, instead
of every message quietly arriving empty.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from typing import Any

import pytest

from bot.feishu import content

NORMALIZERS = "lark_oapi.channel"


def changed(what: str) -> str:
    return (
        f"lark-oapi changed the message normalizers amux relies on: {what}; "
        "see bot/feishu/sdk.py and bot/feishu/content.py"
    )


def module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        pytest.fail(changed(f"{name} cannot be imported ({error})"))


# Callables amux calls, and their parameters (name, kind, default).
SIGNATURES: dict[tuple[str, str], list[tuple[str, str, object]]] = {
    (NORMALIZERS, "parse_message_content"): [
        ("message_type", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("raw_content", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
    ],
    (NORMALIZERS, "flatten_content"): [
        ("content", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
    ],
    ("lark_oapi.channel.normalize.mentions", "extract_mentions"): [
        ("raw", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("bot_open_id", "POSITIONAL_OR_KEYWORD", None),
    ],
    ("lark_oapi.channel.normalize.mentions", "resolve_mentions"): [
        ("content", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("ext", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("strip_bot_mentions", "KEYWORD_ONLY", False),
        ("bot_open_id", "KEYWORD_ONLY", None),
    ],
    ("lark_oapi.channel.normalize.merge_forward", "MergeForwardExpander"): [
        ("fetch_message", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("resolve_names", "POSITIONAL_OR_KEYWORD", None),
        ("max_depth", "POSITIONAL_OR_KEYWORD", 3),
        ("max_items", "POSITIONAL_OR_KEYWORD", 50),
    ],
}

# Fields of the content types amux reads.
FIELDS = {
    "InteractiveContent": {"card", "card_version", "raw"},
    "MergeForwardContent": {"items", "truncated", "error", "loading", "raw"},
    "MergeForwardItem": {
        "message_id",
        "sender_open_id",
        "sender_name",
        "create_time",
        "content",
        "raw",
    },
}


@pytest.mark.parametrize(
    ("where", "parameters"), SIGNATURES.items(), ids=[name for _, name in SIGNATURES]
)
def test_the_normalizers_keep_their_signatures(
    where: tuple[str, str], parameters: list[tuple[str, str, object]]
) -> None:
    found = getattr(module(where[0]), where[1], None)
    assert found is not None, changed(f"{where[0]}.{where[1]} is gone")
    shape = [
        (p.name, p.kind.name, p.default)
        for p in inspect.signature(found).parameters.values()
        if p.name != "self"
    ]
    assert shape == parameters, changed(f"{where[1]} takes {shape}, not {parameters}")


def test_the_expander_expands_with_a_coroutine_taking_the_forwards_id() -> None:
    expander = module("lark_oapi.channel.normalize.merge_forward").MergeForwardExpander
    assert inspect.iscoroutinefunction(expander.expand), changed("expand is not a coroutine")
    found = list(inspect.signature(expander.expand).parameters)
    assert found[:2] == ["self", "message_id"], changed(f"expand takes {found}")


@pytest.mark.parametrize(("name", "fields"), FIELDS.items(), ids=list(FIELDS))
def test_the_content_types_keep_their_fields(name: str, fields: set[str]) -> None:
    kind = getattr(module(NORMALIZERS), name, None)
    assert kind is not None and dataclasses.is_dataclass(kind), changed(f"{name} is gone")
    found = {f.name for f in dataclasses.fields(kind)}
    assert fields <= found, changed(f"{name} lost {sorted(fields - found)}")


@pytest.mark.parametrize(
    ("message_type", "raw", "expected"),
    [
        ("share_chat", {"chat_id": "oc_1"}, '<group_card id="oc_1"/>'),
        ("share_user", {"user_id": "ou_1"}, '<contact_card id="ou_1"/>'),
        ("location", {"name": "HQ", "longitude": "1.5", "latitude": "2.5"}, "HQ"),
        ("todo", {"summary": {"title": "Ship", "content": []}}, "Ship"),
        ("share_calendar_event", {"summary": "Retro"}, "Retro"),
        ("text", {"text": "hi @_user_1"}, "hi @_user_1"),
        (
            "interactive",
            {"header": {"title": {"tag": "plain_text", "content": "Alert"}}, "body": {}},
            "Alert",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_the_normalizers_render_sample_payloads_as_before(
    message_type: str, raw: dict[str, Any], expected: str
) -> None:
    channel = module(NORMALIZERS)
    parsed = channel.parse_message_content(message_type, json.dumps(raw))
    text, _ = channel.flatten_content(parsed)
    assert expected in text, changed(f"{message_type} now reads {text!r}")


def test_mentions_resolve_to_names() -> None:
    mentions = module("lark_oapi.channel.normalize.mentions")
    raw = [{"key": "@_user_1", "id": {"open_id": "ou_c"}, "name": "Carol"}]
    said = mentions.resolve_mentions("ask @_user_1", mentions.extract_mentions(raw))
    assert said == "ask @Carol", changed(f"resolve_mentions now gives {said!r}")


async def test_a_forward_is_expanded_from_one_fetch_into_its_messages_in_order() -> None:
    expander_type = module("lark_oapi.channel.normalize.merge_forward").MergeForwardExpander
    channel = module(NORMALIZERS)

    def item(message_id: str, upper: str, sender: str, at: int, text: str) -> dict[str, Any]:
        return {
            "message_id": message_id,
            "upper_message_id": upper,
            "msg_type": "text",
            "create_time": str(at),
            "sender": {"id": sender, "id_type": "open_id", "sender_type": "user"},
            "body": {"content": json.dumps({"text": text})},
        }

    nested = {
        "message_id": "om_inner",
        "upper_message_id": "om_fwd",
        "msg_type": "merge_forward",
        "create_time": "3000",
        "sender": {"id": "ou_b", "id_type": "open_id", "sender_type": "user"},
        "body": {"content": json.dumps({"content": "Merged and Forwarded Message"})},
    }
    payload = {
        "data": {
            "items": [
                {"message_id": "om_fwd", "msg_type": "merge_forward", "create_time": "9000"},
                item("om_2", "om_fwd", "ou_b", 2000, "second"),
                item("om_1", "om_fwd", "ou_a", 1000, "first"),
                nested,
                item("om_3", "om_inner", "ou_a", 500, "inside"),
            ]
        }
    }
    fetched: list[str] = []

    async def fetch(message_id: str) -> dict[str, Any]:
        fetched.append(message_id)
        return payload

    async def names(open_ids: list[str]) -> dict[str, str]:
        return {"ou_a": "Alice", "ou_b": "Bob"}

    expanded = await expander_type(fetch, names).expand("om_fwd")
    assert fetched == ["om_fwd"], changed(f"a forward is fetched as {fetched}")
    got = [(i.message_id, i.sender_name, i.create_time) for i in expanded.items]
    assert got == [("om_1", "Alice", 1000), ("om_2", "Bob", 2000), ("om_inner", "Bob", 3000)], (
        changed(f"a forward expands to {got}")
    )
    assert isinstance(expanded.items[2].content, channel.MergeForwardContent)
    inner = content.forwarded_item_text(expanded.items[2])
    assert "Alice:" in inner and "inside" in inner, changed(f"a nested forward reads {inner!r}")
