"""Card JSON 2.0 building blocks shared by every builder."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from cards.actions import callback

Element = dict[str, Any]
Card = dict[str, Any]

# Feishu rejects a card whose JSON exceeds 30 KB; leave room for the message envelope.
CARD_MAX_BYTES = 28_000
_MENTION_TAG = re.compile(r"<(?=at)", re.IGNORECASE)

Template = Literal["blue", "wathet", "turquoise", "green", "yellow", "orange", "red", "grey"]
ButtonType = Literal["default", "primary", "danger", "primary_filled", "danger_filled"]

_MARKDOWN_ENTITIES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "*": "&#42;",
    "_": "&#95;",
    "~": "&#126;",
    "[": "&#91;",
    "]": "&#93;",
    "`": "&#96;",
}


def escape(value: str) -> str:
    """``value`` as literal text inside card markdown (names, paths and queries are not markup)."""
    return "".join(_MARKDOWN_ENTITIES.get(ch, ch) for ch in value)


def code(value: str) -> str:
    """``value`` as inline code; backticks cannot be escaped inside it, so they become quotes."""
    return value.replace("`", "'").replace("\n", " ")


def defuse_mentions(markdown_text: str) -> str:
    """Neutralise ``<at ...>`` tags, in any letter case (tag names are not case-sensitive), so
    Agent output or stored text can never mention anyone."""
    return _MENTION_TAG.sub("&lt;", markdown_text)


def card(title: str, template: Template, elements: list[Element], subtitle: str = "") -> Card:
    """A complete JSON 2.0 card; ``update_multi`` lets every viewer see in-place updates."""
    header: dict[str, Any] = {
        "title": {"tag": "plain_text", "content": title},
        "template": template,
    }
    if subtitle:
        header["subtitle"] = {"tag": "plain_text", "content": subtitle}
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "header": header,
        "body": {"elements": elements},
    }


def markdown(content: str) -> Element:
    return {"tag": "markdown", "content": content}


def plain(content: str) -> Element:
    """Text shown verbatim: no markdown, no mentions."""
    return {"tag": "div", "text": {"tag": "plain_text", "content": content}}


def hr() -> Element:
    return {"tag": "hr"}


def button(
    label: str, action: str, kind: ButtonType = "default", name: str = "", **fields: Any
) -> Element:
    element: Element = {
        "tag": "button",
        "text": {"tag": "plain_text", "content": label},
        "type": kind,
        "behaviors": callback(action, **fields),
    }
    if name:
        element["name"] = name
    return element


def checker(name: str, label: str, checked: bool, action: str, **fields: Any) -> Element:
    """A switch-like checker; without a callback behaviour Feishu would only toggle it locally."""
    return {
        "tag": "checker",
        "name": name,
        "checked": checked,
        "text": {"tag": "plain_text", "content": label},
        "behaviors": callback(action, **fields),
    }


def row(*elements: Element) -> Element:
    """Elements side by side (buttons in one line)."""
    return {
        "tag": "column_set",
        "flex_mode": "flow",
        "columns": [
            {"tag": "column", "width": "auto", "elements": [element]} for element in elements
        ],
    }


def select(name: str, placeholder: str, options: list[tuple[str, str]]) -> Element:
    """A drop-down of ``(label, value)`` options; inside a form Feishu returns the chosen value
    as ``form_value[name]``."""
    return {
        "tag": "select_static",
        "name": name,
        "placeholder": {"tag": "plain_text", "content": placeholder},
        "options": [
            {"text": {"tag": "plain_text", "content": label}, "value": value}
            for label, value in options
        ],
    }


def form(name: str, elements: list[Element], submit: Element) -> Element:
    """``elements`` with ``submit`` (a button) sending their values along with its own value."""
    sending = {**submit, "name": f"{name}_submit", "form_action_type": "submit"}
    return {"tag": "form", "name": name, "elements": [*elements, sending]}


def search_form(
    name: str, input_name: str, placeholder: str, submit_label: str, action: str
) -> Element:
    """A one-line form; Feishu returns the input as ``form_value[input_name]``."""
    submit = button(submit_label, action, kind="primary", name=f"{name}_submit")
    submit["form_action_type"] = "submit"
    return {
        "tag": "form",
        "name": name,
        "elements": [
            {
                "tag": "input",
                "name": input_name,
                "placeholder": {"tag": "plain_text", "content": placeholder},
                "max_length": 512,
            },
            submit,
        ],
    }


def encoded_size(value: Any) -> int:
    """Bytes of ``value`` as the JSON Feishu receives (UTF-8, not ASCII-escaped)."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
