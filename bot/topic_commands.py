"""Commands sent inside a topic that act on its conversation: ``/model``, ``/compact``, ``/btw``.

Whoever may continue a topic's conversation (``Conversations.conversation_for``) may send them;
the answer is a short reply in the topic.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from bot.chat_commands import Said
from bot.conversations import Conversations, with_sender
from bot.feishu.client import FeishuClient
from cards.catalogue import plain_text
from cards.models import Lang
from hub.contract import Session
from hub.errors import InvalidArgument
from hub.services import Hub
from runtime_bridge.providers.plan import COMPACT_COMMAND

logger = logging.getLogger("amux.bot")

# The Agents whose own compaction a ``/compact`` turn runs on the resumed session: Claude's CLI
# runs ``/compact`` given as the prompt with ``--resume`` (a compact boundary in the same
# session); Codex's app-server compacts the resumed thread (``thread/compact/start``).
COMPACTS = ("claude", "codex")
# The Agents a side question can fork the session of, leaving the conversation and its running
# turn as they were: Claude resumes a copy of it (``--resume ID --fork-session``), Codex forks the
# thread (``thread/fork``) and runs the question there.
FORKS = ("claude", "codex")
# What of a name not on the list is echoed back: anyone in the topic may send any text.
MAX_SHOWN = 128


class TopicCommands:
    """``/model``: the model a topic's conversation asks its Agent for, from the owner's list."""

    def __init__(
        self,
        client: FeishuClient,
        hub: Hub,
        conversations: Conversations,
        models: Mapping[str, Sequence[str]],
        lang: Lang,
    ) -> None:
        self._client = client
        self._hub = hub
        self._conversations = conversations
        self._models = models
        self._lang = lang

    async def _say(self, said: Said, key: str, **fields: object) -> None:
        text = plain_text(self._lang, key, **fields)
        await self._client.reply(said.event.message_id, text=text, in_thread=True)

    async def _conversation(self, said: Said) -> Session | None:
        """The topic's conversation when the sender may act on it; None once told why not."""
        found = self._conversations.conversation_for(said.event, said.sender())
        if found == "none":
            await self._say(said, "topic.no_conversation")
            return None
        if found == "not_yours":
            logger.warning("refused a topic command from %s", said.sender().label)
            await self._say(said, "topic.not_yours")
            return None
        return found

    async def model(self, said: Said) -> None:
        """``/model``: the current model and the allowed ones; ``/model NAME``: choose one."""
        session = await self._conversation(said)
        if session is None:
            return
        allowed = list(self._models.get(session.provider, ()))
        listed = ", ".join(allowed) or plain_text(self._lang, "model.none_listed")
        current = session.model or plain_text(self._lang, "model.default")
        if not said.args:
            await self._say(
                said, "model.current", model=current, provider=session.provider, allowed=listed
            )
            return
        chosen = " ".join(said.args)[:MAX_SHOWN]
        if chosen not in allowed:
            await self._say(
                said, "model.refused", model=chosen, provider=session.provider, allowed=listed
            )
            return
        await self._hub.executions.set_model(session.id, chosen)
        logger.info("a conversation's model set to %s by %s", chosen, said.sender().label)
        await self._say(said, "model.set", model=chosen)

    async def compact(self, said: Said) -> None:
        """``/compact``: the Agent's own compaction of the conversation's session, as a turn
        (after the one running, if any)."""
        session = await self._conversation(said)
        if session is None:
            return
        if said.args or session.provider not in COMPACTS:
            key = "compact.usage" if said.args else "compact.unsupported"
            await self._say(said, key, provider=session.provider)
            return
        title = plain_text(self._lang, "compact.title")
        logger.info("a conversation's session compacted for %s", said.sender().label)
        await self._conversations.run_command(
            said.event, said.sender(), session, COMPACT_COMMAND, title
        )

    async def btw(self, said: Said) -> None:
        """``/btw QUESTION``: answered in a fork of the conversation's session, as a card in the
        topic, without stopping or changing the conversation or its running turn."""
        session = await self._conversation(said)
        if session is None:
            return
        question = " ".join(said.args)
        if not question:
            await self._say(said, "btw.usage")
            return
        if session.provider not in FORKS:
            await self._say(said, "btw.unsupported", provider=session.provider)
            return
        try:
            fork = await self._hub.executions.fork(session.id)
        except InvalidArgument:
            await self._say(said, "btw.cannot_fork")
            return
        logger.info("a side question of %s runs in a fork of its conversation", said.sender().label)
        prompt = with_sender(question, said.sender())
        title = plain_text(self._lang, "btw.title", question=question)
        await self._conversations.run_command(said.event, said.sender(), fork, prompt, title)
