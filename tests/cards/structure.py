"""Structural checks every card must pass, shared by the card tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cards import actions
from cards.elements import CARD_MAX_BYTES, encoded_size

INTERACTIVE = {"button", "checker", "select_static", "overflow", "date_picker"}


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every element (dict with a ``tag``) anywhere inside ``node``."""
    if isinstance(node, dict):
        if "tag" in node:
            yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def callbacks(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The callback values of every interactive element, in order."""
    return [el["behaviors"][0]["value"] for el in walk(card) if el["tag"] in INTERACTIVE]


def tags(card: dict[str, Any]) -> list[str]:
    return [el["tag"] for el in walk(card)]


def all_text(card: dict[str, Any]) -> str:
    parts: list[str] = []
    for el in walk(card):
        for key in ("content",):
            if isinstance(el.get(key), str):
                parts.append(el[key])
    return "\n".join(parts)


def assert_valid_card(card: dict[str, Any]) -> None:
    assert card["schema"] == "2.0"
    assert card["config"]["update_multi"] is True
    assert card["header"]["title"]["content"]
    assert isinstance(card["body"]["elements"], list) and card["body"]["elements"]
    assert encoded_size(card) <= CARD_MAX_BYTES
    for el in walk(card):
        if el["tag"] in INTERACTIVE:
            behaviors = el.get("behaviors")
            assert behaviors and behaviors[0]["type"] == "callback", el
            assert behaviors[0]["value"]["action"] in actions.ALL, el
        if el["tag"] == "form":
            submits = [e for e in walk(el["elements"]) if e.get("form_action_type") == "submit"]
            assert len(submits) == 1, el
            assert el["name"]
            for field in walk(el["elements"]):
                if field["tag"] == "input":
                    assert field["name"]
