"""The card action table: each name in ``cards.actions`` routed to one handler, as bolt registers
listeners by action id.

A click's value comes back from the client as it likes (forged, or replayed from a card weeks
old), so the table does once, before any handler runs, what every handler would otherwise repeat:

- an action this version does not know, or a value naming none, is logged and the card is left
  as it is;
- an owner-only action (``cards.actions.OWNER_ONLY``) from anyone else gets the Owner only card,
  or for an action answered with a toast, an Owner only toast and the card left as it is;
- the value is parsed into the route's typed value, and a value the setting refuses, like any
  Hub error of the handler, is answered readably: an error card, or an error toast for the
  actions that answer with a toast (their card belongs to a running turn, which updates it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from bot.feishu.events import CardAction, CardResponse
from cards import actions
from cards.catalogue import text
from cards.elements import Card
from cards.models import Lang
from cards.notices import error_card, owner_only_card
from cards.schedules import CHANGES
from hub.errors import AmuxError, InvalidArgument, InvalidPath
from hub.memory import ABSENT
from hub.principals import Principal
from hub.sysconfig import SPECS

if TYPE_CHECKING:
    from bot.conversations import Conversations
    from bot.management import Management

logger = logging.getLogger("amux.bot")

Value = dict[str, Any]
V = TypeVar("V")


@dataclass(frozen=True)
class Click:
    """One card click with its clicker resolved: what every handler gets besides its value."""

    principal: Principal
    action: str
    # As the card sent it; handlers read their typed value instead.
    value: Value
    form: Value
    message_id: str
    chat_id: str


# -- typed values, one parser per shape of value --------------------------------------------


def no_value(value: Value) -> None:
    """Actions that carry no fields."""
    return None


def raw_value(value: Value) -> Value:
    """``memory.undo``, whose handler reads its own fields."""
    return value


@dataclass(frozen=True)
class RunRef:
    """``run.cancel``: the execution to stop."""

    run_id: str

    @classmethod
    def parse(cls, value: Value) -> RunRef:
        return cls(str(value.get("run_id") or ""))


@dataclass(frozen=True)
class Extension:
    """``budget.extend``: the extension request the owner grants; whose and how much are the
    Hub's record of the request, never the card's. Empty on a card from before requests."""

    request: str

    @classmethod
    def parse(cls, value: Value) -> Extension:
        request = value.get("request")
        return cls(request if isinstance(request, str) else "")


@dataclass(frozen=True)
class RunAnswer:
    """``run.approve``: a decision on one permission request; the Hub checks it and who sent it."""

    run_id: str
    request_id: str
    decision: str

    @classmethod
    def parse(cls, value: Value) -> RunAnswer:
        return cls(
            str(value.get("run_id") or ""),
            str(value.get("request_id") or ""),
            str(value.get("decision") or ""),
        )


@dataclass(frozen=True)
class Renewal:
    """``conversation.new``: the topic whose next message starts a new conversation."""

    origin: str

    @classmethod
    def parse(cls, value: Value) -> Renewal:
        return cls(str(value.get("origin") or ""))


@dataclass(frozen=True)
class ProviderChoice:
    """``provider.set``: the Agent chosen. The chat is the click's own, never the value's."""

    provider: str

    @classmethod
    def parse(cls, value: Value) -> ProviderChoice:
        return cls(str(value.get("provider") or ""))


def _path(value: Value, field: str = "path") -> str:
    """A document path a card carries; the store checks the rest of its rules.

    Raises:
        InvalidPath: no path, or one that is not text.
    """
    path = value.get(field)
    if not isinstance(path, str):
        raise InvalidPath(f"{field} must be a string")
    return path


def _optional_path(value: Value, field: str = "path") -> str | None:
    """A path a card may carry; None when it carries none (or an empty one).

    Raises:
        InvalidPath: one that is not text, which is never taken for "none".
    """
    path = value.get(field)
    return None if path is None or path == "" else _path(value, field)


def _revision(value: Value, field: str, default: str = "") -> str:
    """A revision a card carries, ``default`` when it carries none; the store checks its form.

    Raises:
        InvalidArgument: one that is not text.
    """
    revision = value.get(field)
    if not revision:
        return default
    if not isinstance(revision, str):
        raise InvalidArgument(f"{field} must be a string")
    return revision


@dataclass(frozen=True)
class ListRequest:
    """``memory.list``: the documents under ``path_prefix``, or all of them."""

    path_prefix: str | None

    @classmethod
    def parse(cls, value: Value) -> ListRequest:
        prefix = value.get("path_prefix")
        return cls(None if prefix is None else _path(value, "path_prefix"))


@dataclass(frozen=True)
class SearchForm:
    """``memory.search``: the keywords typed into the card's form (its value carries none)."""

    query: str

    @classmethod
    def parse(cls, form: Value) -> SearchForm:
        return cls(str(form.get("query") or "").strip())


