"""Launch environment hygiene: what a launch inherits, what it never sees, what it gets instead."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime_bridge.launch_env import (
    DEFAULT_PASS_ENV,
    NO_OWNER_TOKEN,
    collapse_case_variants,
    filter_env,
    join_path,
    launch_env,
)


def test_only_allowed_variables_pass() -> None:
    env = {
        "ANTHROPIC_BASE_URL": "u",
        "OPENAI_API_KEY": "k",
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "https_proxy": "p",
        "LC_CTYPE": "C",
        "AWS_SECRET_ACCESS_KEY": "no",
        "SSH_AUTH_SOCK": "no",
    }
    assert filter_env(env, DEFAULT_PASS_ENV) == {
        "ANTHROPIC_BASE_URL": "u",
        "OPENAI_API_KEY": "k",
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "https_proxy": "p",
        "LC_CTYPE": "C",
    }


def test_case_variants_of_path_like_keys_collapse_to_upper_case() -> None:
    assert collapse_case_variants({"Path": "/a", "PATH": "/b", "home": "/h"}) == {
        "PATH": "/b",
        "HOME": "/h",
    }


def test_home_selectors_are_reset_and_claude_config_dir_dropped() -> None:
    env = launch_env(
        {
            "CODEX_HOME": "/svc/.codex",
            "PI_CODING_AGENT_DIR": "/svc/.pi",
            "CLAUDE_CONFIG_DIR": "/svc/.claude",
            "HOME": "/svc",
        },
        (*DEFAULT_PASS_ENV, "CODEX_*", "PI_*", "CLAUDE_*"),
        homes={"CODEX_HOME": "/run/r/codex-home"},
    )
    assert env == {"CODEX_HOME": "/run/r/codex-home", "HOME": "/svc", **NO_OWNER_TOKEN}


def test_memory_connection_never_comes_from_the_service_environment() -> None:
    env = launch_env({"AMUX_TOKEN": "svc", "AMUX_HUB_URL": "h"}, ("AMUX_*",))
    # Only the switch that keeps an Agent's amux off any owner token it might find.
    assert env == {"AMUX_OWNER_TOKEN_FALLBACK": "false"}


def test_prepended_directories_come_first_and_path_entries_are_unique() -> None:
    env = launch_env({"PATH": "/usr/bin::/bin:/usr/bin"}, prepend_path=["/cli", "/bin"])
    assert env["PATH"] == "/cli:/bin:/usr/bin"


def test_relative_path_entries_which_name_the_agents_own_directories_are_dropped() -> None:
    env = launch_env({"PATH": ".:node_modules/.bin:/usr/bin:bin:./tools"})
    assert env["PATH"] == "/usr/bin"


@given(st.lists(st.sampled_from(["/a", "/b", "/c", "", "d", "."]), max_size=8))
def test_join_path_keeps_first_occurrence_order(entries: list[str]) -> None:
    joined = join_path([], ":".join(entries)).split(":")
    expected = list(dict.fromkeys(e for e in entries if e.startswith("/")))
    assert joined == (expected or [""])
