"""Errors of the Feishu adapter, grafted onto the shared tree in ``hub.errors``.

AmuxError
├── Unavailable            unavailable        503   Feishu unreachable or still rate limited
├── FeishuApiError         feishu_api_error   502   Feishu refused the call (feishu_code,
│                                                   http_status, operation)
└── PayloadTooLarge        payload_too_large  413
    └── ResourceTooLarge   payload_too_large  413   a download cut off at its cap (received)
"""

from __future__ import annotations

from hub.errors import AmuxError, PayloadTooLarge

# Feishu's answers when the app lacks a scope the call needs.
MISSING_SCOPE_CODES = frozenset({99991672, 99991679})


class FeishuApiError(AmuxError):
    """Feishu answered with an error that retrying will not fix (auth, validation, not found)."""

    code = "feishu_api_error"
    status = 502

    @property
    def feishu_code(self) -> int | None:
        """Feishu's own error code (``99991663``: invalid token, ``10014``: wrong secret…)."""
        value = self.details.get("feishu_code")
        return value if isinstance(value, int) else None

    @property
    def missing_scope(self) -> bool:
        """Whether Feishu refused because the app lacks a scope (granted in its console)."""
        return self.feishu_code in MISSING_SCOPE_CODES

    @property
    def http_status(self) -> int | None:
        value = self.details.get("http_status")
        return value if isinstance(value, int) else None

    @property
    def operation(self) -> str | None:
        value = self.details.get("operation")
        return value if isinstance(value, str) else None


class ResourceTooLarge(PayloadTooLarge):
    """A download was over its cap, so it was cut off; ``received`` bytes were read before that."""

    @property
    def received(self) -> int:
        value = self.details.get("received")
        return value if isinstance(value, int) else 0
