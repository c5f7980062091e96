"""Progress and result cards for an Agent execution, and the splitting of long results."""

from __future__ import annotations

import json
from functools import lru_cache

from cards import actions
from cards.approvals import approvals_section, progress_elements
from cards.catalogue import text
from cards.elements import (
    CARD_MAX_BYTES,
    Card,
    Element,
    Template,
    button,
    card,
    code,
    defuse_mentions,
    escape,
    markdown,
    plain,
    row,
)
from cards.models import (
    BranchView,
    Lang,
    MemoryNote,
    ProgressView,
    TurnApprovals,
    TurnMemory,
)

# One result card holds one markdown element of at most this many JSON-encoded bytes, leaving
# room under CARD_MAX_BYTES for the header and code-fence repairs.
RESULT_CHUNK_BYTES = 20_000
PROGRESS_LINES = 12
PROGRESS_LINE_CHARS = 300

_STATUS_TEMPLATE: dict[str, Template] = {
    "queued": "grey",
    "running": "blue",
    "done": "green",
    "failed": "red",
    "cancelled": "grey",
}


def progress_card(view: ProgressView, lang: Lang) -> Card:
    """The card updated in place while an Agent works (the caller throttles updates), with the
    turn's permission requests: pending ones with their buttons while it runs."""
    elements = project_line(view, lang)
    lines = [line[:PROGRESS_LINE_CHARS] for line in view.lines[-PROGRESS_LINES:]]
    if lines:
        elements.append(plain("\n".join(lines)))
    if view.status in ("queued", "running"):
        elements += progress_elements(view.approvals, lang)
    else:
        elements += approvals_section(TurnApprovals(view.approvals), lang)
    if view.elapsed_seconds is not None:
        seconds = f"{view.elapsed_seconds:.0f}"
        elements.append(markdown(f"*{text(lang, 'progress.elapsed', seconds=seconds)}*"))
    if view.run_id and view.status in ("queued", "running"):
        elements.append(cancel_row(view.run_id, lang))
    return card(
        text(lang, f"progress.title.{view.status}"),
        _STATUS_TEMPLATE[view.status],
        elements,
        subtitle=view.title[:120],
    )


def project_line(view: ProgressView, lang: Lang) -> list[Element]:
    """A project conversation's project and branch, as its progress cards show them."""
    if not view.project:
        return []
    shown = text(lang, "progress.project", project=escape(view.project), branch=code(view.branch))
    return [markdown(shown)]


def cancel_row(run_id: str, lang: Lang) -> Element:
    """The Stop button of a running turn's card."""
    return row(
        button(text(lang, "progress.cancel"), actions.RUN_CANCEL, kind="danger", run_id=run_id)
    )


