"""Permission requests on cards: what an Agent wants, its three answers, and how it was settled.

Rules:

- A pending request shows the tool, the whole command or path and the whole diff or input, each
  in a code block (mentions defused, no fence inside can close it), when it expires, whose it is
  to answer, and three buttons: Allow once, Allow for this conversation, Deny. The handler
  checks who presses them; the card only offers.
- A person never allows what they could not see: a command or a detail too long for a card
  (``SUBJECT_BYTES``, ``REQUEST_BYTES``) shows its start and says the whole of it is in a file
  posted in the topic (``subject_file_name``, ``request_file_text``; the bot posts it, see
  ``shows_whole``); when that file could not be posted, the card offers Deny alone.
- Its text arrives with its controls already escaped (the bot applies ``hub.contract.visible``
  to what an Agent wrote, which this package may not import).
- A settled one shows who decided and when (or that a conversation rule allowed it, nobody
  answered in time, or it lapsed with a run handed back), and no buttons.
- A running turn's requests are part of its progress card (``progress_elements``), or, when its
  progress streams into a CardKit card, each is a card of its own (``approval_card``) updated in
  place once settled. A finished turn's first card lists them all, with the conversation's rules
  for the turn's person (``approvals_section``).
"""

from __future__ import annotations

import re

from cards import actions
from cards.catalogue import text
from cards.elements import (
    ButtonType,
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
    row,
)
from cards.models import ApprovalView, Lang, TurnApprovals
from cards.times import clock_time

# A request's command or paths are shown whole up to this many bytes of card JSON, and with its
# detail (an edit's diff or new content, a tool's input) up to ``REQUEST_BYTES``: the detail has
# the room the subject left, so beside a path about 9,000 bytes of an edit show whole. What does
# not fit goes whole into a file. With the buttons, one pending request stays within
# ``PENDING_BYTES``.
SUBJECT_BYTES = 7_000
REQUEST_BYTES = 10_000
PENDING_BYTES = 13_000
# What a one-line mention of a request keeps of its subject, and any card of a tool's or a
# person's name: the lines stay short whatever an Agent or a directory calls them.
LINE_SUBJECT_CHARS = 120
NAME_CHARS = 40
# A progress card shows this many pending requests in full, and the newest settled ones briefly.
SHOWN_PENDING = 3
SHOWN_SETTLED = 5
# A finished turn's card lists at most this many requests, and this many rules, so the section
# fits beside a full result chunk (see ``cards.progress``).
LISTED_REQUESTS = 10
LISTED_RULES = 10
REQUESTS_BYTES = 3500
RULES_BYTES = 1500

_FENCE_RUN = re.compile(r"`(?=``)")
_ICONS = {"allow_once": "✅", "allow_session": "✅", "deny": "⛔"}


def _name(value: str) -> str:
    return escape(value[:NAME_CHARS].replace("\n", " "))


def _when(moment: float | None, zone: str) -> str:
    return clock_time(moment or 0.0, zone)


def _fenced(value: str) -> str:
    """``value`` as a fenced code block: mentions defused, and no run of three backticks left
    inside to close the fence early."""
    shown = _FENCE_RUN.sub("`\u200b", defuse_mentions(value))
    return f"```\n{shown}\n```"


def _within_bytes(value: str, budget: int) -> str:
    """The longest start of ``value`` whose code block is at most ``budget`` bytes of card JSON."""
    if encoded_size(_fenced(value)) <= budget:
        return value
    low, high = 0, len(value)
    while low < high:
        middle = (low + high + 1) // 2
        if encoded_size(_fenced(value[:middle])) <= budget:
            low = middle
        else:
            high = middle - 1
    return value[:low]


def _shown(view: ApprovalView) -> tuple[str, str]:
    """What a card shows of the request's subject and detail: each whole, or its start."""
    subject = _within_bytes(view.subject, SUBJECT_BYTES)
    if not view.detail.strip():
        return subject, view.detail
    room = REQUEST_BYTES - encoded_size(_fenced(subject))
    return subject, _within_bytes(view.detail, room)


def shows_whole(view: ApprovalView) -> bool:
    """Whether a card shows the request's whole command or paths and its whole detail; if not,
    the bot posts them as the file ``subject_file_name`` (``request_file_text``) in the topic."""
    return _shown(view) == (view.subject, view.detail)


