"""Feishu conversations: one Session per topic, one progress card per turn, results in the topic.

A private message or a group message that @mentions the bot is a turn. The bot answers in the
message's topic (``reply_in_thread``), so the topic is the conversation: later messages in it
resume the same Session, and so the same frozen memory binding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bot.feishu.client import FeishuClient
from bot.feishu.events import MessageEvent
from cards.models import Lang, Progress
from cards.notices import error_card, own_topic_card, warning_card
from cards.progress import progress_card, result_cards
from hub.contract import CANCELLED, RUNNING, SUCCEEDED, WatchResult
from hub.errors import AmuxError
from hub.services import Hub
from hub.state import Principal

logger = logging.getLogger("amux.bot")

WATCH_SECONDS = 20.0
TITLE_CHARS = 60


@dataclass(frozen=True)
class Turn:
    execution_id: str
    session_id: str
    progress_message_id: str


def origin_of(event: MessageEvent) -> str:
    """The topic's key: its root message (a topic's first message is its own root)."""
    return f"feishu:{event.chat_id}:{event.root_id or event.message_id}"


class Conversations:
    """Starts Agent turns for Feishu messages and reports them back into the topic."""

    def __init__(
        self,
        hub: Hub,
        client: FeishuClient,
        update_card: Callable[[str, dict[str, object]], None],
        finish_card: Callable[[str, dict[str, object]], Awaitable[None]],
        *,
        provider_of: Callable[[str], str],
        lang: Lang,
    ) -> None:
        self._hub = hub
        self._client = client
        self._update = update_card
        self._finish = finish_card
        self._provider_of = provider_of
        self._lang = lang

    async def handle(self, event: MessageEvent, sender: Principal) -> Turn | None:
        """Queue the message as a turn and follow it to its result in the topic."""
        origin = origin_of(event)
        executions = self._hub.executions
        session = executions.session_by_origin(origin)
        principal_id = sender.id
        if session is not None and session.principal_id != sender.id:
            if self._hub.config.isolation:
                # Under isolation a topic runs with its starter's memory only.
                await self._client.reply(event.message_id, card=own_topic_card(self._lang))
                return None
            principal_id = session.principal_id
        prompt = event.text.strip()
        if not prompt:
            return None
        try:
            submitted, session = await executions.submit(
                principal_id=principal_id,
                submitted_by=sender.id,
                provider=session.provider if session else self._provider_of(event.chat_id),
                prompt=prompt,
                origin=origin,
            )
        except AmuxError as error:
            card = error_card(error.code, error.message, self._lang)
            await self._client.reply(event.message_id, card=card)
            return None
        title = prompt.splitlines()[0][:TITLE_CHARS]
        view = Progress(title=title, status="queued", run_id=submitted.id)
        sent = await self._client.reply(event.message_id, card=progress_card(view, self._lang))
        turn = Turn(submitted.id, session.id, sent.message_id)
        await self._follow(turn, title, event.message_id)
        return turn

    async def _follow(self, turn: Turn, title: str, reply_to: str) -> None:
        executions = self._hub.executions
        lines: list[str] = []
        warnings: list[str] = []
        after = 0
        started = time.monotonic()
        while True:
            answer = await executions.watch(turn.execution_id, after, WATCH_SECONDS)
            after = max(after, answer.last_seq)
            for event in answer.events:
                if event.kind == "warning":
                    warnings.append(event.text)
                    lines.append("⚠ " + event.text)
                else:
                    lines.append(event.text)
            state = answer.execution.state
            elapsed = time.monotonic() - started
            finished = answer.execution.finished
            if executions.closing and not finished:
                return  # The Hub is restarting; the turn carries on (or is retried) without us.
            if finished:
                await self._report(turn, title, answer, warnings, elapsed, reply_to)
                return
            view = Progress(
                title,
                "running" if state == RUNNING else "queued",
                tuple(lines),
                elapsed,
                turn.execution_id,
            )
            self._update(turn.progress_message_id, progress_card(view, self._lang))

    async def _report(
        self,
        turn: Turn,
        title: str,
        answer: WatchResult,
        warnings: list[str],
        elapsed: float,
        reply_to: str,
    ) -> None:
        execution = answer.execution
        state = execution.state
        text = execution.result.text if execution.result is not None else None
        if state == SUCCEEDED and text is not None:
            parts = result_cards(text, self._lang, title=title)
            await self._finish(turn.progress_message_id, parts[0])
            for extra in parts[1:]:
                await self._client.reply(reply_to, card=extra)
        else:
            view = Progress(title, "cancelled" if state == CANCELLED else "failed", (), elapsed)
            await self._finish(turn.progress_message_id, progress_card(view, self._lang))
            reason = execution.error or "the Agent ended without an answer"
            await self._client.reply(reply_to, card=error_card(state, reason, self._lang))
        for warning in warnings:
            await self._client.reply(reply_to, card=warning_card(warning, self._lang))

    async def cancel(self, execution_id: str, by: Principal) -> bool:
        """Cancel a turn for its topic's owner (or the Hub owner); False when not theirs."""
        executions = self._hub.executions
        session = executions.session(executions.describe(execution_id).session_id)
        if session.principal_id != by.id and not by.is_owner:
            return False
        await executions.cancel(execution_id)
        return True
