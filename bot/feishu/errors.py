"""Errors of the Feishu adapter, grafted onto the shared tree in ``hub.errors``.

AmuxError
├── Unavailable            unavailable        503   Feishu unreachable or still rate limited
└── FeishuApiError         feishu_api_error   502   Feishu refused the call (feishu_code,
                                                    http_status, operation)
"""

from __future__ import annotations

from hub.errors import AmuxError


class FeishuApiError(AmuxError):
    """Feishu answered with an error that retrying will not fix (auth, validation, not found)."""

    code = "feishu_api_error"
    status = 502