def subject_file_name(view: ApprovalView) -> str:
    """The file a request too long for a card is posted in."""
    return f"request-{view.request_id}.txt"


def request_file_text(view: ApprovalView, lang: Lang) -> str:
    """The whole request as its file holds it: the command or paths, then the detail under a
    line that says what follows."""
    if not view.detail.strip():
        return view.subject + "\n"
    rule = text(lang, "approval.file_detail", count=len(view.detail))
    return f"{view.subject}\n\n{rule}\n{view.detail}\n"


def _part(value: str, shown: str, view: ApprovalView, lang: Lang) -> list[str]:
    """A command, paths or detail as a code block: whole, or its start and where the whole of
    it is."""
    if shown == value:
        return [_fenced(value)]
    count = len(value)
    if view.subject_file:
        name = code(subject_file_name(view))
        note = text(lang, "approval.subject_in_file", count=count, name=f"`{name}`")
    elif view.pending:
        note = text(lang, "approval.subject_unseen", count=count)
    else:
        note = text(lang, "approval.subject_cut", count=count)
    return [_fenced(shown), f"**{note}**"]


def request_line(view: ApprovalView) -> str:
    """``Write `notes.md``` in one line, for lists and progress lines: a long path keeps its
    end (the file), a long command its start (the program)."""
    lines = view.subject.splitlines() or [""]
    subject = lines[0]
    if view.action == "edit" and len(subject) > LINE_SUBJECT_CHARS:
        subject = "…" + subject[-LINE_SUBJECT_CHARS:]
    elif len(subject) > LINE_SUBJECT_CHARS or len(lines) > 1:
        subject = subject[:LINE_SUBJECT_CHARS] + " …"
    shown = f" `{defuse_mentions(code(subject))}`" if subject else ""
    return f"{_name(view.tool)}{shown}"


def outcome(view: ApprovalView, lang: Lang, *, markup: bool = True) -> str:
    """How the request was settled, by whom and when, in one line: escaped for card markdown,
    or (``markup`` false) as plain text, for a toast."""

    def shown(value: str) -> str:
        value = value.replace("\n", " ")
        return escape(value) if markup else value

    name = shown((view.decided_by or text(lang, "approval.someone"))[:NAME_CHARS])
    when = _when(view.decided_at, view.zone)
    if view.pending:
        return text(lang, "approval.unanswered")
    if view.decision in ("allow_once", "allow_session"):
        if view.via == "rule":
            return text(lang, "approval.allowed_rule", when=when)
        key = (
            "approval.allowed_session"
            if view.decision == "allow_session"
            else "approval.allowed_once"
        )
        return text(lang, key, name=name, when=when)
    if view.via == "timeout":
        return text(lang, "approval.denied_timeout", when=when)
    if view.via == "lapsed":
        return text(lang, "approval.lapsed", when=when)
    said = text(lang, "approval.denied_person", name=name, when=when)
    if view.reason:
        reason = shown(view.reason[:LINE_SUBJECT_CHARS])
        said += " · " + text(lang, "approval.reason", reason=reason)
    return said


def _icon(view: ApprovalView) -> str:
    if view.pending:
        return "⏳"
    if view.via == "lapsed":
        return "↩"
    return _ICONS.get(view.decision or "", "⛔")


def request_elements(view: ApprovalView, lang: Lang) -> list[Element]:
    """One request in full: what is wanted, then its buttons (pending) or its outcome."""
    action = view.action if view.action in ("command", "edit", "tool") else "tool"
    wants = text(lang, f"approval.wants.{action}", tool=_name(view.tool))
    subject_shown, detail_shown = _shown(view)
    subject, *unseen = _part(view.subject, subject_shown, view, lang)
    elements: list[Element] = [markdown(f"{wants}\n{subject}")]
    elements += [markdown(note) for note in unseen]
    if view.detail.strip():
        elements += [markdown(part) for part in _part(view.detail, detail_shown, view, lang)]
    if not view.pending:
        elements.append(markdown(f"{_icon(view)} {outcome(view, lang)}"))
        return elements
    notes = [text(lang, "approval.expires", when=_when(view.expires_at, view.zone))]
    if view.asked_of:
        notes.append(text(lang, "approval.asked_of", name=_name(view.asked_of)))
    elements.append(markdown("\n".join(f"*{note}*" for note in notes)))
    answers = [_answer(view, lang, "deny", "danger")]
    if (subject_shown, detail_shown) == (view.subject, view.detail) or view.subject_file:
        answers[:0] = [
            _answer(view, lang, "allow_once", "primary"),
            _answer(view, lang, "allow_session", "default"),
        ]
    elements.append(row(*answers))
    return elements


