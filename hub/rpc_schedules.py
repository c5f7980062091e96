"""Hub RPC methods for schedules and triggers, as people call them from the CLI.

An Agent's delegated credential may not call any of them: a schedule runs turns as its creator
later, so one an Agent could make would outlive the turn that made it. A person schedules into
their own private chat with the bot; a group, which the Hub cannot check they are in, only the
owner names from here (members add a group's schedules in the group, where Feishu says who is
there). Changing a schedule is its creator's or the owner's; anyone sees their own.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field

from hub.errors import Forbidden, InvalidArgument
from hub.identity import Actor
from hub.rpc import Call, Method, Methods, Params, text_field
from hub.schedules import MAX_PROMPT_BYTES, ChatType, Schedule

NOT_FOR_AGENTS = (
    "an Agent's credential cannot manage schedules; a person does, in Feishu or the CLI"
)


def _in_person(actor: Actor) -> None:
    if actor.delegated:
        raise Forbidden(NOT_FOR_AGENTS)


class AddParams(Params):
    when: str = text_field(200)
    prompt: str = text_field(MAX_PROMPT_BYTES)
    chat_id: str | None = text_field(128, None)
    provider: str = text_field(32, "claude")
    name: str = text_field(80, "")
    time_zone: str | None = text_field(64, None)
    overlap: Literal["skip", "queue"] = Field("skip", description="skip or queue")


class TriggerAddParams(Params):
    prompt: str = text_field(MAX_PROMPT_BYTES)
    chat_id: str | None = text_field(128, None)
    provider: str = text_field(32, "claude")
    name: str = text_field(80, "")


class ScheduleParams(Params):
    id: str = text_field(32)


class ListParams(Params):
    everyone: bool = Field(False, description="the owner: every person's schedules")


def _where(call: Call, chat_id: str | None) -> tuple[str, ChatType]:
    """The chat a schedule made from the CLI delivers into, and its kind."""
    me = call.actor.principal
    people = call.hub.people
    if chat_id is None:
        mine = [chat for chat, holder in people.private_chats() if holder.id == me.id]
        if not mine:
            raise InvalidArgument(
                "you have no private chat with the bot yet: message the bot in Feishu once, or "
                "name a chat with --chat"
            )
        return mine[0], "p2p"
    holder = people.private_chat_holder(chat_id)
    if holder is not None:
        if holder.id != me.id:
            raise Forbidden("that is someone else's private chat with the bot")
        return chat_id, "p2p"
    if not me.is_owner:
        raise Forbidden(
            "only the owner names a group from the CLI; add a group's schedule in the group "
            "with /amux schedule add"
        )
    return chat_id, "group"


def _wire(schedule: Schedule) -> dict[str, Any]:
    return schedule.to_wire()


async def schedules_add(call: Call, params: AddParams) -> dict[str, Any]:
    _in_person(call.actor)
    if params.when.strip().lower() == "trigger":
        raise InvalidArgument("a trigger is added with triggers.add (amux trigger add)")
    chat_id, chat_type = _where(call, params.chat_id)
    schedule, _ = await call.hub.schedules.add(
        creator=call.actor.principal,
        chat_id=chat_id,
        chat_type=chat_type,
        when=params.when,
        prompt=params.prompt,
        provider=params.provider,
        name=params.name,
        time_zone=params.time_zone,
        overlap=params.overlap,
    )
    return {"schedule": _wire(schedule)}


async def schedules_list(call: Call, params: ListParams) -> dict[str, Any]:
    _in_person(call.actor)
    me = call.actor.principal
    if params.everyone and not me.is_owner:
        raise Forbidden("only the owner lists everyone's schedules")
    found = call.hub.schedules.listed(created_by=None if params.everyone else me.id)
    return {"schedules": [_wire(s) for s in found]}


def _visible(call: Call, schedule_id: str) -> Schedule:
    schedule = call.hub.schedules.get(schedule_id)
    me = call.actor.principal
    if schedule.created_by != me.id and not me.is_owner:
        raise Forbidden("only the schedule's creator or the owner may see it from here")
    return schedule


async def schedules_show(call: Call, params: ScheduleParams) -> dict[str, Any]:
    _in_person(call.actor)
    return {"schedule": _wire(_visible(call, params.id))}


async def schedules_pause(call: Call, params: ScheduleParams) -> dict[str, Any]:
    _in_person(call.actor)
    return {"schedule": _wire(await call.hub.schedules.pause(params.id, call.actor.principal))}


async def schedules_resume(call: Call, params: ScheduleParams) -> dict[str, Any]:
    _in_person(call.actor)
    return {"schedule": _wire(await call.hub.schedules.resume(params.id, call.actor.principal))}


async def schedules_remove(call: Call, params: ScheduleParams) -> dict[str, Any]:
    _in_person(call.actor)
    removed = await call.hub.schedules.remove(params.id, call.actor.principal)
    return {"schedule": _wire(removed), "removed": True}


async def schedules_run(call: Call, params: ScheduleParams) -> dict[str, Any]:
    _in_person(call.actor)
    asked = await call.hub.schedules.request_run(params.id, call.actor.principal)
    return {"schedule": _wire(asked), "requested": True}


async def triggers_add(call: Call, params: TriggerAddParams) -> dict[str, Any]:
    _in_person(call.actor)
    chat_id, chat_type = _where(call, params.chat_id)
    trigger, secret = await call.hub.schedules.add(
        creator=call.actor.principal,
        chat_id=chat_id,
        chat_type=chat_type,
        when="trigger",
        prompt=params.prompt,
        provider=params.provider,
        name=params.name,
    )
    return {"trigger": _wire(trigger), "secret": secret}


async def triggers_rotate(call: Call, params: ScheduleParams) -> dict[str, Any]:
    _in_person(call.actor)
    secret = await call.hub.schedules.rotate_secret(params.id, call.actor.principal)
    return {"trigger": _wire(call.hub.schedules.get(params.id)), "secret": secret}


SCHEDULE_METHODS: Methods = MappingProxyType(
    {
        "schedules.add": Method(AddParams, schedules_add),
        "schedules.list": Method(ListParams, schedules_list),
        "schedules.show": Method(ScheduleParams, schedules_show),
        "schedules.pause": Method(ScheduleParams, schedules_pause),
        "schedules.resume": Method(ScheduleParams, schedules_resume),
        "schedules.remove": Method(ScheduleParams, schedules_remove),
        "schedules.run": Method(ScheduleParams, schedules_run),
        "triggers.add": Method(TriggerAddParams, triggers_add),
        "triggers.rotate": Method(ScheduleParams, triggers_rotate),
    }
)
