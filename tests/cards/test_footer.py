"""The foot of a finished turn's first card: model, time, tokens, the context's fill, branch."""

from __future__ import annotations

import pytest

from cards.elements import CARD_MAX_BYTES, encoded_size
from cards.models import LANGS, BranchView, FinishView, Lang
from cards.progress import result_cards
from tests.cards.structure import all_text, assert_valid_card


def _first(usage: dict[str, object], lang: Lang = "en_us", branch: str = "") -> str:
    view = BranchView(branch, "main", (), 0) if branch else None
    (card,) = result_cards("Done.", lang, finish=FinishView(usage, 42.0, "o"), branch=view)
    assert_valid_card(card)
    return all_text(card)


def test_the_footer_names_the_model_time_tokens_context_and_branch() -> None:
    usage = {
        "input_tokens": 12_300,
        "output_tokens": 456,
        "model": "claude-sonnet-4-5-20250929",
        "context_tokens": 90_000,
    }
    shown = _first(usage, branch="amux/fix-parser")
    footer = shown.splitlines()[-1] if "<font" not in shown else shown[shown.index("<font") :]
    assert "claude-sonnet-4-5-20250929" in footer
    assert "42 s" in footer and "12.3k in / 456 out" in footer
    # 90k of Claude's 200k window.
    assert "context 45% full" in footer
    assert "amux/fix-parser" in footer
    assert "/compact" not in shown


@pytest.mark.parametrize("lang", LANGS)
def test_a_nearly_full_context_suggests_compact(lang: Lang) -> None:
    usage = {"context_tokens": 340_000, "context_window": 400_000, "model": "gpt-5-codex"}
    shown = _first(usage, lang)
    assert {"en_us": "context 85% full", "zh_cn": "上下文已用 85%"}[lang] in shown
    assert "`/compact`" in shown


def test_an_unknown_models_context_is_left_out() -> None:
    shown = _first({"model": "mystery-model", "context_tokens": 5000})
    assert "mystery-model" in shown and "context" not in shown and "/compact" not in shown


def test_a_one_million_token_claude_reads_against_its_own_window() -> None:
    shown = _first({"model": "claude-sonnet-4-5[1m]", "context_tokens": 900_000})
    assert "context 90% full" in shown


def test_a_hostile_model_name_cannot_restyle_the_card_and_the_card_still_fits() -> None:
    usage = {"model": "</font><at id=all></at>" * 100, "context_tokens": 10**12}
    (card,) = result_cards(
        "x" * 100_000,
        "en_us",
        finish=FinishView(usage, 1.0, "o"),
        branch=BranchView("b<" * 500, "main", (), 0),
    )[:1]
    shown = all_text(card)
    assert "<at" not in shown and shown.count("</font>") == 1
    assert encoded_size(card) <= CARD_MAX_BYTES
