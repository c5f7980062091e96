"""``/amux schedule …`` in a chat: schedules whose results go to the chat they are added in.

Anyone with a Principal in the chat may add one (it runs as them) and list the chat's; pausing,
resuming, removing and running one is its creator's or the owner's (the Hub decides, from who
sent the command), and only for a schedule of this chat: an id copied from another chat names
nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.feishu.client import FeishuClient
from bot.feishu.events import MessageEvent
from cards.catalogue import plain_text
from cards.models import Lang, ScheduleView
from cards.notices import error_card
from cards.schedules import schedule_list_text
from cards.times import date_time
from hub.errors import AmuxError, InvalidArgument, NotFound
from hub.principals import Principal
from hub.schedules import Schedule, Schedules

logger = logging.getLogger("amux.bot")

# Quotes people type around a cron expression, the ones a Chinese keyboard gives included.
_QUOTES = {'"': '"', "'": "'", "“": "”", "‘": "’", "「": "」"}


def split_when(rest: str) -> tuple[str, str]:
    """``"<when>" <prompt>`` into its two parts: the clock in quotes, or a date and a time
    (``2026-12-24 18:00``) unquoted.

    Raises:
        InvalidArgument: no clock could be told from the prompt.
    """
    rest = rest.strip()
    closing = _QUOTES.get(rest[:1])
    if closing is not None:
        end = rest.find(closing, 1)
        if end > 1:
            return rest[1:end].strip(), rest[end + 1 :].strip()
    words = rest.split(maxsplit=2)
    if len(words) >= 2 and words[0][:4].isdigit() and ":" in words[1]:
        return f"{words[0]} {words[1]}", words[2] if len(words) > 2 else ""
    raise InvalidArgument("put the schedule's time in quotes")


class ScheduleCommands:
    """What each ``/amux schedule`` command does once the command table let it through."""

    def __init__(
        self,
        schedules: Schedules,
        client: FeishuClient,
        lang: Lang,
        zone: str,
        *,
        provider_of: Callable[[str], str],
        wake: Callable[[], None],
    ) -> None:
        self._schedules = schedules
        self._client = client
        self._lang = lang
        self._zone = zone
        self._provider_of = provider_of
        self._wake = wake

    async def run(self, event: MessageEvent, sender: Principal, args: tuple[str, ...]) -> None:
        verb = args[0] if args else ""
        try:
            if verb == "add":
                await self._add(event, sender)
            elif verb == "list" and len(args) == 1:
                await self._list(event)
            elif verb in ("pause", "resume", "remove", "run") and len(args) == 2:
                await self._change(event, sender, verb, args[1])
            else:
                await self._say(event, plain_text(self._lang, "schedule.usage"))
        except AmuxError as error:
            card = error_card(error.code, error.message, self._lang)
            await self._client.reply(event.message_id, card=card, in_thread=False)

    async def _add(self, event: MessageEvent, sender: Principal) -> None:
        rest = event.text.strip().split(maxsplit=3)
        if len(rest) < 4:
            await self._say(event, plain_text(self._lang, "schedule.usage"))
            return
        when, prompt = split_when(rest[3])
        if not prompt:
            await self._say(event, plain_text(self._lang, "schedule.usage"))
            return
        if when.lower() == "trigger":
            # A trigger's secret must not be shown in a chat; the CLI prints it to its creator.
            raise InvalidArgument("add a trigger with amux trigger add, which shows you its secret")
        schedule, _ = await self._schedules.add(
            creator=sender,
            chat_id=event.chat_id,
            chat_type="p2p" if event.is_private else "group",
            when=when,
            prompt=prompt,
            provider=self._provider_of(event.chat_id),
            time_zone=await self._zone_of(event),
        )
        self._wake()
        await self._say(event, self._told("schedule.added", schedule))

    async def _zone_of(self, event: MessageEvent) -> str | None:
        """The sender's own Feishu time zone, which their clock means; None (the Hub's
        ``schedules.time_zone``) when Feishu gives none or it cannot be read."""
        if not event.sender.open_id:
            return None
        try:
            zone = await self._client.user_time_zone(event.sender.open_id)
        except AmuxError as error:
            logger.info("no Feishu time zone for a schedule's creator: %s", error.message)
            return None
        try:
            return ZoneInfo(zone).key if zone else None
        except (ZoneInfoNotFoundError, ValueError):
            return None

    async def _list(self, event: MessageEvent) -> None:
        lines = [
            ScheduleView(s.id, s.name, s.spec or s.kind, s.active, s.next_run_at, s.last_result)
            for s in self._schedules.listed(chat_id=event.chat_id)
        ]
        await self._say(event, schedule_list_text(lines, self._zone, self._lang))

    async def _change(self, event: MessageEvent, sender: Principal, verb: str, id_: str) -> None:
        try:
            schedule = self._schedules.get(id_)
        except NotFound:
            schedule = None
        if schedule is None or schedule.chat_id != event.chat_id:
            await self._say(event, plain_text(self._lang, "schedule.not_here", id=id_[:32]))
            return
        if verb == "pause":
            changed = await self._schedules.pause(schedule.id, sender)
            key = "schedule.paused"
        elif verb == "resume":
            changed = await self._schedules.resume(schedule.id, sender)
            key = "schedule.resumed"
        elif verb == "remove":
            changed = await self._schedules.remove(schedule.id, sender)
            key = "schedule.removed"
        else:
            changed = await self._schedules.request_run(schedule.id, sender)
            key = "schedule.run_asked"
        self._wake()
        await self._say(event, self._told(key, changed))

    def _told(self, key: str, schedule: Schedule) -> str:
        upcoming = schedule.next_run_at
        when = date_time(upcoming, self._zone) if upcoming is not None else "-"
        return plain_text(self._lang, key, name=schedule.name, id=schedule.id, time=when)

    async def _say(self, event: MessageEvent, text: str) -> None:
        await self._client.reply(event.message_id, text=text, in_thread=False)
