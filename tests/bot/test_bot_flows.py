"""What Feishu users notice of the bot, with the whole service in-process.

The real ``create_app`` (Hub, bot, adapter, lark-oapi client) runs behind aiohttp's test server;
Feishu's servers are the loopback fake and events are signed and encrypted as Feishu does. These
need no worker (a queued turn is enough); ``test_bot_turns`` runs turns that must finish, with the
real ``claude`` CLI.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.conversations import origin_of
from bot.feishu.adapter import FeishuAdapter
from bot.feishu.events import MessageEvent, UserIds
from bot.service.app import create_app
from bot.service.feishu_app import FEISHU
from hub.config import HubSettings
from hub.contract import EGRESS, Execution, Session, TurnOutcome, TurnResult
from hub.paths import principal_scope
from hub.rpc import HUB
from hub.services import Hub
from hub.state import State
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.egress import refusal_text
from tests.conftest import free_port, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner

pytestmark = pytest.mark.timeout(120)

APP_ID = "cli_flows"
signer = FeishuSigner(encrypt_key="ek_flows", verification_token="vt_flows", app_id=APP_ID)
BOT_OPEN_ID = "ou_amux_bot"
GROUP = "oc_group1"

Who = dict[str, Any]
ALICE: Who = {"sender_open_id": "ou_alice", "sender_union_id": "on_alice", "sender_user_id": "u_a"}
BOB: Who = {"sender_open_id": "ou_bob", "sender_union_id": "on_bob", "sender_user_id": "u_b"}
CAROL: Who = {"sender_open_id": "ou_carol", "sender_union_id": "on_carol", "sender_user_id": "u_c"}


def private_chat(who: Who) -> str:
    return f"oc_p2p_{who['sender_open_id']}"


def as_operator(who: Who) -> Who:
    return {k.replace("sender_", "operator_"): v for k, v in who.items()}


def card_text(card: dict[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False)


def markdown_of(card: dict[str, Any]) -> str:
    return "".join(e["content"] for e in card["body"]["elements"] if e.get("tag") == "markdown")


def plain_of(card: dict[str, Any]) -> str:
    return "".join(e["text"]["content"] for e in card["body"]["elements"] if e.get("tag") == "div")


def button_nodes(card: dict[str, Any]) -> list[dict[str, Any]]:
    """Every button element of the card, in order."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("tag") == "button":
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(card)
    return found


