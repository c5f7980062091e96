"""Feishu traffic shows up in /metrics, and the bot's connection in /readyz."""

from __future__ import annotations

import re
from pathlib import Path

from tests.bot.test_bot_flows import ALICE, running_bot, signer


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample, 0 when it has not been recorded."""
    for line in metrics.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_events_duplicates_calls_and_retries_are_counted(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        payload = signer.message("/amux", **ALICE, chat_id="oc_p2p_ou_alice")
        stored = bot.feishu.add_message("oc_p2p_ou_alice", "/amux")
        payload["event"]["message"]["message_id"] = stored.message_id
        bot.feishu.fail_next(1, status=429, code=99991400, path_contains="/reply")
        assert (await bot.post(payload))[0] == 200
        assert (await bot.post(payload))[0] == 200  # Feishu's retry of the same event
        await bot.reply_to(stored.message_id)
        await bot.idle()

        metrics = await (await bot.client.get("/metrics")).text()
        assert sample(metrics, "amux_feishu_events_total", outcome="received") == 1
        assert sample(metrics, "amux_feishu_events_total", outcome="deduplicated") == 1
        assert sample(metrics, "amux_feishu_api_retries_total", api="reply") == 1
        assert sample(metrics, "amux_feishu_api_calls_total", api="reply", outcome="ok") == 1


async def test_readiness_includes_the_feishu_connection(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot:
        response = await bot.client.get("/readyz")
        body = await response.json()
        assert response.status == 200, body
        feishu = [check for check in body["checks"] if check["name"] == "feishu"]
        assert feishu and feishu[0]["ok"] is True
