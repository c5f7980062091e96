"""Feishu people → Hub Principals, the events that may speak for them, and the owner claim.

Ids become aliases namespaced by tenant and app (``hub.aliases``): ``union_id`` is stable across
one developer's apps; ``user_id`` is unique only inside a tenant, whose admins set it; ``open_id``
is per app and is what replies address people by.

Only events delivered for the bot's own app and tenant, from people of that tenant, are acted on;
any other is logged and acknowledged with nothing done. The app's tenant is
``AMUX_FEISHU_TENANT_KEY`` when set; else the one recorded in the Hub's state for this app id;
else the tenant of the first signed event the bot receives, recorded from then on. A self-built
app is delivered events for the one tenant it belongs to; a person of another tenant (in an
external group) carries their own tenant and is refused.

The owner's Feishu identity comes from a one-time claim code the log offers, or, for an app
``amux feishu setup`` made, from the person who scanned its QR code: their open_id for this app is
saved beside the app's secret in AMUX_HOME, which only the operator can write, and their first
event gives the owner their ids. An owner claimed before is never replaced that way.

One event's ids name one Principal or none. When they name two, or the one they name already has
an id of the same kind that differs (an admin gave a user_id to someone new; another open_id for
this app), nothing is merged: the event is refused, with a warning naming the principals by id.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from typing import NoReturn

from bot.feishu.events import UserIds
from bot.names import DisplayNames
from hub.aliases import ID_FIELDS, FeishuApp, IdField, alias_kind
from hub.errors import Conflict
from hub.people import Alias, Mismatch, People, Resolved, TwoPrincipals
from hub.principals import Principal

logger = logging.getLogger("amux.bot")

# Long enough to read the log and open a chat with the bot; short enough that a code seen in an
# old log (or a leaked one) is worthless.
CLAIM_SECONDS = 30 * 60
# Wrong claim codes one sender may send within CLAIM_LOCK_SECONDS, and everyone together while a
# code stands (until a new one is offered: a restart). A code has 32 bits: guessing it takes
# billions of tries, so a few wrong ones mean a typo or someone guessing.
CLAIM_TRIES_PER_SENDER = 5
CLAIM_TRIES_IN_ALL = 20
CLAIM_LOCK_SECONDS = 60 * 60
# Burnt codes remembered, to tell someone sending one why it no longer works.
BURNT_KEPT = 16
MISMATCH = (
    "amux cannot tell who you are: your Feishu ids do not match the ones it knows, so nothing "
    "was done; the owner can see why in amux's log"
)


class ClaimRefused(Enum):
    """Why ``/amux claim CODE`` did not make the sender the owner."""

    WRONG = "wrong"
    EXPIRED = "expired"
    USED = "used"
    # Too many wrong codes from this sender within CLAIM_LOCK_SECONDS; any code is refused.
    LOCKED = "locked"
    # Too many wrong codes in all; any code is refused until a new one is offered.
    LOCKED_FOR_ALL = "locked_for_all"
    # The code was seen outside a private chat with the bot, so others may know it.
    BURNT = "burnt"


class FeishuIdentities:
    """Admits events of the bot's own tenant and resolves senders to Principals, enrolling
    newcomers when the Hub allows it."""

    def __init__(
        self,
        people: People,
        *,
        enroll: bool,
        app_id: str = "",
        tenant_key: str = "",
        clock: Callable[[], float] = time.time,
        names: DisplayNames | None = None,
        scanner_open_id: str = "",
    ) -> None:
        self._people = people
        # Who scanned the QR code that made this app (`amux feishu setup`), read from the file
        # only the operator can write: the owner, unless the Hub has a Feishu owner already.
        self._scanner = scanner_open_id
        self._names = names
        self._enroll = enroll
        self._clock = clock
        self.claim_code: str | None = None
        # Wall-clock seconds, so the log can say when the code stops working.
        self.claim_expires_at: float | None = None
        self._used_code: str | None = None
        # Codes seen where others could read them: refused as burnt, never as merely wrong.
        self._burnt: deque[str] = deque(maxlen=BURNT_KEPT)
        # When each sender's recent wrong codes came, and how many came in all.
        self._wrong_tries: dict[str, deque[float]] = {}
        self._wrong_in_all = 0
        self.app_id = app_id
        self.app: FeishuApp | None = None
        recorded = people.recorded_app()
        if recorded is not None and recorded.app_id != app_id:
            recorded = None  # Another app's tenant says nothing about this one's.
        if tenant_key:
            if recorded is not None and recorded.tenant_key != tenant_key:
                logger.warning(
                    "AMUX_FEISHU_TENANT_KEY %s replaces tenant %s recorded for Feishu app %s",
                    tenant_key,
                    recorded.tenant_key,
                    app_id,
                )
            self._bind(FeishuApp(app_id, tenant_key))
        elif recorded is not None:
            self._bind(recorded)

    # -- which events count ----------------------------------------------------------------------

    def admits(self, tenant_key: str, app_id: str, person: UserIds) -> bool:
        """Whether an event delivered for ``tenant_key`` and ``app_id``, from ``person``, may be
        acted on; a refusal is logged."""
        if self.app_id and app_id and app_id != self.app_id:
            logger.warning(
                "refused a Feishu event for app %s: this bot is app %s", app_id, self.app_id
            )
            return False
        tenant = tenant_key or person.tenant_key
        if not tenant:
            logger.warning("refused a Feishu event that names no tenant")
            return False
        if self.app is None:
            self._bind(FeishuApp(self.app_id, tenant))
            logger.warning(
                "Feishu app %s belongs to tenant %s, learned from its first event and kept in "
                "the Hub's state; events of other tenants are refused (AMUX_FEISHU_TENANT_KEY "
                "pins the tenant)",
                self.app_id or "(no id)",
                tenant,
            )
        own = self.app.tenant_key if self.app is not None else tenant
        foreign = sorted({t for t in (tenant_key, person.tenant_key) if t and t != own})
        if foreign:
            logger.warning(
                "refused a Feishu event from tenant %s: this bot's app belongs to tenant %s",
                ", ".join(foreign),
                own,
            )
            return False
        return True

    def _bind(self, app: FeishuApp) -> None:
        for kind, holder in self._people.bind_app(app):
            logger.warning(
                "a %s alias of principal %s waiting for the tenant was left unbound: another "
                "principal has that id in tenant %s",
                kind,
                holder,
                app.tenant_key,
            )
        self.app = app

    # -- who is it -------------------------------------------------------------------------------

    def _aliases(self, ids: UserIds) -> list[tuple[IdField, str, str]]:
        """(field, alias kind, value) of each id given; user_id and open_id only once the app's
        tenant is known, in the person's own tenant's namespace."""
        found: list[tuple[IdField, str, str]] = []
        for field in ID_FIELDS:
            value = str(getattr(ids, field))
            if not value:
                continue
            if field == "union_id":
                found.append((field, alias_kind(field, None), value))
            elif self.app is not None:
                app = FeishuApp(self.app.app_id, ids.tenant_key or self.app.tenant_key)
                found.append((field, alias_kind(field, app), value))
        return found

    def resolve(self, ids: UserIds) -> Principal | None:
        """The sender's Principal, created on first contact when enrollment is open.

        Raises:
            Conflict: the ids name two Principals, or differ from the ones their Principal has;
                nothing was changed.
        """
        aliases = self._aliases(ids)
        self._adopt_scanner(ids, aliases)
        enrol_as = self._new_name(ids) if self._enroll else None
        found = self._people.resolve([Alias(kind, value) for _, kind, value in aliases], enrol_as)
        if not isinstance(found, Resolved):
            self._refuse(found, aliases)
        principal = found.principal
        for alias in found.taken:
            logger.warning(
                "a Feishu %s of principal %s belongs to another",
                alias.kind,
                principal.id if principal is not None else "?",
            )
        if found.enrolled and principal is not None:
            logger.info("enrolled a new Feishu user as principal %s", principal.name)
        return principal

    async def person(self, ids: UserIds) -> Principal | None:
        """``resolve``, with the person's display name as well as Feishu lets it be known.

        Raises:
            Conflict: as ``resolve``.
        """
        principal = self.resolve(ids)
        if principal is None or self._names is None:
            return principal
        return await self._names.named(principal, ids)

    @staticmethod
    def _refuse(mismatch: Mismatch, aliases: list[tuple[IdField, str, str]]) -> NoReturn:
        if isinstance(mismatch, TwoPrincipals):
            logger.warning(
                "refused a Feishu event whose ids belong to principals %s; nothing merged",
                ", ".join(mismatch.principal_ids),
            )
        else:
            differ = [field for field, kind, _ in aliases if kind in mismatch.kinds]
            logger.warning(
                "refused a Feishu event whose %s differ from those principal %s has; "
                "nothing merged",
                ", ".join(differ),
                mismatch.principal_id,
            )
        raise Conflict(MISMATCH)

    @staticmethod
    def _new_name(ids: UserIds) -> str:
        """Where a newcomer's name starts: the Hub adds a suffix while it is taken."""
        return "feishu-" + (ids.union_id or ids.user_id or ids.open_id)[-10:]

    # -- owner claim -----------------------------------------------------------------------------

    def _scanner_awaited(self) -> Principal | None:
        """The owner, while they have no Feishu identity and the app's scanner is to get it."""
        owner = self._people.owner()
        if not self._scanner or owner is None or self._people.has_feishu_identity(owner.id):
            return None
        return owner

    def _adopt_scanner(self, ids: UserIds, aliases: list[tuple[IdField, str, str]]) -> None:
        """Make the app's scanner the owner at their first event, as a claim would."""
        owner = self._scanner_awaited()
        if owner is None or ids.open_id != self._scanner or self.app is None or not aliases:
            return
        self._people.move_aliases([Alias(kind, value) for _, kind, value in aliases], owner.id)
        self.claim_code = None
        self.claim_expires_at = None
        logger.info(
            "the Feishu user who scanned the app's set-up QR code (%s) is now the owner",
            self._scanner,
        )

    def offer_claim(self) -> str | None:
        """A one-time code, valid for ``CLAIM_SECONDS``, while the owner has no Feishu identity
        yet, offered to the operator in the log (the one place it is ever written).

        None once claimed. ``claim_expires_at`` says until when the code works.
        """
        owner = self._people.owner()
        if owner is None:
            return None
        if self._people.has_feishu_identity(owner.id):
            held = {alias.value for alias in self._people.aliases(owner.id)}
            if self._scanner and self._scanner not in held:
                logger.warning(
                    "the Feishu user who scanned the app's set-up QR code (%s) is not the owner: "
                    "the Hub's Feishu owner stays as claimed before",
                    self._scanner,
                )
            return None
        if self._scanner:
            logger.info(
                "the owner in Feishu is the user who scanned the app's set-up QR code (%s); "
                "no claim code is needed",
                self._scanner,
            )
            return None
        self.claim_code = secrets.token_hex(4)
        self.claim_expires_at = self._clock() + CLAIM_SECONDS
        self._wrong_in_all = 0
        expires = datetime.fromtimestamp(self.claim_expires_at, UTC)
        logger.warning(
            "no owner in Feishu yet: the owner sends '/amux claim %s' to the bot in a private "
            "chat before %s (the code works once, for %d minutes; a restart makes a new one)",
            self.claim_code,
            expires.strftime("%Y-%m-%d %H:%M:%S UTC"),
            CLAIM_SECONDS // 60,
        )
        return self.claim_code

    def burn_if_seen(self, text: str, ids: UserIds) -> bool:
        """Whether ``text``, read outside the sender's private chat with the bot, held the
        current claim code; if so the code no longer works and a new one is offered in the log.

        Whoever else read that chat could claim the Hub with it, so the sender's own claim
        with it fails too.
        """
        code = self.claim_code
        if code is None or code not in text.lower():
            return False
        self._burnt.append(code)
        logger.warning(
            "the owner claim code was posted outside a private chat with the bot (by Feishu "
            "user %s); it no longer works",
            ids.union_id or ids.open_id or ids.user_id or "(no id)",
        )
        self.claim_code = None
        self.claim_expires_at = None
        self.offer_claim()
        return True

    def claim(self, code: str, ids: UserIds) -> Principal | ClaimRefused:
        """Make this Feishu person the owner if ``code`` is the current, unexpired one.

        A code works once: after it succeeds (or expires) it never works again. After
        ``CLAIM_TRIES_PER_SENDER`` wrong codes within ``CLAIM_LOCK_SECONDS`` a sender's claims are
        refused, the right code too, until the oldest of them is that old; after
        ``CLAIM_TRIES_IN_ALL`` wrong codes everyone's are, until a new code is offered.
        """
        sender = ids.union_id or ids.open_id or ids.user_id
        locked = self._locked(sender)
        if locked is not None:
            return locked
        sent = code.strip().encode()
        if self._used_code is not None and hmac.compare_digest(sent, self._used_code.encode()):
            return ClaimRefused.USED
        if any(hmac.compare_digest(sent.lower(), burnt.encode()) for burnt in self._burnt):
            logger.warning("a burnt owner claim code was sent from Feishu")
            return ClaimRefused.BURNT
        expected = self.claim_code
        owner = self._people.owner()
        aliases = self._aliases(ids)
        if expected is None or owner is None or not aliases:
            return self._wrong(sender)
        if not hmac.compare_digest(sent, expected.encode()):
            return self._wrong(sender)
        if self.claim_expires_at is None or self._clock() >= self.claim_expires_at:
            logger.warning("an expired owner claim code was sent from Feishu")
            return ClaimRefused.EXPIRED
        self._people.move_aliases([Alias(kind, value) for _, kind, value in aliases], owner.id)
        self._used_code = expected
        self.claim_code = None
        self.claim_expires_at = None
        logger.info("the owner's Feishu identity was claimed")
        return owner

    def _recent_wrong(self, sender: str) -> deque[float]:
        """The times of ``sender``'s wrong codes within ``CLAIM_LOCK_SECONDS``."""
        tries = self._wrong_tries.get(sender, deque())
        since = self._clock() - CLAIM_LOCK_SECONDS
        while tries and tries[0] <= since:
            tries.popleft()
        return tries

    def _locked(self, sender: str) -> ClaimRefused | None:
        if self._wrong_in_all >= CLAIM_TRIES_IN_ALL:
            return ClaimRefused.LOCKED_FOR_ALL
        if len(self._recent_wrong(sender)) >= CLAIM_TRIES_PER_SENDER:
            return ClaimRefused.LOCKED
        return None

    def _wrong(self, sender: str) -> ClaimRefused:
        """Count one wrong code; the one that reaches a limit is answered with the lock.

        Senders are remembered only for wrong codes, at most ``CLAIM_TRIES_IN_ALL`` of them per
        code on offer.
        """
        tries = self._wrong_tries.setdefault(sender, self._recent_wrong(sender))
        tries.append(self._clock())
        self._wrong_in_all += 1
        # For the owner, who may be the one mistyping; never the code, which is still good.
        if self._wrong_in_all == CLAIM_TRIES_IN_ALL:
            logger.warning(
                "owner claims from Feishu are locked after %d wrong codes; restart amux serve "
                "for a new code",
                CLAIM_TRIES_IN_ALL,
            )
            return ClaimRefused.LOCKED_FOR_ALL
        if len(tries) == CLAIM_TRIES_PER_SENDER:
            logger.warning(
                "owner claims from Feishu user %s are locked for %d minutes after %d wrong codes",
                sender or "(no id)",
                CLAIM_LOCK_SECONDS // 60,
                CLAIM_TRIES_PER_SENDER,
            )
            return ClaimRefused.LOCKED
        return ClaimRefused.WRONG
