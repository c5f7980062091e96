"""Who a Principal is: the value the Hub's services hand out and its callers may name.

A value only, with nothing of the state database behind it, so a module that names a Principal
(the bot, the cards' callers) depends on no storage.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

# Long enough for any real person's name; short enough for a card's line and a log line.
DISPLAY_NAME_CHARS = 64


@dataclass(frozen=True)
class Principal:
    id: str
    name: str
    kind: str
    is_owner: bool
    # How people know this person (Feishu's display name), or "" while it is not known: the
    # name is a unique handle for the CLI, the display name what cards, prompts and logs say.
    display_name: str = ""

    @property
    def label(self) -> str:
        """What people are shown: the display name, else the handle."""
        return self.display_name or self.name

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "owner": self.is_owner,
            "display_name": self.display_name,
        }


def clean_display_name(raw: str) -> str:
    """A display name fit for a card line, a prompt header and a log line: NFC, without control,
    format (bidi, zero-width) or line-breaking characters, spaces folded, at most
    ``DISPLAY_NAME_CHARS``; "" when nothing is left.

    The name comes from someone's own profile: it must not redraw a line, pass for another
    header or hide characters.
    """
    kept = (
        " " if unicodedata.category(ch).startswith("Z") or ch in "\t\n\r" else ch
        for ch in unicodedata.normalize("NFC", raw)
        if unicodedata.category(ch) not in ("Cc", "Cf", "Co", "Cn", "Cs") or ch in "\t\n\r"
    )
    return " ".join("".join(kept).split())[:DISPLAY_NAME_CHARS].strip()
