"""A Feishu docx reaches the Agent as Markdown built from its blocks: the block JSON here is
shaped as ``GET /open-apis/docx/v1/documents/{id}/blocks`` answers it (``items``)."""

from __future__ import annotations

from typing import Any

from bot.feishu_docx import markdown

DOC = "doxcnDocument01"


def run(content: str, **style: Any) -> dict[str, Any]:
    """One ``text_run`` element, with its ``text_element_style``."""
    return {"text_run": {"content": content, "text_element_style": style}}


def block(
    block_id: str,
    kind: int,
    key: str,
    elements: list[dict[str, Any]] | None = None,
    *,
    children: list[str] | None = None,
    parent: str = DOC,
    style: dict[str, Any] | None = None,
) -> dict[str, Any]:
    shaped: dict[str, Any] = {"block_id": block_id, "block_type": kind, "parent_id": parent}
    if key:
        shaped[key] = {"elements": elements or [], "style": style or {}}
    if children:
        shaped["children"] = children
    return shaped


def page(*children: dict[str, Any], more: list[dict[str, Any]] | None = None) -> list[Any]:
    """The page block first, then its children, then any nested blocks (as Feishu lists them:
    every block of the document, the page first)."""
    root = {
        "block_id": DOC,
        "block_type": 1,
        "parent_id": "",
        "children": [c["block_id"] for c in children],
        "page": {"elements": [run("The title")], "style": {"align": 1}},
    }
    return [root, *children, *(more or [])]


def test_headings_keep_their_level() -> None:
    blocks = page(
        block("h1", 3, "heading1", [run("Plan")]),
        block("h2", 4, "heading2", [run("Dates")]),
        block("h9", 11, "heading9", [run("Deep")]),
    )
    # Markdown stops at six levels; Feishu's seventh to ninth stay headings at the sixth.
    assert markdown(blocks) == "# Plan\n\n## Dates\n\n###### Deep"


def test_text_keeps_inline_code_links_and_emphasis() -> None:
    blocks = page(
        block(
            "t1",
            2,
            "text",
            [
                run("Run "),
                run("make test", inline_code=True),
                run(" before "),
                run("merging", bold=True),
                run(", see "),
                run("the guide", link={"url": "https%3A%2F%2Fexample.com%2Fguide%3Fa%3D1"}),
                run(" and "),
                run("old", strikethrough=True, italic=True),
                run(" "),
                run("a `tick`", inline_code=True),
            ],
        )
    )
    assert markdown(blocks) == (
        "Run `make test` before **merging**, see [the guide](https://example.com/guide?a=1)"
        " and ~~*old*~~ `` a `tick` ``"
    )


def test_mentions_and_equations_keep_their_text() -> None:
    blocks = page(
        block(
            "t1",
            2,
            "text",
            [
                {"mention_user": {"user_id": "ou_x", "text_element_style": {}}},
                run(" wrote "),
                {
                    "mention_doc": {
                        "token": "doxcnOther",
                        "obj_type": 22,
                        "url": "https%3A%2F%2Facme.feishu.cn%2Fdocx%2FdoxcnOther",
                        "title": "Design",
                    }
                },
                run(": "),
                {"equation": {"content": "E=mc^2\n", "text_element_style": {}}},
            ],
        )
    )
    assert markdown(blocks) == (
        "@user wrote [Design](https://acme.feishu.cn/docx/doxcnOther): $E=mc^2$"
    )


def test_bullet_and_ordered_lists_nest_by_their_children() -> None:
    blocks = page(
        block("b1", 12, "bullet", [run("fruit")], children=["b1a", "b1b"]),
        block("b2", 12, "bullet", [run("bread")]),
        block("o1", 13, "ordered", [run("first")], style={"sequence": "1"}),
        block("o2", 13, "ordered", [run("second")], children=["o2a"], style={"sequence": "auto"}),
        more=[
            block("b1a", 12, "bullet", [run("apple")], parent="b1"),
            block("b1b", 13, "ordered", [run("pear")], parent="b1"),
            block("o2a", 2, "text", [run("details")], parent="o2"),
        ],
    )
    assert markdown(blocks) == (
        "- fruit\n  - apple\n  1. pear\n- bread\n1. first\n2. second\n   details"
    )


def test_an_ordered_list_starting_elsewhere_keeps_its_number() -> None:
    blocks = page(
        block("o1", 13, "ordered", [run("third")], style={"sequence": "3"}),
        block("o2", 13, "ordered", [run("fourth")], style={"sequence": "auto"}),
    )
    assert markdown(blocks) == "3. third\n4. fourth"


