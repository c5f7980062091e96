"""How a person's Feishu ids are kept as aliases of their Principal, and the app they belong to.

Each kind of id is unique only within its own namespace, and the alias kind names it:

- ``union_id``, one per person for all apps of one developer: ``feishu_union_id``;
- ``user_id``, unique only inside a tenant, and set by that tenant's admins:
  ``feishu:<tenant>:user_id``;
- ``open_id``, one per person per app: ``feishu:<tenant>:<app_id>:open_id``.

So the same ``user_id`` in another tenant is another alias, and names nobody here. The bot's
own app (its ``app_id`` and the tenant it belongs to) is kept in the saved setting ``feishu.app``
once the bot knows it. Until then (a database from before tenants, or ``amux principal alias``
run before the bot first started) ``user_id`` and ``open_id`` aliases wait under
``feishu:*:user_id`` and ``feishu:*:open_id``, meaning "of the app's own tenant, once known";
the bot binds them to its tenant and app when it learns them (:func:`bind_pending`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hub.state import State

IdField = Literal["union_id", "user_id", "open_id"]
ID_FIELDS: tuple[IdField, ...] = ("union_id", "user_id", "open_id")
UNION_ID_KIND = "feishu_union_id"
PENDING = "*"
APP_SETTING = "feishu.app"


@dataclass(frozen=True)
class FeishuApp:
    app_id: str
    tenant_key: str


def alias_kind(field: IdField, app: FeishuApp | None) -> str:
    """The alias kind of one Feishu id field for ``app`` (None: the app's tenant not known yet)."""
    if field == "union_id":
        return UNION_ID_KIND
    if app is None:
        return f"feishu:{PENDING}:{field}"
    if field == "user_id":
        return f"feishu:{app.tenant_key}:user_id"
    return f"feishu:{app.tenant_key}:{app.app_id}:open_id"


def is_feishu_kind(kind: str) -> bool:
    return kind == UNION_ID_KIND or kind.startswith("feishu:")


def recorded_app(state: State) -> FeishuApp | None:
    """The bot's app as last recorded, if any."""
    saved = state.saved_settings().get(APP_SETTING)
    if not isinstance(saved, dict):
        return None
    app_id, tenant_key = saved.get("app_id"), saved.get("tenant_key")
    if isinstance(app_id, str) and isinstance(tenant_key, str) and app_id and tenant_key:
        return FeishuApp(app_id, tenant_key)
    return None


def bind_pending(state: State, app: FeishuApp) -> list[tuple[str, str]]:
    """Record ``app`` and give the aliases waiting for its tenant their namespaced kinds.

    Returns the (kind, principal id) of waiting aliases left as they were because the
    namespaced alias belongs to another Principal already.
    """
    with state.transaction():
        state.save_setting(APP_SETTING, {"app_id": app.app_id, "tenant_key": app.tenant_key})
        left: list[tuple[str, str]] = []
        waiting_fields: tuple[IdField, ...] = ("user_id", "open_id")
        for field in waiting_fields:
            waiting = alias_kind(field, None)
            left += [
                (waiting, holder)
                for holder in state.rekind_aliases(waiting, alias_kind(field, app))
            ]
        return left
