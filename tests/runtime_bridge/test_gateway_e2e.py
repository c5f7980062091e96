"""A managed turn through the worker's model gateway, end to end: the Hub's own worker launches
the real Claude, the model sees the operator's key, the result carries the gateway's count, and
the key is in neither the service's log nor `amux runtime plan`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cards.controls import usage_summary
from tests.fakes.model_server import INPUT_TOKENS, OUTPUT_TOKENS, Answer, FakeModelServer
from tests.runtime_bridge.test_worker import agent_run, cli, start_hub

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OPERATOR_KEY = "sk-operator-e2e-7d0c5b13"
OAUTH_TOKEN = "sk-operator-oauth-e2e-19fa"


async def test_a_turn_goes_through_the_gateway_with_the_key_nowhere_else(tmp_path: Path) -> None:
    async with FakeModelServer([Answer("Plain answer.")]) as model:
        hub = start_hub(
            tmp_path,
            model.base_url,
            ANTHROPIC_API_KEY=OPERATOR_KEY,
            CLAUDE_CODE_OAUTH_TOKEN=OAUTH_TOKEN,
        )
        try:
            done = await agent_run(hub, "--provider", "claude", "Hello")
            planned = await cli(
                hub,
                "runtime",
                "plan",
                "--provider",
                "claude",
                env={"ANTHROPIC_API_KEY": OPERATOR_KEY, "AMUX_TOKEN": hub.owner_token},
            )
        finally:
            await asyncio.to_thread(hub.stop)
    assert done["state"] == "succeeded", done
    assert done["text"] == "Plain answer."
    assert {r.credential() for r in model.requests} == {OPERATOR_KEY}
    count = len(model.requests)
    counted = done["usage"]["gateway"]
    assert counted == {
        "input_tokens": INPUT_TOKENS * count,
        "output_tokens": OUTPUT_TOKENS * count,
        "requests": count,
    }
    # The result card's totals are the gateway's.
    assert usage_summary(done["usage"], 1, "en_us").startswith(
        f"{INPUT_TOKENS * count} in / {OUTPUT_TOKENS * count} out"
    )
    assert planned.returncode == 0, planned.stderr
    assert hub.log_path is not None
    log = hub.log_path.read_text(encoding="utf-8", errors="replace")
    for secret in (OPERATOR_KEY, OAUTH_TOKEN):
        assert secret not in log
        assert secret not in planned.stdout + planned.stderr
