"""The "My memory" cards: list, search results, one document, forget confirmation and outcome."""

from __future__ import annotations

from cards import actions
from cards.catalogue import text
from cards.elements import (
    Card,
    Element,
    button,
    card,
    code,
    escape,
    hr,
    markdown,
    plain,
    row,
    search_form,
)
from cards.models import (
    EraseView,
    ForgetOutcome,
    Lang,
    MemoryChange,
    MemoryDocument,
    MemoryList,
    MemorySearch,
)
from cards.times import date_time

# Stored text is shown verbatim; keep one document card well inside Feishu's card size limit.
DOCUMENT_CHARS = 6_000
SNIPPET_CHARS = 400


def _short(revision: str) -> str:
    return revision[:12]


def _search(lang: Lang) -> Element:
    return search_form(
        "memory_search",
        "query",
        text(lang, "memory.search_placeholder"),
        text(lang, "memory.search"),
        actions.MEMORY_SEARCH,
    )


def memory_list_card(view: MemoryList, lang: Lang) -> Card:
    """The caller's documents, each with an Open button, and a search form."""
    elements: list[Element] = [markdown(text(lang, "memory.scope", scope=code(view.scope)))]
    if view.project:
        elements.append(markdown(text(lang, "memory.project", project=escape(view.project))))
    if not view.items:
        elements.append(markdown(text(lang, "memory.empty")))
    for item in view.items:
        label = f"`{code(item.path)}`"
        if item.title:
            label += f" {escape(item.title)}"
        if item.size_bytes is not None:
            label += f" · {item.size_bytes} B"
        elements.append(
            row(
                markdown(label),
                button(text(lang, "memory.open"), actions.MEMORY_OPEN, path=item.path),
            )
        )
    if view.truncated:
        elements.append(markdown(f"*{text(lang, 'memory.truncated')}*"))
    elements += [
        hr(),
        _search(lang),
        row(
            button(text(lang, "memory.history"), actions.MEMORY_HISTORY),
            button(text(lang, "memory.erase"), actions.MEMORY_ERASE_ASK, kind="danger"),
        ),
    ]
    return card(text(lang, "memory.title"), "turquoise", elements)


def _when(moment: float, zone: str) -> str:
    return date_time(moment, zone)


def change_elements(changes: tuple[MemoryChange, ...], lang: Lang) -> list[Element]:
    """Each change in one line (when, what, by whom), with Restore this version while the
    earlier body is kept."""
    elements: list[Element] = []
    for change in changes:
        line = text(
            lang,
            "memory.change",
            when=_when(change.at, change.zone),
            action=change.action,
            path=f"`{code(change.path)}`",
            by=change.by,
        )
        if change.restore_revision is None or change.restorable_until is None:
            elements.append(markdown(line))
            continue
        restorable_until = _when(change.restorable_until, change.zone)
        until = text(lang, "memory.change.restorable", until=restorable_until)
        elements.append(
            row(
                markdown(f"{line}\n*{until}*"),
                button(
                    text(lang, "memory.restore"),
                    actions.MEMORY_RESTORE,
                    path=change.path,
                    revision=change.restore_revision,
                    expected_revision=change.current_revision,
                ),
            )
        )
    return elements


def memory_history_card(changes: tuple[MemoryChange, ...], lang: Lang) -> Card:
    """Recent changes of the caller's memory, forgotten documents included."""
    elements: list[Element] = change_elements(changes, lang) or [
        markdown(text(lang, "memory.no_changes"))
    ]
    elements += [hr(), row(button(text(lang, "memory.back"), actions.MEMORY_LIST))]
    return card(text(lang, "memory.changes_title"), "turquoise", elements)


def restored_card(path: str, revision: str, lang: Lang) -> Card:
    elements: list[Element] = [
        markdown(text(lang, "memory.restored", path=escape(path), revision=code(_short(revision)))),
        row(
            button(text(lang, "memory.open"), actions.MEMORY_OPEN, path=path),
            button(text(lang, "memory.back"), actions.MEMORY_LIST),
        ),
    ]
    return card(text(lang, "memory.restored_title"), "green", elements)


def _erase_counts(view: EraseView, lang: Lang, key: str) -> str:
    what = f"`{code(view.path)}`" if view.path else text(lang, "memory.erase_all")
    return text(
        lang, key, documents=view.documents, copies=view.copies, entries=view.entries, what=what
    )


def _kept(view: EraseView, lang: Lang) -> list[Element]:
    if not view.kept:
        return []
    paths = ", ".join(f"`{code(path)}`" for path in view.kept)
    return [markdown(text(lang, "memory.erase_kept", count=len(view.kept), paths=paths))]


