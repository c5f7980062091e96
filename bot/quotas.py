"""Each Feishu sender's share: messages the bot answers, per minute, and the answer a refusal gets.

The limit is the running ``feishu.messages_per_minute``. Every message the bot would answer
counts (a turn, a command, a bare mention, a message answered with a refusal), and one over it
gets nothing done. The first refused message of a wait is told when to try again; the rest
until then get no answer, so a sender flooding the bot cannot spend the app's Feishu call
budget, which everyone shares, on answers or refusals either.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.feishu.ratelimit import SlidingWindow
from cards.elements import Card
from cards.models import Lang
from cards.notices import error_card, try_later_card
from hub.errors import AmuxError, QuotaExceeded

RATE_LIMITED = "rate_limited"
MINUTE = 60.0
# Senders remembered as told; past this, those whose wait is over are forgotten.
TOLD_KEYS = 10_000


@dataclass(frozen=True)
class Refusal:
    """A message over its sender's limit: seconds until one may go, and whether to say so."""

    retry_after: int
    tell: bool


class SenderLimit:
    """At most ``per_minute`` answered messages per sender in any minute (0: no limit)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._window = SlidingWindow(per_minute, MINUTE) if per_minute > 0 else None
        self._clock = clock
        self._told_until: dict[str, float] = {}

    def check(self, sender: str) -> Refusal | None:
        """None, with the message counted, when ``sender`` is within the limit."""
        if self._window is None:
            return None
        now = self._clock()
        wait = self._window.admit(sender, now)
        if wait <= 0:
            return None
        told = self._told_until.get(sender, 0.0) > now
        if not told:
            if len(self._told_until) >= TOLD_KEYS:
                self._told_until = {k: t for k, t in self._told_until.items() if t > now}
            self._told_until[sender] = now + wait
        return Refusal(max(1, math.ceil(wait)), tell=not told)

    def card(self, refusal: Refusal, lang: Lang) -> Card:
        return try_later_card("messages", self.per_minute, refusal.retry_after, RATE_LIMITED, lang)


def refusal_card(error: AmuxError, lang: Lang) -> Card:
    """The card for a refused submit: when to try again if waiting helps, else the error."""
    if isinstance(error, QuotaExceeded) and error.limit == "queued_turns":
        queued = error.details.get("queued")
        return try_later_card(
            "queued",
            queued if isinstance(queued, int) else 0,
            error.retry_after or 0,
            error.code,
            lang,
        )
    return error_card(error.code, error.message, lang)
