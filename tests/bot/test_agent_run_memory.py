"""How `amux agent run` shows a turn's memory calls on its progress lines."""

from __future__ import annotations

from bot.commands.runtime_cli import memory_line
from hub.contract import MemoryUse


def test_each_memory_call_is_one_line_with_its_path_and_whole_revision() -> None:
    assert memory_line(MemoryUse("read", "MEMORY.md", "a" * 64)) == (
        f"memory: read MEMORY.md (revision {'a' * 64})"
    )
    assert memory_line(MemoryUse("saved", "topics/x.md", "b" * 64, None)) == (
        f"memory: saved topics/x.md (revision {'b' * 64})"
    )
    # A forget names the revision it removed.
    assert memory_line(MemoryUse("forgot", "old.md", None, "c" * 64)) == (
        f"memory: forgot old.md (revision {'c' * 64})"
    )
    assert memory_line(MemoryUse("searched", "")) == "memory: searched all documents"
    assert memory_line(MemoryUse("searched", "topics")) == "memory: searched topics"