@dataclass(frozen=True)
class OpenRequest:
    """``memory.open``: the document, from ``offset`` (a byte offset) when continuing."""

    path: str
    offset: int | None

    @classmethod
    def parse(cls, value: Value) -> OpenRequest:
        """Raises: InvalidArgument: no path, or an offset that is no whole number."""
        offset = value.get("offset")
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int)):
            raise InvalidArgument("offset must be an integer")
        return cls(_path(value), offset)


@dataclass(frozen=True)
class DocumentRef:
    """``memory.forget.ask`` and ``memory.forget.confirm``: a document at the revision shown."""

    path: str
    revision: str

    @classmethod
    def parse(cls, value: Value) -> DocumentRef:
        """Raises: InvalidArgument: no path, or a path or revision that is not text."""
        return cls(_path(value), _revision(value, "revision"))


@dataclass(frozen=True)
class MemoryTarget:
    """``memory.history``, ``memory.erase.ask`` and ``memory.erase.confirm``: one document, or
    with ``path`` None the caller's whole memory."""

    path: str | None

    @classmethod
    def parse(cls, value: Value) -> MemoryTarget:
        """Raises: InvalidPath: a path that is not text (never taken for the whole memory)."""
        return cls(_optional_path(value))


@dataclass(frozen=True)
class Restore:
    """``memory.restore``: the kept ``revision`` of a document still at ``expected_revision``."""

    path: str
    revision: str
    expected_revision: str

    @classmethod
    def parse(cls, value: Value) -> Restore:
        """Raises: InvalidArgument: no path, or a path or revision that is not text."""
        return cls(
            _path(value),
            _revision(value, "revision"),
            _revision(value, "expected_revision", ABSENT),
        )


def _setting(value: Any, key: str) -> int | None:
    """A number a card carries for setting ``key``, parsed as the setting itself parses it;
    None when an older card carries none (the saved value stays).

    Raises:
        InvalidArgument: not a number the setting accepts.
    """
    if value is None:
        return None
    spec = SPECS[key]
    try:
        return int(spec.parse(value))
    except InvalidArgument as err:
        raise InvalidArgument(f"{spec.key}: {err.message}") from None


@dataclass(frozen=True)
class Draft:
    """The settings draft a management click carries; None is what the card lacks (an older
    card, or a value that is no switch), which keeps the saved value."""

    memory_enabled: bool | None
    isolation: bool | None
    history_days: int | None
    max_queued: int | None
    messages_per_minute: int | None
    # The revision of the saved settings the draft was built from ("" on an older card).
    revision: str = ""

    @classmethod
    def parse(cls, value: Value) -> Draft:
        """Every number checked before any is used, so a refused one saves nothing of the click.

        Raises:
            InvalidArgument: a value the setting would refuse.
        """
        memory, isolation = value.get("memory_enabled"), value.get("isolation")
        revision = value.get("settings_revision")
        return cls(
            memory if isinstance(memory, bool) else None,
            isolation if isinstance(isolation, bool) else None,
            _setting(value.get("history_days"), "memory.history_days"),
            _setting(value.get("max_queued"), "turns.max_queued_per_principal"),
            _setting(value.get("messages_per_minute"), "feishu.messages_per_minute"),
            revision if isinstance(revision, str) else "",
        )


@dataclass(frozen=True)
class LiveChange:
    """``agents.permissions`` and ``agents.timeout``: a setting saved at once (the Hub checks
    its value), and the draft the card shows beside it."""

    key: str
    value: Any
    draft: Draft

    @staticmethod
    def of(key: str, field: str) -> Callable[[Value], LiveChange]:
        def parse(value: Value) -> LiveChange:
            # The draft first: a refused draft saves nothing, the live setting included.
            draft = Draft.parse(value)
            return LiveChange(key, value.get(field), draft)

        return parse


@dataclass(frozen=True)
class UnbindRequest:
    """``project.unbind``: the chat to unbind from the project the card showed, and the draft
    the card carries beside it."""

    chat_id: str
    project: str
    draft: Draft

    @classmethod
    def parse(cls, value: Value) -> UnbindRequest:
        """Raises: InvalidArgument: a draft value the setting would refuse."""
        return cls(
            str(value.get("chat_id") or ""), str(value.get("project") or ""), Draft.parse(value)
        )


