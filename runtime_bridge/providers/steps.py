"""What a tool call of an Agent is, as its cards list it: read, edit, run, search or another tool,
with the file, the command's first words or the query it acts on (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime_bridge.providers.plan import ToolStep

# A command shows its first words only: a step says what ran, the command is the Agent's.
COMMAND_WORDS = 6
READS = {"read", "notebookread", "webfetch", "view"}
EDITS = {"write", "edit", "multiedit", "notebookedit", "apply_patch"}
RUNS = {"bash", "shell", "exec", "exec_command"}
SEARCHES = {"glob", "grep", "ls", "find", "websearch", "search"}
SUBJECT_KEYS = ("file_path", "notebook_path", "path", "url", "pattern", "query", "command")


def first_words(command: str) -> str:
    words = command.split()
    shown = " ".join(words[:COMMAND_WORDS])
    return shown + (" …" if len(words) > COMMAND_WORDS else "")


def tool_step(name: str, tool_input: Any) -> ToolStep:
    """The step of a call to tool ``name`` with ``tool_input`` (its arguments, any shape)."""
    given = tool_input if isinstance(tool_input, Mapping) else {}
    subject = next((str(given[k]) for k in SUBJECT_KEYS if given.get(k)), "")
    short = name.lower()
    if short in RUNS:
        return ToolStep.of("run", first_words(subject))
    if short in EDITS:
        return ToolStep.of("edit", subject)
    if short in READS:
        return ToolStep.of("read", subject)
    if short in SEARCHES:
        return ToolStep.of("search", subject)
    return ToolStep.of("tool", name)
