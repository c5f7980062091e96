"""An Agent's permission requests, asked of the Hub for the turn a worker runs.

The Hub records the request as an ``approval`` event of the turn, where its user (a Feishu card,
``amux agent run``) answers it; the worker long-polls for that answer. Anything short of an
answer (the Hub gone past the request's timeout, the lease lost) is a denial, never a silent
allow.
"""

from __future__ import annotations

import asyncio
import logging

from hub.client import HubClient
from hub.errors import AmuxError, QuotaExceeded, Unavailable
from runtime_bridge.approvals import ApprovalAnswer, ApprovalRequest

logger = logging.getLogger("amux.worker")

POLL_SECONDS = 25.0
RETRY_SECONDS = 1.0
GIVE_UP_MARGIN = 120.0


class HubApprover:
    """Answers one turn's permission requests through the Hub."""

    def __init__(self, hub: HubClient, execution_id: str, worker_id: str) -> None:
        self._hub = hub
        self._execution_id = execution_id
        self._worker_id = worker_id

    async def __call__(self, request: ApprovalRequest) -> ApprovalAnswer:
        refused = request.refusal()
        if refused is not None:
            logger.warning(
                "denied a permission request of %s without asking: %d characters",
                self._execution_id,
                max(len(request.subject), len(request.detail)),
            )
            return refused
        try:
            approval = await self._hub.ask(
                self._execution_id,
                self._worker_id,
                tool=request.tool,
                action=request.action,
                subject=request.subject,
                detail=request.detail,
            )
        except QuotaExceeded as error:
            # The turn asked too much (see hub.approvals): the Hub's own words, which say so.
            return ApprovalAnswer(False, error.message)
        except AmuxError as error:
            return ApprovalAnswer(False, f"amux could not ask for permission: {error.message}")
        loop = asyncio.get_running_loop()
        # By this worker's own clock (a remote worker's may differ from the Hub's): past the
        # request's timeout and a margin, an unreachable Hub means no answer is coming.
        give_up = loop.time() + (approval.expires_at - approval.asked_at) + GIVE_UP_MARGIN
        while approval.pending:
            if loop.time() > give_up:
                return ApprovalAnswer(False, "no answer reached amux in time; denied")
            try:
                approval = await self._hub.decision(
                    self._execution_id,
                    self._worker_id,
                    approval.request_id,
                    wait_seconds=POLL_SECONDS,
                )
            except Unavailable as error:
                # A short Hub outage: the lease covers it, and so does the request's timeout.
                logger.info("waiting for a permission answer: %s", error.message)
                await asyncio.sleep(RETRY_SECONDS)
            except AmuxError as error:
                return ApprovalAnswer(False, f"the permission request ended: {error.message}")
        return ApprovalAnswer(approval.allowed, approval.message())
