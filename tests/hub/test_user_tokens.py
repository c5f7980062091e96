"""A person's Feishu token kept by the Hub: sealed at rest under the operator's key file, only
their own, and gone when the owner erases them."""

from __future__ import annotations

import stat
from pathlib import Path

from hub.config import HubSettings
from hub.rpc import HUB
from hub.sealing import KEY_FILE, Sealer
from hub.services import Hub
from hub.user_tokens import UserToken, UserTokens
from tests.hub.conftest import ServeHub
from tests.hub.test_approvals import rpc

ACCESS = "u-access-7f3c9e1d2b"
REFRESH = "ur-refresh-4a8b6c0e9f"
SCOPES = ("docx:document:readonly", "wiki:wiki:readonly")


def granted() -> UserToken:
    return UserToken(ACCESS, REFRESH, 2e9, 2.1e9, SCOPES)


async def test_a_stored_token_is_not_readable_in_the_state_database(
    serve_hub: ServeHub, tmp_path: Path
) -> None:
    client, ids = await serve_hub("owner", "alice")
    hub: Hub = client.server.app[HUB]
    await hub.user_tokens.store(ids["alice"], granted())

    key = HubSettings(home=tmp_path / "home").home / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    hub.state.db.execute("PRAGMA wal_checkpoint(FULL)")
    state_files = list(hub.settings.state_path.parent.glob(hub.settings.state_path.name + "*"))
    for path in state_files:
        raw = path.read_bytes()
        assert ACCESS.encode() not in raw and REFRESH.encode() not in raw, path
    token = hub.user_tokens.token(ids["alice"])
    assert token is not None
    assert (token.access_token, token.refresh_token, token.scopes) == (ACCESS, REFRESH, SCOPES)
    assert ACCESS not in repr(token)
    # Sealed to Alice: nobody else's lookup, and no other key, opens it.
    assert hub.user_tokens.token(ids["owner"]) is None
    key.unlink()
    assert UserTokens(hub.state, Sealer(key.parent)).token(ids["alice"]) is None


async def test_erasing_a_principal_erases_their_feishu_connection(serve_hub: ServeHub) -> None:
    client, ids = await serve_hub("owner", "alice", memory=True)
    hub: Hub = client.server.app[HUB]
    await hub.user_tokens.store(ids["alice"], granted())
    await hub.user_tokens.store(ids["owner"], granted())

    await rpc(client, ids["owner-token"], "memory.erase_principal", principal_id=ids["alice"])

    assert hub.user_tokens.token(ids["alice"]) is None
    assert hub.user_tokens.connection(ids["alice"]) is None
    assert hub.user_tokens.token(ids["owner"]) is not None


def test_the_key_an_older_version_named_user_token_key_is_taken_over(tmp_path: Path) -> None:
    before = tmp_path / "before"
    before.mkdir()
    sealed = Sealer(before).seal("alice", b"u-access")
    (tmp_path / "home").mkdir()
    (before / KEY_FILE).rename(tmp_path / "home" / "user-token.key")

    assert Sealer(tmp_path / "home").open("alice", sealed) == b"u-access"
    assert not (tmp_path / "home" / "user-token.key").exists()
    assert Sealer(tmp_path / "home").open("bob", sealed) is None
