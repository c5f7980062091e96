"""Feishu people → Hub Principals, and the one-time owner claim.

``union_id`` is stable across one developer's apps, so it is the preferred key; ``user_id`` next;
``open_id`` (per app) is kept as an alias too because replies address people by it.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import Callable
from enum import Enum

from bot.feishu.events import UserIds
from hub.errors import Conflict, NotFound
from hub.state import Principal, State

logger = logging.getLogger("amux.bot")

ALIAS_KINDS = (
    ("feishu_union_id", "union_id"),
    ("feishu_user_id", "user_id"),
    ("feishu_open_id", "open_id"),
)


# Long enough to read the log and open a chat with the bot; short enough that a code seen in an
# old log (or a leaked one) is worthless.
CLAIM_SECONDS = 30 * 60


class ClaimRefused(Enum):
    """Why ``/amux claim CODE`` did not make the sender the owner."""

    WRONG = "wrong"
    EXPIRED = "expired"
    USED = "used"


def _aliases(ids: UserIds) -> list[tuple[str, str]]:
    return [(kind, getattr(ids, field)) for kind, field in ALIAS_KINDS if getattr(ids, field)]


class FeishuIdentities:
    """Resolves senders to Principals, enrolling newcomers when the Hub allows it."""

    def __init__(
        self, state: State, *, enroll: bool, clock: Callable[[], float] = time.time
    ) -> None:
        self._state = state
        self._enroll = enroll
        self._clock = clock
        self.claim_code: str | None = None
        # Wall-clock seconds, so the log can say when the code stops working.
        self.claim_expires_at: float | None = None
        self._used_code: str | None = None

    def resolve(self, ids: UserIds) -> Principal | None:
        """The sender's Principal, created on first contact when enrollment is open."""
        known = self.find(ids)
        if known is not None:
            self._remember(known, ids)
            return known
        if not self._enroll or not _aliases(ids):
            return None
        # The Principal and its aliases in one commit: a first contact runs on the event loop,
        # and a burst of newcomers would otherwise wait for a sync per row.
        with self._state.transaction():
            principal = self._state.add_principal(self._new_name(ids), "user")
            self._remember(principal, ids)
        logger.info("enrolled a new Feishu user as principal %s", principal.name)
        return principal

    def find(self, ids: UserIds) -> Principal | None:
        for kind, value in _aliases(ids):
            principal = self._state.principal_by_alias(kind, value)
            if principal is not None:
                return principal
        return None

    def _remember(self, principal: Principal, ids: UserIds) -> None:
        for kind, value in _aliases(ids):
            holder = self._state.principal_by_alias(kind, value)
            if holder is not None and holder.id == principal.id:
                continue  # Known already: a read, where adding would take the write lock.
            try:
                self._state.add_alias(principal.id, kind, value)
            except Conflict:
                # Another Principal owns this id already; resolution above preferred ours.
                logger.warning("Feishu %s of %s belongs to another principal", kind, principal.name)

    def _new_name(self, ids: UserIds) -> str:
        base = "feishu-" + (ids.union_id or ids.user_id or ids.open_id)[-10:]
        name = base
        for suffix in range(2, 1000):
            try:
                self._state.principal_by_name(name)
            except NotFound:
                return name
            name = f"{base}-{suffix}"
        return f"{base}-{secrets.token_hex(4)}"

    # -- owner claim -----------------------------------------------------------------------------

    def offer_claim(self) -> str | None:
        """A one-time code, valid for ``CLAIM_SECONDS``, while the owner has no Feishu identity yet.

        None once claimed. ``claim_expires_at`` says until when the code works.
        """
        owner = self._state.owner()
        if owner is None:
            return None
        if any(kind.startswith("feishu_") for kind, _ in self._state.aliases(owner.id)):
            return None
        self.claim_code = secrets.token_hex(4)
        self.claim_expires_at = self._clock() + CLAIM_SECONDS
        return self.claim_code

    def claim(self, code: str, ids: UserIds) -> Principal | ClaimRefused:
        """Make this Feishu person the owner if ``code`` is the current, unexpired one.

        A code works once: after it succeeds (or expires) it never works again.
        """
        sent = code.strip().encode()
        if self._used_code is not None and hmac.compare_digest(sent, self._used_code.encode()):
            return ClaimRefused.USED
        expected = self.claim_code
        owner = self._state.owner()
        if expected is None or owner is None or not _aliases(ids):
            return ClaimRefused.WRONG
        if not hmac.compare_digest(sent, expected.encode()):
            return ClaimRefused.WRONG
        if self.claim_expires_at is None or self._clock() >= self.claim_expires_at:
            logger.warning("an expired owner claim code was sent from Feishu")
            return ClaimRefused.EXPIRED
        for kind, value in _aliases(ids):
            self._state.move_alias(kind, value, owner.id)
        self._used_code = expected
        self.claim_code = None
        self.claim_expires_at = None
        logger.info("the owner's Feishu identity was claimed")
        return owner
