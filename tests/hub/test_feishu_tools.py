"""The Hub's ``feishu.read`` and ``feishu.search``: whom they read as, and their typed refusals.

The bot's reader is the real one (``bot.feishu_docs.FeishuDocs``) given a person's token by
the callable ``amux serve`` gives it (``FeishuAccounts.access_token``); tokens here are handed out
per person by that callable, and Feishu itself is the loopback fake.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.feishu_docs import FeishuDocs
from hub.rpc import HUB
from hub.services import Hub
from tests.fakes.feishu import FakeDocument, FakeFeishu
from tests.hub.conftest import Served, ServeHub

Client = TestClient[Any, Any]
TOPIC = "feishu:oc_team:om_root"
WORKSPACE = "topic-" + "cd" * 16
PLAN = "https://acme.feishu.cn/docx/DocPlan0001"


@pytest.fixture
async def served(serve_hub: ServeHub) -> Served:
    return await serve_hub("alice", "mallory", memory=True)


async def call(client: Client, token: str, method: str, **params: Any) -> tuple[int, Any]:
    response = await client.post(
        f"/rpc/v1/{method}", json=params, headers={"Authorization": f"Bearer {token}"}
    )
    return response.status, await response.json()


async def turn_credential(client: Client, ids: dict[str, str], sender: str) -> tuple[str, str]:
    """(the delegated credential of a turn ``sender`` sent in a shared topic Alice started, the
    turn's id)."""
    hub: Hub = client.server.app[HUB]
    first, session = await hub.executions.submit(
        principal_id=ids["alice"],
        submitted_by=ids["alice"],
        provider="claude",
        prompt="start",
        origin=TOPIC,
        workspace=WORKSPACE,
    )
    turn = first
    if sender != "alice":
        turn, _ = await hub.executions.submit(
            principal_id=session.principal_id,
            submitted_by=ids[sender],
            provider="claude",
            prompt="reply",
            origin=TOPIC,
        )
    status, delegated = await call(
        client,
        ids["runtime-token"],
        "sessions.memory",
        session_id=session.id,
        capable=True,
        execution_id=turn.id,
    )
    assert status == 200, delegated
    return str(delegated["token"]), turn.id


async def test_without_a_feishu_app_the_tools_are_unavailable_not_an_error(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    token, _ = await turn_credential(client, ids, "alice")
    status, body = await call(client, token, "feishu.read", document=PLAN)
    assert status == 503
    assert body["error"]["code"] == "feishu_unavailable"
    status, capabilities = await call(client, token, "system.capabilities")
    assert capabilities["feishu"] == {
        "available": False,
        "methods": ["feishu.read", "feishu.search", "feishu.comment"],
    }


async def test_a_turn_reads_as_its_sender_and_an_unconnected_sender_is_told_to_connect(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    async with FakeFeishu(app_id="cli_tools") as feishu:
        feishu.documents["DocPlan0001"] = FakeDocument(
            "docx", "Release plan", "Ship on Friday. " * 3000, readers={"ou_mallory"}
        )
        mallory_token = feishu.user_token_for("ou_mallory")
        # Alice has connected, Mallory too; the turn is Mallory's, in Alice's topic.
        tokens = {ids["mallory"]: mallory_token, ids["alice"]: feishu.user_token_for("ou_alice")}

        async def access_token(principal_id: str) -> str | None:
            return tokens.get(principal_id)

        hub.feishu_docs = FeishuDocs(access_token, feishu.url)
        token, turn = await turn_credential(client, ids, "mallory")

        status, read = await call(client, token, "feishu.read", document=PLAN)
        assert status == 200, read
        assert (read["title"], read["kind"], read["revision"]) == ("Release plan", "docx", "7")
        assert read["text"].startswith("Ship on Friday.")
        assert read["next_offset"] == len(read["text"]) < read["total_chars"]
        status, rest = await call(
            client, token, "feishu.read", document="DocPlan0001", offset=read["next_offset"]
        )
        assert status == 200, rest
        assert read["text"] + rest["text"] == "Ship on Friday. " * 3000
        assert rest["next_offset"] is None
        assert {bearer for _, bearer in feishu.document_reads} == {mallory_token}

        status, found = await call(client, token, "feishu.search", query="release")
        assert status == 200, found
        assert found["results"] == [
            {"kind": "docx", "token": "DocPlan0001", "title": "Release plan", "url": ""}
        ]

        # Mallory disconnects: the turn is told how to connect, and nothing is read as anyone.
        del tokens[ids["mallory"]]
        reads = len(feishu.document_reads)
        status, refused = await call(client, token, "feishu.read", document=PLAN)
        assert status == 403
        assert refused["error"]["code"] == "feishu_not_connected"
        assert "send /amux connect in your private chat" in refused["error"]["message"]
        assert len(feishu.document_reads) == reads

        # Once the turn has ended, its credential reads nothing, even left in the workspace.
        tokens[ids["mallory"]] = mallory_token
        await hub.executions.cancel(turn)
        status, ended = await call(client, token, "feishu.read", document=PLAN)
        assert status == 403 and ended["error"]["code"] == "forbidden", ended
        assert "has ended" in ended["error"]["message"]
        assert len(feishu.document_reads) == reads


async def test_a_sheet_is_read_at_the_range_asked_for_and_a_bad_range_is_refused(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    async with FakeFeishu(app_id="cli_tools") as feishu:
        rows = [["name", "owner", "due"], ["login", "mallory", "Fri"], ["search", "alice", "Mon"]]
        feishu.documents["ShtBugs0001"] = FakeDocument(
            "sheet", "Bugs", rows, readers={"ou_alice"}
        )
        alice = feishu.user_token_for("ou_alice")

        async def access_token(principal_id: str) -> str | None:
            return alice if principal_id == ids["alice"] else None

        hub.feishu_docs = FeishuDocs(access_token, feishu.url)
        token, _ = await turn_credential(client, ids, "alice")
        sheet = "https://acme.feishu.cn/sheets/ShtBugs0001"

        status, whole = await call(client, token, "feishu.read", document=sheet)
        assert status == 200, whole
        assert "| search | alice | Mon |" in whole["text"]
        for cells in ("B2:C3", "s1!B2:C3"):
            status, part = await call(client, token, "feishu.read", document=sheet, range=cells)
            assert status == 200, part
            assert "mallory | Fri" in part["text"] and "alice | Mon" in part["text"]
            assert "name" not in part["text"] and "login" not in part["text"], part["text"]
        for cells in ("../values", "A1:D5/x", "a1", "s1!"):
            status, body = await call(client, token, "feishu.read", document=sheet, range=cells)
            assert (status, body["error"]["code"]) == (400, "invalid_argument"), cells
        status, body = await call(client, token, "feishu.read", document=PLAN, range="A1:B2")
        assert (status, body["error"]["code"]) == (400, "invalid_argument")
        assert "only from a sheet" in body["error"]["message"]


async def test_bad_references_and_services_are_refused_with_their_codes(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]

    async def nobody(principal_id: str) -> str | None:
        return None

    hub.feishu_docs = FeishuDocs(nobody, "http://127.0.0.1:9")
    token, _ = await turn_credential(client, ids, "alice")
    for document in ("../../etc/passwd", "https://example.com/docx/DocPlan0001", "short"):
        status, body = await call(client, token, "feishu.read", document=document)
        assert (status, body["error"]["code"]) == (400, "invalid_argument"), document
    status, body = await call(client, token, "feishu.read", document="DocPlan0001", kind="slides")
    assert (status, body["error"]["code"]) == (400, "invalid_argument")
    status, body = await call(client, token, "feishu.search", query="")
    assert (status, body["error"]["code"]) == (400, "invalid_argument")
    # The worker's own credential is a service's: it has no Feishu account to read as.
    status, body = await call(client, ids["runtime-token"], "feishu.search", query="plan")
    assert (status, body["error"]["code"]) == (403, "forbidden")


async def running_turn(
    client: Client, ids: dict[str, str], person: str = "alice"
) -> tuple[str, str]:
    """(the delegated credential, the id) of ``person``'s turn, claimed by a worker."""
    hub: Hub = client.server.app[HUB]
    turn, session = await hub.executions.submit(
        principal_id=ids[person], submitted_by=ids[person], provider="claude", prompt="go"
    )
    runtime = ids["runtime-token"]
    _, registered = await call(client, runtime, "workers.register", name="w")
    status, claimed = await call(
        client, runtime, "executions.claim", worker_id=registered["worker_id"]
    )
    assert status == 200 and claimed["execution"]["id"] == turn.id, claimed
    _, delegated = await call(
        client, runtime, "sessions.memory", session_id=session.id, execution_id=turn.id
    )
    return str(delegated["token"]), turn.id


async def test_a_comment_waits_for_its_persons_answer_on_exactly_that_text(
    served: tuple[Client, dict[str, str]],
) -> None:
    client, ids = served
    hub: Hub = client.server.app[HUB]
    alice = hub.state.principal(ids["alice"])
    assert alice is not None
    async with FakeFeishu(app_id="cli_tools") as feishu:
        feishu.documents["DocPlan0001"] = FakeDocument(
            "docx", "Release plan", "Ship.", readers={"ou_alice"}
        )
        alice_token = feishu.user_token_for("ou_alice")

        async def access_token(principal_id: str) -> str | None:
            return alice_token if principal_id == ids["alice"] else None

        hub.feishu_docs = FeishuDocs(access_token, feishu.url)
        token, turn = await running_turn(client, ids)

        # Under ask (the default) it is a permission request, and nothing is written yet.
        status, asked = await call(client, token, "feishu.comment", document=PLAN, text="Ship it")
        assert status == 200 and asked["pending"] is True, asked
        (request,) = hub.approvals.of_execution(turn)
        assert (request.tool, request.detail) == ("feishu_comment", "Ship it")
        assert request.subject == f"comment on {PLAN}"
        assert feishu.comments_added == []
        # An answer holds for the text shown, not for another.
        rid = asked["request_id"]
        status, other = await call(
            client, token, "feishu.comment", document=PLAN, text="Delete it", request_id=rid
        )
        assert (status, other["error"]["code"]) == (400, "invalid_argument")

        await hub.approvals.decide(turn, rid, "allow_once", alice)
        status, done = await call(
            client, token, "feishu.comment", document=PLAN, text="Ship it", request_id=rid
        )
        assert status == 200 and done["commented"] is True, done
        assert feishu.comments_added == [("DocPlan0001", "Ship it", alice_token)]
        # One answer, one comment.
        status, again = await call(
            client, token, "feishu.comment", document=PLAN, text="Ship it", request_id=rid
        )
        assert (status, again["error"]["code"]) == (409, "conflict")

        status, asked = await call(client, token, "feishu.comment", document=PLAN, text="No")
        await hub.approvals.decide(turn, asked["request_id"], "deny", alice, "not now")
        status, denied = await call(
            client,
            token,
            "feishu.comment",
            document=PLAN,
            text="No",
            request_id=asked["request_id"],
        )
        assert (status, denied["error"]["code"]) == (403, "forbidden")
        assert "not now" in denied["error"]["message"]

        # Mallory's comment goes out in her name: the owner's answer is not hers.
        mallory_turn, mallory = await running_turn(client, ids, "mallory")
        tokens_of = {ids["mallory"]: feishu.user_token_for("ou_mallory")}

        async def either(principal_id: str) -> str | None:
            return tokens_of.get(principal_id) or await access_token(principal_id)

        hub.feishu_docs = FeishuDocs(either, feishu.url)
        status, asked = await call(client, mallory_turn, "feishu.comment", document=PLAN, text="Hi")
        await hub.approvals.decide(mallory, asked["request_id"], "allow_once", alice)
        status, theirs = await call(
            client,
            mallory_turn,
            "feishu.comment",
            document=PLAN,
            text="Hi",
            request_id=asked["request_id"],
        )
        assert (status, theirs["error"]["code"]) == (403, "forbidden")
        assert "only the person a comment is made as" in theirs["error"]["message"]

        hub.config.save("agents.permissions", "read-only")
        status, refused = await call(client, token, "feishu.comment", document=PLAN, text="x")
        assert (status, refused["error"]["code"]) == (403, "forbidden")
        assert len(feishu.comments_added) == 1