@dataclass(frozen=True)
class ScheduleChange:
    """``schedule.change``: which schedule and what to do with it; whether the clicker may is
    the Hub's to decide from the stored schedule, never the card's."""

    schedule_id: str
    change: str
    draft: Draft

    @classmethod
    def parse(cls, value: Value) -> ScheduleChange:
        """Raises: InvalidArgument: an unknown change, or a draft value a setting refuses."""
        change = value.get("change")
        if change not in CHANGES:
            raise InvalidArgument("unknown schedule change")
        return cls(str(value.get("schedule") or "")[:32], str(change), Draft.parse(value))


# -- the table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route(Generic[V]):
    """How one action is answered: its value's parser, its handler, and how errors are shown."""

    action: str
    parse: Callable[[Value], V]
    handle: Callable[[Click, V], Awaitable[CardResponse | None]]
    answer: Literal["card", "toast"]

    @property
    def owner_only(self) -> bool:
        # The wire vocabulary is the one home of who may click what.
        return self.action in actions.OWNER_ONLY


class ActionTable:
    """Card action names to their routes; dispatches a click through the checks every action
    shares."""

    def __init__(self, lang: Lang) -> None:
        self._lang = lang
        self._routes: dict[str, Route[Any]] = {}

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._routes)

    def card(
        self,
        action: str,
        parse: Callable[[Value], V],
        handler: Callable[[Click, V], Awaitable[Card | None]],
    ) -> None:
        """Answer ``action`` with the card ``handler`` returns in place of the clicked one.

        Raises:
            ValueError: not a name of ``cards.actions``, or one already routed.
        """

        async def answer(click: Click, value: V) -> CardResponse | None:
            card = await handler(click, value)
            return None if card is None else CardResponse(card=card)

        self._add(Route(action, parse, answer, "card"))

    def toast(
        self,
        action: str,
        parse: Callable[[Value], V],
        handler: Callable[[Click, V], Awaitable[CardResponse]],
    ) -> None:
        """Answer ``action`` with the toast ``handler`` returns; the card stays as it is.

        Raises:
            ValueError: not a name of ``cards.actions``, or one already routed.
        """
        self._add(Route(action, parse, handler, "toast"))

    def _add(self, route: Route[Any]) -> None:
        if route.action not in actions.ALL:
            raise ValueError(f"unknown card action {route.action!r}")
        if route.action in self._routes:
            raise ValueError(f"card action {route.action!r} is routed twice")
        self._routes[route.action] = route

    async def dispatch(self, event: CardAction, principal: Principal) -> CardResponse | None:
        """Answer one click of ``principal``; None leaves the card as it is."""
        name = event.value.get("action")
        # A list or dict here is no action of ours (and unhashable for the lookup).
        route = self._routes.get(name) if isinstance(name, str) else None
        if route is None:
            logger.warning("unknown card action %r", name)
            return None
        if route.owner_only and not principal.is_owner:
            logger.warning(
                "refused owner-only card action %s from %s", route.action, principal.name
            )
            if route.answer == "toast":
                # The card is shared (a request in the owner's chat): it stays as it is.
                refused = text(self._lang, "notice.owner_only.toast")
                return CardResponse(toast=refused, toast_type="error")
            return CardResponse(card=owner_only_card(self._lang))
        click = Click(
            principal,
            route.action,
            event.value,
            event.form_value or {},
            event.open_message_id,
            event.chat_id,
        )
        try:
            return await route.handle(click, route.parse(event.value))
        except AmuxError as error:
            if route.answer == "toast":
                return CardResponse(toast=error.message, toast_type="error")
            return CardResponse(card=error_card(error.code, error.message, self._lang))


class TurnActions:
    """The actions on a turn's own cards, answered with a toast: the card belongs to the turn,
    whose follower updates it."""

    def __init__(self, management: Management, conversations: Conversations, lang: Lang) -> None:
        self._management = management
        self._conversations = conversations
        self._lang = lang

    async def cancel(self, click: Click, run: RunRef) -> CardResponse:
        cancelled = await self._conversations.cancel(run.run_id, click.principal)
        if not cancelled:
            return CardResponse(toast=text(self._lang, "run.toast.not_yours"), toast_type="error")
        return CardResponse(toast=text(self._lang, "run.toast.cancelling"), toast_type="info")

    async def approve(self, click: Click, answer: RunAnswer) -> CardResponse:
        # The Hub decides who may answer (the turn's person or the owner), whatever the
        # (forgeable) value says; the card shows the answer when the turn's follower sees it.
        message, kind = await self._conversations.approve(
            answer.run_id, answer.request_id, answer.decision, click.principal
        )
        return CardResponse(toast=message, toast_type=kind)

    async def pull_request(self, click: Click, run: RunRef) -> CardResponse:
        # Which conversation, and whether the clicker takes part in it, is the Hub's record of
        # the turn; the card's run id only names it.
        _, opened = await self._conversations.pull_request(
            run.run_id, click.principal, click.message_id, click.chat_id
        )
        key = "result.pull_request.toast.opened" if opened else "result.pull_request.toast.updated"
        return CardResponse(toast=text(self._lang, key), toast_type="success")

    async def undo(self, click: Click, value: Value) -> CardResponse:
        message, undone = await self._management.undo(click.principal, value)
        return CardResponse(toast=message, toast_type="success" if undone else "error")

    async def extend(self, click: Click, extension: Extension) -> CardResponse:
        message, kind = await self._management.extend_budget(click.principal, extension.request)
        return CardResponse(toast=message, toast_type=kind)

    async def renew(self, click: Click, renewal: Renewal) -> CardResponse:
        renewed = await self._conversations.renew(renewal.origin, click.principal, click.chat_id)
        if renewed != "renewed":
            return CardResponse(
                toast=text(self._lang, f"conversation.{renewed}"), toast_type="error"
            )
        return CardResponse(toast=text(self._lang, "conversation.renewed"), toast_type="info")


