"""The bot's event handlers: what a Feishu message or card click does in amux."""

from __future__ import annotations

import asyncio
import logging

from bot.actions import Click, action_table, no_value
from bot.chat_commands import command_table, command_words
from bot.comments import DocumentComments
from bot.conversations import Conversations
from bot.feishu.catchup import CatchUp
from bot.feishu.client import FeishuClient
from bot.feishu.content import STICKER
from bot.feishu.events import (
    CardAction,
    CardResponse,
    CommentEvent,
    MessageEvent,
    OtherEvent,
    UserIds,
    recall_of,
)
from bot.feishu_accounts import FeishuAccounts
from bot.identity import FeishuIdentities
from bot.management import Management
from bot.quotas import SenderLimit
from bot.schedule_commands import ScheduleCommands
from bot.topic_commands import TopicCommands
from cards import actions
from cards.catalogue import plain_text, text
from cards.elements import Card
from cards.models import Lang
from cards.notices import (
    enrollment_closed_card,
    error_card,
    late_message_card,
    late_message_started_card,
)
from hub.errors import AmuxError
from hub.principals import Principal

logger = logging.getLogger("amux.bot")


class BotSink:
    """Routes Feishu events to the management card, the owner claim, or an Agent turn."""

    def __init__(
        self,
        client: FeishuClient,
        identities: FeishuIdentities,
        management: Management,
        conversations: Conversations,
        lang: Lang,
        limit: SenderLimit | None = None,
        schedules: ScheduleCommands | None = None,
        late: CatchUp | None = None,
        accounts: FeishuAccounts | None = None,
        comments: DocumentComments | None = None,
        topics: TopicCommands | None = None,
    ) -> None:
        self._client = client
        self._comments = comments
        self._identities = identities
        self._management = management
        self._conversations = conversations
        self._lang = lang
        self._limit = limit or SenderLimit(0)
        self._actions = action_table(management, conversations, lang)
        self._commands = command_table(
            client, identities, management, lang, schedules, accounts, topics
        )
        # Messages found long after they were sent wait for their sender's word (catch-up).
        self._late = late
        self._late_runs: set[asyncio.Task[None]] = set()
        self._actions.toast(actions.CATCH_UP_RUN, no_value, self._run_late)

    async def on_message(self, event: MessageEvent) -> None:
        if event.sender_type not in ("user", ""):
            return  # Other bots and apps do not drive Agents.
        if not self._identities.admits(event.tenant_key, event.app_id, event.sender):
            return
        text = event.text.strip()
        if not event.is_private and self._identities.burn_if_seen(text, event.sender):
            # Whoever reads the chat could claim the Hub with it; the new code is in the log.
            await self._answer(event, text=plain_text(self._lang, "claim.burnt"))
            return
        if not event.is_private and not event.mentions_bot:
            return
        # Every message the bot answers counts, commands and refusals too: one sender cannot
        # spend the app's Feishu calls, which everyone shares.
        sender = event.sender.union_id or event.sender.open_id or event.sender.user_id
        refusal = self._limit.check(sender)
        if refusal is not None:
            logger.info("a message of Feishu user %s is over the per-minute limit", sender)
            if refusal.tell:
                # In the message's topic, where a turn's answer would have been.
                card = self._limit.card(refusal, self._lang)
                await self._answer(event, card=card, in_thread=True)
            return
        try:
            if not event.is_private:
                # For the owner's card, which offers the groups the bot knows for binding.
                self._management.note_group(event.chat_id)
            if self._late is not None and self._late.is_late(event):
                await self._hold(event, self._late)
                return
            words = command_words(text)
            if words is not None:
                await self._commands.dispatch(event, words)
                return
            principal = await self._enrolled(event)
            if principal is None:
                return
            if event.is_private:
                self._management.note_private_chat(event.chat_id, principal)
            if not event.readable:
                # A bare mention, a sticker, or a kind of message with nothing to read: say so.
                said = "message.sticker" if event.message_type == STICKER else "command.text_only"
                await self._client.reply(event.message_id, text=plain_text(self._lang, said))
                return
            await self._conversations.handle(event, principal)
        except AmuxError as error:
            logger.warning("Feishu message %s failed: %s", event.message_id, error.message)
            await self._client.reply(
                event.message_id, card=error_card(error.code, error.message, self._lang)
            )

    async def _answer(
        self,
        event: MessageEvent,
        *,
        text: str | None = None,
        card: Card | None = None,
        in_thread: bool = False,
    ) -> None:
        """A reply to ``event``; one Feishu refuses is logged, not raised."""
        try:
            await self._client.reply(event.message_id, text=text, card=card, in_thread=in_thread)
        except AmuxError as error:
            logger.warning("Feishu message %s got no answer: %s", event.message_id, error.message)

    async def _enrolled(self, event: MessageEvent) -> Principal | None:
        """The sender's Principal; None once someone without one was told enrollment is closed."""
        principal = await self._identities.person(event.sender)
        if principal is None:
            await self._client.reply(
                event.message_id, card=enrollment_closed_card(self._lang), in_thread=False
            )
        return principal

    async def _hold(self, event: MessageEvent, late: CatchUp) -> None:
        """Answer a message found long after it was sent with a note instead of running it."""
        principal = await self._enrolled(event)
        if principal is None:
            return
        card = late_message_card(late.late_minutes(event), self._lang)
        note = await self._client.reply(event.message_id, card=card, in_thread=False)
        late.hold(event, note.message_id, principal.id)
        logger.info(
            "message %s was found too late to run unasked; its sender may", event.message_id
        )

    async def _run_late(self, click: Click, _: None) -> CardResponse:
        """The note's button: the message it answers runs once, for its sender or the owner."""
        taken = (
            self._late.take(click.message_id, click.principal.id, click.principal.is_owner)
            if self._late is not None
            else "unknown"
        )
        if isinstance(taken, str):
            if taken == "not_yours":
                logger.warning(
                    "refused %s running another person's late message", click.principal.name
                )
            key = "catchup.not_yours" if taken == "not_yours" else "catchup.done"
            return CardResponse(toast=text(self._lang, key), toast_type="error")
        logger.info("late message %s runs on %s's word", taken.message_id, click.principal.name)
        # The turn takes as long as it takes; the click is answered now.
        task = asyncio.get_running_loop().create_task(self.on_message(taken))
        self._late_runs.add(task)
        task.add_done_callback(self._late_runs.discard)
        return CardResponse(
            card=late_message_started_card(self._lang),
            toast=text(self._lang, "catchup.started"),
            toast_type="success",
        )

    async def on_card_action(self, action: CardAction) -> CardResponse | None:
        if not self._identities.admits(action.tenant_key, action.app_id, action.operator):
            return None
        try:
            principal = await self._identities.person(action.operator)
        except AmuxError as error:
            return CardResponse(toast=error.message, toast_type="error")
        if principal is None:
            return CardResponse(card=enrollment_closed_card(self._lang))
        return await self._actions.dispatch(action, principal)

    async def on_comment(self, event: CommentEvent) -> None:
        """A document comment that @mentions the bot: a turn of its author, who is admitted and
        resolved as a message's sender is; someone without a Principal is told so in the thread
        and nothing runs. A claim code in it is burnt, as anywhere outside a private chat."""
        if not event.mentions_bot or self._comments is None:
            return
        if not self._identities.admits(event.tenant_key, event.app_id, event.author):
            return
        author = event.author.union_id or event.author.open_id or event.author.user_id
        refusal = self._limit.check(author)
        if refusal is not None:
            logger.info("a comment of Feishu user %s is over the per-minute limit", author)
            return
        comments = self._comments
        try:
            principal = await self._identities.person(event.author)
        except AmuxError as error:
            logger.warning("comment %s refused: %s", event.comment_id, error.message)
            return
        if principal is None:
            logger.info("a comment of Feishu user %s, who is no member, runs nothing", author)
        await comments.handle(
            event, principal, lambda said: self._identities.burn_if_seen(said, event.author)
        )

    async def on_event(self, event: OtherEvent) -> None:
        recall = recall_of(event)
        if recall is None:
            logger.debug("Feishu event %s needs no action", event.event_type)
            return
        # The event names no operator: only its tenant and app are checked; what the recall
        # may stop is found from the message alone (``Conversations.recall``).
        if not self._identities.admits(event.tenant_key, event.app_id, UserIds()):
            return
        try:
            await self._conversations.recall(recall)
        except AmuxError as error:
            logger.warning("recall of %s not applied: %s", recall.message_id, error.message)
