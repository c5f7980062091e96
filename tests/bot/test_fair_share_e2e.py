"""One Feishu sender's burst cannot take the service from everyone else: `amux serve` as a
process, with the default limits, two worker slots, signed events and the fake Feishu.

The Agent is a declared stand-in (``tests/fakes/turn_agent.sh``) that notes when its turn
starts and waits for a gate file the test writes, so the test decides when each turn ends and
reads the order turns started in.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import HubProcess, free_port, stand_in, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TURN_AGENT = "turn_agent.sh"
APP = "cli_fair"
signer = FeishuSigner(encrypt_key="ek_fair", verification_token="vt_fair", app_id=APP)
MEMBER: dict[str, Any] = {
    "sender_open_id": "ou_member",
    "sender_union_id": "on_member",
    "sender_user_id": "u_member",
}
OWNER: dict[str, Any] = {
    "sender_open_id": "ou_owner",
    "sender_union_id": "on_owner",
    "sender_user_id": "u_owner",
}
BURST = 20
SLOTS = 2
# The defaults an operator gets: feishu.messages_per_minute and turns.max_queued_per_principal.
PER_MINUTE = 10
MAX_QUEUED = 5


@dataclass
class Bot:
    hub: HubProcess
    feishu: FakeFeishu
    http: aiohttp.ClientSession
    log: Path

    async def say(self, who: dict[str, Any], label: str) -> str:
        chat = f"oc_p2p_{who['sender_open_id']}"
        text = f"turn {self.log} {label}"
        stored = self.feishu.add_message(chat, text, sender_open_id=who["sender_open_id"])
        payload = signer.message(text, **who, chat_id=chat, message_id=stored.message_id)
        body, headers = signer.sign(payload)
        url = f"{self.hub.url}/feishu/events"
        async with self.http.post(url, data=io.BytesIO(body), headers=headers) as response:
            assert response.status == 200
        return stored.message_id

    def replies_to(self, message_id: str) -> list[StoredMessage]:
        return [m for m in list(self.feishu.messages.values()) if m.root_id == message_id]

    def started(self) -> list[str]:
        return self.log.read_text().split()

    def open_gate(self, label: str) -> None:
        self.log.with_name(f"{self.log.name}.{label}").touch()


def shown(message: StoredMessage) -> str:
    return json.dumps([message.content, message.card], ensure_ascii=False)


def is_progress(message: StoredMessage) -> bool:
    return "run.cancel" in shown(message)


@pytest.fixture
async def bot(tmp_path: Path, shared_dir: Path) -> AsyncIterator[Bot]:
    async with FakeFeishu(app_id=APP) as feishu:
        hub = HubProcess(
            tmp_path / "amux-home",
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": APP,
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_FEISHU_PROVIDER": "turn",
                "AMUX_RUNTIME_PROVIDERS": json.dumps({"turn": str(stand_in(TURN_AGENT))}),
                "AMUX_RUNTIME_SANDBOX": "off",
                "AMUX_RUNTIME_SLOTS": str(SLOTS),
                "AMUX_RUNTIME_WORK_DIR": str(tmp_path / "runtime"),
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            aliased = await asyncio.to_thread(
                hub.cli, "principal", "alias", "owner", "--feishu-union-id", "on_owner"
            )
            assert aliased.returncode == 0, aliased.stderr
            # Made here, writable by all: each Principal's Agents may run as a uid of its own.
            log = shared_dir / "started"
            log.touch()
            log.chmod(0o666)
            async with aiohttp.ClientSession() as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                yield Bot(hub, feishu, http, log)
        finally:
            await asyncio.to_thread(hub.stop)


async def test_a_burst_from_one_sender_leaves_the_owners_turn_the_next_free_slot(
    bot: Bot,
) -> None:
    labels = [f"m{n:02d}" for n in range(BURST)]
    asked = [await bot.say(MEMBER, label) for label in labels]

    # Within the minute's limit each message is answered: a turn, or "too many waiting".
    admitted = asked[:PER_MINUTE]
    answers = await until(
        lambda: (
            [bot.replies_to(m)[0] for m in admitted]
            if all(bot.replies_to(m) for m in admitted)
            else None
        ),
        seconds=60,
    )
    accepted = [
        label
        for label, answer in zip(labels[:PER_MINUTE], answers, strict=True)
        if is_progress(answer)
    ]
    waiting_refused = [answer for answer in answers if not is_progress(answer)]
    # Two slots and five waiting: how many ran before the rest was refused depends only on how
    # fast the slots claimed.
    assert MAX_QUEUED <= len(accepted) <= SLOTS + MAX_QUEUED
    for refusal in waiting_refused:
        assert f"{MAX_QUEUED} of your turns are already waiting" in shown(refusal)
        assert "quota_exceeded" in shown(refusal)

    # Past the limit: the first is told when to try again, the rest of that wait are not answered.
    told = (await until(lambda: bot.replies_to(asked[PER_MINUTE]), seconds=60))[0]
    assert f"more than {PER_MINUTE} messages in a minute" in shown(told)
    assert "Try again in " in shown(told) and "rate_limited" in shown(told)
    await until(lambda: bot.hub.log().count("is over the per-minute limit") == BURST - PER_MINUTE)
    assert all(bot.replies_to(m) == [] for m in asked[PER_MINUTE + 1 :])

    # Both slots hold the burst's first turns; the owner asks while the rest of it waits.
    await until(lambda: len(bot.started()) == SLOTS, seconds=60)
    owners = await bot.say(OWNER, "owner")
    owner_card = (await until(lambda: bot.replies_to(owners), seconds=60))[0]
    assert is_progress(owner_card)
    waiting = [label for label in accepted if label not in bot.started()]
    assert len(waiting) >= MAX_QUEUED - SLOTS

    # The first slot to free runs the owner's turn, ahead of every turn of the burst still waiting.
    bot.open_gate(bot.started()[0])
    await until(lambda: len(bot.started()) == SLOTS + 1, seconds=60)
    assert bot.started()[SLOTS] == "owner"

    bot.open_gate("all")
    await until(lambda: len(bot.started()) == len(accepted) + 1, seconds=120)
    order = bot.started()
    assert sorted(order) == sorted([*accepted, "owner"])
    assert all(order.index("owner") < order.index(label) for label in waiting)
    await until(lambda: "done owner" in shown(owner_card), seconds=60)
