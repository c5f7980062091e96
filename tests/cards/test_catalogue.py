import ast
import string
from pathlib import Path

import pytest

from cards.catalogue import MESSAGES, text
from cards.models import LANGS


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_both_languages_have_exactly_the_same_keys() -> None:
    assert set(MESSAGES) == set(LANGS)
    assert set(MESSAGES["zh_cn"]) == set(MESSAGES["en_us"])


@pytest.mark.parametrize("key", sorted(MESSAGES["en_us"]))
def test_every_message_takes_the_same_placeholders_in_both_languages(key: str) -> None:
    assert _placeholders(MESSAGES["zh_cn"][key]) == _placeholders(MESSAGES["en_us"][key])
    assert MESSAGES["zh_cn"][key].strip() and MESSAGES["en_us"][key].strip()


def test_chinese_catalogue_is_actually_chinese_for_sentences() -> None:
    assert text("zh_cn", "restart.now") == "立即重启"
    assert text("en_us", "restart.now") == "Restart now"


def test_text_fills_placeholders() -> None:
    assert text("en_us", "result.part", index=2, total=3) == "Result (2/3)"


def test_no_strings_in_both_languages_live_outside_the_catalogue() -> None:
    """A dict keyed by language elsewhere is a message the catalogue's checks never see."""
    repo = Path(__file__).resolve().parents[2]
    catalogue = repo / "cards" / "catalogue.py"
    found = []
    for path in sorted([*(repo / "bot").rglob("*.py"), *(repo / "cards").glob("*.py")]):
        if path == catalogue:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and any(
                isinstance(key, ast.Constant) and key.value in LANGS for key in node.keys
            ):
                found.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert found == []
