import pytest

from cards import actions
from cards.catalogue import MESSAGES, about_error, plain_text
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
from tests.cards.structure import all_text, assert_valid_card, callbacks, walk


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


def _error_codes() -> set[str]:
    """Every stable code of the error tree, the adapters' branches included."""
    import bot.feishu.errors
    import runtime_bridge.providers.errors
    from hub.errors import AmuxError

    assert bot.feishu.errors and runtime_bridge.providers.errors  # their classes join the tree
    found: set[str] = set()
    todo: list[type[AmuxError]] = [AmuxError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not AmuxError:
            found.add(cls.code)
    return found


@pytest.mark.parametrize("code", sorted(_error_codes()))
def test_every_error_code_is_explained_in_both_languages(code: str) -> None:
    for lang in LANGS:
        assert about_error(lang, code), (lang, code)


def test_a_chinese_error_card_says_what_happened_in_chinese_before_the_errors_own_words() -> None:
    card = error_card("quota_exceeded", "topic documents are at most 65536 bytes", "zh_cn")
    first, detail, code_line = [e["content"] for e in walk(card) if e["tag"] == "markdown"]
    assert first == "已达到上限。"
    assert detail == "详情：topic documents are at most 65536 bytes"
    assert "`quota_exceeded`" in code_line
    # A turn's own failure words, which carry no stable code the catalogue knows, stay as said.
    failed = error_card("failed", "the Agent ended without an answer", "zh_cn")
    assert [e["content"] for e in walk(failed) if e["tag"] == "markdown"][0] == (
        "the Agent ended without an answer"
    )


def test_plain_text_messages_carry_no_markdown_from_the_template_but_keep_the_fields() -> None:
    for lang in LANGS:
        for key in MESSAGES[lang]:
            plain = plain_text(lang, key)
            assert "**" not in plain and "`" not in plain, key
    said = plain_text("en_us", "project.current", project="web**x", branch="main")
    assert said == "This chat is bound to project web**x (from main)."
