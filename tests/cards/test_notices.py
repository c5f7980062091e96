import pytest

from cards import actions
from cards.models import LANGS, Lang
from cards.notices import (
    enrollment_closed_card,
    error_card,
    memory_disabled_card,
    own_topic_card,
    owner_only_card,
    stale_card,
    warning_card,
)
from tests.cards.structure import all_text, assert_valid_card, callbacks


@pytest.mark.parametrize("lang", LANGS)
def test_every_notice_is_a_valid_card(lang: Lang) -> None:
    for card in (
        error_card("conflict", "The document changed", lang),
        warning_card("Heads up", lang),
        memory_disabled_card(lang),
        enrollment_closed_card(lang),
        own_topic_card(lang),
        owner_only_card(lang),
        stale_card(lang),
    ):
        assert_valid_card(card)


def test_error_card_shows_message_and_stable_code_without_markup() -> None:
    card = error_card("memory_disabled", "Memory is <off>", "en_us")
    assert card["header"]["template"] == "red"
    text = all_text(card)
    assert "Memory is &lt;off&gt;" in text
    assert "`memory_disabled`" in text


def test_own_topic_notice_tells_the_member_what_to_do() -> None:
    assert "Start your own topic" in all_text(own_topic_card("en_us"))
    assert "新建你自己的话题" in all_text(own_topic_card("zh_cn"))


@pytest.mark.parametrize("lang", LANGS)
def test_memory_off_still_offers_to_erase_the_whole_own_memory(lang: Lang) -> None:
    card = memory_disabled_card(lang)
    assert callbacks(card) == [{"action": actions.MEMORY_ERASE_ASK}]
    if lang == "en_us":
        assert "Erase my memory…" in all_text(card)
        assert "You can still erase them for good." in all_text(card)
