"""The bot's own choices, kept by the Hub in its ``settings`` table under ``bot.``: the Agent of
each chat and the restart card to update once the Hub is back.

This module owns those keys, and nothing else writes them; the settings RPC lists and accepts
only ``hub.sysconfig``'s keys, never these. Renaming a stored key needs a migration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hub.state import State

CHAT_PROVIDER_KEY = "bot.chat_provider."
RESTART_CARD_KEY = "bot.restart_card"

Choice = Literal["saved", "unknown_provider", "no_chat"]


class ChatPreferences:
    """Which Agent each chat's new conversations run."""

    def __init__(self, state: State, providers: Callable[[], tuple[str, ...]]) -> None:
        self._state = state
        self._providers = providers

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
