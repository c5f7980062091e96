"""The `/amux` management card, the restart notice, and what follows a restart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cards import actions
from cards.catalogue import text
from cards.elements import (
    CARD_MAX_BYTES,
    Card,
    Element,
    Template,
    button,
    card,
    checker,
    code,
    encoded_size,
    escape,
    hr,
    markdown,
    row,
)
from cards.models import Lang, ManagementView, RestartNotice, Setting
from cards.projects import projects_section
from cards.schedules import schedules_section

# The history windows offered as buttons; any other saved number of days is shown as it is.
HISTORY_CHOICES: tuple[int, ...] = (0, 7, 30, 90, 365)
# Each person's share offered as buttons (0: no limit); other saved numbers are shown as they are.
QUEUED_CHOICES: tuple[int, ...] = (1, 3, 5, 10, 20, 0)
MESSAGES_CHOICES: tuple[int, ...] = (5, 10, 20, 60, 0)
# The Agents' permission policies, and the approval timeouts offered (seconds).
PERMISSION_CHOICES: tuple[str, ...] = ("ask", "auto", "read-only")
TIMEOUT_CHOICES: tuple[int, ...] = (60, 300, 600, 1800, 3600)
# Token budgets offered (0: no limit); any other saved number is shown as it is.
DAILY_TOKEN_CHOICES: tuple[int, ...] = (0, 200_000, 1_000_000, 5_000_000, 20_000_000)
TURN_TOKEN_CHOICES: tuple[int, ...] = (0, 50_000, 200_000, 1_000_000)


def _tokens(lang: Lang, tokens: int) -> str:
    return text(lang, "value.no_limit") if tokens == 0 else f"{tokens:,}"


def _on_off(lang: Lang, value: bool) -> str:
    return text(lang, "value.on" if value else "value.off")


def _days(lang: Lang, days: int) -> str:
    return text(lang, "value.off") if days == 0 else text(lang, "value.days", days=days)


def _limit(lang: Lang, value: int) -> str:
    return text(lang, "value.no_limit") if value == 0 else str(value)


def duration(lang: Lang, seconds: int) -> str:
    """``90 s``, ``10 min``, ``1 h``: the largest unit that divides ``seconds``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return text(lang, "value.hours", hours=seconds // 3600)
    if seconds >= 60 and seconds % 60 == 0:
        return text(lang, "value.minutes", minutes=seconds // 60)
    return text(lang, "value.seconds", seconds=seconds)


def _policy(lang: Lang, policy: str) -> str:
    known = policy if policy in PERMISSION_CHOICES else "ask"
    return text(lang, f"manage.permissions.{known}")


def _agents_section(view: ManagementView, lang: Lang, draft: dict[str, Any]) -> list[Element]:
    """The live permission settings: each button saves its value at once (carrying the draft of
    the restart-pending settings, so an unsaved draft stays on the card)."""
    policies = row(
        *(
            button(
                _policy(lang, policy),
                actions.PERMISSIONS_SET,
                kind="primary" if policy == view.permissions else "default",
                **{**draft, "permissions": policy},
            )
            for policy in PERMISSION_CHOICES
        )
    )
    timeouts = row(
        *(
            button(
                duration(lang, seconds),
                actions.APPROVAL_TIMEOUT_SET,
                kind="primary" if seconds == view.approval_timeout else "default",
                **{**draft, "approval_timeout": seconds},
            )
            for seconds in TIMEOUT_CHOICES
        )
    )
    budgets = [
        row(
            *(
                button(
                    _tokens(lang, tokens),
                    action,
                    kind="primary" if tokens == current else "default",
                    **{**draft, field: tokens},
                )
                for tokens in choices
            )
        )
        for action, field, choices, current in (
            (actions.BUDGET_DAILY_SET, "daily_tokens", DAILY_TOKEN_CHOICES, view.daily_tokens),
            (actions.BUDGET_TURN_SET, "turn_tokens", TURN_TOKEN_CHOICES, view.turn_tokens),
        )
    ]
    policy = _policy(lang, view.permissions)
    timeout = duration(lang, view.approval_timeout)
    return [
        hr(),
        markdown(text(lang, "manage.agents")),
        markdown(
            text(lang, "manage.permissions", policy=policy)
            + f"\n{text(lang, 'manage.permissions.explain')}"
        ),
        policies,
        markdown(text(lang, "manage.approval_timeout", timeout=timeout)),
        timeouts,
        markdown(text(lang, "manage.budget.daily", tokens=_tokens(lang, view.daily_tokens))),
        budgets[0],
        markdown(text(lang, "manage.budget.turn", tokens=_tokens(lang, view.turn_tokens))),
        budgets[1],
        markdown(f"*{text(lang, 'manage.live')}*"),
    ]


def _identity_section(view: ManagementView, lang: Lang) -> list[Element]:
    who = view.identity
    role = text(lang, "manage.role.owner" if who.is_owner else "manage.role.member")
    scope_hint = text(
        lang,
        "manage.scope.global" if view.memory_scope == "global" else "manage.scope.principal",
    )
    return [
        markdown(
            text(
                lang,
                "manage.identity",
                name=escape(who.display_name),
                principal=code(who.principal_id),
                kind=text(lang, f"manage.kind.{who.kind}"),
            )
            + f"\n{role}"
        ),
        markdown(text(lang, "manage.scope", scope=code(view.memory_scope)) + f"\n{scope_hint}"),
        *_feishu_account(view, lang),
    ]


def _feishu_account(view: ManagementView, lang: Lang) -> list[Element]:
    if not view.feishu_connectable:
        return []
    if view.feishu_scopes is None:
        return [
            markdown(text(lang, "manage.feishu.none")),
            row(button(text(lang, "manage.feishu.connect"), actions.FEISHU_CONNECT)),
        ]
    scopes = ", ".join(code(scope) for scope in view.feishu_scopes) or "-"
    return [
        markdown(text(lang, "manage.feishu.connected", scopes=scopes)),
        row(button(text(lang, "manage.feishu.disconnect"), actions.FEISHU_DISCONNECT)),
    ]


def _provider_section(view: ManagementView, lang: Lang) -> list[Element]:
    if not view.providers:
        return []
    choices = [
        button(
            name,
            actions.PROVIDER_SET,
            kind="primary" if name == view.provider else "default",
            provider=name,
            chat_id=view.chat_id,
        )
        for name in view.providers
    ]
    return [markdown(text(lang, "manage.provider", provider=view.provider)), row(*choices)]


def _setting_line(lang: Lang, setting: Setting[bool]) -> Element:
    return markdown(
        text(
            lang,
            "manage.values",
            saved=_on_off(lang, setting.saved),
            running=_on_off(lang, setting.running),
        )
    )


def _history_line(lang: Lang, setting: Setting[int]) -> Element:
    values = text(
        lang,
        "manage.values",
        saved=_days(lang, setting.saved),
        running=_days(lang, setting.running),
    )
    return markdown(f"{text(lang, 'manage.history')}\n{values}")


def _limit_line(lang: Lang, key: str, setting: Setting[int]) -> Element:
    values = text(
        lang,
        "manage.values",
        saved=_limit(lang, setting.saved),
        running=_limit(lang, setting.running),
    )
    return markdown(f"{text(lang, key)}\n{values}")


def _choices(
    lang: Lang,
    label: Callable[[Lang, int], str],
    action: str,
    field: str,
    choices: tuple[int, ...],
    draft: dict[str, Any],
) -> Element:
    """A row of buttons, one per value of ``field``, each carrying the whole draft after it."""
    return row(
        *(
            button(
                label(lang, choice),
                action,
                kind="primary" if choice == draft[field] else "default",
                **{**draft, field: choice},
            )
            for choice in choices
        )
    )


def management_card(view: ManagementView, lang: Lang) -> Card:
    """The management card; switches appear only when the viewer is the owner."""
    elements = _identity_section(view, lang) + _provider_section(view, lang)
    if view.restarted:
        elements.insert(0, markdown(text(lang, "manage.restarted")))
    if not view.identity.is_owner:
        elements += [
            hr(),
            markdown(text(lang, "manage.member_hint")),
            row(button(text(lang, "manage.my_memory"), actions.MEMORY_LIST)),
        ]
        elements += schedules_section(view.schedules, lang, {})
        if view.notice:
            elements.insert(0, markdown(view.notice))
        return card(text(lang, "manage.title"), "blue", elements)

    # Each click carries the whole draft after that click, so the card stays the only state.
    draft: dict[str, Any] = {
        "memory_enabled": view.memory.shown,
        "isolation": view.isolation.shown,
        "history_days": view.history_days.shown,
        "max_queued": view.max_queued.shown,
        "messages_per_minute": view.messages_per_minute.shown,
        "settings_revision": view.settings_revision,
    }
    memory, isolation = view.memory.shown, view.isolation.shown
    elements += [
        hr(),
        markdown(text(lang, "manage.experiments")),
        checker(
            "memory_enabled",
            text(lang, "manage.memory_switch"),
            memory,
            actions.MEMORY_TOGGLE,
            **{**draft, "memory_enabled": not memory},
        ),
        _setting_line(lang, view.memory),
        checker(
            "isolation",
            text(lang, "manage.isolation_switch"),
            isolation,
            actions.ISOLATION_TOGGLE,
            **{**draft, "isolation": not isolation},
        ),
        _setting_line(lang, view.isolation),
        _history_line(lang, view.history_days),
        _choices(lang, _days, actions.HISTORY_DAYS, "history_days", HISTORY_CHOICES, draft),
        hr(),
        markdown(text(lang, "manage.fair_share")),
        _limit_line(lang, "manage.max_queued", view.max_queued),
        _choices(lang, _limit, actions.QUEUED_MAX, "max_queued", QUEUED_CHOICES, draft),
        _limit_line(lang, "manage.messages_per_minute", view.messages_per_minute),
        _choices(
            lang, _limit, actions.MESSAGES_RATE, "messages_per_minute", MESSAGES_CHOICES, draft
        ),
    ]
    if view.has_unsaved_draft:
        elements.append(markdown(text(lang, "manage.unsaved")))
    if view.restart_pending:
        elements.append(markdown(f"**{text(lang, 'manage.restart_pending')}**"))
    elements.append(
        row(
            button(text(lang, "manage.save"), actions.SETTINGS_SAVE, kind="primary", **draft),
            button(text(lang, "manage.my_memory"), actions.MEMORY_LIST),
        )
    )
    if view.restart_pending:
        elements.append(row(button(text(lang, "restart.now"), actions.RESTART_NOW, kind="danger")))
    # After Save: these are not part of what Save (and a restart) applies.
    elements += _agents_section(view, lang, draft)
    if view.notice:
        # What the click before did (or why it changed nothing), where the owner looks first.
        elements.insert(0, markdown(view.notice))
    elements += schedules_section(view.schedules, lang, draft)
    # The projects get what room the rest of the card leaves (a margin for the header).
    room = CARD_MAX_BYTES - encoded_size(elements) - 1_000
    elements += projects_section(view, lang, draft, room)
    template: Template = "orange" if view.restart_pending else "blue"
    return card(text(lang, "manage.title"), template, elements)


def restart_notice_card(notice: RestartNotice, lang: Lang) -> Card:
    """Shown after Save: what a restart does, with "Restart now" and "Later"."""
    elements: list[Element] = [
        markdown(
            text(
                lang,
                "restart.changes",
                memory=_on_off(lang, notice.memory.saved),
                isolation=_on_off(lang, notice.isolation.saved),
                history=_days(lang, notice.history_days.saved),
            )
        ),
        _setting_line(lang, notice.memory),
        _setting_line(lang, notice.isolation),
        _history_line(lang, notice.history_days),
        _limit_line(lang, "manage.max_queued", notice.max_queued),
        _limit_line(lang, "manage.messages_per_minute", notice.messages_per_minute),
        hr(),
        markdown(text(lang, "restart.body")),
        markdown(f"*{text(lang, 'restart.when')}*"),
        row(
            button(text(lang, "restart.now"), actions.RESTART_NOW, kind="danger"),
            button(text(lang, "restart.later"), actions.RESTART_LATER),
        ),
    ]
    return card(text(lang, "restart.title"), "orange", elements)


def restart_scheduled_card(lang: Lang) -> Card:
    """Replaces the notice once "Restart now" was accepted."""
    return card(text(lang, "restart.title"), "yellow", [markdown(text(lang, "restart.scheduled"))])


def restart_deferred_card(lang: Lang) -> Card:
    """Replaces the notice after "Later"; the owner can still restart from the management card."""
    return card(
        text(lang, "restart.title"),
        "grey",
        [
            markdown(text(lang, "restart.deferred")),
            row(button(text(lang, "manage.title"), actions.MANAGE_OPEN)),
        ],
    )