@lru_cache(maxsize=4096)
def _char_cost(ch: str) -> int:
    # JSON escaping is per character, so a prefix's encoded size is the sum of its characters'.
    return len(json.dumps(ch, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def split_text(value: str, limit: int = RESULT_CHUNK_BYTES) -> list[str]:
    """Split ``value`` into pieces whose JSON-encoded size is at most ``limit`` bytes.

    Cuts prefer a paragraph break, then a line break, then a space, and fall back to a hard
    cut only when a piece has none in its second half. ``"".join(pieces) == value`` always.
    """
    if limit < 8:
        raise ValueError("limit too small")
    pieces: list[str] = []
    start = 0
    while start < len(value):
        end, used = start, 0
        while end < len(value) and used + _char_cost(value[end]) <= limit:
            used += _char_cost(value[end])
            end += 1
        if end == len(value):
            pieces.append(value[start:])
            break
        window = value[start:end]
        cut = len(window)
        for separator in ("\n\n", "\n", " "):
            found = window.rfind(separator)
            if found >= 0 and found + len(separator) >= len(window) // 2:
                cut = found + len(separator)
                break
        pieces.append(value[start : start + cut])
        start += cut
    return pieces


def _is_fence(line: str) -> bool:
    return line.lstrip(" ")[:3] == "```" and len(line) - len(line.lstrip(" ")) <= 3


def _repair_fences(pieces: list[str]) -> list[str]:
    """Close a code block a piece ends inside of, and reopen it at the start of the next."""
    repaired: list[str] = []
    open_fence = ""
    for piece in pieces:
        prefix = f"{open_fence}\n" if open_fence else ""
        for line in piece.split("\n"):
            if _is_fence(line):
                open_fence = "" if open_fence else line.strip()
        suffix = "\n```" if open_fence else ""
        repaired.append(prefix + piece + suffix)
    return repaired


SHORT_REVISION = 8
MEMORY_ITEMS = 10


def _code(path: str) -> str:
    # A path may hold a backtick or a mention tag; neither may break out of the code span.
    return "`" + defuse_mentions(path).replace("`", "'") + "`"


def _short(revision: str | None) -> str:
    return (revision or "")[:SHORT_REVISION]


def memory_section(memory: TurnMemory, lang: Lang) -> list[Element]:
    """What a turn read, searched, saved and forgot, compactly; each change has an Undo for the
    memory's owner (the handler checks who presses it)."""
    elements: list[Element] = [markdown(text(lang, "result.memory"))]
    notes = memory.notes
    if not notes:
        elements.append(markdown(text(lang, "result.memory.none")))
        return elements
    read: list[str] = []
    for note in notes:
        if note.op == "read" and _code(note.path) not in read:
            read.append(_code(note.path))
    if read:
        shown = ", ".join(read[:MEMORY_ITEMS]) + (" …" if len(read) > MEMORY_ITEMS else "")
        elements.append(markdown(text(lang, "result.memory.read", paths=shown)))
    searches = sum(1 for note in notes if note.op == "searched")
    if searches:
        elements.append(markdown(text(lang, "result.memory.searched", count=searches)))
    changes = [note for note in notes if note.op in ("saved", "forgot")]
    for note in changes[-MEMORY_ITEMS:]:
        elements.append(_change_row(note, memory.principal_id, lang))
    return elements


def _change_row(note: MemoryNote, principal_id: str, lang: Lang) -> Element:
    if note.op == "saved":
        revision = _short(note.revision)
        label = text(lang, "result.memory.saved", path=_code(note.path), revision=revision)
    else:
        label = text(lang, "result.memory.forgot", path=_code(note.path))
    undo = button(
        text(lang, "result.memory.undo"),
        actions.MEMORY_UNDO,
        path=note.path,
        revision=note.revision,
        previous_revision=note.previous_revision,
        principal_id=principal_id,
    )
    return row(markdown(label), undo)


# Files a result card lists of a branch; the rest are counted, and the diff file has them all.
BRANCH_FILES_SHOWN = 20


def _change_counts(added: int | None, removed: int | None, lang: Lang) -> str:
    if added is None or removed is None:
        return text(lang, "result.branch.binary")
    return f"+{added} −{removed}"


def branch_section(branch: BranchView, lang: Lang) -> list[Element]:
    """A project turn's branch: its name and base, the files it changed with their lines
    added and removed, and whether the diff follows as a file."""
    name, base = code(branch.branch), escape(branch.base)
    if not branch.files_total:
        return [markdown(text(lang, "result.branch.none", branch=name, base=base))]
    heading = text(lang, "result.branch", branch=name, base=base, count=branch.files_total)
    shown = branch.files[:BRANCH_FILES_SHOWN]
    lines = [f"- {_code(code(f.path))} {_change_counts(f.added, f.removed, lang)}" for f in shown]
    more = branch.files_total - len(shown)
    if more > 0:
        lines.append(text(lang, "result.branch.more", more=more))
    elements: list[Element] = [markdown(heading + "\n" + "\n".join(lines))]
    notes = []
    if branch.diff_attached:
        notes.append(text(lang, "result.diff_file", base=base))
    if branch.diff_truncated:
        notes.append(text(lang, "result.diff_truncated"))
    if branch.diff_unchanged:
        notes.append(text(lang, "result.diff_unchanged"))
    if notes:
        elements.append(markdown(f"*{' '.join(notes)}*"))
    return elements


def result_cards(
    value: str,
    lang: Lang,
    title: str = "",
    memory: TurnMemory | None = None,
    approvals: TurnApprovals | None = None,
    branch: BranchView | None = None,
) -> list[Card]:
    """The Agent's result as one or more cards, split cleanly under Feishu's size limit. A turn
    bound to memory shows what it did with it on the first card, and a turn that asked for
    permissions (or whose conversation keeps rules) what was allowed and denied."""
    pieces = _repair_fences(split_text(defuse_mentions(value)) or [""])
    total = len(pieces)
    cards: list[Card] = []
    for index, piece in enumerate(pieces, start=1):
        heading = (
            text(lang, "result.part", index=index, total=total)
            if total > 1
            else text(lang, "result.title")
        )
        elements = [markdown(piece)]
        if branch is not None and index == 1:
            elements += branch_section(branch, lang)
        if memory is not None and index == 1:
            elements += memory_section(memory, lang)
        if approvals is not None and index == 1:
            elements += approvals_section(approvals, lang)
        cards.append(card(heading, "green", elements, subtitle=title[:120]))
    return cards


assert RESULT_CHUNK_BYTES + 2_000 < CARD_MAX_BYTES