def erase_confirm_card(view: EraseView, lang: Lang) -> Card:
    """States exactly what an erase removes, and what it does not, before it happens."""
    elements: list[Element] = [
        markdown(_erase_counts(view, lang, "memory.erase_body")),
        *_kept(view, lang),
        markdown(f"*{text(lang, 'memory.not_erased')}*"),
        row(
            button(
                text(lang, "memory.erase_confirm"),
                actions.MEMORY_ERASE_CONFIRM,
                kind="danger",
                path=view.path,
            ),
            button(text(lang, "memory.forget_cancel"), actions.MEMORY_LIST),
        ),
    ]
    return card(text(lang, "memory.erase_title"), "red", elements)


def erased_card(view: EraseView, lang: Lang) -> Card:
    """The receipt of an erase."""
    elements: list[Element] = [
        markdown(_erase_counts(view, lang, "memory.erased")),
        *_kept(view, lang),
        markdown(f"*{text(lang, 'memory.not_erased')}*"),
        row(button(text(lang, "memory.back"), actions.MEMORY_LIST)),
    ]
    return card(text(lang, "memory.erased_title"), "green", elements)


def memory_search_card(view: MemorySearch, lang: Lang) -> Card:
    """Search hits with their snippets; snippets are shown verbatim, never as markup."""
    elements: list[Element] = [markdown(text(lang, "memory.scope", scope=code(view.scope)))]
    if not view.hits:
        elements.append(markdown(text(lang, "memory.no_hits")))
    for hit in view.hits:
        where = f"`{code(hit.path)}`" + (f" :{hit.line}" if hit.line is not None else "")
        snippet = hit.snippet[:SNIPPET_CHARS]
        elements += [
            row(
                markdown(where),
                button(text(lang, "memory.open"), actions.MEMORY_OPEN, path=hit.path),
            ),
            plain(snippet),
        ]
    if view.incomplete:
        elements.append(markdown(f"*{text(lang, 'memory.incomplete')}*"))
    elements += [hr(), _search(lang), row(button(text(lang, "memory.back"), actions.MEMORY_LIST))]
    return card(text(lang, "memory.search_title", query=view.query[:80]), "turquoise", elements)


def memory_document_card(view: MemoryDocument, lang: Lang) -> Card:
    """One page of a document with Read more (when continued), Forget and Back."""
    content = view.content[:DOCUMENT_CHARS]
    next_offset = view.next_offset
    elements: list[Element] = [
        markdown(text(lang, "memory.revision", revision=code(_short(view.revision)))),
        plain(content),
    ]
    if view.changes:
        elements += [markdown(text(lang, "memory.changes")), *change_elements(view.changes, lang)]
    buttons: list[Element] = []
    if next_offset is not None:
        buttons.append(
            button(
                text(lang, "memory.more"), actions.MEMORY_OPEN, path=view.path, offset=next_offset
            )
        )
    buttons += [
        button(
            text(lang, "memory.forget"),
            actions.MEMORY_FORGET_ASK,
            kind="danger",
            path=view.path,
            revision=view.revision,
        ),
        button(text(lang, "memory.erase"), actions.MEMORY_ERASE_ASK, kind="danger", path=view.path),
        button(text(lang, "memory.back"), actions.MEMORY_LIST),
    ]
    elements.append(row(*buttons))
    return card(text(lang, "memory.document_title", path=view.path), "turquoise", elements)


def forget_confirm_card(path: str, revision: str, lang: Lang) -> Card:
    """Asks before deleting; the confirm button carries the revision the user saw."""
    elements: list[Element] = [
        markdown(
            text(lang, "memory.forget_body", path=escape(path), revision=code(_short(revision)))
        ),
        row(
            button(
                text(lang, "memory.forget_confirm"),
                actions.MEMORY_FORGET_CONFIRM,
                kind="danger",
                path=path,
                revision=revision,
            ),
            button(text(lang, "memory.forget_cancel"), actions.MEMORY_OPEN, path=path),
        ),
    ]
    return card(text(lang, "memory.forget_title"), "red", elements)


def forget_done_card(outcome: ForgetOutcome, lang: Lang) -> Card:
    key = "memory.already_absent" if outcome.already_absent else "memory.forgotten"
    elements: list[Element] = [
        markdown(text(lang, key, path=escape(outcome.path))),
        row(button(text(lang, "memory.back"), actions.MEMORY_LIST)),
    ]
    return card(text(lang, "memory.forgotten_title"), "green", elements)
