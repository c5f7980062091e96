"""The Projects section of the owner's `/amux` card: what it shows, and its binds and unbinds.

The rules are the Hub's (``hub.projects``: which projects exist, one project per chat, an
unbind only from the project the card showed); this module only knows which chats the bot has
met, so a bind names one of those, and words each refusal for the card. The action table lets
only the owner's clicks reach it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from cards.catalogue import plain_text, text
from cards.elements import escape
from cards.models import ChatView, Lang, ProjectsView, ProjectView
from cards.projects import chat_label
from hub.errors import AmuxError, Conflict, InvalidArgument, NotFound
from hub.principals import Principal
from hub.services import Hub

logger = logging.getLogger("amux.bot")

# At most this many reach the card, which shows what fits Feishu's card size and counts the
# rest; the CLI lists everything.
PROJECTS_SHOWN = 20
CHATS_SHOWN = 10
CHATS_OFFERED = 30


# Posts a text to a chat: how a chat bound or unbound from the card learns of it.
Tell = Callable[[str, str], Awaitable[object]]


class ProjectCards:
    """The owner's view of projects and bindings on the card, and the card's changes to them."""

    def __init__(self, hub: Hub, lang: Lang, tell: Tell | None = None) -> None:
        self._hub = hub
        self._lang = lang
        self._tell = tell
        self._telling: set[asyncio.Task[None]] = set()

    def _told(self, chat_id: str, said: str) -> None:
        """Tell the chat what changed for it, as ``/amux project bind`` typed there would: its
        members' turns now work in the project (and, in a group, share its memory). In the
        background: Feishu waits only a few seconds for the card, and a retried post may take
        longer. The binding stands whether Feishu takes the message or not."""
        if self._tell is None:
            return
        tell = self._tell

        async def post() -> None:
            try:
                await tell(chat_id, said)
            except AmuxError as error:
                logger.warning("a chat was not told of its project binding: %s", error.message)

        task = asyncio.create_task(post())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    def known_chats(self) -> dict[str, ChatView]:
        """The chats the bot has met, newest first: private chats by their person, the groups
        it was spoken to in, and any other bound chat."""
        people, projects = self._hub.people, self._hub.projects
        chats: dict[str, ChatView] = {}
        for chat_id, person in people.private_chats():
            chats.setdefault(chat_id, ChatView(chat_id, "private", person.label))
        for chat_id in self._hub.chats.groups():
            chats.setdefault(chat_id, ChatView(chat_id, "group"))
        for project in projects.all():
            for binding in projects.chats(project.name):
                chats.setdefault(binding.chat_id, ChatView(binding.chat_id, "chat"))
        return chats

    def view(self) -> ProjectsView:
        projects = self._hub.projects
        chats = self.known_chats()
        everything = projects.all()
        shown: list[ProjectView] = []
        bound: set[str] = set()
        for project in everything:
            bindings = projects.chats(project.name)
            bound.update(b.chat_id for b in bindings)
            if len(shown) == PROJECTS_SHOWN:
                continue
            listed = tuple(chats[b.chat_id] for b in bindings[:CHATS_SHOWN])
            shown.append(
                ProjectView(
                    project.name,
                    project.kind,
                    project.source,
                    project.default_branch,
                    project.provider,
                    project.permissions,
                    listed,
                    len(bindings) - len(listed),
                )
            )
        bindable = tuple(c for c in chats.values() if c.chat_id not in bound)[:CHATS_OFFERED]
        return ProjectsView(tuple(shown), len(everything) - len(shown), bindable)

    def _label(self, chat_id: str) -> str:
        known = self.known_chats().get(chat_id)
        if known is None:  # Only a forged value names a chat the bot never met.
            return text(self._lang, "manage.projects.chat", chat=escape(chat_id))
        return chat_label(known, self._lang)

    def _refused(self, reason: str, code: str) -> str:
        """``reason`` is card markdown: the caller escapes what it did not word itself."""
        logger.info("a project binding change from the card was refused: %s", code)
        return text(self._lang, "manage.projects.refused", reason=reason, code=code)

    async def bind(self, by: Principal, form: dict[str, Any]) -> str:
        """Bind the chat the form chose to the project it chose; the notice for the card (what
        was done, or why nothing was)."""
        lang = self._lang
        chat_id = str(form.get("chat_id") or "")
        name = str(form.get("project") or "")
        invalid = InvalidArgument.code
        if not chat_id:
            return self._refused(text(lang, "manage.projects.pick_chat"), invalid)
        if not name:
            return self._refused(text(lang, "manage.projects.pick_project"), invalid)
        if chat_id not in self.known_chats():
            # A value no card offered: the bot binds only chats it has met.
            unknown = text(lang, "manage.projects.unknown_chat", chat=escape(chat_id))
            return self._refused(unknown, invalid)
        label = self._label(chat_id)
        try:
            project = await self._hub.projects.bind(chat_id, name, by.id)
        except Conflict as error:
            current = escape(str(error.details.get("project") or ""))
            bound = text(lang, "manage.projects.already_bound", chat=label, project=current)
            return self._refused(bound, error.code)
        except AmuxError as error:
            return self._refused(escape(error.message), error.code)
        logger.info("a chat bound to project %s from the card by %s", project.name, by.label)
        group = self._hub.people.private_chat_holder(chat_id) is None
        memory = text(lang, "project.memory.group" if group else "project.memory.private")
        self._told(
            chat_id,
            plain_text(
                lang,
                "project.bound",
                project=project.name,
                branch=project.default_branch,
                memory=memory,
            ),
        )
        return text(lang, "manage.projects.bound", chat=label, project=project.name)

    async def unbind(self, by: Principal, chat_id: str, shown: str) -> str:
        """Unbind ``chat_id`` if it is still bound to ``shown``, the project the card showed;
        the notice for the card."""
        lang = self._lang
        label = self._label(chat_id)
        try:
            project = await self._hub.projects.unbind(chat_id, expected=shown or None)
        except NotFound as error:
            return self._refused(text(lang, "manage.projects.not_bound", chat=label), error.code)
        except Conflict as error:
            current = escape(str(error.details.get("project") or ""))
            moved = text(
                lang, "manage.projects.moved", chat=label, project=current, shown=escape(shown)
            )
            return self._refused(moved, error.code)
        logger.info("a chat unbound from project %s from the card by %s", project.name, by.label)
        self._told(chat_id, plain_text(lang, "project.unbound", project=project.name))
        return text(lang, "manage.projects.unbound", chat=label, project=project.name)
