"""A Feishu docx as Markdown, from its blocks as ``GET /open-apis/docx/v1/documents/{id}/blocks``
lists them.

The document's raw text loses what an Agent reads a document for: which line is a heading, what
is a list and how deep, which text is code and in what language, what a table's rows are. The
blocks keep it. Pure: no I/O, so every block kind is checked with the JSON Feishu sends.

Each block names its kind by ``block_type`` and holds its content under the key of that kind
(``text``, ``heading1`` .. ``heading9``, ``bullet``, ``code``, ...), as ``elements``: runs of text
with their style, mentions and equations. Children are listed by id in ``children``. A kind this
module does not know still gives its text and its children, so nothing in a document is lost
because Feishu added a block kind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

PAGE = 1
TEXT = 2
HEADING_1 = 3
HEADING_9 = 11
BULLET = 12
ORDERED = 13
CODE = 14
QUOTE = 15
EQUATION = 16
TODO = 17
CALLOUT = 19
DIVIDER = 22
FILE = 23
IMAGE = 27
TABLE = 31
TABLE_CELL = 32
QUOTE_CONTAINER = 34

_LIST_ITEMS = (BULLET, ORDERED, TODO)

# Feishu's code block languages (``code.style.language``) as Markdown fence names.
_LANGUAGES: dict[int, str] = {
    1: "",
    2: "abap",
    3: "ada",
    4: "apache",
    5: "apex",
    6: "asm",
    7: "bash",
    8: "csharp",
    9: "cpp",
    10: "c",
    11: "cobol",
    12: "css",
    13: "coffeescript",
    14: "d",
    15: "dart",
    16: "delphi",
    17: "django",
    18: "dockerfile",
    19: "erlang",
    20: "fortran",
    21: "foxpro",
    22: "go",
    23: "groovy",
    24: "html",
    25: "handlebars",
    26: "http",
    27: "haskell",
    28: "json",
    29: "java",
    30: "javascript",
    31: "julia",
    32: "kotlin",
    33: "latex",
    34: "lisp",
    35: "logo",
    36: "lua",
    37: "matlab",
    38: "makefile",
    39: "markdown",
    40: "nginx",
    41: "objectivec",
    42: "openedge",
    43: "php",
    44: "perl",
    45: "postscript",
    46: "powershell",
    47: "prolog",
    48: "protobuf",
    49: "python",
    50: "r",
    51: "rpg",
    52: "ruby",
    53: "rust",
    54: "sas",
    55: "scss",
    56: "sql",
    57: "scala",
    58: "scheme",
    59: "scratch",
    60: "shell",
    61: "swift",
    62: "thrift",
    63: "typescript",
    64: "vbscript",
    65: "vbnet",
    66: "xml",
    67: "yaml",
    68: "cmake",
    69: "diff",
    70: "gherkin",
    71: "graphql",
    72: "glsl",
    73: "properties",
    74: "solidity",
    75: "toml",
}

# A document nests only so deep in practice; a deeper (or cyclic) one is cut, not recursed into.
MAX_DEPTH = 32

Block = Mapping[str, Any]


def markdown(blocks: Sequence[Block]) -> str:
    """The document ``blocks`` make up, as Markdown; its page block is the root (the first block
    when none says it is one)."""
    by_id = {str(b.get("block_id")): b for b in blocks if isinstance(b, Mapping)}
    if not by_id:
        return ""
    root = next((b for b in by_id.values() if b.get("block_type") == PAGE), None)
    if root is None:
        root = next(iter(by_id.values()))
        return _Render(by_id).blocks([str(root.get("block_id"))], 0).strip("\n")
    return _Render(by_id).children(root, 0).strip("\n")


class _Render:
    def __init__(self, by_id: Mapping[str, Block]) -> None:
        self._by_id = by_id
        self._seen: set[str] = set()

    def children(self, block: Block, depth: int) -> str:
        ids = block.get("children")
        return self.blocks([str(i) for i in ids] if isinstance(ids, list) else [], depth)

    def blocks(self, ids: list[str], depth: int) -> str:
        """Sibling blocks: list items one to a line, everything else a paragraph apart."""
        out: list[str] = []
        previous: int | None = None
        number = 0
        for block_id in ids:
            block = self._by_id.get(block_id)
            if block is None or block_id in self._seen or depth > MAX_DEPTH:
                continue
            self._seen.add(block_id)
            kind = _kind(block)
            if kind == ORDERED:
                number = number + 1 if previous == ORDERED else 1
                # A list Feishu shows restarting (or starting) at a number says which.
                sequence = _style(block, "ordered").get("sequence")
                if isinstance(sequence, str) and sequence.isdigit():
                    number = int(sequence)
            shown = self.block(block, kind, depth, number)
            if not shown:
                continue
            if out:
                tight = kind in _LIST_ITEMS and previous in _LIST_ITEMS
                out.append("\n" if tight else "\n\n")
            out.append(shown)
            previous = kind
        return "".join(out)

    def block(self, block: Block, kind: int, depth: int, number: int) -> str:
        if HEADING_1 <= kind <= HEADING_9:
            level = kind - HEADING_1 + 1
            # Markdown has six heading levels: Feishu's seventh to ninth are its sixth.
            head = "#" * min(level, 6) + " " + _one_line(_inline(block, f"heading{level}"))
            return _joined(head, self.children(block, depth + 1))
        if kind in _LIST_ITEMS:
            if kind == ORDERED:
                marker = f"{number}. "
            elif kind == TODO:
                done = _style(block, "todo").get("done") is True
                marker = "- [x] " if done else "- [ ] "
            else:
                marker = "- "
            key = {BULLET: "bullet", ORDERED: "ordered", TODO: "todo"}[kind]
            item = marker + _inline(block, key).replace("\n", "\n" + " " * len(marker))
            nested = self.children(block, depth + 1)
            # Children indented to the item's text belong to the item (nested lists too).
            return item + ("\n" + _indent(nested, " " * len(marker)) if nested else "")
        if kind == CODE:
            return _code(block)
        if kind == QUOTE:
            return _joined(
                _quoted(_inline(block, "quote")), _quoted(self.children(block, depth + 1))
            )
        if kind in (QUOTE_CONTAINER, CALLOUT):
            return _quoted(self.children(block, depth + 1))
        if kind == DIVIDER:
            return "---"
        if kind == TABLE:
            return self.table(block, depth)
        if kind == EQUATION:
            formula = _inline(block, "equation", styled=False).strip()
            return f"$$\n{formula}\n$$" if formula else ""
        if kind == IMAGE:
            return "[image]"
        if kind == FILE:
            name = _one_line(str(_content(block, "file").get("name") or ""))
            return f"[file: {name}]" if name else "[file]"
        # A text block, or a kind not known here: its text, then its children.
        holder = "text" if kind == TEXT else _content_key(block)
        own = _inline(block, holder) if holder else ""
        return _joined(own, self.children(block, depth + 1))

    def table(self, block: Block, depth: int) -> str:
        table = _content(block, "table")
        prop = _content(table, "property")
        cells = table.get("cells")
        ids = [str(c) for c in cells] if isinstance(cells, list) else []
        if not ids:
            children = block.get("children")
            ids = [str(c) for c in children] if isinstance(children, list) else []
        columns = _positive(prop.get("column_size")) or 1
        shown: list[str] = []
        for cell_id in ids:
            cell = self._by_id.get(cell_id)
            self._seen.add(cell_id)
            text = self.children(cell, depth + 1) if cell is not None else ""
            shown.append(_cell(text))
        if not shown:
            return ""
        rows = [shown[i : i + columns] for i in range(0, len(shown), columns)]
        rows = [row + [""] * (columns - len(row)) for row in rows]
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * columns]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        return "\n".join(lines)


def _kind(block: Block) -> int:
    kind = block.get("block_type")
    return kind if isinstance(kind, int) else 0


def _content(block: Block, key: str) -> Mapping[str, Any]:
    found = block.get(key)
    return found if isinstance(found, Mapping) else {}


def _content_key(block: Block) -> str | None:
    """The key an unknown kind keeps its text under: the one holding ``elements``."""
    for key, value in block.items():
        if isinstance(value, Mapping) and isinstance(value.get("elements"), list):
            return str(key)
    return None


def _style(block: Block, key: str) -> Mapping[str, Any]:
    style = _content(block, key).get("style")
    return style if isinstance(style, Mapping) else {}


def _positive(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


def _inline(block: Block, key: str, *, styled: bool = True) -> str:
    elements = _content(block, key).get("elements")
    if not isinstance(elements, list):
        return ""
    return "".join(_element(e, styled) for e in elements if isinstance(e, Mapping))


def _element(element: Mapping[str, Any], styled: bool) -> str:
    run = element.get("text_run")
    if isinstance(run, Mapping):
        text = str(run.get("content") or "")
        style = run.get("text_element_style")
        return _styled(text, style) if styled and isinstance(style, Mapping) else text
    doc = element.get("mention_doc")
    if isinstance(doc, Mapping):
        title = str(doc.get("title") or "document")
        url = unquote(str(doc.get("url") or ""))
        return f"[{title}]({url})" if styled and url else title
    if isinstance(element.get("mention_user"), Mapping):
        return "@user"
    equation = element.get("equation")
    if isinstance(equation, Mapping):
        formula = str(equation.get("content") or "").strip()
        return f"${formula}$" if styled and formula else formula
    return ""


def _styled(text: str, style: Mapping[str, Any]) -> str:
    if not text.strip():
        return text
    # Markers hug the words: ``** bold**`` is not bold, so the spaces stay outside.
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()) :]
    core = text.strip()
    if style.get("inline_code"):
        core = _code_span(core)
    else:
        if style.get("bold"):
            core = f"**{core}**"
        if style.get("italic"):
            core = f"*{core}*"
        if style.get("strikethrough"):
            core = f"~~{core}~~"
    link = style.get("link")
    if isinstance(link, Mapping) and link.get("url"):
        core = f"[{core}]({unquote(str(link['url']))})"
    return lead + core + trail


def _code_span(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{ticks}{padded}{ticks}"


def _code(block: Block) -> str:
    body = _inline(block, "code", styled=False).rstrip("\n")
    language = _style(block, "code").get("language")
    name = _LANGUAGES.get(language, "") if isinstance(language, int) else ""
    longest = max((len(run) for run in re.findall(r"`{3,}", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{name}\n{body}\n{fence}"


def _quoted(text: str) -> str:
    if not text:
        return ""
    return "\n".join("> " + line if line else ">" for line in text.split("\n"))


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.split("\n"))


def _joined(head: str, rest: str) -> str:
    return "\n\n".join(part for part in (head, rest) if part)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    """A cell's blocks on one table row: line breaks as ``<br>``, pipes escaped."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    return "<br>".join(lines).replace("|", "\\|")
