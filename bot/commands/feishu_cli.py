"""`amux feishu setup`: create the Feishu (or Lark) app from one QR scan and save it.

Feishu's app registration is an OAuth device flow on its accounts site: amux asks for an app with
every scope, event and callback of ``bot.feishu.app_manifest``, shows the link as a QR code, and
polls until the person who scans it confirms (or declines, or the code expires). The app's id and
secret are saved in AMUX_HOME (``bot.feishu.saved_app``), where `amux serve` finds them; the
person who scanned becomes the Feishu owner. Nothing is written unless the app was made.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, Literal, TextIO

import typer

from bot.config import FEISHU_ACCOUNTS, FEISHU_DOMAIN, LARK_ACCOUNTS, LARK_DOMAIN, FeishuSettings
from hub.cli import JsonOutput, emit, fail, note
from hub.config import HubSettings
from hub.errors import AmuxError, Forbidden, NotFound, RequestTimeout, Unavailable

feishu_app = typer.Typer(help="The Feishu (or Lark) app the bot runs as.", no_args_is_help=True)

# Exit status of a set-up the operator interrupted (as a shell reports Ctrl-C).
INTERRUPTED = 130
# Without a terminal to redraw a line in, the countdown is told this often.
PLAIN_COUNTDOWN_SECONDS = 60


class Countdown:
    """How long the QR code still works, redrawn in place on a terminal."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._deadline: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        tty = self._out.isatty()
        told: int | None = None
        while self._deadline is not None:
            left = max(0, round(self._deadline - time.monotonic()))
            line = f"waiting for the scan: {left // 60}:{left % 60:02d} left"
            if tty:
                self._out.write(f"\r{line} ")
                self._out.flush()
            elif told is None or told - left >= PLAIN_COUNTDOWN_SECONDS:
                self._out.write(line + "\n")
                self._out.flush()
                told = left
            await asyncio.sleep(1)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            if self._out.isatty():
                self._out.write("\n")
                self._out.flush()
        self._deadline = None


def show_qr(url: str, out: TextIO) -> None:
    """The link as a QR code drawn in text, and the link itself for whoever cannot scan it."""
    import segno

    segno.make(url, error="l").terminal(out=out, compact=True)
    out.write(f"Scan with the Feishu (or Lark) app, or open: {url}\n")
    out.flush()


