"""People: who an outside id names, newcomers enrolled, and aliases moved, for the bot in the
Hub's own process.

The rows are ``hub.state``'s (``principals``, ``aliases``); this service is the door to them for
callers outside hub/, and owns, through ``hub.aliases``, the ``feishu.app`` setting and the
``feishu_p2p_chat`` aliases. The rules are the Hub's and have one home here: the aliases of one
event name one Principal or none, nothing is ever merged, a newcomer and its aliases are one
commit, and a name is never reused. What the ids mean, whom to admit and what to say to them
are the caller's (``bot.identity``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from hub.aliases import FeishuApp, bind_pending, is_feishu_kind, recorded_app
from hub.errors import Conflict, NotFound
from hub.principals import Principal, clean_display_name
from hub.state import State

# A private chat with the bot belongs to one person: an alias of theirs, keyed by the chat.
PRIVATE_CHAT_ALIAS = "feishu_p2p_chat"


@dataclass(frozen=True)
class Alias:
    kind: str
    value: str


@dataclass(frozen=True)
class TwoPrincipals:
    """The aliases of one event belong to more than one Principal."""

    principal_ids: tuple[str, ...]


@dataclass(frozen=True)
class OtherIds:
    """The Principal they name already has another value of these kinds."""

    principal_id: str
    kinds: tuple[str, ...]


Mismatch = TwoPrincipals | OtherIds


@dataclass(frozen=True)
class Resolved:
    """Whom the aliases name: ``principal`` None when nobody, and nobody was enrolled."""

    principal: Principal | None
    enrolled: bool = False
    # Aliases another Principal took in between (an admin command): left as they were.
    taken: tuple[Alias, ...] = ()


class People:
    def __init__(self, state: State) -> None:
        self._state = state

    def principal(self, principal_id: str) -> Principal | None:
        return self._state.principal(principal_id)

    def owner(self) -> Principal | None:
        return self._state.owner()

    def aliases(self, principal_id: str) -> list[Alias]:
        return [Alias(kind, value) for kind, value in self._state.aliases(principal_id)]

    def set_display_name(self, principal_id: str, raw: str, at: float) -> Principal | None:
        """Record the name people know ``principal_id`` by (cleaned of what could redraw a line
        or hide characters) as read at ``at``; the Principal as it now is. An empty name keeps
        the one known: Feishu answers none for someone the app may no longer see."""
        known = self._state.principal(principal_id)
        if known is None:
            return None
        name = clean_display_name(raw) or known.display_name
        self._state.set_display_name(principal_id, name, at)
        return self._state.principal(principal_id)

    def display_name_at(self, principal_id: str) -> float:
        """When the display name was last read (0: never)."""
        return self._state.display_name_at(principal_id)

    def has_feishu_identity(self, principal_id: str) -> bool:
        return any(is_feishu_kind(kind) for kind, _ in self._state.aliases(principal_id))

    def resolve(self, aliases: Sequence[Alias], enrol_as: str | None) -> Resolved | Mismatch:
        """The one Principal ``aliases`` name, given the ones it lacks; else, with ``enrol_as``
        (a name to start from) and some aliases, a new Principal holding them."""
        known = self.holder(aliases)
        if isinstance(known, TwoPrincipals | OtherIds):
            return known
        if known is not None:
            return Resolved(known, taken=self._remember(known, aliases))
        if enrol_as is None or not aliases:
            return Resolved(None)
        # The Principal and its aliases in one commit: a first contact runs on the event loop,
        # and a burst of newcomers would otherwise wait for a sync per row.
        with self._state.transaction():
            principal = self._state.add_principal(self._free_name(enrol_as), "user")
            taken = self._remember(principal, aliases)
        return Resolved(principal, enrolled=True, taken=taken)

    def holder(self, aliases: Sequence[Alias]) -> Principal | Mismatch | None:
        """The one Principal these aliases name, if any, provided they all fit it."""
        holders: dict[str, Principal] = {}
        for alias in aliases:
            holder = self._state.principal_by_alias(alias.kind, alias.value)
            if holder is not None:
                holders[holder.id] = holder
        if len(holders) > 1:
            return TwoPrincipals(tuple(sorted(holders)))
        if not holders:
            return None
        (principal,) = holders.values()
        has: dict[str, set[str]] = {}
        for kind, value in self._state.aliases(principal.id):
            has.setdefault(kind, set()).add(value)
        differ = tuple(a.kind for a in aliases if has.get(a.kind) and a.value not in has[a.kind])
        return OtherIds(principal.id, differ) if differ else principal

    def _remember(self, principal: Principal, aliases: Sequence[Alias]) -> tuple[Alias, ...]:
        taken: list[Alias] = []
        for alias in aliases:
            holder = self._state.principal_by_alias(alias.kind, alias.value)
            if holder is not None and holder.id == principal.id:
                continue  # Known already: a read, where adding would take the write lock.
            try:
                self._state.add_alias(principal.id, alias.kind, alias.value)
            except Conflict:
                taken.append(alias)
        return tuple(taken)

    def _free_name(self, base: str) -> str:
        name = base
        for suffix in range(2, 1000):
            try:
                self._state.principal_by_name(name)
            except NotFound:
                return name
            name = f"{base}-{suffix}"
        return f"{base}-{secrets.token_hex(4)}"

    def move_aliases(self, aliases: Sequence[Alias], principal_id: str) -> None:
        """Give ``aliases`` to ``principal_id``, from whoever held them (the owner's claim)."""
        for alias in aliases:
            self._state.move_alias(alias.kind, alias.value, principal_id)

    # -- the bot's Feishu app --------------------------------------------------------------------

    def recorded_app(self) -> FeishuApp | None:
        return recorded_app(self._state)

    def bind_app(self, app: FeishuApp) -> list[tuple[str, str]]:
        """Record ``app``; the (kind, principal id) of waiting aliases left unbound (see
        :func:`hub.aliases.bind_pending`)."""
        return bind_pending(self._state, app)

    # -- private chats ---------------------------------------------------------------------------

    def private_chat_holder(self, chat_id: str) -> Principal | None:
        """Whose private chat with the bot ``chat_id`` is, as last seen."""
        return self._state.principal_by_alias(PRIVATE_CHAT_ALIAS, chat_id) if chat_id else None

    def private_chats(self) -> list[tuple[str, Principal]]:
        """Every private chat with the bot whose person is known, newest first."""
        return self._state.alias_holders(PRIVATE_CHAT_ALIAS)

    def note_private_chat(self, chat_id: str, principal: Principal) -> None:
        """Remember ``chat_id`` as ``principal``'s private chat (learned from a signed event)."""
        holder = self.private_chat_holder(chat_id)
        if chat_id and (holder is None or holder.id != principal.id):
            self._state.move_alias(PRIVATE_CHAT_ALIAS, chat_id, principal.id)
