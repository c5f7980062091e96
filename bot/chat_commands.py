"""The chat command table: each ``/amux`` command, who may send it and in which chat, as the
card actions have theirs (``bot.actions``).

A command is found by its longest leading words (``project bind`` before ``project``; words
naming no command are the management card's, which is private). The table's dispatch does,
before any handler runs, what every handler would otherwise repeat:

- a command sent in a kind of chat its row does not list is refused, and nothing else is done
  (``claim`` only in a private chat, so no branch order can let it through in a group);
- someone without a Principal is told enrollment is closed, unless the row lets anyone send it;
- an owner-only command from anyone else gets the Owner only card.

The per-sender limit is the sink's, applied to every message the bot would answer before it
reaches this table.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from bot.feishu.client import FeishuClient
from bot.feishu.events import MessageEvent
from bot.feishu_accounts import FeishuAccounts
from bot.identity import CLAIM_LOCK_SECONDS, CLAIM_SECONDS, ClaimRefused, FeishuIdentities
from bot.management import Management
from bot.schedule_commands import ScheduleCommands
from cards.catalogue import plain_text
from cards.models import Lang
from cards.notices import enrollment_closed_card, owner_only_card
from hub.principals import Principal

if TYPE_CHECKING:
    from bot.topic_commands import TopicCommands

logger = logging.getLogger("amux.bot")

COMMAND = "/amux"

Chat = Literal["private", "group"]
# Who may send a command in a kind of chat: anyone at all (before enrollment), a person with a
# Principal, or the owner only.
Who = Literal["anyone", "member", "owner"]


@dataclass(frozen=True)
class Said:
    """One command as sent: the message, its sender's Principal (None only where anyone may
    send it), and the words after the command's own."""

    event: MessageEvent
    principal: Principal | None
    args: tuple[str, ...]

    def sender(self) -> Principal:
        assert self.principal is not None, "a command for members was dispatched without one"
        return self.principal


@dataclass(frozen=True)
class Command:
    """One row: the command's words, who may send it in each kind of chat (a chat kind not
    listed refuses it), and its handler."""

    words: tuple[str, ...]
    private: Who | None
    group: Who | None
    handle: Callable[[Said], Awaitable[None]]

    def who(self, chat: Chat) -> Who | None:
        return self.private if chat == "private" else self.group


# Commands of a topic's conversation, sent without ``/amux``: ``/model x`` is ``/amux model x``.
TOPIC_COMMANDS = ("model", "compact", "btw")


def command_words(text: str) -> tuple[str, ...] | None:
    """The words after ``/amux`` when ``text`` is a command; None for any other message."""
    if text == COMMAND or text.startswith(COMMAND + " "):
        return tuple(text[len(COMMAND) :].split())
    for name in TOPIC_COMMANDS:
        short = "/" + name
        if text == short or text.startswith(short + " "):
            return (name, *text[len(short) :].split())
    return None


class CommandTable:
    """Chat commands to their rows; dispatches a command through the checks every one shares."""

    def __init__(
        self, client: FeishuClient, identities: FeishuIdentities, management: Management, lang: Lang
    ) -> None:
        self._client = client
        self._identities = identities
        self._management = management
        self._lang = lang
        self._rows: dict[tuple[str, ...], Command] = {}

    def add(
        self,
        words: tuple[str, ...],
        handle: Callable[[Said], Awaitable[None]],
        *,
        private: Who | None = None,
        group: Who | None = None,
    ) -> None:
        """Route ``/amux WORDS…`` to ``handle`` where ``private`` / ``group`` allow it.

        Raises:
            ValueError: a command routed twice, or one no chat may send.
        """
        if words in self._rows:
            raise ValueError(f"chat command {' '.join(words)!r} is routed twice")
        if private is None and group is None:
            raise ValueError(f"chat command {' '.join(words)!r} is allowed in no chat")
        self._rows[words] = Command(words, private, group, handle)

    def find(self, words: tuple[str, ...]) -> tuple[Command, tuple[str, ...]]:
        """The row of the longest leading words, and the words after them."""
        for length in range(len(words), -1, -1):
            row = self._rows.get(words[:length])
            if row is not None:
                return row, words[length:]
        raise LookupError("the table has no row for /amux alone")

    async def dispatch(self, event: MessageEvent, words: tuple[str, ...]) -> None:
        """Answer one ``/amux`` command of ``event``'s sender."""
        row, args = self.find(words)
        chat: Chat = "private" if event.is_private else "group"
        who = row.who(chat)
        name = " ".join((COMMAND, *row.words))
        if who is None:
            logger.info("refused %s sent in a %s chat", name, chat)
            await self._reply(event, plain_text(self._lang, "command.private_only"))
            return
        principal = None
        if who != "anyone":
            principal = await self._identities.person(event.sender)
            if principal is None:
                card = enrollment_closed_card(self._lang)
                await self._client.reply(event.message_id, card=card, in_thread=False)
                return
            if event.is_private:
                # Its cards' buttons act on this chat; remember it is this person's own.
                self._management.note_private_chat(event.chat_id, principal)
            if who == "owner" and not principal.is_owner:
                logger.warning("refused owner-only %s from %s", name, principal.label)
                card = owner_only_card(self._lang)
                await self._client.reply(event.message_id, card=card, in_thread=False)
                return
        await row.handle(Said(event, principal, args))

    async def _reply(self, event: MessageEvent, text: str) -> None:
        await self._client.reply(event.message_id, text=text, in_thread=False)


