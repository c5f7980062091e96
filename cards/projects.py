"""The Projects section of the owner's `/amux` card: each project with the chats bound to it
(an Unbind button each), a form binding a known chat to a project, and how long unused
checkouts are kept. Adding and removing projects stays on the CLI: it needs a path or a remote
on the Hub's host, and a credential the card must never carry."""

from __future__ import annotations

from typing import Any

from cards import actions
from cards.catalogue import text
from cards.elements import (
    CARD_MAX_BYTES,
    Card,
    Element,
    button,
    card,
    code,
    encoded_size,
    escape,
    form,
    hr,
    markdown,
    row,
    select,
)
from cards.models import ChatView, Lang, ManagementView, ProjectView

# Days an unused checkout is kept, offered as buttons; another saved number is shown as it is.
WORKTREE_CHOICES: tuple[int, ...] = (3, 7, 14, 30, 90)


def chat_label(chat: ChatView, lang: Lang, *, markup: bool = True) -> str:
    """How the card names a chat: a private chat by its person, others by their chat id
    (plain text for a drop-down option, which shows no markup)."""
    if chat.kind == "private":
        person = escape(chat.person) if markup else chat.person
        return text(lang, "manage.projects.private", person=person)
    chat_id = f"`{code(chat.chat_id)}`" if markup else chat.chat_id
    return text(lang, f"manage.projects.{chat.kind}", chat=chat_id)


def _size(elements: list[Element]) -> int:
    return sum(encoded_size(element) + 1 for element in elements)


def _project_line(project: ProjectView, lang: Lang) -> Element:
    # A policy of its own, in the words the card's permission buttons use.
    policy = (
        text(
            lang,
            "manage.projects.policy",
            policy=text(lang, f"manage.permissions.{project.permissions}"),
        )
        if project.permissions in ("ask", "auto", "read-only")
        else ""
    )
    line = text(
        lang,
        "manage.projects.line",
        name=escape(project.name),
        source=code(project.source),
        kind=text(lang, f"manage.projects.kind.{project.kind}"),
        branch=code(project.branch),
        provider=code(project.provider),
        policy=policy,
    )
    return markdown(line)


def _project(
    project: ProjectView, lang: Lang, draft: dict[str, Any], room: int
) -> list[Element] | None:
    """The project's line and a row per bound chat with its Unbind, as many as ``room`` bytes
    hold (the rest counted); None when not even its line fits."""
    elements: list[Element] = [_project_line(project, lang)]
    if not project.chats:
        elements.append(markdown(text(lang, "manage.projects.no_chats")))
        return elements if _size(elements) <= room else None
    more = text(lang, "manage.projects.more_chats", more=len(project.chats), name=project.name)
    if _size(elements) + _size([markdown(more)]) > room:
        return None
    rows: list[Element] = []
    for chat in project.chats:
        unbind = button(
            text(lang, "manage.projects.unbind"),
            actions.PROJECT_UNBIND,
            **{**draft, "chat_id": chat.chat_id, "project": project.name},
        )
        candidate = row(markdown(f"- {chat_label(chat, lang)}"), unbind)
        if _size(elements + rows) + _size([candidate, markdown(more)]) > room:
            break
        rows.append(candidate)
    elements += rows
    hidden = project.more_chats + len(project.chats) - len(rows)
    if hidden:
        more = text(lang, "manage.projects.more_chats", more=hidden, name=project.name)
        elements.append(markdown(more))
    return elements


def _bind_form(view: ManagementView, lang: Lang, draft: dict[str, Any], room: int) -> list[Element]:
    """The bind form with as many of the chats to offer as ``room`` bytes hold."""
    projects = view.projects
    if not projects.projects:
        return []
    if not projects.bindable:
        return [markdown(text(lang, "manage.projects.nothing_to_bind"))]
    submit = button(
        text(lang, "manage.projects.bind"), actions.PROJECT_BIND, kind="primary", **draft
    )
    names = select(
        "project",
        text(lang, "manage.projects.choose_project"),
        [(p.name, p.name) for p in projects.projects],
    )
    offered = list(projects.bindable)
    while True:
        chats = select(
            "chat_id",
            text(lang, "manage.projects.choose_chat"),
            [(chat_label(chat, lang, markup=False), chat.chat_id) for chat in offered],
        )
        elements = [
            markdown(text(lang, "manage.projects.bind_title")),
            form("project_bind", [chats, names], submit),
        ]
        if len(offered) == 1 or _size(elements) <= room:
            return elements
        offered = offered[: len(offered) * 3 // 4]


def projects_section(
    view: ManagementView, lang: Lang, draft: dict[str, Any], room: int = CARD_MAX_BYTES
) -> list[Element]:
    """The owner's Projects section, within ``room`` bytes of card JSON: what does not fit is
    counted and left to the CLI. Each button carries the settings draft, so an unsaved draft
    stays on the card."""
    projects = view.projects
    head: list[Element] = [hr(), markdown(text(lang, "manage.projects"))]
    if not projects.projects:
        head.append(markdown(text(lang, "manage.projects.none")))
    days = view.worktree_days
    choices = WORKTREE_CHOICES if days in WORKTREE_CHOICES else (*WORKTREE_CHOICES, days)
    tail: list[Element] = [
        markdown(text(lang, "manage.projects.add_hint")),
        markdown(text(lang, "manage.worktree_days", days=days)),
        row(
            *(
                button(
                    text(lang, "value.days", days=choice),
                    actions.WORKTREE_DAYS_SET,
                    kind="primary" if choice == days else "default",
                    **{**draft, "worktree_days": choice},
                )
                for choice in sorted(choices)
            )
        ),
    ]
    room -= _size(head) + _size(tail)
    # The form first (binding is what the owner comes for), within half of what is left.
    bind = _bind_form(view, lang, draft, room // 2)
    room -= _size(bind)
    listed: list[Element] = []
    shown = 0
    for project in projects.projects:
        more = markdown(text(lang, "manage.projects.more", more=len(projects.projects)))
        part = _project(project, lang, draft, room - _size(listed) - _size([more]))
        if part is None:
            break
        listed += part
        shown += 1
    hidden = projects.more_projects + len(projects.projects) - shown
    if hidden:
        listed.append(markdown(text(lang, "manage.projects.more", more=hidden)))
    return head + listed + bind + tail


def binding_card(said: str, project: str, lang: Lang) -> Card:
    """A bound group's answer to ``/amux project``: ``said`` (the binding, card markdown) and
    the button that opens the project's memory, which this group's turns share."""
    memory = button(text(lang, "project.memory_button"), actions.MEMORY_LIST)
    hint = text(lang, "project.memory_hint", project=escape(project))
    return card(text(lang, "manage.title"), "blue", [markdown(said), markdown(hint), row(memory)])
