"""Who a Principal is: the value the Hub's services hand out and its callers may name.

A value only, with nothing of the state database behind it, so a module that names a Principal
(the bot, the cards' callers) depends on no storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Principal:
    id: str
    name: str
    kind: str
    is_owner: bool

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "owner": self.is_owner}