def _answer(view: ApprovalView, lang: Lang, decision: str, kind: ButtonType) -> Element:
    return button(
        text(lang, f"approval.{decision}"),
        actions.RUN_APPROVE,
        kind=kind,
        run_id=view.run_id,
        request_id=view.request_id,
        decision=decision,
    )


def approval_card(view: ApprovalView, lang: Lang, title: str = "") -> Card:
    """A request's own card (beside a streaming progress card), updated in place once settled."""
    template: Template
    if view.pending:
        heading, template = text(lang, "approval.title.pending"), "orange"
    elif view.decision in ("allow_once", "allow_session"):
        heading, template = text(lang, "approval.title.allowed"), "green"
    else:
        heading, template = text(lang, "approval.title.denied"), "grey"
    return card(heading, template, request_elements(view, lang), subtitle=title[:120])


def progress_elements(views: tuple[ApprovalView, ...], lang: Lang) -> list[Element]:
    """What a running turn's progress card shows of its requests: the oldest pending ones in
    full with their buttons, as many as fit ``PENDING_BYTES`` (at least one; the rest counted
    and shown once these are answered), the newest settled ones in a line each."""
    settled = [v for v in views if not v.pending][-SHOWN_SETTLED:]
    pending = [v for v in views if v.pending]
    elements: list[Element] = []
    if settled:
        lines = [f"{_icon(v)} {request_line(v)}: {outcome(v, lang)}" for v in settled]
        elements.append(markdown("\n".join(lines)))
    room = PENDING_BYTES
    shown = 0
    for view in pending[:SHOWN_PENDING]:
        request = [markdown(f"**{text(lang, 'approval.title.pending')}**")]
        request += request_elements(view, lang)
        room -= encoded_size(request)
        if shown and room < 0:
            break
        elements += request
        shown += 1
    if len(pending) > shown:
        waiting = text(lang, "approval.more_pending", count=len(pending) - shown)
        elements.append(markdown(f"*{waiting}*"))
    return elements


def _rule(rule: str) -> str:
    cut = rule[:LINE_SUBJECT_CHARS] + (" …" if len(rule) > LINE_SUBJECT_CHARS else "")
    return f"`{defuse_mentions(code(cut))}`"


def approvals_section(turn: TurnApprovals, lang: Lang) -> list[Element]:
    """A finished turn's requests, how each was settled, and the conversation's rules; nothing
    when the turn asked for nothing and the conversation keeps no rule. The newest requests and
    the oldest rules are listed within a budget, so the section fits beside a full result."""
    if not turn.requests and not turn.rules:
        return []
    elements: list[Element] = [markdown(text(lang, "result.approvals"))]
    lines = _within(
        [f"{_icon(v)} {request_line(v)}: {outcome(v, lang)}" for v in reversed(turn.requests)],
        LISTED_REQUESTS,
        REQUESTS_BYTES,
    )[::-1]
    if len(turn.requests) > len(lines):
        lines.insert(0, text(lang, "approval.more", count=len(turn.requests) - len(lines)))
    if lines:
        elements.append(markdown("\n".join(lines)))
    if turn.rules:
        shown = _within([_rule(rule) for rule in turn.rules], LISTED_RULES, RULES_BYTES)
        more = " …" if len(turn.rules) > len(shown) else ""
        rules = "; ".join(shown) + more
        elements.append(markdown(text(lang, "result.approvals.rules", rules=rules)))
    return elements


def _within(items: list[str], most: int, budget: int) -> list[str]:
    """The first items, at most ``most`` of them and ``budget`` bytes as card JSON together."""
    kept: list[str] = []
    for item in items[:most]:
        budget -= encoded_size(item)
        if budget < 0 and kept:
            break
        kept.append(item)
    return kept
