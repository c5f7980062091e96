"""Hub RPC methods for projects: the owner adds, lists, shows and removes them, and sets
their forges.

Chats are bound from Feishu (``/amux project bind``), where the chat is known; the bot calls
``hub.projects`` in-process for that.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field

from hub.identity import require_owner
from hub.rpc import Call, Method, Methods, NoParams, Params, text_field

OWNER_ONLY = "only the owner manages projects"


class ProjectParams(Params):
    name: str = text_field(64)


class AddParams(ProjectParams):
    path: str | None = text_field(4096, None)
    remote: str | None = text_field(4096, None)
    credential_env: str | None = text_field(64, None)
    branch: str = text_field(100, "main")
    provider: str = text_field(32, "claude")
    permissions: Literal["ask", "auto", "read-only"] | None = Field(
        None, description="ask, auto or read-only"
    )


async def projects_add(call: Call, params: AddParams) -> dict[str, Any]:
    require_owner(call.actor, OWNER_ONLY)
    project = await call.hub.projects.add(
        params.name,
        by=call.actor.principal.id,
        path=params.path,
        remote=params.remote,
        credential_env=params.credential_env,
        branch=params.branch,
        provider=params.provider,
        permissions=params.permissions,
    )
    return {"project": project.to_wire(), "chats": []}


class ForgeParams(ProjectParams):
    kind: Literal["github", "gitlab"] = Field(..., description="github or gitlab")
    base_url: str | None = text_field(2048, None)
    repo: str | None = text_field(512, None)
    token: str = text_field(1024)


async def projects_forge(call: Call, params: ForgeParams) -> dict[str, Any]:
    require_owner(call.actor, OWNER_ONLY)
    forge = await call.hub.forges.set(
        params.name,
        kind=params.kind,
        token=params.token,
        by=call.actor.principal.id,
        base_url=params.base_url,
        repo=params.repo,
    )
    # The answer names the forge, never its token.
    return {"forge": forge.to_wire()}


async def projects_list(call: Call, params: NoParams) -> dict[str, Any]:
    require_owner(call.actor, OWNER_ONLY)
    projects = call.hub.projects
    return {
        "projects": [
            {**p.to_wire(), "chats": [b.chat_id for b in projects.chats(p.name)]}
            for p in projects.all()
        ]
    }


async def projects_show(call: Call, params: ProjectParams) -> dict[str, Any]:
    require_owner(call.actor, OWNER_ONLY)
    projects = call.hub.projects
    project = projects.get(params.name)
    return {
        "project": project.to_wire(),
        "chats": [b.to_wire() for b in projects.chats(project.name)],
    }


async def projects_remove(call: Call, params: ProjectParams) -> dict[str, Any]:
    require_owner(call.actor, OWNER_ONLY)
    removed = await call.hub.projects.remove(params.name)
    return {"project": removed.to_wire(), "removed": True}


PROJECT_METHODS: Methods = MappingProxyType(
    {
        "projects.add": Method(AddParams, projects_add),
        "projects.list": Method(NoParams, projects_list),
        "projects.show": Method(ProjectParams, projects_show),
        "projects.remove": Method(ProjectParams, projects_remove),
        "projects.forge": Method(ForgeParams, projects_forge),
    }
)
