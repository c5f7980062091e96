"""A turn past its token budget, end to end: the Hub's own worker launches the real Claude or
Codex, the gateway refuses the model request past the per-turn ceiling in a shape that CLI gives
up on, and the turn ends as 'budget reached' with what it used."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from runtime_bridge.worker import BUDGET_WARNING
from tests.conftest import MEMORY_ON, stand_in, until
from tests.fakes.model_server import INPUT_TOKENS, OUTPUT_TOKENS, Answer, CallTool, FakeModelServer
from tests.runtime_bridge.test_worker import agent_run, cli, start_hub
from tests.runtime_bridge.test_worker_codex import start_codex_hub

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# Below one answer's usage: the first model request is the last one forwarded.
CEILING = 10
# What the gateway logs for each request it refuses.
REFUSED = "budget is spent"


@pytest.mark.parametrize("provider", ["claude", "codex"])
async def test_a_turn_past_its_budget_stops_at_once_as_budget_reached(
    tmp_path: Path, provider: str
) -> None:
    script = [CallTool("mcp__memory__amux_memory_list", {}), Answer("Should never be sent.")]
    settings = {**MEMORY_ON, "budget.turn_tokens": CEILING}
    async with FakeModelServer(script) as model:
        if provider == "codex":
            hub = start_codex_hub(tmp_path, model, settings=settings)
        else:
            hub = start_hub(tmp_path, model.base_url, settings=settings)
        try:
            started = time.monotonic()
            done = await agent_run(hub, "--provider", provider, "List the notes")
            took = time.monotonic() - started
        finally:
            await asyncio.to_thread(hub.stop)
    assert done["state"] == "failed", done
    assert len(model.requests) == 1
    used = INPUT_TOKENS + OUTPUT_TOKENS
    assert (
        done["usage"]["gateway"]["input_tokens"] + done["usage"]["gateway"]["output_tokens"] == used
    )
    assert done["budget_reached"] is True
    assert done["error"] == f"budget reached: {used}/{CEILING} tokens"
    assert done["text"] != "Should never be sent."
    assert done["warnings"].count(BUDGET_WARNING) == 1
    # The CLI gave up on the refusal instead of retrying it with backoff.
    assert hub.log_path is not None
    refusals = hub.log_path.read_text(encoding="utf-8").count(REFUSED)
    assert 1 <= refusals <= 3, refusals
    assert took < 60, took


async def test_a_spent_day_refuses_the_next_turn_until_the_owner_extends_it(
    tmp_path: Path,
) -> None:
    script = [Answer("First."), Answer("After the extension.")]
    async with FakeModelServer(script) as model:
        hub = start_hub(tmp_path, model.base_url, settings={"budget.daily_tokens": CEILING})
        try:
            first = await agent_run(hub, "--provider", "claude", "One")
            spent = await cli(hub, "agent", "run", "--json", "--provider", "claude", "Two")
            extended = await cli(hub, "usage", "extend", "owner", "--tokens", "1000")
            third = await agent_run(hub, "--provider", "claude", "Three")
        finally:
            await asyncio.to_thread(hub.stop)
    # The first turn ran within the day's budget and went past it with its one answer.
    assert first["state"] == "succeeded" and first["text"] == "First.", first
    # Nothing left of the day: refused as it was submitted, with the figures, not launched.
    assert spent.returncode != 0, spent.stdout
    used = INPUT_TOKENS + OUTPUT_TOKENS
    assert "quota_exceeded" in spent.stderr, spent.stderr
    assert f"today's token budget is spent ({used}/{CEILING} tokens" in spent.stderr
    assert len(model.requests) == 2
    assert extended.returncode == 0, extended.stderr
    assert third["state"] == "succeeded" and third["text"] == "After the extension.", third


SPEND_AGENT = "spend_agent.py"
HEARTBEAT = "POST /rpc/v1/executions.heartbeat 200"


async def test_a_running_turn_gets_the_owners_extension_at_its_next_heartbeat(
    tmp_path: Path,
) -> None:
    used = INPUT_TOKENS + OUTPUT_TOKENS
    gates = tmp_path / "gates"
    gates.mkdir()
    # A root worker runs the Agent as a uid of its own, which must see the gate appear.
    gates.chmod(0o1777)
    gate = gates / "go"
    env = {
        "AMUX_RUNTIME_PROVIDERS": json.dumps({"spend": str(stand_in(SPEND_AGENT))}),
        "AMUX_RUNTIME_DEFAULT_CWD": str(gates),
        "AMUX_LEASE_SECONDS": "0.6",
    }
    async with FakeModelServer([Answer("one"), Answer("two")]) as model:
        # The day holds one answer: the second request is refused unless the budget grows.
        hub = start_hub(tmp_path, model.base_url, settings={"budget.daily_tokens": used}, **env)
        try:
            running = asyncio.create_task(
                agent_run(hub, "--provider", "spend", f"spend\nwait {gate}\nspend\n")
            )
            await until(lambda: len(model.requests) == 1 or running.done(), seconds=120)
            assert not running.done(), running.result()
            extended = await cli(hub, "usage", "extend", "owner", "--tokens", str(10 * used))
            assert extended.returncode == 0, extended.stderr
            log = hub.log_path
            assert log is not None
            beats = log.read_text(encoding="utf-8").count(HEARTBEAT)
            # Two heartbeats after the extension: the first one's answer was applied before the
            # second was sent.
            await until(
                lambda: log.read_text(encoding="utf-8").count(HEARTBEAT) >= beats + 2, seconds=30
            )
            gate.write_text("go\n")
            done = await running
        finally:
            await asyncio.to_thread(hub.stop)
    assert done["state"] == "succeeded", done
    assert done["text"].splitlines() == ["spent 200", "spent 200"], done
    assert len(model.requests) == 2
