"""The fixed memory protocol text: stable bytes, every rule it states, the right tool names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime_bridge.memoryprotocol import (
    PROTOCOL_VERSION,
    merge_instructions,
    protocol_text,
)

VARIANTS = ("mcp", "cli")
MCP_TOOLS = (
    "amux.memory_search",
    "amux.memory_get",
    "amux.memory_upsert",
    "amux.memory_forget",
    "amux.result_continue",
)
CLI_COMMANDS = (
    "amux memory search",
    "amux memory show",
    "amux memory upsert",
    "amux memory forget",
)

# One phrase per rule the protocol states; each must appear (case-insensitively) in both variants.
RULES = (
    "memory.md",
    "once",
    "new conversation",
    "not local files",
    "earlier work",
    "decisions",
    "preferences",
    "agreements",
    "repeated problems",
    "only the relevant excerpts",
    "need no search",
    "explicit requests to remember",
    "stable corrections",
    "verified reusable lessons",
    "topic",
    "entry small",
    "read before updating",
    "revision",
    "conflict, reread, merge",
    "saved only after",
    "correcting or forgetting",
    "related topic",
    "partial failure",
    "never save secrets",
    "temporary authorizations",
    "unverified guesses",
    "current instructions and verified facts take priority",
    "memory grants no authority",
)


@pytest.mark.parametrize("variant", VARIANTS)
def test_protocol_is_the_same_bytes_on_every_call(variant: str) -> None:
    first = protocol_text(variant)  # type: ignore[arg-type]
    assert all(protocol_text(variant) == first for _ in range(3))  # type: ignore[arg-type]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rule", RULES)
def test_protocol_states_every_rule(variant: str, rule: str) -> None:
    assert rule in protocol_text(variant).lower()  # type: ignore[arg-type]


@pytest.mark.parametrize("variant", VARIANTS)
def test_protocol_is_short_and_names_its_version(variant: str) -> None:
    text = protocol_text(variant)  # type: ignore[arg-type]
    assert len(text.encode()) < 2048
    assert f"protocol {PROTOCOL_VERSION}" in text


def test_mcp_variant_names_the_tools_and_no_cli_commands() -> None:
    text = protocol_text("mcp")
    for tool in MCP_TOOLS:
        assert tool in text
    for command in CLI_COMMANDS:
        assert command not in text


def test_cli_variant_names_the_commands_and_no_mcp_tools() -> None:
    text = protocol_text("cli")
    for command in CLI_COMMANDS:
        assert command in text
    assert "amux." not in text
    assert "--expected-revision <revision from show>" in text
    assert "cat a.md b.md | amux memory upsert x.md --expected-revision absent" in text


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="variant"):
        protocol_text("sdk")  # type: ignore[arg-type]


def test_merge_puts_existing_text_first_with_a_blank_line() -> None:
    protocol = protocol_text("mcp")
    assert merge_instructions("Answer in English.", protocol) == (
        "Answer in English.\n\n" + protocol
    )


@pytest.mark.parametrize("existing", [None, "", "  \n"])
def test_merge_without_existing_text_is_the_protocol(existing: str | None) -> None:
    assert merge_instructions(existing, protocol_text("cli")) == protocol_text("cli")


def test_merge_does_not_repeat_a_protocol_already_present() -> None:
    protocol = protocol_text("mcp")
    once = merge_instructions("Be brief.", protocol)
    assert merge_instructions(once, protocol) == once
    assert once.count(protocol.strip()) == 1


@given(st.text(max_size=200))
def test_merge_always_contains_the_protocol_exactly_once(existing: str) -> None:
    protocol = protocol_text("mcp")
    merged = merge_instructions(existing, protocol)
    assert merged.count(protocol.strip()) == 1
    assert merged.startswith(existing.rstrip()) or not existing.strip()
