"""The bot's event handlers: what a Feishu message or card click does in amux."""

from __future__ import annotations

import logging

from bot.conversations import Conversations
from bot.feishu.client import FeishuClient
from bot.feishu.events import CardAction, CardResponse, MessageEvent, OtherEvent
from bot.identity import CLAIM_LOCK_SECONDS, CLAIM_SECONDS, ClaimRefused, FeishuIdentities
from bot.management import Management
from bot.quotas import SenderLimit
from cards import actions
from cards.catalogue import text
from cards.models import Lang
from cards.notices import enrollment_closed_card, error_card, owner_only_card
from hub.errors import AmuxError

logger = logging.getLogger("amux.bot")

COMMAND = "/amux"
PRIVATE_ONLY = {
    "zh_cn": "请在与机器人的私聊中发送 /amux。",
    "en_us": "Send /amux to the bot in a private chat.",
}
PROVIDER_SET = {
    "zh_cn": "本会话的新对话将使用 {provider}。",
    "en_us": "New conversations in this chat now run {provider}.",
}
TEXT_ONLY = {
    "zh_cn": "请用文字描述你的请求（读取文字、富文本、图片和文件消息）。",
    "en_us": "Please write your request as text (text, rich text, images and files are read).",
}
CLAIM_REFUSED = {
    ClaimRefused.WRONG: {
        "zh_cn": "认领码无效。",
        "en_us": "That claim code is not valid.",
    },
    ClaimRefused.EXPIRED: {
        "zh_cn": "认领码已过期（有效期 {minutes} 分钟）。重启 amux serve，使用其日志中的新认领码。",
        "en_us": "That claim code has expired (codes last {minutes} minutes). Restart amux serve "
        "and send the new code from its log.",
    },
    ClaimRefused.USED: {
        "zh_cn": "该认领码已被使用过，不能再次使用。",
        "en_us": "That claim code was already used; a code works only once.",
    },
    ClaimRefused.LOCKED: {
        "zh_cn": "错误的认领码太多：{lock_minutes} 分钟内不再接受你的认领，正确的认领码也不例外。",
        "en_us": "Too many wrong claim codes: claims from you are refused for {lock_minutes} "
        "minutes, even with the right code.",
    },
    ClaimRefused.LOCKED_FOR_ALL: {
        "zh_cn": "错误的认领码太多：认领已锁定。重启 amux serve，使用其日志中的新认领码。",
        "en_us": "Too many wrong claim codes: claiming is locked. Restart amux serve and send the "
        "new code from its log.",
    },
}


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
            if is_command:
                await self._command(event, text[len(COMMAND) :].strip())
                return
            principal = self._identities.resolve(event.sender)
            if principal is None:
                await self._client.reply(
                    event.message_id, card=enrollment_closed_card(self._lang), in_thread=False
                )
                return
            if not text and not event.attachments:
                # A bare mention, or a kind of message with nothing to read: say so.
                await self._client.reply(event.message_id, text=TEXT_ONLY[self._lang])
                return
            # Before any work for the message (files, topic context): over the limit, none.
            refusal = self._limit.check(principal.id)
            if refusal is not None:
                logger.info("a message of %s is over the per-minute limit", principal.name)
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

    async def _command(self, event: MessageEvent, rest: str) -> None:
        if rest.startswith("provider"):
            await self._provider_command(event, rest[len("provider") :].strip())
            return
        if not event.is_private:
            await self._client.reply(
                event.message_id, text=PRIVATE_ONLY[self._lang], in_thread=False
            )
            return
        if rest.startswith("claim"):
            owner = self._identities.claim(rest[len("claim") :].strip(), event.sender)
            if isinstance(owner, ClaimRefused):
                logger.warning("an owner claim from Feishu was refused (%s)", owner.value)
                refusal = CLAIM_REFUSED[owner][self._lang].format(
                    minutes=CLAIM_SECONDS // 60, lock_minutes=CLAIM_LOCK_SECONDS // 60
                )
                await self._client.reply(event.message_id, text=refusal, in_thread=False)
                return
            await self._client.reply(
                event.message_id, card=self._management.card(owner), in_thread=False
            )
            return
        principal = self._identities.resolve(event.sender)
        if principal is None:
            await self._client.reply(
                event.message_id, card=enrollment_closed_card(self._lang), in_thread=False
            )
            return
        # Its provider buttons act on this chat; remember it is this person's own.
        self._management.note_private_chat(event.chat_id, principal)
        await self._client.reply(
            event.message_id,
            card=self._management.card(principal, chat_id=event.chat_id),
            in_thread=False,
        )

    async def _provider_command(self, event: MessageEvent, provider: str) -> None:
        principal = self._identities.resolve(event.sender)
        if principal is None:
            await self._client.reply(
                event.message_id, card=enrollment_closed_card(self._lang), in_thread=False
            )
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
        message = PROVIDER_SET[self._lang].format(provider=provider)
        await self._client.reply(event.message_id, text=message, in_thread=False)

    async def on_card_action(self, action: CardAction) -> CardResponse | None:
        if not self._identities.admits(action.tenant_key, action.app_id, action.operator):
            return None
        try:
            principal = self._identities.resolve(action.operator)
        except AmuxError as error:
            return CardResponse(toast=error.message, toast_type="error")
        if principal is None:
            return CardResponse(card=enrollment_closed_card(self._lang))
        value = action.value
        if value.get("action") == actions.RUN_CANCEL:
            run_id = str(value.get("run_id") or "")
            try:
                cancelled = await self._conversations.cancel(run_id, principal)
            except AmuxError as error:
                return CardResponse(toast=error.message, toast_type="error")
            if not cancelled:
                return CardResponse(toast="not yours to cancel", toast_type="error")
            return CardResponse(toast="cancelling", toast_type="info")
        if value.get("action") == actions.RUN_APPROVE:
            # The Hub decides who may answer (the turn's person or the owner), whatever the
            # (forgeable) value says; the card shows the answer when the turn's follower sees it.
            try:
                message, kind = await self._conversations.approve(
                    str(value.get("run_id") or ""),
                    str(value.get("request_id") or ""),
                    str(value.get("decision") or ""),
                    principal,
                )
            except AmuxError as error:
                return CardResponse(toast=error.message, toast_type="error")
            return CardResponse(toast=message, toast_type=kind)
        if value.get("action") == actions.MEMORY_UNDO:
            try:
                message, undone = await self._management.undo(principal, value)
            except AmuxError as error:
                return CardResponse(toast=error.message, toast_type="error")
            return CardResponse(toast=message, toast_type="success" if undone else "error")
        if value.get("action") == actions.CONVERSATION_NEW:
            renewed = await self._conversations.renew(str(value.get("origin") or ""), principal)
            if not renewed:
                return CardResponse(
                    toast=text(self._lang, "conversation.not_yours"), toast_type="error"
                )
            return CardResponse(toast=text(self._lang, "conversation.renewed"), toast_type="info")
        card = await self._management.act(
            principal, value, action.form_value, action.open_message_id, action.chat_id
        )
        if card is None:
            logger.warning("unknown card action %r", value.get("action"))
            return None
        return CardResponse(card=card)

    async def on_event(self, event: OtherEvent) -> None:
        logger.debug("Feishu event %s needs no action", event.event_type)
