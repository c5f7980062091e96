"""Each person's own Feishu user access token, kept by the Hub and sealed at rest.

A connected person's documents are read with their token and nobody else's, so the token is
worth as much as their Feishu account: the Hub keeps it in the ``user_tokens`` table of its
state database, sealed (``hub.sealing``) with the Principal's id as the associated data, so a
row copied onto another Principal does not open. A backup of the database without the key file
holds nothing usable; losing the key only means everyone connects again.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from hub.errors import InvalidArgument
from hub.sealing import Sealer
from hub.state import State


@dataclass(frozen=True)
class UserToken:
    """One person's token as Feishu granted it; ``expires_at`` / ``refresh_expires_at`` are
    epoch seconds, None when Feishu said nothing."""

    access_token: str
    refresh_token: str | None
    expires_at: float | None
    refresh_expires_at: float | None
    scopes: tuple[str, ...]
    connected_at: float = 0.0

    def __repr__(self) -> str:
        # Never a secret in a log line or a traceback.
        return f"UserToken(scopes={self.scopes!r}, expires_at={self.expires_at!r})"

    def expired(self, now: float, slack: float = 60.0) -> bool:
        return self.expires_at is not None and self.expires_at - slack <= now


@dataclass(frozen=True)
class Connection:
    """What a card may show of a connection: never the token."""

    scopes: tuple[str, ...]
    connected_at: float


class UserTokens:
    def __init__(self, state: State, sealer: Sealer) -> None:
        self._state = state
        self._sealer = sealer

    def _seal(self, principal_id: str, token: UserToken) -> bytes:
        secret = json.dumps(
            {
                "access_token": token.access_token,
                "refresh_token": token.refresh_token,
                "expires_at": token.expires_at,
                "refresh_expires_at": token.refresh_expires_at,
            }
        ).encode()
        return self._sealer.seal(principal_id, secret)

    def _open(self, principal_id: str, sealed: bytes) -> dict[str, object] | None:
        clear = self._sealer.open(principal_id, sealed)
        if clear is None:
            # Another key or a moved row: unusable, and the person connects again.
            return None
        opened = json.loads(clear)
        return opened if isinstance(opened, dict) else None

    async def store(self, principal_id: str, token: UserToken) -> None:
        """Keep ``token`` as ``principal_id``'s, replacing any they had."""
        if not token.access_token:
            raise InvalidArgument("Feishu granted no access token")
        sealed = self._seal(principal_id, token)
        now = time.time()
        scopes = " ".join(token.scopes)

        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO user_tokens (principal_id, sealed, scopes, connected_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (principal_id) DO UPDATE SET"
                " sealed = excluded.sealed, scopes = excluded.scopes,"
                " updated_at = excluded.updated_at",
                (principal_id, sealed, scopes, now, now),
            )

        await self._state.write(work)

    def token(self, principal_id: str) -> UserToken | None:
        """``principal_id``'s token, None when they have not connected (or it no longer opens)."""
        row = self._state.db.execute(
            "SELECT sealed, scopes, connected_at FROM user_tokens WHERE principal_id = ?",
            (principal_id,),
        ).fetchone()
        if row is None:
            return None
        opened = self._open(principal_id, bytes(row["sealed"]))
        if opened is None:
            return None
        return UserToken(
            access_token=str(opened.get("access_token") or ""),
            refresh_token=_text_or_none(opened.get("refresh_token")),
            expires_at=_number_or_none(opened.get("expires_at")),
            refresh_expires_at=_number_or_none(opened.get("refresh_expires_at")),
            scopes=tuple(str(row["scopes"]).split()),
            connected_at=float(row["connected_at"]),
        )

    def connection(self, principal_id: str) -> Connection | None:
        row = self._state.db.execute(
            "SELECT scopes, connected_at FROM user_tokens WHERE principal_id = ?",
            (principal_id,),
        ).fetchone()
        if row is None:
            return None
        return Connection(tuple(str(row["scopes"]).split()), float(row["connected_at"]))

    async def erase(self, principal_id: str) -> bool:
        """Forget ``principal_id``'s token; whether there was one."""

        def work(db: sqlite3.Connection) -> bool:
            gone = db.execute("DELETE FROM user_tokens WHERE principal_id = ?", (principal_id,))
            return gone.rowcount > 0

        return await self._state.write(work)


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _number_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