def action_table(management: Management, conversations: Conversations, lang: Lang) -> ActionTable:
    """Every card action amux answers, and what answers it."""
    table = ActionTable(lang)
    turns = TurnActions(management, conversations, lang)
    table.toast(actions.RUN_CANCEL, RunRef.parse, turns.cancel)
    table.toast(actions.RUN_APPROVE, RunAnswer.parse, turns.approve)
    table.toast(actions.MEMORY_UNDO, raw_value, turns.undo)
    table.toast(actions.CONVERSATION_NEW, Renewal.parse, turns.renew)
    table.toast(actions.BUDGET_EXTEND, Extension.parse, turns.extend)
    table.toast(actions.PULL_REQUEST, RunRef.parse, turns.pull_request)

    table.card(actions.MANAGE_OPEN, no_value, management.open)
    # Each acts on the clicker's own account only; connecting, only in their private chat.
    table.card(actions.FEISHU_CONNECT, no_value, management.connect_feishu)
    table.card(actions.FEISHU_DISCONNECT, no_value, management.disconnect_feishu)
    table.card(actions.PROVIDER_SET, ProviderChoice.parse, management.choose_provider)
    for drafting in (
        actions.MEMORY_TOGGLE,
        actions.ISOLATION_TOGGLE,
        actions.HISTORY_DAYS,
        actions.QUEUED_MAX,
        actions.MESSAGES_RATE,
    ):
        table.card(drafting, Draft.parse, management.redraw)
    table.card(
        actions.PERMISSIONS_SET,
        LiveChange.of("agents.permissions", "permissions"),
        management.save_live,
    )
    table.card(
        actions.APPROVAL_TIMEOUT_SET,
        LiveChange.of("agents.approval_timeout", "approval_timeout"),
        management.save_live,
    )
    table.card(
        actions.BUDGET_DAILY_SET,
        LiveChange.of("budget.daily_tokens", "daily_tokens"),
        management.save_live,
    )
    table.card(
        actions.BUDGET_TURN_SET,
        LiveChange.of("budget.turn_tokens", "turn_tokens"),
        management.save_live,
    )
    table.card(
        actions.WORKTREE_DAYS_SET,
        LiveChange.of("projects.worktree_days", "worktree_days"),
        management.save_live,
    )
    table.card(actions.PROJECT_BIND, Draft.parse, management.bind_project)
    table.card(actions.PROJECT_UNBIND, UnbindRequest.parse, management.unbind_project)
    table.card(actions.SCHEDULE_CHANGE, ScheduleChange.parse, management.change_schedule)
    table.card(actions.SETTINGS_SAVE, Draft.parse, management.save_settings)
    table.card(actions.RESTART_NOW, no_value, management.restart_now)
    table.card(actions.RESTART_LATER, no_value, management.restart_later)

    table.card(actions.MEMORY_LIST, ListRequest.parse, management.memory_list)
    table.card(actions.MEMORY_SEARCH, no_value, management.memory_search)
    table.card(actions.MEMORY_OPEN, OpenRequest.parse, management.memory_open)
    table.card(actions.MEMORY_FORGET_ASK, DocumentRef.parse, management.forget_ask)
    table.card(actions.MEMORY_FORGET_CONFIRM, DocumentRef.parse, management.forget_confirm)
    table.card(actions.MEMORY_HISTORY, MemoryTarget.parse, management.memory_history)
    table.card(actions.MEMORY_RESTORE, Restore.parse, management.restore)
    table.card(actions.MEMORY_ERASE_ASK, MemoryTarget.parse, management.erase_ask)
    table.card(actions.MEMORY_ERASE_CONFIRM, MemoryTarget.parse, management.erase_confirm)
    return table
