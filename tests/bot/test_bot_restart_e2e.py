"""Feishu turns survive Hub restarts and Feishu outages, stream progress and carry files:
`amux serve` as a process.

The Agent is a declared stand-in (``tests/fakes/gate_agent.sh``) that waits for a gate file the
test writes, so the test decides whether a turn is still running when the Hub restarts or
Feishu goes down. Feishu is the fake on loopback, driven by the real lark-oapi client.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import HubProcess, free_port, stand_in, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

GATE_AGENT = "gate_agent.sh"
signer = FeishuSigner(encrypt_key="ek_rs", verification_token="vt_rs", app_id="cli_rs")
ALICE = {"sender_open_id": "ou_alice", "sender_union_id": "on_alice", "sender_user_id": "u_alice"}
HANDED_BACK = "it runs again from the start after the restart"


@dataclass
class Bot:
    hub: HubProcess
    feishu: FakeFeishu
    http: aiohttp.ClientSession
    gate: Path

    async def say(self, text: str) -> str:
        stored = self.feishu.add_message("oc_chat1", text)
        payload = signer.message(text, **ALICE, message_id=stored.message_id)
        body, headers = signer.sign(payload)
        async with self.http.post(
            f"{self.hub.url}/feishu/events", data=io.BytesIO(body), headers=headers
        ) as response:
            assert response.status == 200
        return stored.message_id

    def replies_to(self, message_id: str) -> list[StoredMessage]:
        return [m for m in self.feishu.messages.values() if m.root_id == message_id]

    def runs(self) -> int:
        path = self.gate.with_name(self.gate.name + ".runs")
        return len(path.read_text().splitlines()) if path.exists() else 0

    def open_gate(self, answer: str) -> None:
        partial = self.gate.with_name("partial")
        partial.write_text(answer)
        partial.rename(self.gate)  # the Agent never reads half an answer

    async def restart(self) -> None:
        status, body = await asyncio.to_thread(self.hub.rpc, "system.restart")
        assert status == 200, body


def shown(message: StoredMessage) -> str:
    return json.dumps(message.card, ensure_ascii=False)


def every_state(message: StoredMessage) -> str:
    return json.dumps([message.content, *message.updates], ensure_ascii=False)


@pytest.fixture
async def bot(
    tmp_path: Path, shared_dir: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Bot]:
    drain = getattr(request, "param", "120")
    async with FakeFeishu(app_id="cli_rs") as feishu:
        hub = HubProcess(
            tmp_path / "amux-home",
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": "cli_rs",
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_FEISHU_CARD_UPDATE_INTERVAL_SECONDS": "0.2",
                "AMUX_FEISHU_PROVIDER": "gate",
                "AMUX_RUNTIME_PROVIDERS": json.dumps({"gate": str(stand_in(GATE_AGENT))}),
                "AMUX_RUNTIME_SANDBOX": "off",
                "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
                "AMUX_DRAIN_SECONDS": drain,
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            async with aiohttp.ClientSession() as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                yield Bot(hub, feishu, http, shared_dir / "gate")
        finally:
            await asyncio.to_thread(hub.stop)


async def restarted(bot: Bot, before: int) -> None:
    """Wait until the Hub process has come back from its ``before``-th restart."""
    await until(lambda: bot.hub.log().count("amux Hub listening") > before, seconds=90)
    await until(lambda: bot.hub.healthy(), seconds=30)


async def held_turn(bot: Bot) -> tuple[str, StoredMessage]:
    """Start a turn whose Agent waits at its gate; its message and progress card."""
    asked = await bot.say(str(bot.gate))
    progress = (await until(lambda: bot.replies_to(asked)))[0]
    await until(lambda: bot.runs() == 1)
    return asked, progress


@pytest.mark.parametrize("bot", ["120"], indirect=True)
async def test_a_restart_waits_for_the_running_turn_and_its_card_ends_with_the_answer(
    bot: Bot,
) -> None:
    asked, progress = await held_turn(bot)
    await bot.restart()
    await until(lambda: "draining before restart: no new turns; 1 running" in bot.hub.log())
    bot.open_gate("finished during the drain")
    await until(lambda: "finished during the drain" in shown(progress), seconds=60)
    await restarted(bot, 1)
    assert bot.runs() == 1
    assert HANDED_BACK not in every_state(progress)
    assert bot.replies_to(asked) == [progress]


@pytest.mark.parametrize("bot", ["1"], indirect=True)
async def test_a_turn_still_running_at_the_drain_deadline_runs_again_and_its_card_follows_it(
    bot: Bot,
) -> None:
    asked, progress = await held_turn(bot)
    await bot.restart()
    # Handed back visibly, then claimed again by the next process.
    await until(lambda: HANDED_BACK in every_state(progress), seconds=60)
    await restarted(bot, 1)
    await until(lambda: bot.runs() == 2, seconds=60)
    bot.open_gate("the answer after the restart")
    await until(lambda: "the answer after the restart" in shown(progress), seconds=60)
    assert progress.card["header"]["title"]["content"].startswith("Result · ")
    assert bot.replies_to(asked) == [progress]


@pytest.mark.parametrize("bot", ["120"], indirect=True)
async def test_an_answer_owed_during_a_feishu_outage_and_a_restart_is_posted_once_afterwards(
    bot: Bot,
) -> None:
    asked, progress = await held_turn(bot)
    # Long enough for three cards: the progress card and two follow-up replies.
    paragraphs = [f"Paragraph {n}: " + "lorem ipsum dolor sit amet " * 30 for n in range(80)]
    answer = "\n\n".join(paragraphs)
    await bot.feishu.go_down()
    bot.open_gate(answer)
    await until(lambda: "stays owed and is retried" in bot.hub.log(), seconds=90)
    # The Hub restarts while the answer is owed; the next process delivers it.
    await bot.restart()
    await restarted(bot, 1)
    await bot.feishu.come_back()
    bot.feishu.fail_next(2, status=503, code=0, path_contains="/im/v1/messages")
    bot.feishu.fail_next(2, status=429, code=99991400, path_contains="/im/v1/messages")
    await until(lambda: "Paragraph 0:" in shown(progress), seconds=120)
    await until(lambda: "Paragraph 79:" in json.dumps([shown(m) for m in bot.replies_to(asked)]))
    delivered = "".join(shown(m) for m in bot.replies_to(asked))
    for n in range(80):
        assert delivered.count(f"Paragraph {n}:") == 1, n
    assert len(bot.replies_to(asked)) == 4  # the progress card, then three follow-ups
    assert bot.feishu.failures_left() == 0
    assert bot.runs() == 1


@pytest.mark.parametrize("bot", ["120"], indirect=True)
async def test_progress_streams_into_a_cardkit_card_or_an_ordinary_card_when_cardkit_is_refused(
    bot: Bot,
) -> None:
    streamed = await bot.say(str(bot.gate))
    card = (await until(lambda: bot.replies_to(streamed)))[0]
    assert card.entity is not None and card.entity.card["config"]["streaming_mode"] is True
    bot.open_gate("streamed answer")
    await until(lambda: "streamed answer" in shown(card))
    # The finished card's title carries the elapsed time; the stand-in reports no token usage.
    assert re.fullmatch(r"Result · \d+ s", card.card["header"]["title"]["content"])
    assert "New conversation" in shown(card)
    await until(
        lambda: card.entity is not None and not card.entity.card["config"].get("streaming_mode")
    )

    bot.feishu.cardkit_refused = True
    bot.gate.unlink()
    patched = await bot.say(str(bot.gate))
    progress = (await until(lambda: bot.replies_to(patched)))[0]
    assert progress.entity is None
    bot.open_gate("patched answer")
    await until(lambda: "patched answer" in shown(progress))
    assert bot.feishu.calls("PATCH", f"/im/v1/messages/{progress.message_id}")


@pytest.mark.parametrize("bot", ["120"], indirect=True)
async def test_a_files_image_reaches_the_agents_workspace_and_its_outbox_file_is_posted_after(
    bot: Bot,
) -> None:
    stored = bot.feishu.add_message("oc_chat1", "")
    bot.feishu.resources[(stored.message_id, "img_1")] = b"GIF89a first image line\nmore\n"
    content = {
        "title": "",
        "content": [
            [{"tag": "text", "text": str(bot.gate)}],
            [{"tag": "img", "image_key": "img_1"}],
        ],
    }
    payload = signer.message(
        "",
        **ALICE,
        message_id=stored.message_id,
        message_type="post",
        content=content,
    )
    body, headers = signer.sign(payload)
    async with bot.http.post(
        f"{bot.hub.url}/feishu/events", data=io.BytesIO(body), headers=headers
    ) as response:
        assert response.status == 200
    card = (await until(lambda: bot.replies_to(stored.message_id)))[0]
    bot.gate.with_name("gate.out").write_text("the report the Agent wrote\n")
    bot.open_gate("answer with a file\n")
    saved = f"inbox/{stored.message_id}/image-1.gif"
    await until(lambda: f"saw {saved}: GIF89a first image line" in shown(card))
    posted = await until(
        lambda: [m for m in bot.replies_to(stored.message_id) if m.msg_type == "file"]
    )
    (file_key,) = [json.loads(m.content)["file_key"] for m in posted]
    assert bot.feishu.uploads[file_key] == ("report.txt", b"the report the Agent wrote\n")
    # Posted after the answer: the answer card was finished before the file was uploaded.
    assert card.entity is not None
    finished = bot.feishu.calls("PUT", f"/cardkit/v1/cards/{card.entity.card_id}")
    upload = bot.feishu.calls("POST", "/im/v1/files")
    assert finished and upload and finished[-1].at <= upload[0].at


@pytest.mark.parametrize("bot", ["120"], indirect=True)
async def test_a_turn_whose_progress_card_feishu_refuses_still_answers_in_the_topic(
    bot: Bot,
) -> None:
    bot.feishu.fail_next(1, status=400, code=230002, path_contains="/reply")
    asked = await bot.say(str(bot.gate))
    await until(lambda: bot.runs() == 1)
    bot.open_gate("answered without a progress card")
    (answer,) = await until(lambda: bot.replies_to(asked))
    assert "answered without a progress card" in shown(answer)
    assert bot.feishu.failures_left() == 0


@pytest.mark.parametrize("bot", ["1"], indirect=True)
async def test_a_document_comments_turn_running_across_a_restart_is_answered_in_its_thread(
    bot: Bot,
) -> None:
    # No passage and no earlier replies: the prompt is the sender's line and the gate.
    comment = bot.feishu.add_comment("DocGate0001", "", str(bot.gate), author_open_id="ou_alice")
    payload = signer.comment(
        comment.file_token,
        comment.comment_id,
        comment.replies[0].reply_id,
        author_open_id="ou_alice",
        author_union_id="on_alice",
        author_user_id="u_alice",
    )
    body, headers = signer.sign(payload)
    url = f"{bot.hub.url}/feishu/events"
    async with bot.http.post(url, data=io.BytesIO(body), headers=headers) as response:
        assert response.status == 200
    await until(lambda: bot.runs() == 1)
    await bot.restart()
    await restarted(bot, 1)
    await until(lambda: bot.runs() == 2, seconds=60)
    bot.open_gate("answered after the restart")

    def answers() -> list[str]:
        return [r.text for r in comment.replies if r.user_id == bot.feishu.bot_open_id]

    await until(lambda: answers() or None, seconds=60)
    assert answers() == ["answered after the restart"]
