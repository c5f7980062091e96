"""The bot's own choices, kept by the Hub in its ``settings`` table under ``bot.``: the Agent of
each chat, the group chats the bot was spoken to in, and the restart card to update once the Hub
is back.

This module owns those keys, and nothing else writes them; the settings RPC lists and accepts
only ``hub.sysconfig``'s keys, never these. Renaming a stored key needs a migration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hub.state import State

CHAT_PROVIDER_KEY = "bot.chat_provider."
RESTART_CARD_KEY = "bot.restart_card"
# One key for every group (chat id to when it was first seen): settings are read whole.
KNOWN_GROUPS_KEY = "bot.groups"
# The newest kept; an older group can still be bound from inside it.
MAX_KNOWN_GROUPS = 200

Choice = Literal["saved", "unknown_provider", "no_chat"]


class ChatPreferences:
    """Which Agent each chat's new conversations run, and which group chats the bot knows."""

    def __init__(self, state: State, providers: Callable[[], tuple[str, ...]]) -> None:
        self._state = state
        self._providers = providers
        self._groups: dict[str, float] | None = None

    def _known_groups(self) -> dict[str, float]:
        if self._groups is None:
            stored = self._state.saved_settings().get(KNOWN_GROUPS_KEY)
            groups = stored if isinstance(stored, dict) else {}
            self._groups = {
                str(chat): float(at) for chat, at in groups.items() if isinstance(at, int | float)
            }
        return self._groups

    def note_group(self, chat_id: str) -> None:
        """Remember ``chat_id`` as a group chat the bot was spoken to in (learned from a signed
        message event). Only a group not yet known is written: this runs for every message."""
        groups = self._known_groups()
        if not chat_id or chat_id in groups:
            return
        added = {**groups, chat_id: time.time()}
        newest = sorted(added.items(), key=lambda item: item[1])[-MAX_KNOWN_GROUPS:]
        self._state.save_setting(KNOWN_GROUPS_KEY, dict(newest))
        self._groups = dict(newest)

    def groups(self) -> list[str]:
        """The group chats the bot knows, newest first."""
        known = self._known_groups()
        return sorted(known, key=lambda chat: known[chat], reverse=True)

    @property
    def providers(self) -> tuple[str, ...]:
        """The Agents a chat may choose: those turns may name."""
        return self._providers()

    def provider(self, chat_id: str) -> str | None:
        """The Agent chosen for ``chat_id``, if one was."""
        chosen = self._state.saved_settings().get(CHAT_PROVIDER_KEY + chat_id)
        return chosen if isinstance(chosen, str) and chosen else None

    def choose_provider(self, chat_id: str, provider: str) -> Choice:
        """Save ``provider`` as ``chat_id``'s Agent, if it is one turns may name."""
        if provider not in self.providers:
            return "unknown_provider"
        if not chat_id:
            return "no_chat"
        self._state.save_setting(CHAT_PROVIDER_KEY + chat_id, provider)
        return "saved"


@dataclass(frozen=True)
class RestartCard:
    """The card a restart was asked from, and who asked."""

    message_id: str
    principal_id: str


class RestartCards:
    """The one card to update after a restart, kept across it."""

    def __init__(self, state: State) -> None:
        self._state = state

    def remember(self, card: RestartCard) -> None:
        value = {"message_id": card.message_id, "principal_id": card.principal_id}
        self._state.save_setting(RESTART_CARD_KEY, value)

    def take(self) -> RestartCard | None:
        """The card remembered, forgotten as it is taken: it is updated once."""
        pending = self._state.saved_settings().get(RESTART_CARD_KEY)
        if not isinstance(pending, dict):
            return None
        self._state.save_setting(RESTART_CARD_KEY, None)
        message_id = pending.get("message_id")
        principal_id = str(pending.get("principal_id"))
        return RestartCard(message_id if isinstance(message_id, str) else "", principal_id)
