"""Moments as the people reading a card tell time: in their time zone, with the zone named.

Feishu users read "21:05 UTC+8", not the Hub's UTC: a request that expires at "13:05 UTC" in a
Beijing chat reads as long past. The zone is the bot's (``AMUX_FEISHU_TIME_ZONE``); the offset
is named beside every time, so nobody has to guess which zone a card means.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

DEFAULT_TIME_ZONE = "Asia/Shanghai"


@lru_cache(maxsize=8)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _offset(moment: datetime) -> str:
    """``UTC``, ``UTC+8``, ``UTC+5:30``, ``UTC-3``."""
    delta = moment.utcoffset() or timedelta(0)
    minutes = int(delta.total_seconds()) // 60
    if minutes == 0:
        return "UTC"
    sign = "+" if minutes > 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours}" + (f":{rest:02d}" if rest else "")


def clock_time(moment: float, zone: str) -> str:
    """``21:05 UTC+8``: a time of today or thereabouts."""
    local = datetime.fromtimestamp(moment, _zone(zone))
    return f"{local:%H:%M} {_offset(local)}"


def date_time(moment: float, zone: str) -> str:
    """``2026-12-03 21:05 UTC+8``."""
    local = datetime.fromtimestamp(moment, _zone(zone))
    return f"{local:%Y-%m-%d %H:%M} {_offset(local)}"
