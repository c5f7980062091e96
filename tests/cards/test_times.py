"""Times on cards are in the chat's zone, with the zone named."""

from __future__ import annotations

import dataclasses

from cards.approvals import approval_card
from cards.models import ApprovalView
from cards.times import DEFAULT_TIME_ZONE, clock_time, date_time
from tests.cards.structure import all_text

AT = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def test_a_moment_is_shown_in_the_zone_asked_for_with_its_offset() -> None:
    assert DEFAULT_TIME_ZONE == "Asia/Shanghai"
    assert clock_time(AT, "Asia/Shanghai") == "06:13 UTC+8"
    assert date_time(AT, "Asia/Shanghai") == "2023-11-15 06:13 UTC+8"
    assert clock_time(AT, "UTC") == "22:13 UTC"
    assert clock_time(AT, "Asia/Kolkata") == "03:43 UTC+5:30"
    assert date_time(AT, "America/Sao_Paulo") == "2023-11-14 19:13 UTC-3"


def test_an_approval_card_tells_its_expiry_in_its_zone() -> None:
    view = ApprovalView("run", "req", "Bash", "command", "ls", expires_at=AT + 600)
    assert "06:23 UTC+8" in all_text(approval_card(view, "en_us", title="t"))
    elsewhere = dataclasses.replace(view, zone="Europe/Berlin")
    assert "23:23 UTC+1" in all_text(approval_card(elsewhere, "en_us", title="t"))
