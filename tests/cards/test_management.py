import json

import pytest

from cards import actions
from cards.management import (
    management_card,
    restart_deferred_card,
    restart_notice_card,
    restart_scheduled_card,
)
from cards.models import LANGS, Identity, Lang, ManagementView, RestartNotice, Setting
from tests.cards.structure import all_text, assert_valid_card, callbacks, tags

OWNER = Identity(display_name="Ada *Owner*", principal_id="p_owner", is_owner=True)
MEMBER = Identity(display_name="Bob", principal_id="p_bob")


def _view(identity: Identity = OWNER, **kw: object) -> ManagementView:
    defaults: dict[str, object] = {
        "memory_scope": "global",
        "memory": Setting(saved=False, running=False),
        "isolation": Setting(saved=False, running=False),
        "history_days": Setting(saved=30, running=30),
    }
    defaults.update(kw)
    return ManagementView(identity=identity, **defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize("lang", LANGS)
def test_owner_sees_both_switches_and_save(lang: Lang) -> None:
    card = management_card(_view(), lang)
    assert_valid_card(card)
    names = [el["name"] for el in _checkers(card)]
    assert names == ["memory_enabled", "isolation"]
    assert actions.SETTINGS_SAVE in [v["action"] for v in callbacks(card)]


@pytest.mark.parametrize("lang", LANGS)
def test_non_owner_sees_identity_and_scope_but_no_switches(lang: Lang) -> None:
    card = management_card(_view(MEMBER, memory_scope="principal:p_bob"), lang)
    assert_valid_card(card)
    assert "checker" not in tags(card)
    assert not {v["action"] for v in callbacks(card)} & actions.OWNER_ONLY
    assert "Bob" in all_text(card) and "principal:p_bob" in all_text(card)


def test_toggle_callbacks_carry_the_draft_after_the_click() -> None:
    view = _view(
        memory=Setting(saved=False, running=False),
        isolation=Setting(True, True),
        settings_revision="rev1",
    )
    memory_box, isolation_box = _checkers(management_card(view, "en_us"))
    assert memory_box["checked"] is False
    assert memory_box["behaviors"][0]["value"] == {
        "action": "memory.toggle",
        "memory_enabled": True,
        "isolation": True,
        "history_days": 30,
        "max_queued": 0,
        "messages_per_minute": 0,
        "settings_revision": "rev1",
    }
    assert isolation_box["behaviors"][0]["value"] == {
        "action": "isolation.toggle",
        "memory_enabled": False,
        "isolation": False,
        "history_days": 30,
        "max_queued": 0,
        "messages_per_minute": 0,
        "settings_revision": "rev1",
    }


def test_draft_is_shown_and_saved_but_running_value_is_reported_separately() -> None:
    view = _view(memory=Setting(saved=False, running=False, draft=True))
    card = management_card(view, "en_us")
    memory_box = _checkers(card)[0]
    assert memory_box["checked"] is True
    save = next(v for v in callbacks(card) if v["action"] == actions.SETTINGS_SAVE)
    assert save["memory_enabled"] is True
    assert "unsaved changes" in all_text(card)
    assert "saved: **off**, running: **off**" in all_text(card)


def test_saved_but_not_running_says_restart_pending_and_offers_restart() -> None:
    view = _view(memory=Setting(saved=True, running=False))
    card = management_card(view, "en_us")
    assert "Restart pending" in all_text(card)
    assert "saved: **on**, running: **off**" in all_text(card)
    assert actions.RESTART_NOW in [v["action"] for v in callbacks(card)]
    quiet = management_card(_view(memory=Setting(saved=True, running=True)), "en_us")
    assert "Restart pending" not in all_text(quiet)
    assert actions.RESTART_NOW not in [v["action"] for v in callbacks(quiet)]


def test_after_restart_the_card_says_so_and_shows_the_new_running_state() -> None:
    view = _view(memory=Setting(saved=True, running=True), restarted=True)
    card = management_card(view, "zh_cn")
    text = all_text(card)
    assert "Hub 已重启" in text
    assert "已保存：**开**，运行中：**开**" in text


def test_display_names_are_not_markup() -> None:
    card = management_card(_view(), "en_us")
    assert "Ada &#42;Owner&#42;" in all_text(card)


@pytest.mark.parametrize("lang", LANGS)
def test_restart_notice_explains_restart_and_offers_now_or_later(lang: Lang) -> None:
    notice = RestartNotice(
        memory=Setting(True, False), isolation=Setting(False, False), history_days=Setting(30, 30)
    )
    card = restart_notice_card(notice, lang)
    assert_valid_card(card)
    assert [v["action"] for v in callbacks(card)] == [actions.RESTART_NOW, actions.RESTART_LATER]
    text = all_text(card)
    if lang == "en_us":
        assert "Saving does not change the running policy" in text
        assert "start a new conversation" in text
        assert "files are kept" in text


def _history_choices(card: dict[str, object]) -> list[dict[str, object]]:
    return [v for v in callbacks(card) if v["action"] == actions.HISTORY_DAYS]


def _primary_labels(card: dict[str, object]) -> list[str]:
    from tests.cards.structure import walk

    return [
        el["text"]["content"]  # type: ignore[index]
        for el in walk(card)
        if el["tag"] == "button"
        and el["type"] == "primary"
        and el["behaviors"][0]["value"]["action"] == actions.HISTORY_DAYS  # type: ignore[index]
    ]


@pytest.mark.parametrize("lang", LANGS)
def test_owner_sees_the_history_window_and_its_common_choices(lang: Lang) -> None:
    card = management_card(_view(history_days=Setting(saved=30, running=7)), lang)
    assert_valid_card(card)
    text = all_text(card)
    if lang == "en_us":
        assert "**History kept**" in text
        assert "saved: **30 days**, running: **7 days**" in text
        assert _primary_labels(card) == ["30 days"]
    else:
        assert "**历史保留**" in text
        assert "已保存：**30 天**，运行中：**7 天**" in text
        assert _primary_labels(card) == ["30 天"]
    assert [v["history_days"] for v in _history_choices(card)] == [0, 7, 30, 90, 365]
    # A saved window that is not a running one is a pending restart, like the switches.
    assert actions.RESTART_NOW in [v["action"] for v in callbacks(card)]


def test_every_history_choice_carries_the_whole_draft() -> None:
    view = _view(
        memory=Setting(False, False, draft=True),
        isolation=Setting(True, True),
        settings_revision="rev1",
    )
    choices = _history_choices(management_card(view, "en_us"))
    assert choices[1] == {
        "action": "history.days",
        "memory_enabled": True,
        "isolation": True,
        "history_days": 7,
        "max_queued": 0,
        "messages_per_minute": 0,
        "settings_revision": "rev1",
    }
    assert all(v["memory_enabled"] is True and v["isolation"] is True for v in choices)


def test_a_history_draft_is_shown_saved_and_flagged_as_unsaved() -> None:
    view = _view(history_days=Setting(saved=30, running=30, draft=0))
    card = management_card(view, "en_us")
    assert _primary_labels(card) == ["off"]
    save = next(v for v in callbacks(card) if v["action"] == actions.SETTINGS_SAVE)
    assert save["history_days"] == 0
    assert all(v["history_days"] == 0 for v in _checkers_values(card))
    assert "unsaved changes" in all_text(card)
    assert "Restart pending" not in all_text(card)
    assert "saved: **30 days**, running: **30 days**" in all_text(card)


def test_a_window_saved_outside_the_choices_is_shown_and_kept_by_every_click() -> None:
    card = management_card(_view(history_days=Setting(saved=14, running=0)), "en_us")
    assert "saved: **14 days**, running: **off**" in all_text(card)
    assert _primary_labels(card) == []
    save = next(v for v in callbacks(card) if v["action"] == actions.SETTINGS_SAVE)
    assert save["history_days"] == 14
    assert all(v["history_days"] == 14 for v in _checkers_values(card))
    assert "unsaved changes" not in all_text(card)


def test_members_see_no_history_setting() -> None:
    card = management_card(_view(MEMBER, memory_scope="principal:p_bob"), "en_us")
    assert "History kept" not in all_text(card)
    assert _history_choices(card) == []


@pytest.mark.parametrize("lang", LANGS)
def test_restart_notice_states_the_saved_history_window(lang: Lang) -> None:
    notice = RestartNotice(
        memory=Setting(True, True), isolation=Setting(False, False), history_days=Setting(7, 30)
    )
    text = all_text(restart_notice_card(notice, lang))
    if lang == "en_us":
        assert "history kept: 7 days" in text
        assert "saved: **7 days**, running: **30 days**" in text
        assert "History kept: the days an overwritten or forgotten document" in text
    else:
        assert "历史保留：7 天" in text
    off = RestartNotice(Setting(True, True), Setting(False, False), history_days=Setting(0, 30))
    assert "history kept: off" in all_text(restart_notice_card(off, "en_us"))


@pytest.mark.parametrize("lang", LANGS)
def test_restart_outcome_cards_are_valid(lang: Lang) -> None:
    assert_valid_card(restart_scheduled_card(lang))
    assert_valid_card(restart_deferred_card(lang))


def test_cards_are_plain_json() -> None:
    json.dumps(management_card(_view(), "en_us"))


def _checkers(card: dict[str, object]) -> list[dict[str, object]]:
    from tests.cards.structure import walk

    return [el for el in walk(card) if el["tag"] == "checker"]


def _checkers_values(card: dict[str, object]) -> list[dict[str, object]]:
    return [el["behaviors"][0]["value"] for el in _checkers(card)]  # type: ignore[index]