class ChatCommands:
    """What each ``/amux`` command does once the table let it through."""

    def __init__(
        self, client: FeishuClient, identities: FeishuIdentities, management: Management, lang: Lang
    ) -> None:
        self._client = client
        self._identities = identities
        self._management = management
        self._lang = lang

    async def _say(self, said: Said, text: str) -> None:
        await self._client.reply(said.event.message_id, text=text, in_thread=False)

    async def card(self, said: Said) -> None:
        """``/amux``: the management card, for this private chat."""
        card = self._management.card(said.sender(), chat_id=said.event.chat_id)
        await self._client.reply(said.event.message_id, card=card, in_thread=False)

    async def claim(self, said: Said) -> None:
        """``/amux claim CODE``: the sender becomes the owner if the code is the current one."""
        owner = self._identities.claim(" ".join(said.args), said.event.sender)
        if isinstance(owner, ClaimRefused):
            logger.warning("an owner claim from Feishu was refused (%s)", owner.value)
            refusal = plain_text(
                self._lang,
                f"claim.refused.{owner.value}",
                minutes=CLAIM_SECONDS // 60,
                lock_minutes=CLAIM_LOCK_SECONDS // 60,
            )
            await self._say(said, refusal)
            return
        self._management.note_private_chat(said.event.chat_id, owner)
        card = self._management.card(owner, chat_id=said.event.chat_id)
        await self._client.reply(said.event.message_id, card=card, in_thread=False)

    async def provider(self, said: Said) -> None:
        """``/amux provider NAME``: the Agent new conversations in this chat run."""
        provider = " ".join(said.args)
        self._management.set_provider(said.event.chat_id, provider)
        await self._say(said, plain_text(self._lang, "provider.set", provider=provider))

    async def project(self, said: Said) -> None:
        """``/amux project``: the chat's binding (in a bound group under isolation, with the
        button into the project's memory)."""
        event = said.event
        if said.args:
            await self._say(said, plain_text(self._lang, "project.usage"))
            return
        if not event.is_private:
            card = self._management.group_binding_card(event.chat_id)
            if card is not None:
                await self._client.reply(event.message_id, card=card, in_thread=False)
                return
        await self._say(said, self._management.chat_binding_text(event.chat_id))

    async def bind(self, said: Said) -> None:
        """``/amux project bind NAME``: a binding decides whose memory and which repository
        everyone in the chat gets."""
        if len(said.args) != 1:
            await self._say(said, plain_text(self._lang, "project.usage"))
            return
        event = said.event
        bound = await self._management.bind_chat(
            event.chat_id, said.args[0], said.sender(), group=not event.is_private
        )
        await self._say(said, bound)

    async def unbind(self, said: Said) -> None:
        """``/amux project unbind``."""
        if said.args:
            await self._say(said, plain_text(self._lang, "project.usage"))
            return
        await self._say(said, await self._management.unbind_chat(said.event.chat_id, said.sender()))


class AccountCommands:
    """``/amux connect`` and ``/amux disconnect``: a person's own Feishu account."""

    def __init__(self, client: FeishuClient, accounts: FeishuAccounts) -> None:
        self._client = client
        self._accounts = accounts

    async def connect(self, said: Said) -> None:
        chat_id = said.event.chat_id

        async def tell(text: str) -> None:
            await self._client.send_text(chat_id, text)

        answer = await self._accounts.begin(said.sender(), tell)
        await self._client.reply(said.event.message_id, text=answer, in_thread=False)

    async def disconnect(self, said: Said) -> None:
        answer = await self._accounts.disconnect(said.sender())
        await self._client.reply(said.event.message_id, text=answer, in_thread=False)


def command_table(
    client: FeishuClient,
    identities: FeishuIdentities,
    management: Management,
    lang: Lang,
    schedules: ScheduleCommands | None = None,
    accounts: FeishuAccounts | None = None,
    topics: TopicCommands | None = None,
) -> CommandTable:
    """Every chat command amux answers, who may send it, and where."""
    table = CommandTable(client, identities, management, lang)
    commands = ChatCommands(client, identities, management, lang)
    # The card shows a person's identity and, for the owner, the Hub's settings: private.
    table.add((), commands.card, private="member")
    # A code read by anyone but the bot is burnt before this table sees it (``BotSink``); a
    # claim is taken only where nobody else reads it.
    table.add(("claim",), commands.claim, private="anyone")
    # A group's Agent affects everyone in it; the owner decides.
    table.add(("provider",), commands.provider, private="member", group="owner")
    table.add(("project",), commands.project, private="member", group="member")
    table.add(("project", "bind"), commands.bind, private="owner", group="owner")
    table.add(("project", "unbind"), commands.unbind, private="owner", group="owner")
    if accounts is not None:
        # The link and code connect whoever opens them first: only the person's own chat.
        account_commands = AccountCommands(client, accounts)
        table.add(("connect",), account_commands.connect, private="member")
        table.add(("disconnect",), account_commands.disconnect, private="member")
    if topics is not None:
        # Whoever may continue a topic's conversation may choose its model; the owner lists
        # the models (``TopicCommands`` checks the sender against the conversation).
        table.add(("model",), topics.model, private="member", group="member")
        table.add(("compact",), topics.compact, private="member", group="member")
        table.add(("btw",), topics.btw, private="member", group="member")
    if schedules is not None:
        # A schedule runs as whoever adds it and delivers where it was added; changing one is
        # its creator's or the owner's, which the Hub checks per schedule.
        table.add(
            ("schedule",),
            lambda said: schedules.run(said.event, said.sender(), said.args),
            private="member",
            group="member",
        )
    return table