async def register(
    accounts: str,
    lark_accounts: str,
    app_id: str | None,
    on_qr: Callable[[str], None],
    countdown: Countdown,
) -> dict[str, Any]:
    """The registration's result (``client_id``, ``client_secret``, ``user_info``).

    Raises:
        AmuxError: declined, expired, refused or unreachable; one line says which.
    """
    import httpx
    from lark_oapi.scene.registration import aregister_app
    from lark_oapi.scene.registration.errors import (
        AppAccessDeniedError,
        AppExpiredError,
        RegisterAppError,
    )

    from bot.feishu import app_manifest

    def qr_code(info: dict[str, Any]) -> None:
        on_qr(str(info["url"]))
        countdown.start(float(info.get("expire_in") or 600))

    def status(info: dict[str, Any]) -> None:
        if info.get("status") == "domain_switched":
            note("the scan came from a Lark tenant: continuing with Lark")

    preset = (
        None if app_id else {"name": app_manifest.APP_NAME, "desc": app_manifest.APP_DESCRIPTION}
    )
    try:
        result: dict[str, Any] = await aregister_app(
            qr_code,
            on_status_change=status,
            source="amux",
            domain=accounts,
            lark_domain=lark_accounts,
            app_preset=preset,
            addons=app_manifest.addons(),
            app_id=app_id,
        )
    except AppAccessDeniedError:
        raise Forbidden("the app was not made: the scan was declined in Feishu") from None
    except AppExpiredError:
        raise RequestTimeout(
            "the QR code expired before the app was confirmed; run `amux feishu setup` again"
        ) from None
    except RegisterAppError as error:
        raise Unavailable(
            f"Feishu refused to make the app ({error.code}: {error.description})"
        ) from None
    except httpx.TimeoutException:
        raise Unavailable(
            f"{accounts} did not answer in time; check the network (or "
            "AMUX_FEISHU_ACCOUNTS_DOMAIN) and run `amux feishu setup` again"
        ) from None
    except httpx.HTTPError as error:
        raise Unavailable(
            f"cannot reach {accounts} ({type(error).__name__}); check the network (or "
            "AMUX_FEISHU_ACCOUNTS_DOMAIN) and run `amux feishu setup` again"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise Unavailable(
            f"{accounts} answered something that is not an app registration; check "
            "AMUX_FEISHU_ACCOUNTS_DOMAIN"
        ) from None
    finally:
        countdown.stop()
    if not result.get("client_id") or not result.get("client_secret"):
        raise Unavailable(f"{accounts} made no app")
    return result


@feishu_app.command("setup")
def setup(
    lark: bool = typer.Option(
        False, "--lark", help="A Lark tenant: register at accounts.larksuite.com."
    ),
    update: bool = typer.Option(
        False,
        "--update",
        help="Apply amux's scopes, events and callbacks again to the app saved before.",
    ),
    as_json: JsonOutput = False,
) -> None:
    """Create the Feishu app from one QR scan, with every scope, event and callback amux uses,
    and save it in AMUX_HOME for `amux serve`; whoever scans it becomes the Feishu owner."""
    # Here, not at the top: every other command (the ones Agents run) must start quickly.
    from bot.feishu import saved_app

    home = HubSettings().home
    feishu = FeishuSettings()
    path = saved_app.app_path(home)
    try:
        previous = saved_app.load(home)
    except AmuxError as error:
        fail(error)
    if update and previous is None:
        fail(NotFound(f"no app is saved in {path}: run `amux feishu setup` first"))
    given = feishu.model_fields_set
    explicit = feishu.accounts_domain if "accounts_domain" in given else None
    if explicit is not None:
        accounts = lark_accounts = explicit
    elif update and previous is not None:
        accounts = previous.accounts_domain
        lark_accounts = accounts if previous.brand == "lark" else LARK_ACCOUNTS
    else:
        accounts = LARK_ACCOUNTS if lark else FEISHU_ACCOUNTS
        lark_accounts = LARK_ACCOUNTS
    countdown = Countdown(sys.stderr)
    app_id = previous.app_id if update and previous is not None else None
    try:
        result = asyncio.run(
            register(
                accounts, lark_accounts, app_id, lambda url: show_qr(url, sys.stderr), countdown
            )
        )
    except AmuxError as error:
        fail(error)
    except KeyboardInterrupt:
        note("cancelled: no app was made or saved")
        raise typer.Exit(INTERRUPTED) from None
    user = result.get("user_info") or {}
    brand: Literal["feishu", "lark"] = (
        "lark"
        if user.get("tenant_brand") == "lark" or (lark and not user.get("tenant_brand"))
        else "feishu"
    )
    if "domain" in given:
        domain = feishu.domain
    elif update and previous is not None and previous.brand == brand:
        domain = previous.domain
    else:
        domain = LARK_DOMAIN if brand == "lark" else FEISHU_DOMAIN
    scanner = str(user.get("open_id") or "")
    owner = scanner
    if previous is not None and previous.app_id == result["client_id"] and previous.owner_open_id:
        owner = previous.owner_open_id
        if scanner and scanner != owner:
            note(f"the owner stays {owner}, who set the app up first; {scanner} scanned this time")
    if previous is not None and previous.app_id != result["client_id"]:
        note(f"app {previous.app_id} saved before is replaced by {result['client_id']}")
    app = saved_app.SavedApp(
        app_id=str(result["client_id"]),
        app_secret=str(result["client_secret"]),
        brand=brand,
        domain=domain,
        accounts_domain=LARK_ACCOUNTS if brand == "lark" and explicit is None else accounts,
        owner_open_id=owner,
    )
    try:
        saved_app.save(home, app)
    except OSError as error:
        fail(Unavailable(f"cannot save {path}: {error.strerror or error}"))
    if not app.owner_open_id:
        note(
            "Feishu did not say who scanned: amux serve logs a claim code for the owner to send "
            "the bot (/amux claim CODE)"
        )
    if feishu.enabled:
        note(
            f"AMUX_FEISHU_APP_ID is exported ({feishu.app_id}): amux serve runs that app until "
            "it is unset"
        )
    result_fields = {
        "app_id": app.app_id,
        "brand": app.brand,
        "domain": app.domain,
        "mode": app.mode,
        "owner_open_id": app.owner_open_id,
        "path": str(path),
        "updated": update,
    }
    emit(result_fields, as_json, _told)


def _told(result: dict[str, Any]) -> str:
    done = "updated" if result["updated"] else "made"
    owner = ", and the person who scanned is the owner" if result["owner_open_id"] else ""
    return (
        f"Feishu app {result['app_id']} ({result['brand']}) {done} with amux's scopes, events and "
        f"callbacks; saved in {result['path']} (mode 0600). Start `amux serve`: it connects over "
        f"the long connection{owner}."
    )
