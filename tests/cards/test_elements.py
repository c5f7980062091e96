"""The shared card building blocks."""

from __future__ import annotations

import pytest

from cards.elements import defuse_mentions


@pytest.mark.parametrize("at", ["at", "AT", "At", "aT"])
def test_mention_tags_in_any_letter_case_are_escaped(at: str) -> None:
    assert defuse_mentions(f"hi <{at} id=all></{at}>") == f"hi &lt;{at} id=all></{at}>"


def test_text_without_mention_tags_is_left_alone() -> None:
    assert defuse_mentions("a <b>bold</b> 1 < 2, cat <- dog") == "a <b>bold</b> 1 < 2, cat <- dog"