def buttons(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The callback values of every button on the card, in order."""
    return [node["behaviors"][0]["value"] for node in button_nodes(card)]


def seed(
    home: Path, *, memory: bool, isolation: bool, owner_in_feishu: bool = True
) -> dict[str, str]:
    """What an operator set up before this start: Alice owns the Hub, Bob is a member.

    Without ``owner_in_feishu`` Alice has no Feishu identity yet, so the bot offers a claim code.
    """
    state = State(HubSettings(home=home).state_path)
    try:
        state.save_setting("memory.enabled", memory)
        state.save_setting("memory.isolation", "on" if isolation else "off")
        alice = state.add_principal("alice", "user", owner=True)
        bob = state.add_principal("bob", "user")
        if owner_in_feishu:
            state.add_alias(alice.id, "feishu_union_id", ALICE["sender_union_id"])
        state.add_alias(bob.id, "feishu_union_id", BOB["sender_union_id"])
        return {"alice": alice.id, "bob": bob.id}
    finally:
        state.close()


@dataclass
class Bot:
    client: TestClient[Any, Any]
    feishu: FakeFeishu
    hub: Hub
    adapter: FeishuAdapter
    ids: dict[str, str]
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return str(self.client.make_url("")).rstrip("/")

    async def post(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        body, headers = signer.sign(payload)
        response = await self.client.post("/feishu/events", data=body, headers=headers)
        return response.status, await response.json(content_type=None)

    async def say(
        self,
        text: str,
        who: Who = ALICE,
        *,
        group: bool = False,
        mention: bool = False,
        root_id: str = "",
        sender_type: str = "user",
    ) -> str:
        """Post what Feishu sends when ``who`` writes ``text``; returns the message id."""
        chat_id = GROUP if group else private_chat(who)
        if mention:
            text = f"@_user_1 {text}"
        # The fake must hold the user's message for the bot to reply to it.
        stored = self.feishu.add_message(chat_id, text)
        stored.root_id = root_id
        mentions = [signer.mention("@_user_1", BOT_OPEN_ID, "amux")] if mention else None
        payload = signer.message(
            text,
            **who,
            chat_id=chat_id,
            chat_type="group" if group else "p2p",
            message_id=stored.message_id,
            root_id=root_id,
            mentions=mentions,
        )
        payload["event"]["sender"]["sender_type"] = sender_type
        self.sent[stored.message_id] = payload
        status, _ = await self.post(payload)
        assert status == 200
        return stored.message_id

    async def click(
        self,
        value: dict[str, Any],
        who: Who = ALICE,
        *,
        chat_id: str = "",
        message_id: str = "om_card",
        form_value: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A card click; returns what Feishu gets back (toast and/or the in-place card)."""
        payload = signer.card_action(
            value,
            **as_operator(who),
            open_chat_id=chat_id or private_chat(who),
            open_message_id=message_id,
            form_value=form_value,
        )
        status, body = await self.post(payload)
        assert status == 200, body
        return body

    async def card_after(self, value: dict[str, Any], **kw: Any) -> dict[str, Any]:
        answer = await self.click(value, **kw)
        card: dict[str, Any] = answer["card"]["data"]
        return card

    def replies_to(self, message_id: str) -> list[StoredMessage]:
        """The bot's replies to this message, oldest first (in a topic they share its root)."""
        calls = self.feishu.calls("POST", f"/messages/{message_id}/reply")
        contents = {str(call.body.get("content")) for call in calls}
        root = self.feishu.messages[message_id].root_id or message_id
        return [
            m
            for m in self.feishu.messages.values()
            if m.root_id == root and m.message_id != message_id and m.content in contents
        ]

    async def reply_to(self, message_id: str) -> StoredMessage:
        replies: list[StoredMessage] = await until(lambda: self.replies_to(message_id))
        return replies[0]

    async def idle(self) -> None:
        """Every event handler has run to its end."""
        await until(lambda: self.adapter.dispatcher.pending == 0)

    def session_of(self, message_id: str) -> Session | None:
        payload = self.sent[message_id]
        message = payload["event"]["message"]
        event = MessageEvent(
            event_id="",
            sender=UserIds(),
            sender_type="user",
            chat_id=message["chat_id"],
            chat_type=message["chat_type"],
            message_id=message["message_id"],
            message_type="text",
            text="",
            root_id=message.get("root_id", ""),
        )
        return self.hub.executions.session_by_origin(origin_of(event))

    def executions_of(self, session_id: str) -> list[Execution]:
        rows = self.hub.executions.db.execute(
            "SELECT id FROM executions WHERE session_id = ? ORDER BY created_at", (session_id,)
        ).fetchall()
        return [self.hub.executions.describe(row["id"]) for row in rows]

    def principal_names(self) -> set[str]:
        return {p.name for p in self.hub.state.principals()}


@asynccontextmanager
async def running_bot(
    tmp_path: Path,
    *,
    memory: bool = False,
    isolation: bool = False,
    enroll: str = "auto",
    mode: str = "webhook",
    runtime: RuntimeSettings | None = None,
    lease_seconds: float = 30.0,
    owner_in_feishu: bool = True,
    language: str = "en_us",
    long_connection_config: dict[str, int] | None = None,
    models: dict[str, list[str]] | None = None,
) -> AsyncIterator[Bot]:
    """The service with Feishu on; ``runtime`` adds the in-process worker ``amux serve`` runs.

    ``long_connection_config`` is what the fake's long-connection endpoint tells the SDK
    (``ping_interval``, ``reconnect_count``).
    """
    home = tmp_path / "amux-home"
    ids = seed(home, memory=memory, isolation=isolation, owner_in_feishu=owner_in_feishu)
    fake = FakeFeishu(app_id=APP_ID, bot_open_id=BOT_OPEN_ID, **(long_connection_config or {}))
    async with fake as feishu:
        settings = signer.settings(
            feishu,
            enroll=enroll,
            mode=mode,
            card_update_interval_seconds=0.1,
            language=language,
            models=models or {},
        )
        port = free_port()
        app = create_app(
            HubSettings(home=home, lease_seconds=lease_seconds),
            runtime_settings=runtime,
            worker_url=f"http://127.0.0.1:{port}" if runtime else None,
            feishu_settings=settings,
        )
        async with TestClient(TestServer(app, host="127.0.0.1", port=port)) as client:
            adapter = app[FEISHU]
            # Mentions are recognised only once the bot knows its own open_id.
            await asyncio.wait_for(adapter.identity_known.wait(), 15)
            yield Bot(client, feishu, app[HUB], adapter, ids)


# -- who may talk to the bot, and where ---------------------------------------------------------


async def test_closed_enrollment_refuses_newcomers_politely_and_creates_no_principal(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, enroll="closed") as bot:
        before = bot.principal_names()
        asked = await bot.say("hello there", CAROL)
        refusal = await bot.reply_to(asked)
        text = card_text(refusal.card)
        assert "Not enrolled" in text and "owner" in text
        command = await bot.say("/amux", CAROL)
        assert "Not enrolled" in card_text((await bot.reply_to(command)).card)
        clicked = await bot.card_after({"action": "memory.list"}, who=CAROL)
        assert "Not enrolled" in card_text(clicked)
        assert bot.principal_names() == before
        assert bot.hub.executions.db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0

        # Enrolled members still get through.
        known = await bot.say("/amux", BOB)
        assert "bob" in card_text((await bot.reply_to(known)).card)


async def test_group_messages_need_a_mention_and_management_stays_private(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        before = len(bot.feishu.messages)
        await bot.say("just chatting among ourselves", BOB, group=True)
        await bot.say("/amux", BOB, group=True)
        await bot.say("a message from another app", BOB, sender_type="app")
        await bot.say("a message from a bot", group=True, mention=True, sender_type="bot")
        await bot.idle()
        # Only the four incoming messages the fake stored; the bot said nothing.
        assert len(bot.feishu.messages) == before + 4
        assert bot.feishu.calls("POST", "/reply") == []

        hinted = await bot.say("/amux", BOB, group=True, mention=True)
        hint = await bot.reply_to(hinted)
        assert hint.msg_type == "text"
        assert "private chat" in json.loads(hint.content)["text"]
        (call,) = bot.feishu.calls("POST", f"{hinted}/reply")
        assert call.body["reply_in_thread"] is False
        assert bot.hub.executions.db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


async def test_a_message_without_text_gets_a_hint_instead_of_silence(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        stored = bot.feishu.add_message(private_chat(BOB), "")
        image = signer.message(
            "",
            **BOB,
            chat_id=private_chat(BOB),
            message_id=stored.message_id,
            message_type="sticker",
            content={"file_key": "sticker_v2_123"},
        )
        bot.sent[stored.message_id] = image
        status, _ = await bot.post(image)
        assert status == 200
        hint = await bot.reply_to(stored.message_id)
        assert "as text" in json.loads(hint.content)["text"]
        bare = await bot.say("", BOB, group=True, mention=True)
        assert "as text" in json.loads((await bot.reply_to(bare)).content)["text"]
        assert bot.hub.executions.db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


async def test_the_owner_claim_code_is_logged_with_its_expiry_and_works_only_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_bot(tmp_path, owner_in_feishu=False) as bot:
        (line,) = [r.getMessage() for r in caplog.records if "/amux claim" in r.getMessage()]
        found = re.search(r"/amux claim ([0-9a-f]+)", line)
        assert found is not None
        assert re.search(r"before \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", line), line
        assert "once, for 30 minutes" in line
        claimed = await bot.say(f"/amux claim {found.group(1)}", CAROL)
        assert "alice" in card_text((await bot.reply_to(claimed)).card)
        again = await bot.say(f"/amux claim {found.group(1)}", BOB)
        answer = json.loads((await bot.reply_to(again)).content)["text"]
        assert answer == "That claim code was already used; a code works only once."
        assert bot.hub.state.principal_by_alias("feishu_union_id", BOB["sender_union_id"]) != (
            bot.hub.state.owner()
        )


@pytest.mark.parametrize("action", [7, ["manage.open"], {"name": "settings.save"}, None])
async def test_a_card_action_that_is_not_a_name_is_unknown_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, action: Any
) -> None:
    async with running_bot(tmp_path) as bot:
        # Feishu keeps the card as it is, as for any action this version does not know.
        assert await bot.click({"action": action}, BOB) == {}
        await bot.idle()
        # The bot still answers the next, well-formed click.
        assert "bob" in card_text(await bot.card_after({"action": "manage.open"}, who=BOB))
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    assert any("unknown card action" in r.getMessage() for r in caplog.records)


# -- My memory -------------------------------------------------------------------------------


async def test_my_memory_lists_searches_opens_page_by_page_and_forgets_by_revision(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True) as bot:
        store = bot.hub.store
        # Long enough that one card page cannot hold it: the reader must continue.
        long_doc = "".join(
            f"line {n:04d}: the release checklist keeps growing\n" for n in range(400)
        )
        await store.upsert("global", "projects/release-checklist.md", long_doc, "absent")
        short = await store.upsert(
            "global", "topics/review-format.md", "# Review format\nconclusion, evidence\n", "absent"
        )

        listed = await bot.card_after({"action": "memory.list"})
        paths = [b.get("path") for b in buttons(listed) if b["action"] == "memory.open"]
        assert paths == ["projects/release-checklist.md", "topics/review-format.md"]

        found = await bot.card_after(
            {"action": "memory.search"}, form_value={"query": "review format"}
        )
        assert "topics/review-format.md" in card_text(found)
        assert "release-checklist" not in card_text(found)

        pages: list[str] = []
        value: dict[str, Any] = {"action": "memory.open", "path": "projects/release-checklist.md"}
        for _ in range(20):
            page = await bot.card_after(value)
            pages.append(plain_of(page))
            more = [b for b in buttons(page) if b["action"] == "memory.open" and "offset" in b]
            if not more:
                break
            value = more[0]
        assert len(pages) > 1
        assert "".join(pages) == long_doc

        opened = await bot.card_after({"action": "memory.open", "path": "topics/review-format.md"})
        (ask,) = [b for b in buttons(opened) if b["action"] == "memory.forget.ask"]
        assert ask["revision"] == short.revision
        confirm_card = await bot.card_after(ask)
        (confirm,) = [b for b in buttons(confirm_card) if b["action"] == "memory.forget.confirm"]

        # Someone changed the document after the card was shown: the old revision is refused.
        changed = await store.upsert(
            "global", "topics/review-format.md", "# Review format\nrisks too\n", short.revision
        )
        stale = await bot.card_after(confirm)
        assert "Something went wrong" in card_text(stale)
        assert "conflict" in card_text(stale).lower()
        assert "Traceback" not in card_text(stale)
        kept = await store.get("global", "topics/review-format.md")
        assert kept.exists and kept.revision == changed.revision

        fresh = dict(confirm, revision=changed.revision)
        done = await bot.card_after(fresh)
        assert "topics/review-format.md" in card_text(done)
        gone = await store.get("global", "topics/review-format.md")
        assert gone.exists is False


async def test_my_memory_under_isolation_shows_only_the_members_own_documents(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path, memory=True, isolation=True) as bot:
        store = bot.hub.store
        await store.upsert(principal_scope(bot.ids["alice"]), "alice.md", "mine\n", "absent")
        await store.upsert(principal_scope(bot.ids["bob"]), "bob.md", "his\n", "absent")
        # My memory is opened from the /amux card in his private chat with the bot.
        await bot.reply_to(await bot.say("/amux", BOB))
        listed = await bot.card_after({"action": "memory.list"}, who=BOB)
        paths = [b.get("path") for b in buttons(listed) if b["action"] == "memory.open"]
        assert paths == ["bob.md"]
        refused = await bot.card_after({"action": "memory.open", "path": "alice.md"}, who=BOB)
        assert "alice.md no longer exists" in card_text(refused)


async def test_my_memory_says_when_memory_is_off(tmp_path: Path) -> None:
    async with running_bot(tmp_path, memory=False) as bot:
        for value in (
            {"action": "memory.list"},
            {"action": "memory.open", "path": "MEMORY.md"},
            {"action": "memory.forget.confirm", "path": "MEMORY.md", "revision": "absent"},
        ):
            card = await bot.card_after(value, who=BOB)
            assert "Memory unavailable" in card_text(card)
            assert "off on this Hub" in card_text(card)


# -- per-chat provider -----------------------------------------------------------------------


async def test_a_private_chat_chooses_its_agent_for_new_conversations(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        before = await bot.say("first question", BOB)
        await bot.reply_to(before)
        chosen = await bot.say("/amux provider codex", BOB)
        answer = await bot.reply_to(chosen)
        assert "codex" in json.loads(answer.content)["text"]
        after = await bot.say("second question", BOB)
        await bot.reply_to(after)
        old, new = bot.session_of(before), bot.session_of(after)
        assert old is not None and new is not None
        assert (old.provider, new.provider) == ("claude", "codex")

        wrong = await bot.say("/amux provider gpt", BOB)
        assert "claude, codex, pi" in card_text((await bot.reply_to(wrong)).card)

        opened = await bot.say("/amux", BOB)
        management = await bot.reply_to(opened)
        (pi_choice,) = [b for b in buttons(management.card) if b.get("provider") == "pi"]
        card = await bot.card_after(pi_choice, who=BOB, message_id=management.message_id)
        assert "`pi`" in card_text(card)
        (pi_button,) = [b for b in buttons(card) if b.get("provider") == "pi"]
        assert pi_button["action"] == "provider.set"
        third = await bot.say("third question", BOB)
        await bot.reply_to(third)
        session = bot.session_of(third)
        assert session is not None and session.provider == "pi"


async def test_only_the_owner_chooses_a_groups_agent(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        refused = await bot.say("/amux provider pi", BOB, group=True, mention=True)
        assert "Owner only" in card_text((await bot.reply_to(refused)).card)
        # A click forged to name the group is refused too: cards offer choices in private chats.
        forged = await bot.card_after(
            {"action": "provider.set", "provider": "pi", "chat_id": GROUP}, who=BOB, chat_id=GROUP
        )
        assert "Owner only" in card_text(forged)
        started = await bot.say("what runs here?", BOB, group=True, mention=True)
        await bot.reply_to(started)
        session = bot.session_of(started)
        assert session is not None and session.provider == "claude"

        allowed = await bot.say("/amux provider pi", ALICE, group=True, mention=True)
        assert "pi" in json.loads((await bot.reply_to(allowed)).content)["text"]
        later = await bot.say("and now?", BOB, group=True, mention=True)
        await bot.reply_to(later)
        session = bot.session_of(later)
        assert session is not None and session.provider == "pi"


# -- turns -----------------------------------------------------------------------------------


async def test_the_topics_starter_can_cancel_a_run_and_others_cannot(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        asked = await bot.say("a long job", BOB, group=True, mention=True)
        progress = await bot.reply_to(asked)
        (cancel,) = [b for b in buttons(progress.card) if b["action"] == "run.cancel"]
        # No Runtime worker is connected: the progress card says why nothing happens yet.
        await until(lambda: "no Runtime worker is connected" in card_text(progress.card))

        refused = await bot.click(cancel, who=CAROL, chat_id=GROUP)
        assert refused["toast"]["type"] == "error"
        assert bot.hub.executions.describe(cancel["run_id"]).state == "queued"

        accepted = await bot.click(cancel, who=BOB, chat_id=GROUP)
        assert accepted["toast"]["type"] != "error"
        assert bot.hub.executions.describe(cancel["run_id"]).state == "cancelled"
        # The progress card says so and loses its Cancel button.
        await until(lambda: "Cancelled" in card_text(progress.card))
        assert not [b for b in buttons(progress.card) if b["action"] == "run.cancel"]


async def test_the_sender_of_a_turn_in_someone_elses_topic_can_stop_it(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        started = await bot.say("plan the release", ALICE, group=True, mention=True)
        first = await bot.reply_to(started)
        # Alice's turn ends first: a message sent while it runs would wait for it.
        (first_stop,) = [b for b in buttons(first.card) if b["action"] == "run.cancel"]
        await bot.click(first_stop, chat_id=GROUP)
        asked = await bot.say("and the changelog", BOB, group=True, mention=True, root_id=started)
        progress = await until(
            lambda: [m for m in bot.replies_to(asked) if "and the changelog" in card_text(m.card)]
        )
        (stop,) = [b for b in buttons(progress[0].card) if b["action"] == "run.cancel"]

        refused = await bot.click(stop, who=CAROL, chat_id=GROUP)
        assert refused["toast"]["type"] == "error"
        stopped = await bot.click(stop, who=BOB, chat_id=GROUP)
        assert stopped["toast"]["type"] != "error", stopped
        assert bot.hub.executions.describe(stop["run_id"]).state == "cancelled"
        # One card says who stopped it, and nothing reports it as an error.
        bob = bot.hub.people.principal(bot.ids["bob"])
        assert bob is not None
        await until(lambda: f"Stopped by **{bob.label}**" in card_text(progress[0].card))
        await bot.idle()
        assert not [m for m in bot.replies_to(asked) if "Something went wrong" in card_text(m.card)]


async def test_a_failed_launch_is_reported_as_a_readable_card(tmp_path: Path) -> None:
    runtime = RuntimeSettings(claude=str(tmp_path / "nonexistent" / "claude"))
    async with running_bot(tmp_path, runtime=runtime) as bot:
        asked = await bot.say("Do something")
        progress = await bot.reply_to(asked)
        await until(lambda: "Failed" in card_text(progress.card), seconds=60)
        error = await until(
            lambda: [
                m for m in bot.replies_to(asked) if "Something went wrong" in card_text(m.card)
            ]
        )
        text = card_text(error[0].card)
        assert "Traceback" not in text and 'File "' not in text
        assert "executable" in text and "was not found" in text


async def test_a_reply_refused_for_rate_limits_is_retried_and_lands_once(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        bot.feishu.fail_next(2, status=429, code=99991400, path_contains="/reply")
        asked = await bot.say("/amux", BOB)
        card = await bot.reply_to(asked)
        assert "bob" in card_text(card.card)
        await bot.idle()
        calls = bot.feishu.calls("POST", f"{asked}/reply")
        assert len(calls) == 3
        # One uuid for every try, so Feishu posts the reply once even if a try had landed.
        assert len({call.body["uuid"] for call in calls}) == 1
        assert len(bot.replies_to(asked)) == 1


async def test_a_refused_network_host_shows_while_the_turn_runs_and_once_with_its_answer(
    tmp_path: Path,
) -> None:
    async with running_bot(tmp_path) as bot:
        asked = await bot.say("fetch the page", BOB)
        progress = await bot.reply_to(asked)
        (cancel,) = [b for b in buttons(progress.card) if b["action"] == "run.cancel"]
        executions = bot.hub.executions
        runtime = bot.hub.state.add_principal("runtime-egress", "service")
        worker = executions.register_worker("egress-worker", runtime.id)
        claimed = await executions.claim(worker, runtime.id, 0)
        assert claimed is not None and claimed.execution_id == cancel["run_id"]
        refusal = refusal_text("github.com:443")
        # The Agent retried: one refusal per attempt.
        for _ in range(3):
            await executions.add_event(claimed.execution_id, worker, EGRESS, refusal)
        await until(lambda: refusal in card_text(progress.card))
        outcome = TurnOutcome(True, TurnResult(text="The page is out of reach."), None)
        await executions.complete(claimed.execution_id, worker, outcome)
        await until(lambda: "The page is out of reach." in card_text(progress.card))
        # A notice of its own beside the answer (the card's markdown escapes the setting's _).
        said = "amux refused github.com:443: it is not on AMUX"
        shown = await until(
            lambda: [
                m for m in bot.replies_to(asked) if m is not progress and said in card_text(m.card)
            ]
        )
    assert len(shown) == 1
