"""Authenticating and opening Feishu webhook requests (pure: the clock is a parameter).

Feishu's scheme: ``X-Lark-Signature = sha256_hex(timestamp + nonce + encrypt_key + raw_body)``
over the exact bytes received; the body is ``{"encrypt": base64(iv + AES-256-CBC(sha256(key)))}``
and the plaintext carries the verification token. Answers: a bad signature or a stale
timestamp is ``Unauthenticated`` (401), a wrong token ``Forbidden`` (403), garbage
``InvalidArgument`` (400). url_verification is the one request Feishu does not sign; it is
accepted on its token alone and may do nothing but echo the challenge.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.feishu.events import event_type_of, token_of
from bot.feishu.sdk import AESCipher
from hub.errors import Forbidden, InvalidArgument, Unauthenticated

TIMESTAMP = "X-Lark-Request-Timestamp"
NONCE = "X-Lark-Request-Nonce"
SIGNATURE = "X-Lark-Signature"


def sign(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """Feishu's request signature."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode("utf-8") + body).hexdigest()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


# Unix seconds in decimal digits, as Feishu sends them; twelve digits reach the year 33658.
_MAX_TIMESTAMP_DIGITS = 12


def _timestamp(text: str) -> int:
    """The request's Unix time in seconds.

    Only plain digits: ``float()`` would take "nan", whose every comparison is false, so a
    signed request stamped "nan" would never count as stale and could be replayed forever.

    Raises:
        Unauthenticated: anything but a decimal integer of at most twelve digits.
    """
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_TIMESTAMP_DIGITS):
        raise Unauthenticated("invalid Feishu request timestamp")
    return int(text)


@dataclass(frozen=True)
class WebhookVerifier:
    """Checks one webhook request and returns its plaintext payload."""

    encrypt_key: str
    verification_token: str
    max_skew_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not self.encrypt_key and not self.verification_token:
            raise InvalidArgument(
                "the Feishu webhook needs AMUX_FEISHU_ENCRYPT_KEY or AMUX_FEISHU_VERIFICATION_TOKEN"
            )

    def open(self, headers: Mapping[str, str], body: bytes, now: float) -> dict[str, Any]:
        """The authenticated plaintext payload of one request.

        Raises:
            Unauthenticated: missing/forged signature or a timestamp outside the window.
            Forbidden: wrong verification token.
            InvalidArgument: the body is not a Feishu payload.
        """
        signature = headers.get(SIGNATURE, "")
        signed = False
        if self.encrypt_key and signature:
            timestamp = headers.get(TIMESTAMP, "")
            nonce = headers.get(NONCE, "")
            expected = sign(timestamp, nonce, self.encrypt_key, body)
            if not _same(signature, expected):
                raise Unauthenticated("invalid Feishu request signature")
            sent_at = _timestamp(timestamp)
            if abs(now - sent_at) > self.max_skew_seconds:
                raise Unauthenticated("stale Feishu request timestamp")
            signed = True
        payload = self._plaintext(body)
        if self.verification_token and not _same(token_of(payload), self.verification_token):
            raise Forbidden("invalid Feishu verification token")
        if self.encrypt_key and not signed and event_type_of(payload) != "url_verification":
            raise Unauthenticated("unsigned Feishu request")
        return payload

    def _plaintext(self, body: bytes) -> dict[str, Any]:
        try:
            outer = json.loads(body)
        except RecursionError:
            # Anyone may post: 200,000 "[" must be a 400, not a traceback and a 500.
            raise InvalidArgument("Feishu request body is nested too deeply") from None
        except ValueError:
            raise InvalidArgument("Feishu request body is not JSON") from None
        if not isinstance(outer, dict):
            raise InvalidArgument("Feishu request body is not an object")
        encrypted = outer.get("encrypt")
        if encrypted is None:
            if self.encrypt_key:
                raise InvalidArgument("Feishu request is not encrypted")
            return outer
        if not self.encrypt_key or not isinstance(encrypted, str):
            raise InvalidArgument("cannot decrypt Feishu request: no encrypt key configured")
        try:
            inner = json.loads(AESCipher(self.encrypt_key).decrypt_str(encrypted))
        except (ValueError, RecursionError):
            raise InvalidArgument("cannot decrypt Feishu request") from None
        if not isinstance(inner, dict):
            raise InvalidArgument("Feishu payload is not an object")
        return inner
