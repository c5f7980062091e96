"""Secrets the Hub keeps in its state database, sealed at rest.

A person's Feishu user token and a project's forge token are each worth an account, so neither
is stored in the clear: each is sealed with AES-GCM under one key in ``<AMUX_HOME>/secrets.key``
(32 bytes, created 0600 on first use by the Hub's process, never handed to a workspace). Each
sealed value names what it belongs to (a Principal's id, a project's name) as its associated
data, so a row copied onto another owner does not open. A backup of the database without the
key holds nothing usable; a lost key only means the secrets are given again.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hub.errors import InvalidArgument

KEY_FILE = "secrets.key"
# The key's name before forge tokens were sealed with it too: taken over where it exists.
_FORMER_KEY_FILE = "user-token.key"
_KEY_BYTES = 32
_NONCE_BYTES = 12


class Sealer:
    """Seals and opens values under the key in ``home``; the key is read at the first use."""

    def __init__(self, home: Path) -> None:
        self._home = home
        self._aead: AESGCM | None = None

    @property
    def key_path(self) -> Path:
        return self._home / KEY_FILE

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            self._aead = AESGCM(_load_or_create_key(self._home))
        return self._aead

    def seal(self, owner: str, clear: bytes) -> bytes:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return nonce + self._cipher().encrypt(nonce, clear, owner.encode())

    def open(self, owner: str, sealed: bytes) -> bytes | None:
        """The clear value, None when it does not open: another key (a restored backup, a
        replaced key file) or a row moved onto another owner."""
        try:
            return self._cipher().decrypt(
                sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], owner.encode()
            )
        except InvalidTag:
            return None


def _load_or_create_key(home: Path) -> bytes:
    """The operator's key, created 0600 on first use; created exclusively, so two processes
    racing to create it agree on one."""
    path = home / KEY_FILE
    former = home / _FORMER_KEY_FILE
    if not path.exists() and former.exists():
        try:
            os.link(former, path)
        except FileExistsError:
            pass
        else:
            former.unlink(missing_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) != _KEY_BYTES:
            raise InvalidArgument(
                f"{path} is not a secrets key ({_KEY_BYTES} bytes): restore it from the backup "
                "or remove it, then connect Feishu accounts and set forge tokens again"
            ) from None
        return key
    key = secrets.token_bytes(_KEY_BYTES)
    with os.fdopen(descriptor, "wb") as out:
        out.write(key)
        out.flush()
        os.fsync(out.fileno())
    return key
