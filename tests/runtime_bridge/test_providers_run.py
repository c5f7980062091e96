"""What every provider's runner does alike, shown without starting an agent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_bridge.providers import (
    ExecutableMissing,
    LaunchRequest,
    MemoryAttachment,
    build_plan,
    run,
)
from tests.fakes.model_server import FakeModelServer
from tests.runtime_bridge import test_providers_claude, test_providers_codex, test_providers_pi
from tests.runtime_bridge.conftest import collect

RequestFor = Callable[..., LaunchRequest]
REQUESTS: dict[str, RequestFor] = {
    "claude": test_providers_claude.request_for,
    "codex": test_providers_codex.request_for,
    "pi": test_providers_pi.request_for,
}


@pytest.mark.parametrize("provider", sorted(REQUESTS))
@pytest.mark.parametrize("named", ["by name", "by path"])
async def test_a_missing_agent_executable_fails_the_launch_before_anything_is_written(
    provider: str,
    named: str,
    tmp_path: Path,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    executable = (
        f"{provider}-not-installed" if named == "by name" else str(tmp_path / "bin" / provider)
    )
    memory = attachment_for(cli_dir=tmp_path / "amux-cli" if provider == "pi" else None)
    async with FakeModelServer() as model:
        plan = build_plan(REQUESTS[provider](tmp_path, model, executable, memory))
        with pytest.raises(ExecutableMissing) as caught:
            await collect(run(plan))
    assert caught.value.code == "executable_missing"
    assert f"{provider} executable {executable!r} was not found" in caught.value.message
    assert f"AMUX_RUNTIME_{provider.upper()}" in caught.value.message
    assert not (tmp_path / "run").exists()
    assert model.requests == []
