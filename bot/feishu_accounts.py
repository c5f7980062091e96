"""Each person's own Feishu account, connected from their private chat, so documents they link
are read as them and never as the bot.

``/amux connect`` runs Feishu's OAuth device flow for a user access token limited to reading
documents (``app_manifest.USER_SCOPES``): the bot answers in the private chat with the link and
code, waits for the person to grant it, and hands the token to the Hub (``hub.user_tokens``),
which keeps it sealed. The token never goes into a workspace, a card, a prompt or a log.
``/amux disconnect`` revokes it at Feishu (``POST <accounts>/oauth/v1/revoke``, the refresh
token and the access token both) and then erases it; a revoke Feishu refuses or never answers
still erases it here, and the answer says so, so the person can also remove the app's access in
Feishu themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
from lark_oapi.channel.auth.device_flow import DeviceFlowClient
from lark_oapi.channel.errors import UATAuthError
from lark_oapi.channel.types import UAT

from bot.feishu.app_manifest import USER_SCOPES
from cards.catalogue import plain_text
from cards.models import Lang
from hub.principals import Principal
from hub.user_tokens import UserToken, UserTokens

logger = logging.getLogger("amux.bot")

# Feishu's device codes live a few minutes; nobody waits longer than this for one.
MAX_WAIT_SECONDS = 900
# Feishu's OAuth token revocation (RFC 7009), on its accounts site.
REVOKE_PATH = "/oauth/v1/revoke"
_REVOKE_SECONDS = 15.0


@dataclass(frozen=True)
class App:
    """What the device flow needs of the app: its id, secret and Feishu's address."""

    app_id: str
    app_secret: str
    domain: str

    @property
    def accounts(self) -> str:
        """Feishu's accounts site for this app's open platform (``open.feishu.cn`` ->
        ``accounts.feishu.cn``, Lark's likewise): where tokens are revoked. Any other address
        (a proxy, a loopback stand-in) serves both."""
        split = urlsplit(self.domain)
        host = split.hostname or ""
        if not host.startswith("open."):
            return self.domain.rstrip("/")
        netloc = split.netloc.replace(host, "accounts." + host.removeprefix("open."), 1)
        return urlunsplit((split.scheme, netloc, "", "", "")).rstrip("/")


