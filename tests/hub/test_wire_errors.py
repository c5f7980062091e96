"""Every registered error code crosses the Hub RPC as its own class, with its details.

The Hub here is the real application (``add_hub``) served on loopback, with one extra method in
its table that raises the error a test names; ``HubClient`` is the real client.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

# Importing the Feishu adapter's errors registers their code as well.
import bot.feishu.errors  # noqa: F401
from hub.client import HubClient
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.errors import (
    ERRORS,
    AmuxError,
    Conflict,
    InternalError,
    QuotaExceeded,
    error_from_wire,
)
from hub.rpc import Call, Method, Params, combine
from hub.server import HUB_METHODS, add_hub
from runtime_bridge.providers.errors import (
    AgentProtocolError,
    ExecutableMissing,
    NativeMemoryUnconfirmed,
)

LAUNCH_CODES = ("executable_missing", "native_memory_unconfirmed", "agent_protocol")
DETAILS = {"path": "notes/a.md", "observed_revision": "absent", "count": 3, "names": ["a", "b"]}


class RaiseParams(Params):
    code: str
    details: dict[str, Any] = {}


async def raise_error(call: Call, params: RaiseParams) -> dict[str, Any]:
    raise ERRORS[params.code](f"raised as {params.code}", **params.details)


@pytest.fixture
async def hub(aiohttp_server: Any, hub_settings: HubSettings) -> HubClient:
    app = web.Application()
    methods = combine(HUB_METHODS, {"test.raise": Method(RaiseParams, raise_error)})
    add_hub(app, hub_settings, methods=methods)
    server = await aiohttp_server(app)
    token = (hub_settings.home / OWNER_TOKEN_FILE).read_text().strip()
    return HubClient(str(server.make_url("")), token)


async def raised(hub: HubClient, code: str, details: dict[str, Any]) -> AmuxError:
    async with hub:
        with pytest.raises(AmuxError) as caught:
            await hub.call("test.raise", code=code, details=details)
    return caught.value


def test_the_launch_errors_of_the_runtime_bridge_are_registered_under_their_codes() -> None:
    assert {code: ERRORS[code] for code in LAUNCH_CODES} == {
        "executable_missing": ExecutableMissing,
        "native_memory_unconfirmed": NativeMemoryUnconfirmed,
        "agent_protocol": AgentProtocolError,
    }


@pytest.mark.parametrize("code", sorted(ERRORS))
async def test_every_registered_error_comes_back_from_the_hub_as_its_own_class(
    hub: HubClient, code: str
) -> None:
    error = await raised(hub, code, DETAILS)
    assert type(error) is ERRORS[code]
    assert error.code == code
    assert error.message == f"raised as {code}"
    assert error.details == DETAILS


async def test_details_read_back_through_the_typed_properties_after_the_wire(
    hub: HubClient,
) -> None:
    conflict = await raised(hub, "conflict", {"path": "a.md", "observed_revision": "0" * 64})
    assert isinstance(conflict, Conflict)
    assert (conflict.path, conflict.observed_revision) == ("a.md", "0" * 64)

    quota = await raised(hub, "quota_exceeded", {"limit": "scope_bytes"})
    assert isinstance(quota, QuotaExceeded)
    assert quota.limit == "scope_bytes"

    missing = await raised(hub, "executable_missing", {"executable": "bwrap", "provider": "pi"})
    assert isinstance(missing, ExecutableMissing)
    assert (missing.executable, missing.provider) == ("bwrap", "pi")


def test_a_detail_of_the_wrong_type_or_left_out_reads_as_none() -> None:
    assert Conflict("changed", observed_revision=7).observed_revision is None
    assert ExecutableMissing("gone").executable is None


def test_a_code_no_class_here_registered_comes_back_as_internal_with_its_message() -> None:
    error = error_from_wire({"error": {"code": "from_the_future", "message": "m", "x": 1}}, 599)
    assert type(error) is InternalError
    assert (error.message, error.details) == ("m", {"x": 1})


def test_a_second_class_cannot_claim_a_registered_code() -> None:
    with pytest.raises(TypeError, match="'conflict' already belongs to hub.errors.Conflict"):

        class Another(AmuxError):
            code = "conflict"

    assert ERRORS["conflict"] is Conflict


def test_a_subclass_without_a_code_of_its_own_travels_as_its_parent() -> None:
    class Narrower(Conflict):
        pass

    assert ERRORS["conflict"] is Conflict
    assert type(error_from_wire(Narrower("changed").to_wire(), 409)) is Conflict
