"""Feishu people → Hub Principals, and the one-time owner claim.

``union_id`` is stable across one developer's apps, so it is the preferred key; ``user_id`` next;
``open_id`` (per app) is kept as an alias too because replies address people by it.
"""

from __future__ import annotations

import hmac
import logging
import secrets

from bot.feishu.events import UserIds
from hub.errors import Conflict, NotFound
from hub.state import Principal, State

logger = logging.getLogger("amux.bot")

ALIAS_KINDS = (
    ("feishu_union_id", "union_id"),
    ("feishu_user_id", "user_id"),
    ("feishu_open_id", "open_id"),
)


def _aliases(ids: UserIds) -> list[tuple[str, str]]:
    return [(kind, getattr(ids, field)) for kind, field in ALIAS_KINDS if getattr(ids, field)]


class FeishuIdentities:
    """Resolves senders to Principals, enrolling newcomers when the Hub allows it."""

    def __init__(self, state: State, *, enroll: bool) -> None:
        self._state = state
        self._enroll = enroll
        self.claim_code: str | None = None

    def resolve(self, ids: UserIds) -> Principal | None:
        """The sender's Principal, created on first contact when enrollment is open."""
        known = self.find(ids)
        if known is not None:
            self._remember(known, ids)
            return known
        if not self._enroll or not _aliases(ids):
            return None
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
        """A one-time code while the owner has no Feishu identity yet; None once claimed."""
        owner = self._state.owner()
        if owner is None:
            return None
        if any(kind.startswith("feishu_") for kind, _ in self._state.aliases(owner.id)):
            return None
        self.claim_code = secrets.token_hex(4)
        return self.claim_code

    def claim(self, code: str, ids: UserIds) -> Principal | None:
        """Make this Feishu person the owner if ``code`` is the current one; None otherwise."""
        expected = self.claim_code
        owner = self._state.owner()
        if expected is None or owner is None or not _aliases(ids):
            return None
        if not hmac.compare_digest(code.strip().encode(), expected.encode()):
            return None
        for kind, value in _aliases(ids):
            self._state.move_alias(kind, value, owner.id)
        self.claim_code = None
        logger.info("the owner's Feishu identity was claimed")
        return owner
