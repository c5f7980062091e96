"""Progress and result cards for an Agent execution, and the splitting of long results.

A result card is built within Feishu's card limit by construction: every section beside the
answer (the branch, memory, approvals) has a byte budget of its own and shows what fits in it,
counting the rest; the first card's header, sections and controls are then measured as card
JSON, and the answer's first piece gets exactly the room left. The rest of the answer follows in
more cards, each measured the same way, so no part of an answer is ever left out for size.
"""

from __future__ import annotations

import json
from functools import lru_cache

from cards import actions
from cards.approvals import REQUESTS_BYTES, RULES_BYTES, approvals_section, progress_elements
from cards.catalogue import text
from cards.controls import finished_card
from cards.elements import (
    CARD_MAX_BYTES,
    Card,
    Element,
    Template,
    button,
    card,
    code,
    defuse_mentions,
    encoded_size,
    escape,
    markdown,
    plain,
    row,
)
from cards.footer import footer
from cards.models import (
    BranchView,
    ChangedFileView,
    FinishView,
    Lang,
    MemoryNote,
    ProgressView,
    TurnApprovals,
    TurnMemory,
)
from cards.notices import budget_line

# One result card holds one markdown element of at most this many JSON-encoded bytes; the first
# card's piece is smaller when its sections leave less room (see ``result_cards``).
RESULT_CHUNK_BYTES = 20_000
# Budgets (card JSON bytes) of the first result card's sections beside the answer.
BRANCH_BYTES = 5_000
MEMORY_BYTES = 5_000
APPROVALS_BYTES = REQUESTS_BYTES + RULES_BYTES + 1_000
# The header (title, usage, subtitle) and the controls row stay under this.
HEAD_BYTES = 1_500
# A path a section shows is cut in the middle past this many characters.
PATH_CHARS = 160
# A code fence reopened at the start of the next piece keeps this much of its info string.
FENCE_CHARS = 32
# The most a fence repair adds to a piece: the reopened fence line and the closing one.
FENCE_BYTES = FENCE_CHARS * 6 + 16
# The least the first card keeps for the answer whatever its sections hold.
MIN_FIRST_ANSWER_BYTES = 5_500
# The footer of a finished turn's first card (model, time, tokens, context, branch).
FOOTER_BYTES = 600
# The Agent's plan, on the progress card and the result card's first part.
PLAN_BYTES = 2_200
PLAN_STEP_CHARS = 200
PLAN_MARKS = {"completed": "✅", "in_progress": "🔄", "pending": "⬜"}
# The Agent's tool calls, newest kept, on the progress card and the result card's first part.
STEPS_BYTES = 1_500
STEP_ACTIONS = ("read", "edit", "run", "search", "tool", "compact")
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
    turn's permission requests: pending ones with their buttons while it runs.

    Within Feishu's limit by construction: the requests, which a person must see to answer,
    are placed first (within their own budget), and the newest progress lines take the room
    left."""
    if view.status in ("queued", "running"):
        requests = progress_elements(view.approvals, lang)
    else:
        requests = approvals_section(TurnApprovals(view.approvals), lang)
    tail: list[Element] = []
    if view.status == "cancelled" and view.recalled_by:
        tail.append(markdown(text(lang, "progress.recalled_by", name=escape(view.recalled_by))))
    elif view.status == "cancelled" and view.stopped_by:
        tail.append(markdown(text(lang, "progress.stopped_by", name=escape(view.stopped_by))))
    if view.elapsed_seconds is not None:
        seconds = f"{view.elapsed_seconds:.0f}"
        tail.append(markdown(f"*{text(lang, 'progress.elapsed', seconds=seconds)}*"))
    if view.run_id and view.status in ("queued", "running"):
        tail.append(cancel_row(view.run_id, lang))

    def build(lines: list[str]) -> Card:
        shown = [plain("\n".join(lines))] if lines else []
        return card(
            text(lang, f"progress.title.{view.status}"),
            _STATUS_TEMPLATE[view.status],
            [
                *project_line(view, lang),
                *plan_section(view.plan, lang),
                *steps_section(view.steps, lang),
                *shown,
                *requests,
                *tail,
            ],
            subtitle=view.title[:120],
        )

    lines = [line[:PROGRESS_LINE_CHARS] for line in view.lines[-PROGRESS_LINES:]]
    built = build(lines)
    while lines and encoded_size(built) > CARD_MAX_BYTES:
        lines = lines[1:]
        built = build(lines)
    return built


def plan_lines(plan: tuple[tuple[str, str], ...] | list[tuple[str, str]], lang: Lang) -> list[str]:
    """The plan as checklist lines (markdown) under its heading, within ``PLAN_BYTES``: the
    steps still to do are kept before the ones done, and those left out are counted."""
    if not plan:
        return []
    done = sum(1 for _, status in plan if status == "completed")
    heading = text(lang, "progress.plan", done=done, total=len(plan))

    def line(step: str, status: str) -> str:
        shown = escape(defuse_mentions(step.replace("\n", " ")[:PLAN_STEP_CHARS]))
        mark = PLAN_MARKS.get(status, PLAN_MARKS["pending"])
        return f"{mark} ~~{shown}~~" if status == "completed" else f"{mark} {shown}"

    lines = [line(step, status) for step, status in plan]
    shown = list(range(len(lines)))
    more = text(lang, "result.branch.more", more=999)
    room = PLAN_BYTES - encoded_size(heading) - encoded_size(more)

    def cost() -> int:
        return sum(encoded_size(lines[i]) for i in shown)

    while shown and cost() > room:
        # A step done is dropped before one still to do; the earliest of each first.
        finished = [i for i in shown if plan[i][1] == "completed"]
        shown.remove(finished[0] if finished else shown[-1])
    kept = [lines[i] for i in shown]
    if len(shown) < len(lines):
        kept.append(text(lang, "result.branch.more", more=len(lines) - len(shown)))
    return [heading, *kept]


def plan_section(plan: tuple[tuple[str, str], ...], lang: Lang) -> list[Element]:
    """The plan as one markdown element, or nothing when the Agent reported none."""
    lines = plan_lines(plan, lang)
    return [markdown("\n".join(lines))] if lines else []


def step_label(action: str, subject: str, lang: Lang) -> str:
    """One step as a list shows it: ``run `pytest -x``` (markdown)."""
    known = action if action in STEP_ACTIONS else "tool"
    # A step with nothing to name (a compaction) is its label alone, not an empty code span.
    shown = _code(code(_middle(subject))) if subject else ""
    return f"- {text(lang, f'step.{known}')} {shown}".rstrip()


def steps_section(steps: tuple[tuple[str, str], ...], lang: Lang) -> list[Element]:
    """The Agent's tool calls as a compact list within ``STEPS_BYTES``: the newest that fit,
    those before them counted."""
    if not steps:
        return []
    heading = text(lang, "progress.steps", count=len(steps))
    room = STEPS_BYTES - encoded_size(heading)
    room -= encoded_size(text(lang, "progress.steps.earlier", more=len(steps)))
    kept: list[str] = []
    for action, subject in reversed(steps):
        line = step_label(action, subject, lang)
        room -= encoded_size(line)
        if room < 0:
            break
        kept.insert(0, line)
    if len(kept) < len(steps):
        kept.insert(0, text(lang, "progress.steps.earlier", more=len(steps) - len(kept)))
    return [markdown("\n".join([heading, *kept]))]


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


def split_text(value: str, limit: int = RESULT_CHUNK_BYTES, first: int | None = None) -> list[str]:
    """Split ``value`` into pieces whose JSON-encoded size is at most ``limit`` bytes (the first
    piece at most ``first`` bytes, when given).

    Cuts prefer a paragraph break, then a line break, then a space, and fall back to a hard
    cut only when a piece has none in its second half. ``"".join(pieces) == value`` always.
    """
    if min(limit, limit if first is None else first) < 8:
        raise ValueError("limit too small")
    pieces: list[str] = []
    start = 0
    while start < len(value):
        budget = first if first is not None and not pieces else limit
        end, used = start, 0
        while end < len(value) and used + _char_cost(value[end]) <= budget:
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
    """Close a code block a piece ends inside of, and reopen it at the start of the next (with
    at most ``FENCE_CHARS`` of its fence line, so a repair adds at most ``FENCE_BYTES``)."""
    repaired: list[str] = []
    open_fence = ""
    for piece in pieces:
        prefix = f"{open_fence}\n" if open_fence else ""
        for line in piece.split("\n"):
            if _is_fence(line):
                open_fence = "" if open_fence else line.strip()[:FENCE_CHARS]
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
        if note.op == "read" and _code(_middle(note.path)) not in read:
            read.append(_code(_middle(note.path)))
    if read:
        shown = ", ".join(read[:MEMORY_ITEMS]) + (" …" if len(read) > MEMORY_ITEMS else "")
        elements.append(markdown(text(lang, "result.memory.read", paths=shown)))
    searches = sum(1 for note in notes if note.op == "searched")
    if searches:
        elements.append(markdown(text(lang, "result.memory.searched", count=searches)))
    changes = [note for note in notes if note.op in ("saved", "forgot")][-MEMORY_ITEMS:]
    rows = [_change_row(note, memory.principal_id, lang) for note in changes]
    # The newest changes that fit the section's budget; the rest are counted.
    room = (
        MEMORY_BYTES
        - _size(elements)
        - _size([markdown(text(lang, "result.branch.more", more=99))])
    )
    kept: list[Element] = []
    for change in reversed(rows):
        room -= _size([change])
        if room < 0:
            break
        kept.insert(0, change)
    if len(kept) < len(rows):
        elements.append(markdown(text(lang, "result.branch.more", more=len(rows) - len(kept))))
    return elements + kept


def _size(elements: list[Element]) -> int:
    """Bytes ``elements`` add to a card's JSON (each with its separating comma)."""
    return sum(encoded_size(element) + 1 for element in elements)


