"""The bot's event handlers: what a Feishu message or card click does in amux."""

from __future__ import annotations

import logging

from bot.actions import action_table
from bot.conversations import Conversations
from bot.feishu.client import FeishuClient
from bot.feishu.events import CardAction, CardResponse, MessageEvent, OtherEvent
from bot.identity import CLAIM_LOCK_SECONDS, CLAIM_SECONDS, ClaimRefused, FeishuIdentities
from bot.management import Management
from bot.quotas import SenderLimit
from cards.catalogue import plain_text
from cards.models import Lang
from cards.notices import enrollment_closed_card, error_card, owner_only_card
from hub.errors import AmuxError
from hub.principals import Principal

logger = logging.getLogger("amux.bot")

COMMAND = "/amux"


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
    ) -> None:
        self._client = client
        self._identities = identities
        self._management = management
        self._conversations = conversations
        self._lang = lang
        self._limit = limit or SenderLimit(0)
        self._actions = action_table(management, conversations, lang)

    async def on_message(self, event: MessageEvent) -> None:
        if event.sender_type not in ("user", ""):
            return  # Other bots and apps do not drive Agents.
        if not self._identities.admits(event.tenant_key, event.app_id, event.sender):
            return
        text = event.text.strip()
        is_command = text == COMMAND or text.startswith(COMMAND + " ")
        if not event.is_private and not event.mentions_bot:
            return
        try:
            if not event.is_private:
                # For the owner's card, which offers the groups the bot knows for binding.
                self._management.note_group(event.chat_id)
            if is_command:
                await self._command(event, text[len(COMMAND) :].strip())
                return
            principal = await self._enrolled(event)
            if principal is None:
                return
            if event.is_private:
                self._management.note_private_chat(event.chat_id, principal)
            if not text and not event.attachments:
                # A bare mention, or a kind of message with nothing to read: say so.
                await self._client.reply(
                    event.message_id, text=plain_text(self._lang, "command.text_only")
                )
                return
            # Before any work for the message (files, topic context): over the limit, none.
            refusal = self._limit.check(principal.id)
            if refusal is not None:
                logger.info("a message of %s is over the per-minute limit", principal.label)
                if refusal.tell:
                    card = self._limit.card(refusal, self._lang)
                    await self._client.reply(event.message_id, card=card)
                return
            await self._conversations.handle(event, principal)
        except AmuxError as error:
            logger.warning("Feishu message %s failed: %s", event.message_id, error.message)
            await self._client.reply(
                event.message_id, card=error_card(error.code, error.message, self._lang)
            )

    async def _enrolled(self, event: MessageEvent) -> Principal | None:
        """The sender's Principal; None once someone without one was told enrollment is closed."""
        principal = await self._identities.person(event.sender)
        if principal is None:
            await self._client.reply(
                event.message_id, card=enrollment_closed_card(self._lang), in_thread=False
            )
        return principal

    async def _command(self, event: MessageEvent, rest: str) -> None:
        if rest.startswith("provider"):
            await self._provider_command(event, rest[len("provider") :].strip())
            return
        if rest == "project" or rest.startswith("project "):
            await self._project_command(event, rest[len("project") :].split())
            return
        if not event.is_private:
            await self._client.reply(
                event.message_id,
                text=plain_text(self._lang, "command.private_only"),
                in_thread=False,
            )
            return
        if rest.startswith("claim"):
            owner = self._identities.claim(rest[len("claim") :].strip(), event.sender)
            if isinstance(owner, ClaimRefused):
                logger.warning("an owner claim from Feishu was refused (%s)", owner.value)
                refusal = plain_text(
                    self._lang,
                    f"claim.refused.{owner.value}",
                    minutes=CLAIM_SECONDS // 60,
                    lock_minutes=CLAIM_LOCK_SECONDS // 60,
                )
                await self._client.reply(event.message_id, text=refusal, in_thread=False)
                return
            await self._client.reply(
                event.message_id, card=self._management.card(owner), in_thread=False
            )
            return
        principal = await self._enrolled(event)
        if principal is None:
            return
        # Its provider buttons act on this chat; remember it is this person's own.
        self._management.note_private_chat(event.chat_id, principal)
        await self._client.reply(
            event.message_id,
            card=self._management.card(principal, chat_id=event.chat_id),
            in_thread=False,
        )

    async def _provider_command(self, event: MessageEvent, provider: str) -> None:
        principal = await self._enrolled(event)
        if principal is None:
            return
        if not event.is_private and not principal.is_owner:
            # A group's Agent affects everyone in it; the owner decides.
            await self._client.reply(
                event.message_id, card=owner_only_card(self._lang), in_thread=False
            )
            return
        if event.is_private:
            self._management.note_private_chat(event.chat_id, principal)
        self._management.set_provider(event.chat_id, provider)
        message = plain_text(self._lang, "provider.set", provider=provider)
        await self._client.reply(event.message_id, text=message, in_thread=False)

    async def _project_command(self, event: MessageEvent, words: list[str]) -> None:
        """``/amux project bind NAME`` / ``unbind`` in the chat to bind (the owner only), and
        ``/amux project`` to see the chat's binding."""
        principal = await self._enrolled(event)
        if principal is None:
            return
        if event.is_private:
            # A bound private chat keeps its person's memory on cards too: known as theirs.
            self._management.note_private_chat(event.chat_id, principal)
        if words and not principal.is_owner:
            # A binding decides whose memory and which repository everyone in the chat gets.
            await self._client.reply(
                event.message_id, card=owner_only_card(self._lang), in_thread=False
            )
            return
        match words:
            case ["bind", name]:
                said = await self._management.bind_chat(
                    event.chat_id, name, principal, group=not event.is_private
                )
            case ["unbind"]:
                said = await self._management.unbind_chat(event.chat_id, principal)
            case [] if not event.is_private and (
                card := self._management.group_binding_card(event.chat_id)
            ):
                # The way into the project's memory from the group that shares it.
                await self._client.reply(event.message_id, card=card, in_thread=False)
                return
            case []:
                said = self._management.chat_binding_text(event.chat_id)
            case _:
                said = plain_text(self._lang, "project.usage")
        await self._client.reply(event.message_id, text=said, in_thread=False)

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

    async def on_event(self, event: OtherEvent) -> None:
        logger.debug("Feishu event %s needs no action", event.event_type)
