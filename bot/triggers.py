"""``POST /triggers/v1/<id>``: an outside system (a CI job, an alert) starts a trigger's turn.

A request proves it knows the trigger's secret: ``X-Amux-Timestamp`` is the Unix time it was
sent, ``X-Amux-Signature-256`` is ``sha256=`` and the hex HMAC-SHA256, under the secret, of
``<timestamp>.<body>`` (GitHub's header convention, with the time signed too, as Slack and
Stripe do). It is compared in constant time; a time further than ``WINDOW_SECONDS`` from the
Hub's clock, or a signature already accepted, is refused, so a request seen on the wire cannot
be sent again. The body (JSON or text, at most ``MAX_BODY_BYTES``) reaches the Agent as fenced
data after the trigger's own prompt, never as instructions. Each trigger starts at most
``PER_MINUTE`` turns a minute. The answer comes as soon as the turn is queued: 202 with its id.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque

from aiohttp import web

from bot.scheduler import Scheduler
from hub.errors import (
    AmuxError,
    Forbidden,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    Unauthenticated,
    Unavailable,
)
from hub.rpc import dumps, error_response
from hub.schedules import schedule_id_problem, signature_matches

logger = logging.getLogger("amux.bot")

TRIGGER_PATH = "/triggers/v1/{trigger_id}"
TIMESTAMP_HEADER = "X-Amux-Timestamp"
SIGNATURE_HEADER = "X-Amux-Signature-256"
WINDOW_SECONDS = 300
MAX_BODY_BYTES = 64 * 1024
PER_MINUTE = 6
RATE_LIMIT = "trigger_rate"


class TriggerDoor:
    """Checks each trigger request and hands it to the scheduler once it is in place."""

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None
        self._recent: dict[str, deque[float]] = {}

    def routes(self) -> list[web.RouteDef]:
        return [web.post(TRIGGER_PATH, self.handle)]

    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._handle(request)
        except AmuxError as error:
            if not isinstance(error, NotFound):
                logger.info("refused a trigger request: %s", error.message)
            response = error_response(error)
            if isinstance(error, QuotaExceeded) and error.limit == RATE_LIMIT:
                # What HTTP clients and CI retry logic understand: Too Many Requests.
                response.set_status(429)
                response.headers["Retry-After"] = str(error.retry_after or 60)
            return response

    async def _handle(self, request: web.Request) -> web.Response:
        scheduler = self.scheduler
        if scheduler is None:
            raise Unavailable("amux is starting; try again in a moment")
        trigger_id = request.match_info["trigger_id"]
        if schedule_id_problem(trigger_id) is not None:
            raise NotFound("no such trigger")
        schedules = scheduler.hub.schedules
        try:
            secret = schedules.secret_of(trigger_id)
        except NotFound:
            raise NotFound("no such trigger") from None
        body = await _bounded_body(request)
        stamp = request.headers.get(TIMESTAMP_HEADER, "").strip()
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if not stamp.isdigit() or not signature:
            raise Unauthenticated(
                f"a trigger request carries {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}"
            )
        if not signature_matches(secret, stamp, body, signature):
            raise Unauthenticated("the signature does not match this trigger's secret")
        now = time.time()
        if abs(now - int(stamp)) > WINDOW_SECONDS:
            raise Unauthenticated(
                f"{TIMESTAMP_HEADER} is more than {WINDOW_SECONDS} s from the Hub's clock"
            )
        data = _data(request, body)
        self._take_turn(trigger_id, now)
        if not await schedules.accept_delivery(trigger_id, signature.strip(), now, WINDOW_SECONDS):
            raise Forbidden("this request was already accepted once; sign a new one")
        trigger = schedules.get(trigger_id)
        if not trigger.active:
            raise Forbidden("this trigger is paused")
        queued = await scheduler.fire(schedules.now_firing(trigger), data)
        if queued is None:
            last = schedules.get(trigger_id).last_result or "it was not started"
            raise Unavailable(f"the trigger's turn was not started: {last}")
        answer = {"run_id": queued.execution_id, "message_id": queued.message_id}
        return web.Response(status=202, body=dumps(answer), content_type="application/json")

    def _take_turn(self, trigger_id: str, now: float) -> None:
        recent = self._recent.setdefault(trigger_id, deque())
        while recent and now - recent[0] >= 60:
            recent.popleft()
        if len(recent) >= PER_MINUTE:
            raise QuotaExceeded(
                f"a trigger starts at most {PER_MINUTE} turns a minute",
                limit=RATE_LIMIT,
                retry_after=int(60 - (now - recent[0])) + 1,
            )
        recent.append(now)


async def _bounded_body(request: web.Request) -> bytes:
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"a trigger's body is at most {MAX_BODY_BYTES} bytes")
    body = await request.content.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"a trigger's body is at most {MAX_BODY_BYTES} bytes")
    return body


def _data(request: web.Request, body: bytes) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("a trigger's body is UTF-8 text or JSON") from None
    if request.content_type == "application/json" and text.strip():
        try:
            json.loads(text)
        except ValueError:
            raise InvalidArgument("the body is not JSON, as its Content-Type says") from None
    return text
