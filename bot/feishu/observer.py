"""What the Feishu adapter reports for monitoring; the Hub's metrics object fits this shape."""

from __future__ import annotations

from typing import Protocol


class FeishuObserver(Protocol):
    def feishu_event(self, outcome: str) -> None:
        """One inbound event: ``received``, ``deduplicated`` or ``failed``; ``caught_up`` also
        for each received one that catch-up listed."""

    def feishu_call(self, api: str, ok: bool) -> None:
        """One outbound API call, after its retries."""

    def feishu_retry(self, api: str) -> None:
        """One retry of an outbound call."""


class NoObserver:
    def feishu_event(self, outcome: str) -> None:
        pass

    def feishu_call(self, api: str, ok: bool) -> None:
        pass

    def feishu_retry(self, api: str) -> None:
        pass
