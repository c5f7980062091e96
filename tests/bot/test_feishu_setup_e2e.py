"""`amux feishu setup` as an operator runs it: one QR scan makes the app, and `amux serve` then
runs it over the long connection with the scanner as the owner, no AMUX_FEISHU_* variable set.

Feishu's accounts site and open platform are fakes on loopback (``tests/fakes/feishu_accounts.py``
answers the registration device flow lark-oapi's ``aregister_app`` speaks).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.feishu import app_manifest
from tests.conftest import AMUX, HubProcess, free_port, until
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_accounts import FakeAccounts, Outcome, decoded_addons
from tests.fakes.feishu_events import FeishuSigner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SAVED_KEYS = {"app_id", "app_secret", "brand", "domain", "accounts_domain", "owner_open_id", "mode"}


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str

    def link(self) -> str:
        found = [line for line in self.stderr.splitlines() if " open: " in line]
        assert len(found) == 1, self.stderr
        return found[0].split(" open: ", 1)[1].strip()

    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def setup_env(home: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env["AMUX_HOME"] = str(home)
    env.update(variables)
    return env


async def setup(home: Path, *args: str, **variables: str) -> Ran:
    process = await asyncio.create_subprocess_exec(
        AMUX,
        "feishu",
        "setup",
        *args,
        env=setup_env(home, **variables),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


def saved(home: Path) -> dict[str, str]:
    data: dict[str, str] = json.loads((home / "feishu-app.json").read_text())
    return data


async def test_one_scan_makes_the_app_with_everything_amux_uses_and_saves_it_for_its_owner_only(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    async with FakeAccounts(pending=2) as accounts:
        ran = await setup(
            home,
            AMUX_FEISHU_ACCOUNTS_DOMAIN=accounts.url,
            AMUX_FEISHU_DOMAIN="https://open.example.test",
        )
    assert ran.returncode == 0, ran.stderr
    # The QR code is drawn, with the link beside it and how long it still works.
    assert "▀" in ran.stderr or "█" in ran.stderr
    assert "left" in ran.stderr
    assert accounts.polls() == 3, "pending twice, then made"
    asked = decoded_addons(ran.link())
    assert asked["scopes"] == {
        "tenant": list(app_manifest.SCOPES),
        "user": list(app_manifest.USER_SCOPES),
    }
    assert asked["events"] == {"items": {"tenant": list(app_manifest.EVENTS)}}
    assert asked["callbacks"] == {"items": list(app_manifest.CALLBACKS)}
    assert "im.message.receive_v1" in asked["events"]["items"]["tenant"]
    assert asked["callbacks"]["items"] == ["card.action.trigger"]
    assert "clientID" not in ran.link(), "a new app, not an update"

    path = home / "feishu-app.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert saved(home) == {
        "app_id": "cli_scanned",
        "app_secret": "scanned_secret",
        "brand": "feishu",
        "domain": "https://open.example.test",
        "accounts_domain": accounts.url,
        "owner_open_id": "ou_scanner",
        "mode": "long_connection",
    }
    assert [p.name for p in home.iterdir()] == ["feishu-app.json"], "no temporary file is left"
    assert "scanned_secret" not in ran.stdout + ran.stderr
    assert "cli_scanned" in ran.stdout and str(path) in ran.stdout


async def test_update_applies_the_manifest_again_to_the_saved_app_and_keeps_its_owner(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    async with FakeAccounts() as accounts:
        first = await setup(home, AMUX_FEISHU_ACCOUNTS_DOMAIN=accounts.url)
        assert first.returncode == 0, first.stderr
        accounts.open_id = "ou_admin"
        second = await setup(home, "--update", AMUX_FEISHU_ACCOUNTS_DOMAIN=accounts.url)
    assert second.returncode == 0, second.stderr
    assert "clientID=cli_scanned" in second.link()
    assert decoded_addons(second.link())["scopes"]["tenant"] == list(app_manifest.SCOPES)
    assert saved(home)["owner_open_id"] == "ou_scanner"
    assert "the owner stays ou_scanner" in second.stderr


async def test_update_without_a_saved_app_says_to_run_setup_first(tmp_path: Path) -> None:
    ran = await setup(tmp_path / "amux-home", "--update")
    assert ran.returncode == 4
    assert ran.errors() == [ran.stderr.strip()]
    assert "run `amux feishu setup` first" in ran.stderr


@pytest.mark.parametrize(
    ("case", "answers", "said", "status"),
    [
        ("declined", "deny", "the scan was declined", 5),
        ("expired", "expire", "the QR code expired", 1),
        ("unreachable", "deny", "cannot reach", 6),
        ("silent", "silent", "did not answer in time", 6),
    ],
)
async def test_a_declined_expired_or_unreachable_registration_says_so_in_one_line_and_saves_nothing(
    tmp_path: Path, case: str, answers: Outcome, said: str, status: int
) -> None:
    home = tmp_path / "amux-home"
    async with FakeAccounts(outcome=answers) as accounts:
        url = f"http://127.0.0.1:{free_port()}" if case == "unreachable" else accounts.url
        ran = await setup(home, AMUX_FEISHU_ACCOUNTS_DOMAIN=url)
    assert ran.returncode == status, ran.stderr
    assert len(ran.errors()) == 1, ran.stderr
    assert said in ran.errors()[0]
    assert ran.stderr.rstrip().splitlines()[-1] == ran.errors()[0]
    assert "Traceback" not in ran.stderr
    assert not (home / "feishu-app.json").exists()
    assert not home.exists() or list(home.iterdir()) == []


@pytest.mark.timeout(240)
async def test_ctrl_c_while_waiting_for_the_scan_ends_in_one_line_and_saves_nothing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    async with FakeAccounts(pending=10**6, interval=1) as accounts:
        process = await asyncio.create_subprocess_exec(
            AMUX,
            "feishu",
            "setup",
            env=setup_env(home, AMUX_FEISHU_ACCOUNTS_DOMAIN=accounts.url),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        await until(lambda: accounts.polls() >= 1, seconds=60)
        process.send_signal(signal.SIGINT)
        try:
            # Its exit unloads lark-oapi's thousands of modules, seconds on a loaded machine.
            out, err = await asyncio.wait_for(process.communicate(), 90)
        except TimeoutError:
            # Not left running into the next test; what it said so far says where it stuck.
            process.kill()
            _, err = await process.communicate()
            pytest.fail(f"setup still ran after Ctrl-C; it said: {err.decode()[-3000:]}")
    after_link = err.decode().split(" open: ", 1)[1].splitlines()[1:]
    told = [line for line in after_link if not line.startswith("waiting for the scan")]
    assert told == ["cancelled: no app was made or saved"], err.decode()
    assert process.returncode == 130
    assert "Traceback" not in err.decode()
    assert not (home / "feishu-app.json").exists()


async def test_a_lark_tenants_scan_saves_a_lark_app(tmp_path: Path) -> None:
    home = tmp_path / "amux-home"
    async with FakeAccounts(brand="lark") as accounts:
        ran = await setup(home, "--lark", AMUX_FEISHU_ACCOUNTS_DOMAIN=accounts.url)
    assert ran.returncode == 0, ran.stderr
    assert saved(home)["brand"] == "lark"
    assert saved(home)["domain"] == "https://open.larksuite.com"
    assert "(lark)" in ran.stdout


async def test_serve_runs_the_saved_app_over_the_long_connection_and_the_scanner_is_the_owner(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    alice = {"sender_open_id": "ou_alice", "sender_union_id": "on_alice", "sender_user_id": None}
    async with (
        FakeFeishu(app_id="cli_scanned", app_secret="scanned_secret") as feishu,
        FakeAccounts(open_id="ou_alice") as accounts,
    ):
        ran = await setup(
            home, AMUX_FEISHU_ACCOUNTS_DOMAIN=accounts.url, AMUX_FEISHU_DOMAIN=feishu.url
        )
        assert ran.returncode == 0, ran.stderr
        # No AMUX_FEISHU_* variable: HubProcess passes on only the AMUX_* ones named here.
        hub = HubProcess(home, free_port(), extra_env={"AMUX_RUNTIME_SANDBOX": "off"})
        await asyncio.to_thread(hub.start)
        try:
            await until(feishu.ws_connected.is_set, seconds=60)
            signer = FeishuSigner(app_id="cli_scanned")
            chat = "oc_p2p_alice"
            stored = feishu.add_message(chat, "/amux")
            ack = await feishu.push(
                signer.message("/amux", **alice, chat_id=chat, message_id=stored.message_id)
            )
            assert ack["code"] == 200
            replies = await until(
                lambda: (
                    [m for m in feishu.messages.values() if m.root_id == stored.message_id]
                    or [
                        m
                        for m in feishu.messages.values()
                        if m.chat_id == chat and not m.sender_open_id
                    ]
                )
            )
            card = json.dumps(replies[0].card, ensure_ascii=False)
            assert '"checker"' in card, "the owner's management card, with the memory switch"
            log = hub.log()
            assert f"from {home / 'feishu-app.json'}" in log
            assert "/amux claim" not in log, "no claim code is offered"
            assert "scanned_secret" not in log
        finally:
            await asyncio.to_thread(hub.stop)