def _middle(path: str) -> str:
    """``path`` as a section shows it: cut in the middle past ``PATH_CHARS`` characters."""
    if len(path) <= PATH_CHARS:
        return path
    half = (PATH_CHARS - 1) // 2
    return path[:half] + "…" + path[-half:]


def _change_row(note: MemoryNote, principal_id: str, lang: Lang) -> Element:
    if note.op == "saved":
        revision = _short(note.revision)
        label = text(lang, "result.memory.saved", path=_code(_middle(note.path)), revision=revision)
    else:
        label = text(lang, "result.memory.forgot", path=_code(_middle(note.path)))
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


def _change_counts(changed: ChangedFileView, lang: Lang) -> str:
    if changed.too_large:
        return text(lang, "result.branch.too_large")
    if changed.added is None or changed.removed is None:
        return text(lang, "result.branch.binary")
    return f"+{changed.added} −{changed.removed}"


def branch_section(branch: BranchView, lang: Lang) -> list[Element]:
    """A project turn's branch: its name and base, the files it changed with their lines
    added and removed, and whether the diff follows as a file."""
    name, base = code(branch.branch), escape(branch.base)
    if not branch.files_total:
        return [markdown(text(lang, "result.branch.none", branch=name, base=base))]
    heading = text(lang, "result.branch", branch=name, base=base, count=branch.files_total)
    notes = []
    if branch.diff_attached:
        notes.append(text(lang, "result.diff_file", base=base))
    if branch.diff_truncated:
        notes.append(text(lang, "result.diff_truncated"))
    if branch.diff_unchanged:
        notes.append(text(lang, "result.diff_unchanged"))
    tail: list[Element] = [markdown(f"*{' '.join(notes)}*")] if notes else []
    # The files that fit the section's budget, each path cut to a readable length; the rest
    # are counted (the diff file has them all).
    more_line = text(lang, "result.branch.more", more=branch.files_total)
    room = BRANCH_BYTES - _size([markdown(heading + "\n" + more_line), *tail])
    lines: list[str] = []
    for changed in branch.files[:BRANCH_FILES_SHOWN]:
        counts = _change_counts(changed, lang)
        line = f"- {_code(code(_middle(changed.path)))} {counts}"
        # As JSON: its quotes stand for the line break before it.
        room -= encoded_size(line)
        if room < 0:
            break
        lines.append(line)
    more = branch.files_total - len(lines)
    if more > 0:
        lines.append(text(lang, "result.branch.more", more=more))
    return [markdown(heading + "\n" + "\n".join(lines)), *tail, *pull_request_section(branch, lang)]


