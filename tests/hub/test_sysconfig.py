"""The revision of the saved settings a restart applies: what a `/amux` card's Save is checked
against, so a stale card cannot put back a value changed since."""

from __future__ import annotations

from pathlib import Path

from hub.config import HubSettings
from hub.state import State
from hub.sysconfig import SystemConfig


def test_the_revision_follows_the_restart_applied_values_and_not_the_live_ones(
    tmp_path: Path,
) -> None:
    state = State(HubSettings(home=tmp_path).state_path)
    try:
        config = SystemConfig(state)
        first = config.revision()
        # Live settings are saved at once from their own buttons, never by Save.
        config.save("agents.permissions", "auto")
        config.save("budget.daily_tokens", 1000)
        assert config.revision() == first
        config.save("memory.isolation", "on")
        assert config.revision() != first
        # The revision is of the values: back as they were, a card built then is current again.
        config.save("memory.isolation", "off")
        assert config.revision() == first
        # Read from the state database: another process's save (the CLI's) counts too.
        other = State(HubSettings(home=tmp_path).state_path)
        try:
            other.save_setting("memory.history_days", 7)
        finally:
            other.close()
        assert config.revision() != first
    finally:
        state.close()
