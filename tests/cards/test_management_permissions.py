import pytest

from cards import actions
from cards.catalogue import text
from cards.management import PERMISSION_CHOICES, TIMEOUT_CHOICES, duration, management_card
from cards.models import LANGS, Lang, Setting
from tests.cards.structure import all_text, assert_valid_card, callbacks, walk
from tests.cards.test_management import MEMBER, _view


def _choices(card: dict[str, object], action: str) -> list[dict[str, object]]:
    return [
        el
        for el in walk(card)
        if el["tag"] == "button" and el["behaviors"][0]["value"]["action"] == action
    ]


@pytest.mark.parametrize("lang", LANGS)
def test_the_owner_sees_the_policy_and_the_timeout_with_a_button_for_each_choice(
    lang: Lang,
) -> None:
    card = management_card(_view(permissions="read-only", approval_timeout=300), lang)
    assert_valid_card(card)
    body = all_text(card)
    policy = text(lang, "manage.permissions.read-only")
    assert text(lang, "manage.permissions", policy=policy) in body
    assert text(lang, "manage.approval_timeout", timeout=duration(lang, 300)) in body
    assert text(lang, "manage.live") in body, "the card says when a change applies"

    policies = _choices(card, actions.PERMISSIONS_SET)
    assert [b["behaviors"][0]["value"]["permissions"] for b in policies] == list(PERMISSION_CHOICES)
    assert [b["type"] for b in policies] == ["default", "default", "primary"]
    timeouts = _choices(card, actions.APPROVAL_TIMEOUT_SET)
    assert [b["behaviors"][0]["value"]["approval_timeout"] for b in timeouts] == list(
        TIMEOUT_CHOICES
    )
    assert [b["type"] for b in timeouts].count("primary") == 1
    assert timeouts[TIMEOUT_CHOICES.index(300)]["type"] == "primary"


def test_each_choice_carries_the_unsaved_draft_so_it_survives_the_click() -> None:
    view = _view(
        memory=Setting(False, False, draft=True),
        history_days=Setting(30, 30, 7),
        settings_revision="rev1",
    )
    card = management_card(view, "en_us")
    (auto,) = [
        b
        for b in _choices(card, actions.PERMISSIONS_SET)
        if b["behaviors"][0]["value"]["permissions"] == "auto"
    ]
    assert auto["behaviors"][0]["value"] == {
        "action": "agents.permissions",
        "permissions": "auto",
        "memory_enabled": True,
        "isolation": False,
        "history_days": 7,
        "max_queued": 0,
        "messages_per_minute": 0,
        "settings_revision": "rev1",
    }


@pytest.mark.parametrize("lang", LANGS)
def test_a_member_sees_no_permission_settings(lang: Lang) -> None:
    card = management_card(_view(MEMBER), lang)
    actions_shown = {v["action"] for v in callbacks(card)}
    assert not actions_shown & {actions.PERMISSIONS_SET, actions.APPROVAL_TIMEOUT_SET}
    assert text(lang, "manage.agents") not in all_text(card)


def test_the_live_settings_are_owner_only() -> None:
    assert {actions.PERMISSIONS_SET, actions.APPROVAL_TIMEOUT_SET} <= actions.OWNER_ONLY
    assert actions.RUN_APPROVE not in actions.OWNER_ONLY


@pytest.mark.parametrize(
    ("seconds", "en", "zh"),
    [
        (45, "45 s", "45 秒"),
        (60, "1 min", "1 分钟"),
        (600, "10 min", "10 分钟"),
        (3600, "1 h", "1 小时"),
        (5400, "90 min", "90 分钟"),
    ],
)
def test_durations_read_in_the_largest_whole_unit(seconds: int, en: str, zh: str) -> None:
    assert duration("en_us", seconds) == en
    assert duration("zh_cn", seconds) == zh