def pull_request_section(branch: BranchView, lang: Lang) -> list[Element]:
    """The conversation's pull request, and the button opening (or updating) it."""
    elements: list[Element] = []
    if branch.pull_request_url:
        elements.append(markdown(text(lang, "result.pull_request", url=branch.pull_request_url)))
    if branch.pull_request_run and branch.files_total:
        label = (
            "result.pull_request.update" if branch.pull_request_url else "result.pull_request.open"
        )
        elements.append(
            row(button(text(lang, label), actions.PULL_REQUEST, run_id=branch.pull_request_run))
        )
    return elements


def pull_request_card(url: str, opened: bool, lang: Lang) -> Card:
    """What the topic is told when a pull request is opened or updated from it."""
    key = "result.pull_request.opened" if opened else "result.pull_request.updated"
    return card(
        text(lang, "result.pull_request.title"), "green", [markdown(text(lang, key, url=url))]
    )


def result_cards(
    value: str,
    lang: Lang,
    title: str = "",
    memory: TurnMemory | None = None,
    approvals: TurnApprovals | None = None,
    branch: BranchView | None = None,
    finish: FinishView | None = None,
    plan: tuple[tuple[str, str], ...] = (),
    steps: tuple[tuple[str, str], ...] = (),
) -> list[Card]:
    """The Agent's result as one or more cards, each within ``CARD_MAX_BYTES``, that together
    hold all of it. A turn bound to memory shows what it did with it on the first card, a turn
    that asked for permissions (or whose conversation keeps rules) what was allowed and denied,
    a project turn its branch, a turn with a plan its plan's final state, the tools it used;
    ``finish`` adds the usage and the conversation's controls."""
    sections: list[Element] = [*plan_section(plan, lang), *steps_section(steps, lang)]
    if branch is not None:
        sections += branch_section(branch, lang)
    if memory is not None:
        sections += memory_section(memory, lang)
    if approvals is not None:
        sections += approvals_section(approvals, lang)
    # The widest heading any card of the answer may carry, for measuring before splitting.
    widest = text(lang, "result.part", index=9999, total=9999)
    first_room = CARD_MAX_BYTES - FENCE_BYTES
    on_branch = branch.branch if branch is not None else ""
    first_room -= encoded_size(_first_card(widest, "", sections, title, finish, lang, on_branch))
    rest_room = CARD_MAX_BYTES - FENCE_BYTES - encoded_size(_part_card(widest, "", title))
    pieces = split_text(
        defuse_mentions(value),
        min(RESULT_CHUNK_BYTES, rest_room),
        first=min(RESULT_CHUNK_BYTES, first_room),
    )
    pieces = _repair_fences(pieces or [""])
    total = len(pieces)
    cards: list[Card] = []
    for index, piece in enumerate(pieces, start=1):
        heading = (
            text(lang, "result.part", index=index, total=total)
            if total > 1
            else text(lang, "result.title")
        )
        if index == 1:
            cards.append(_first_card(heading, piece, sections, title, finish, lang, on_branch))
        else:
            cards.append(_part_card(heading, piece, title))
    return cards


