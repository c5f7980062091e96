"""One rule names a provider: the worker's declared providers and every submitted turn's."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hub.contract import provider_name_problem
from hub.errors import InvalidArgument
from hub.executions import Executions
from hub.state import State
from runtime_bridge.config import RuntimeSettings


@pytest.mark.parametrize("name", ["Aider", "9lives", "a" * 33, "my_agent", ""])
async def test_a_name_the_settings_refuse_is_refused_at_submit_in_the_same_words(
    tmp_path: Path, name: str
) -> None:
    problem = provider_name_problem(name)
    assert problem is not None
    with pytest.raises(ValidationError, match="is not a provider name"):
        RuntimeSettings(providers={name: "/usr/bin/true"})
    state = State(tmp_path / "state.sqlite3")
    try:
        executions = Executions(state, providers=("claude",))
        alice = state.add_principal("alice")
        with pytest.raises(InvalidArgument) as refused:
            await executions.submit(
                principal_id=alice.id, submitted_by=alice.id, provider=name, prompt="hi"
            )
        assert refused.value.message == problem
    finally:
        state.close()


def test_a_name_of_32_lowercase_characters_is_one() -> None:
    assert provider_name_problem("a" + "-b1" * 10 + "c") is None
    assert RuntimeSettings(providers={"aider": "/usr/bin/true"}).providers == {
        "aider": "/usr/bin/true"
    }
