"""State.transaction nests: an inner one is a savepoint of the outer, committed with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.errors import Conflict
from hub.state import State


def test_a_failed_inner_step_undoes_only_itself(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        with state.transaction():
            state.add_principal("alice")
            with pytest.raises(Conflict):
                state.add_principal("alice")
            state.add_principal("bob")
        assert [p.name for p in state.principals()] == ["alice", "bob"]
    finally:
        state.close()


def test_a_failed_outer_transaction_undoes_its_inner_steps(tmp_path: Path) -> None:
    state = State(tmp_path / "state.sqlite3")
    try:
        with pytest.raises(RuntimeError), state.transaction():
            state.add_principal("carol")
            raise RuntimeError("abandoned")
        assert state.principals() == []
        assert not state.db.in_transaction
    finally:
        state.close()
