"""Who a Feishu turn runs as, and where: its sender, in the conversation's own workspace.

Through a real `amux serve` (webhook, signed events, the fake Feishu, the sandbox on), with the
stand-in Agent shell (``tests/fakes/probe_agent.sh``) reporting its workspace and what it can
read. Alice sends a private file to the bot, then starts a topic in a group she shares with
Mallory; Mallory replies there. Mallory's turn must run as Mallory, in the topic's workspace,
with Alice's file out of reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import HubProcess, free_port, save_settings, stand_in, until
from tests.fakes.feishu import FakeFeishu, StoredMessage
from tests.fakes.feishu_events import FeishuSigner
from tests.runtime_bridge.test_sandbox_e2e import PROBE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

APP = "cli_senders"
BOT = "ou_bot"
GROUP = "oc_shared_group"
signer = FeishuSigner(encrypt_key="ek_senders", verification_token="vt_senders", app_id=APP)
ALICE: dict[str, Any] = {
    "sender_open_id": "ou_alice",
    "sender_union_id": "on_alice",
    "sender_user_id": "u_alice",
}
MALLORY: dict[str, Any] = {
    "sender_open_id": "ou_mallory",
    "sender_union_id": "on_mallory",
    "sender_user_id": "u_mallory",
}


@dataclass
class Bot:
    hub: HubProcess
    feishu: FakeFeishu
    http: aiohttp.ClientSession

    async def post(self, payload: dict[str, Any]) -> None:
        body, headers = signer.sign(payload)
        url = f"{self.hub.url}/feishu/events"
        async with self.http.post(url, data=io.BytesIO(body), headers=headers) as response:
            assert response.status == 200

    async def private_file(self, who: dict[str, Any], name: str, content: bytes) -> str:
        stored = self.feishu.add_message(
            f"oc_p2p_{who['sender_open_id']}", "", sender_open_id=who["sender_open_id"]
        )
        self.feishu.resources[(stored.message_id, "file_1")] = content
        payload = signer.message(
            "",
            **who,
            chat_id=stored.chat_id,
            message_id=stored.message_id,
            message_type="file",
            content={"file_key": "file_1", "file_name": name},
        )
        await self.post(payload)
        return stored.message_id

    async def in_group(self, who: dict[str, Any], text: str, root: str | None = None) -> str:
        stored = self.feishu.add_message(
            GROUP, f"@_user_1 {text}", sender_open_id=who["sender_open_id"]
        )
        if root is not None:
            stored.root_id = root
        payload = signer.message(
            f"@_user_1 {text}",
            **who,
            chat_id=GROUP,
            chat_type="group",
            message_id=stored.message_id,
            root_id=root or "",
            mentions=[signer.mention("@_user_1", BOT, "amux")],
        )
        await self.post(payload)
        return stored.message_id

    def answer(self, nonce: str) -> str | None:
        """The bot's card showing the probe's report for ``nonce``, once its turn finished."""
        for message in list(self.feishu.messages.values()):
            if message.sender_open_id:
                continue
            shown = report_of(message)
            if f"nonce {nonce}" in shown and "cwd " in shown:
                return shown
        return None

    def said(self, words: str) -> bool:
        """Whether any card or text the bot posted contains ``words``."""
        return any(
            words in report_of(m).lower()
            for m in list(self.feishu.messages.values())
            if not m.sender_open_id
        )


@contextlib.asynccontextmanager
async def running_bot(tmp_path: Path, isolation: bool) -> AsyncIterator[Bot]:
    home = tmp_path / "amux-home"
    save_settings(home, {"memory.isolation": "on" if isolation else "off"})
    async with FakeFeishu(app_id=APP, bot_open_id=BOT) as feishu:
        hub = HubProcess(
            home,
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": APP,
                "AMUX_FEISHU_APP_SECRET": "secret",
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_FEISHU_PROVIDER": "probe",
                "AMUX_RUNTIME_PROVIDERS": json.dumps({"probe": str(stand_in(PROBE))}),
            },
        )
        await asyncio.to_thread(hub.start)
        try:
            async with aiohttp.ClientSession() as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                yield Bot(hub, feishu, http)
        finally:
            await asyncio.to_thread(hub.stop)


def turns(home: Path) -> list[dict[str, Any]]:
    """Every queued turn as the Hub stored it: whom it runs as, its Session and prompt."""
    db = sqlite3.connect(f"file:{home / 'state.sqlite3'}?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT e.prompt, e.submitted_by, s.principal_id, s.workspace, p.name "
            "FROM executions e JOIN sessions s ON s.id = e.session_id "
            "JOIN principals p ON p.id = e.submitted_by ORDER BY e.rowid"
        ).fetchall()
        return [dict(row) for row in rows]
    finally:
        db.close()


def report_of(message: StoredMessage) -> str:
    return json.dumps([message.card, message.content, *message.updates], ensure_ascii=False)


@pytest.mark.parametrize("isolation", [False, True], ids=["isolation-off", "isolation-on"])
async def test_a_reply_in_someone_elses_topic_runs_as_its_sender_in_the_topics_workspace(
    tmp_path: Path, isolation: bool
) -> None:
    async with running_bot(tmp_path, isolation) as bot:
        home = bot.hub.home
        await bot.private_file(ALICE, "salary.txt", b"ALICE-PRIVATE: salary 123456\n")
        (salary,) = await until(lambda: list(home.glob("runtime/workspaces/*/inbox/*/salary.txt")))
        # The probe reads whole lines: the last one, without a newline after it, is filler.
        root = await bot.in_group(ALICE, "nonce alice\ncwd\nend")
        await until(lambda: bot.answer("alice"))
        await bot.in_group(MALLORY, f"nonce mallory\ncwd\nread {salary}\nend", root=root)
        if isolation:
            # Under isolation a topic is its starter's: Mallory is told to open her own.
            await until(lambda: bot.said("own topic"))
            shown = None
        else:
            shown = await until(lambda: bot.answer("mallory"))
    queued = [t for t in turns(home) if "nonce " in t["prompt"]]
    alice_turn = queued[0]
    # The topic's Session works in a workspace of its own: nobody's personal one.
    topic_dir = home / "runtime" / "workspaces" / str(alice_turn["workspace"])
    assert alice_turn["workspace"] and salary.parents[2] != topic_dir
    if shown is None:
        assert len(queued) == 1
        return
    (mallory_turn,) = queued[1:]
    assert mallory_turn["workspace"] == alice_turn["workspace"]
    assert f"cwd {topic_dir}:" in shown
    assert f"read-denied {salary}" in shown
    # The turn is Mallory's, and its prompt says so.
    assert mallory_turn["submitted_by"] != mallory_turn["principal_id"]
    first_line = str(mallory_turn["prompt"]).splitlines()[0]
    assert first_line.startswith(f"Message from {mallory_turn['name']} (")
    assert str(mallory_turn["submitted_by"]) in first_line