def _part_card(heading: str, piece: str, title: str) -> Card:
    return card(heading, "green", [markdown(piece)], subtitle=title[:120])


def _first_card(
    heading: str,
    piece: str,
    sections: list[Element],
    title: str,
    finish: FinishView | None,
    lang: Lang,
    branch: str = "",
) -> Card:
    if finish is not None and finish.budget is not None:
        sections = [*sections, markdown(budget_line("budget.warning", finish.budget, lang))]
    if finish is not None:
        sections = [*sections, *footer(finish.usage, finish.elapsed_seconds, branch, lang)]
    built = card(heading, "green", [markdown(piece), *sections], subtitle=title[:120])
    if finish is None:
        return built
    return finished_card(
        built,
        usage=finish.usage,
        elapsed_seconds=finish.elapsed_seconds,
        origin=finish.origin,
        lang=lang,
    )


# Every section within its budget leaves the first card room for a good part of the answer.
assert (
    HEAD_BYTES
    + PLAN_BYTES
    + STEPS_BYTES
    + FOOTER_BYTES
    + BRANCH_BYTES
    + MEMORY_BYTES
    + APPROVALS_BYTES
    + FENCE_BYTES
    + MIN_FIRST_ANSWER_BYTES
    <= CARD_MAX_BYTES
)
assert RESULT_CHUNK_BYTES + HEAD_BYTES + FENCE_BYTES < CARD_MAX_BYTES