def test_code_blocks_keep_their_language_and_text_verbatim() -> None:
    source = "def f(x):\n    return x * 2  # **not bold**\n"
    blocks = page(
        block(
            "c1",
            14,
            "code",
            [run(source)],
            style={"language": 49, "wrap": False},
        ),
        block("c2", 14, "code", [run("```\nnested fence\n```")], style={"language": 1}),
    )
    assert markdown(blocks) == (
        "```python\ndef f(x):\n    return x * 2  # **not bold**\n```\n\n"
        "````\n```\nnested fence\n```\n````"
    )


def test_quotes_todos_dividers_and_callouts() -> None:
    blocks = page(
        block("q1", 15, "quote", [run("Ship it.\nThen rest.")]),
        block("d1", 22, "", []) | {"divider": {}},
        block("td1", 17, "todo", [run("write notes")], style={"done": True}),
        block("td2", 17, "todo", [run("review")], style={"done": False}),
        {
            "block_id": "qc",
            "block_type": 34,
            "parent_id": DOC,
            "children": ["qc1"],
            "quote_container": {},
        },
        {
            "block_id": "co",
            "block_type": 19,
            "parent_id": DOC,
            "children": ["co1"],
            "callout": {"background_color": 2, "emoji_id": "bulb"},
        },
        more=[
            block("qc1", 2, "text", [run("quoted paragraph")], parent="qc"),
            block("co1", 2, "text", [run("a tip")], parent="co"),
        ],
    )
    assert markdown(blocks) == (
        "> Ship it.\n> Then rest.\n\n---\n\n- [x] write notes\n- [ ] review\n\n"
        "> quoted paragraph\n\n> a tip"
    )


def test_a_table_becomes_a_markdown_table_from_its_cells() -> None:
    cells = ["c11", "c12", "c21", "c22", "c31", "c32"]
    texts = ["Item", "Cost", "servers", "120", "a | b", "two\nlines"]
    cell_blocks: list[dict[str, Any]] = []
    for cell, words in zip(cells, texts, strict=True):
        cell_blocks.append(
            {
                "block_id": cell,
                "block_type": 32,
                "parent_id": "tb",
                "children": [f"{cell}-t"],
                "table_cell": {},
            }
        )
        cell_blocks.append(block(f"{cell}-t", 2, "text", [run(words)], parent=cell))
    table = {
        "block_id": "tb",
        "block_type": 31,
        "parent_id": DOC,
        "children": cells,
        "table": {
            "cells": cells,
            "property": {"row_size": 3, "column_size": 2, "column_width": [100, 100]},
        },
    }
    assert markdown(page(table, more=cell_blocks)) == (
        "| Item | Cost |\n| --- | --- |\n| servers | 120 |\n| a \\| b | two<br>lines |"
    )


def test_unknown_kinds_give_their_text_and_images_and_files_are_named() -> None:
    blocks = page(
        # A kind Feishu may add: its elements still read.
        {
            "block_id": "x1",
            "block_type": 999,
            "parent_id": DOC,
            "shiny": {"elements": [run("new kind's words")], "style": {}},
        },
        {"block_id": "i1", "block_type": 27, "parent_id": DOC, "image": {"token": "boxcn1"}},
        {"block_id": "f1", "block_type": 23, "parent_id": DOC, "file": {"name": "spec.pdf"}},
        # Grids lay blocks side by side: their text still reads, in order.
        {
            "block_id": "g1",
            "block_type": 24,
            "parent_id": DOC,
            "children": ["gc1"],
            "grid": {"column_size": 1},
        },
        more=[
            {
                "block_id": "gc1",
                "block_type": 25,
                "parent_id": "g1",
                "children": ["gt1"],
                "grid_column": {"width_ratio": 100},
            },
            block("gt1", 2, "text", [run("in a column")], parent="gc1"),
        ],
    )
    assert markdown(blocks) == "new kind's words\n\n[image]\n\n[file: spec.pdf]\n\nin a column"


def test_nothing_readable_is_empty_and_a_cycle_ends() -> None:
    assert markdown([]) == ""
    looped = page(
        block("a", 12, "bullet", [run("a")], children=["b"]),
        more=[block("b", 12, "bullet", [run("b")], children=["a"], parent="a")],
    )
    assert markdown(looped) == "- a\n  - b"