class FeishuAccounts:
    """Connects and disconnects people's own Feishu accounts; hands out the token to read as
    one of them, refreshed when it has expired."""

    def __init__(
        self, tokens: UserTokens, app: App, lang: Lang, *, http: httpx.AsyncClient | None = None
    ) -> None:
        """``http`` is the process's pooled Feishu session; without one each flow opens its own."""
        self._tokens = tokens
        self._http = http
        self._app = app
        self._lang = lang
        self._waiting: dict[str, asyncio.Task[None]] = {}
        # One refresh per person at a time: Feishu rotates the refresh token, so a second
        # refresh with the same one would fail and drop a connection that is fine.
        self._refreshing: dict[str, asyncio.Lock] = {}

    def _flow(self) -> DeviceFlowClient:
        # A flow given a session leaves it open when it closes.
        return DeviceFlowClient(
            self._app.app_id, self._app.app_secret, domain=self._app.domain, http_client=self._http
        )

    async def begin(self, person: Principal, tell: Callable[[str], object]) -> str:
        """Start connecting ``person``: the text to answer with (the link and code), and a wait
        in the background that ``tell``s them the outcome. A connect already waiting is
        replaced, so only the newest code works."""
        flow = self._flow()
        try:
            started = await flow.start(list(USER_SCOPES))
        except (UATAuthError, OSError) as error:
            await flow.close()
            logger.warning("Feishu refused to start connecting %s: %s", person.label, error)
            return plain_text(self._lang, "feishu.connect.failed", reason=_reason(error))
        except Exception as error:  # httpx's own errors: a network failure, said once
            await flow.close()
            logger.warning("could not reach Feishu to connect %s: %s", person.label, error)
            return plain_text(self._lang, "feishu.connect.failed", reason=type(error).__name__)
        earlier = self._waiting.pop(person.id, None)
        if earlier is not None:
            earlier.cancel()
        wait = min(started.expires_in, MAX_WAIT_SECONDS)
        task = asyncio.create_task(
            self._wait(flow, person, started.device_code, started.interval, wait, tell)
        )
        self._waiting[person.id] = task
        task.add_done_callback(lambda done: self._forget(person.id, done))
        return plain_text(
            self._lang,
            "feishu.connect.open",
            url=started.verification_uri_complete or started.verification_uri,
            code=started.user_code,
            minutes=max(1, wait // 60),
            scopes=", ".join(USER_SCOPES),
        )

    def _forget(self, principal_id: str, done: asyncio.Task[None]) -> None:
        if self._waiting.get(principal_id) is done:
            del self._waiting[principal_id]

    async def _wait(
        self,
        flow: DeviceFlowClient,
        person: Principal,
        device_code: str,
        interval: int,
        seconds: int,
        tell: Callable[[str], object],
    ) -> None:
        try:
            try:
                granted = await flow.poll(device_code, interval=interval, timeout_seconds=seconds)
            finally:
                await flow.close()
            token = _user_token(granted)
            await self._tokens.store(person.id, token)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.info("connecting the Feishu account of %s failed: %s", person.label, error)
            await _call(
                tell, plain_text(self._lang, "feishu.connect.failed", reason=_reason(error))
            )
            return
        logger.info("%s connected their Feishu account", person.label)
        scopes = ", ".join(token.scopes)
        await _call(tell, plain_text(self._lang, "feishu.connect.done", scopes=scopes))

    async def disconnect(self, person: Principal) -> str:
        """Revoke ``person``'s token at Feishu, then erase it (and stop a connect still
        waiting), whether or not Feishu took the revoke; the text to answer."""
        waiting = self._waiting.pop(person.id, None)
        if waiting is not None:
            waiting.cancel()
        token = self._tokens.token(person.id)
        # A kept token that no longer opens (the key file replaced) cannot be revoked by amux.
        refused = "amux could not open it" if token is None else await self._revoke(token)
        erased = await self._tokens.erase(person.id)
        if not erased:
            return plain_text(self._lang, "feishu.disconnect.none")
        if refused is not None:
            logger.warning(
                "%s disconnected their Feishu account; Feishu did not revoke it: %s",
                person.label,
                refused,
            )
            return plain_text(self._lang, "feishu.disconnect.unrevoked", reason=refused)
        logger.info("%s disconnected their Feishu account; Feishu revoked it", person.label)
        return plain_text(self._lang, "feishu.disconnect.done")

    async def _revoke(self, token: UserToken) -> str | None:
        """Ask Feishu to revoke both of ``token``'s tokens; None when it did, else why not."""
        url = self._app.accounts + REVOKE_PATH
        pairs = [(token.refresh_token, "refresh_token"), (token.access_token, "access_token")]
        http = self._http or httpx.AsyncClient()
        try:
            for secret, hint in pairs:
                if not secret:
                    continue
                form = {
                    "client_id": self._app.app_id,
                    "client_secret": self._app.app_secret,
                    "token": secret,
                    "token_type_hint": hint,
                }
                response = await http.post(url, data=form, timeout=_REVOKE_SECONDS)
                refused = _revoke_refusal(response.status_code, response.text)
                if refused is not None:
                    return refused
        except (httpx.HTTPError, OSError) as error:
            return f"Feishu did not answer: {type(error).__name__}"
        finally:
            if http is not self._http:
                await http.aclose()
        return None

    async def access_token(self, principal_id: str) -> str | None:
        """The token to read as ``principal_id`` now, refreshed if it has expired; None when
        they have not connected or Feishu no longer honours the grant (they connect again)."""
        lock = self._refreshing.setdefault(principal_id, asyncio.Lock())
        async with lock:
            return await self._current(principal_id)

    async def _current(self, principal_id: str) -> str | None:
        token = self._tokens.token(principal_id)
        if token is None or not token.access_token:
            return None
        if not token.expired(time.time()):
            return token.access_token
        if token.refresh_token is None:
            return None
        flow = self._flow()
        try:
            refreshed = _user_token(await flow.refresh(token.refresh_token))
        except Exception as error:
            logger.info("refreshing a Feishu user token failed: %s", error)
            return None
        finally:
            await flow.close()
        if not refreshed.scopes:
            refreshed = UserToken(
                refreshed.access_token,
                refreshed.refresh_token or token.refresh_token,
                refreshed.expires_at,
                refreshed.refresh_expires_at,
                token.scopes,
            )
        await self._tokens.store(principal_id, refreshed)
        return refreshed.access_token

    async def close(self) -> None:
        for task in list(self._waiting.values()):
            task.cancel()
        self._waiting.clear()


def _user_token(granted: UAT) -> UserToken:
    return UserToken(
        access_token=granted.access_token,
        refresh_token=granted.refresh_token,
        expires_at=granted.expires_at,
        refresh_expires_at=granted.refresh_expires_at,
        scopes=tuple(granted.scopes),
    )


def _revoke_refusal(status: int, body: str) -> str | None:
    """Why Feishu's answer to a revoke is a refusal (its words, cut short), None when it is not.
    An empty or non-JSON 2xx body is RFC 7009's plain success."""
    try:
        answer = json.loads(body) if body.strip() else {}
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    words = str(answer.get("error_description") or answer.get("msg") or answer.get("error") or "")
    words = " ".join(words.split())[:160]
    if status >= 400:
        return f"HTTP {status}" + (f": {words}" if words else "")
    code = answer.get("code")
    if isinstance(code, int) and code != 0:
        return f"Feishu code {code}" + (f": {words}" if words else "")
    if answer.get("error"):
        return words
    return None


def _reason(error: BaseException) -> str:
    # The SDK's messages carry Feishu's words (already stripped of markup), never a token.
    return str(error)[:200] or type(error).__name__


async def _call(tell: Callable[[str], object], text: str) -> None:
    try:
        said = tell(text)
        if asyncio.iscoroutine(said):
            await said
    except Exception:
        logger.exception("could not tell the outcome of connecting a Feishu account")
