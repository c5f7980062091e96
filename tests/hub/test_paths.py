"""Logical memory paths: what a caller may name, and the scope directories the Hub derives."""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.errors import InvalidArgument, InvalidPath
from hub.limits import Limits
from hub.paths import in_prefix, scope_directory, validate_path, validate_prefix


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd.md",
        "/MEMORY.md",
        "../escape.md",
        "topics/../../escape.md",
        "topics/./note.md",
        "./note.md",
        ".hidden.md",
        "topics/.secret/note.md",
        ".amux-tmp-0011.md",
        "topics\\note.md",
        "topics/\x00evil.md",
        "topics/line\nbreak.md",
        "tab\there.md",
        "bell\x07.md",
        "del\x7f.md",
        "bidi\u202etxt.md",
        "sep\u2028.md",
        "notes.txt",
        "notes.MD.bak",
        "topics/note",
        ".md",
        "topics/.md",
        "topics//note.md",
        "topics/note.md/",
        "",
        "a" * 253 + ".md/x.md",
        "x" * 256 + ".md",
        "/".join(["d"] * 16) + "/n.md",
        "\udcff.md",
        "\x01\udcff.md",
    ],
)
def test_paths_outside_the_rules_are_invalid_path(path: str) -> None:
    with pytest.raises(InvalidPath) as caught:
        validate_path(path)
    assert caught.value.code == "invalid_path"
    assert caught.value.status == 400


@pytest.mark.parametrize("value", [None, 7, b"a.md", ["a.md"]])
def test_non_string_paths_are_invalid_path(value: object) -> None:
    with pytest.raises(InvalidPath):
        validate_path(value)


def test_a_path_longer_than_the_byte_limit_is_rejected_even_with_short_names() -> None:
    path = "/".join(["中文目录"] * 5) + "/笔记.md"
    assert validate_path(path)
    with pytest.raises(InvalidPath):
        validate_path(path, Limits(path_bytes=len(path.encode()) - 1))


@pytest.mark.parametrize(
    "path",
    [
        "MEMORY.md",
        "topics/MEMORY.md",
        "preferences/communication.md",
        "projects/amux/decisions.md",
        "项目/发布流程/决定.md",
        "日本語/メモ.md",
        "with space/and-dash_underscore.md",
        "emoji/🚀 launch.md",
        "a" * 252 + ".md",
        "/".join(["d"] * 15) + "/n.md",
        "x.y.md",
    ],
)
def test_relative_visible_markdown_paths_are_accepted(path: str) -> None:
    assert validate_path(path) == tuple(path.split("/"))


_name_chars = st.characters(
    blacklist_categories=("Cc", "Cf", "Cs", "Zl", "Zp"), blacklist_characters="/\\."
)
_names = st.text(_name_chars, min_size=1, max_size=20)


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


@given(st.lists(_names, min_size=0, max_size=5), _names)
def test_any_nested_visible_name_ending_in_md_is_accepted(dirs: list[str], leaf: str) -> None:
    path = "/".join([*dirs, leaf + ".md"])
    assert validate_path(path) == tuple(nfc(part) for part in (*dirs, leaf + ".md"))


@given(st.lists(_names, min_size=0, max_size=5), _names, st.sampled_from(["NFC", "NFD"]))
def test_every_spelling_of_a_path_is_one_path_in_nfc(
    dirs: list[str], leaf: str, form: Literal["NFC", "NFD"]
) -> None:
    path = "/".join([*dirs, leaf + ".md"])
    spelled = unicodedata.normalize(form, path)
    parts = validate_path(spelled)
    assert parts == validate_path(nfc(path))
    assert all(unicodedata.is_normalized("NFC", part) for part in parts)
    # Validating what validation returned changes nothing.
    assert validate_path("/".join(parts)) == parts


def test_cafe_composed_and_decomposed_is_one_path_and_one_prefix() -> None:
    composed, decomposed = "notes/caf\u00e9.md", "notes/cafe\u0301.md"
    assert composed != decomposed
    assert validate_path(decomposed) == validate_path(composed) == ("notes", "caf\u00e9.md")
    assert validate_prefix("cafe\u0301/") == validate_prefix("caf\u00e9") == ("caf\u00e9",)


@given(
    st.lists(_names, min_size=1, max_size=4),
    st.sampled_from(["..", ".", ".git", "", "\x00", "a\\b", "x\x1fy", "\u200b"]),
    st.integers(min_value=0, max_value=4),
)
def test_one_bad_component_anywhere_makes_the_path_invalid(
    names: list[str], bad: str, where: int
) -> None:
    parts = [*names]
    parts.insert(min(where, len(parts)), bad)
    path = "/".join(parts) + "/leaf.md"
    with pytest.raises(InvalidPath):
        validate_path(path)


def test_prefixes_may_name_directories_and_empty_means_the_whole_scope() -> None:
    assert validate_prefix(None) == ()
    assert validate_prefix("") == ()
    assert validate_prefix("projects/amux/") == ("projects", "amux")
    assert validate_prefix("projects/amux/decisions.md") == ("projects", "amux", "decisions.md")
    for bad in ["/", "/abs", "../up", "a/../b", ".hidden", "a\\b", "a//b"]:
        with pytest.raises(InvalidPath):
            validate_prefix(bad)


def test_prefix_matching_uses_whole_components() -> None:
    assert in_prefix(("projects", "amux", "a.md"), ("projects", "amux"))
    assert not in_prefix(("projects", "amuxiliary", "a.md"), ("projects", "amux"))
    assert in_prefix(("a.md",), ())


def test_scope_directories_are_derived_and_hash_the_principal_id() -> None:
    assert scope_directory("global") == ("global",)
    digest = hashlib.sha256(b"p-123").hexdigest()
    assert scope_directory("principal:p-123") == ("users", digest)
    for bad in ["", "principal:", "users/x", "../global", "Global"]:
        with pytest.raises(InvalidArgument):
            scope_directory(bad)
