"""Forges: the GitHub or GitLab a project's pull requests are opened on, and the one each
conversation opened.

The owner names a project's forge (its kind, its API's base URL, the repository on it) and a
token for it. The token is kept in the Hub's state database, beside the projects, sealed
(``hub.sealing``, with the project's name as its associated data), and goes nowhere else: never
to a worker or a sandbox (an Agent pushes the branch; the Hub opens the pull request), never in
a wire answer, a card, a log line or an error message. A forge's own
answer is cut short and has the token taken out before it is shown, in case it echoes it.

A conversation opens at most one pull request: the first press opens it from the conversation's
branch against the project's default branch (or finds the open one from that branch), later
presses update its title and body. Who may press is decided here from the stored Session and its
turns: the owner, the Session's Principal when it is a person's, and whoever sent a turn in it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import aiohttp

from hub.errors import Forbidden, InvalidArgument, NotFound, Unavailable
from hub.principals import Principal
from hub.projects import Projects
from hub.sealing import Sealer
from hub.state import State

ForgeKind = Literal["github", "gitlab"]
FORGE_KINDS: tuple[str, ...] = ("github", "gitlab")
DEFAULT_BASE_URLS = {"github": "https://api.github.com", "gitlab": "https://gitlab.com"}
FORGE_SECONDS = 20.0
# What of a turn's answer a pull request's body carries; forges refuse bodies of some 64 KiB.
BODY_CHARS = 8000
TITLE_CHARS = 120
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class ForgeUnavailable(Unavailable):
    code = "forge_unavailable"


@dataclass(frozen=True)
class Forge:
    """A project's forge as the owner set it; ``token`` is never part of what is shown."""

    project: str
    kind: ForgeKind
    base_url: str
    repo: str
    token: str

    def to_wire(self) -> dict[str, Any]:
        # Without the token: a wire answer is printed, logged and shown.
        return {
            "project": self.project,
            "kind": self.kind,
            "base_url": self.base_url,
            "repo": self.repo,
        }

    def __repr__(self) -> str:
        return f"Forge({self.project!r}, {self.kind!r}, {self.base_url!r}, {self.repo!r})"


@dataclass(frozen=True)
class PullRequest:
    """The pull (or merge) request a conversation opened."""

    session_id: str
    project: str
    number: int
    url: str


def repo_of_remote(remote: str) -> str | None:
    """``owner/name`` (or ``group/sub/name``) of a remote URL; None when it names none."""
    try:
        path = urlsplit(remote).path
    except ValueError:
        return None
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[:-4]
    return path if "/" in path else None


def base_url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        userinfo = parts.username is not None or parts.password is not None
    except ValueError:
        return f"{url!r} is not a URL"
    if userinfo or parts.query or parts.fragment:
        return "the forge's base URL carries no user, token, query or fragment"
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS:
        # A token over plain HTTP only where nobody else is on the path.
        return None
    return "the forge's base URL is https:// (plain http:// only on this host's loopback)"


def _scrubbed(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


class Forges:
    """Projects' forges and conversations' pull requests in the Hub's state database."""

    def __init__(
        self,
        state: State,
        projects: Projects,
        sealer: Sealer,
        seconds: float = FORGE_SECONDS,
    ) -> None:
        self._state = state
        self.db = state.db
        self._projects = projects
        self._sealer = sealer
        self._seconds = seconds
        # One press at a time opens a conversation's pull request: two at once would open two.
        self._lock = asyncio.Lock()
        self._seal_clear_tokens()

    def _seal_clear_tokens(self) -> None:
        """Seal the tokens an older version kept in the clear, so none stays readable."""
        clear = self.db.execute(
            "SELECT project, token FROM project_forges WHERE sealed IS NULL AND token != ''"
        ).fetchall()
        if not clear:
            return
        # Overwritten on disk too, not left in a free page of the database file.
        secure = self.db.execute("PRAGMA secure_delete").fetchone()[0]
        self.db.execute("PRAGMA secure_delete = ON")
        try:
            with self._state.transaction() as db:
                for row in clear:
                    db.execute(
                        "UPDATE project_forges SET sealed = ?, token = '' WHERE project = ?",
                        (self._seal(row["project"], row["token"]), row["project"]),
                    )
        finally:
            self.db.execute(f"PRAGMA secure_delete = {int(secure)}")

    def _seal(self, project: str, token: str) -> bytes:
        return self._sealer.seal(project, token.encode())

    def of(self, project: str) -> Forge | None:
        """The project's forge; None when it has none, or its token no longer opens (the key
        was replaced), so the owner sets it again."""
        row = self.db.execute(
            "SELECT * FROM project_forges WHERE project = ?", (project,)
        ).fetchone()
        if row is None or row["sealed"] is None:
            return None
        token = self._sealer.open(project, bytes(row["sealed"]))
        if token is None:
            return None
        kind: ForgeKind = "gitlab" if row["kind"] == "gitlab" else "github"
        return Forge(row["project"], kind, row["base_url"], row["repo"], token.decode())

    async def set(
        self,
        project: str,
        *,
        kind: str,
        token: str,
        by: str,
        base_url: str | None = None,
        repo: str | None = None,
    ) -> Forge:
        """Set (or replace) the project's forge.

        Raises:
            NotFound: no such project.
            InvalidArgument: an unknown kind, a bad base URL, no repository, an empty token.
        """
        found = self._projects.get(project)
        if kind not in FORGE_KINDS:
            raise InvalidArgument(f"a forge is one of {', '.join(FORGE_KINDS)}")
        token = token.strip()
        if not token or any(c.isspace() for c in token) or len(token) > 1024:
            raise InvalidArgument("the forge token is one word of up to 1024 characters")
        url = (base_url or DEFAULT_BASE_URLS[kind]).rstrip("/")
        problem = base_url_problem(url)
        if problem is not None:
            raise InvalidArgument(problem)
        named = repo or (repo_of_remote(found.source) if found.kind == "remote" else None)
        if not named or not all(part and part not in (".", "..") for part in named.split("/")):
            raise InvalidArgument(
                "name the repository on the forge with --repo (owner/name): "
                "the project's source names none"
            )
        if named.count("/") < 1 or (kind == "github" and named.count("/") != 1):
            raise InvalidArgument(f"{named!r} is not a repository: owner/name")

        def upsert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO project_forges"
                " (project, kind, base_url, repo, token, sealed, set_by, set_at)"
                " VALUES (?, ?, ?, ?, '', ?, ?, ?) ON CONFLICT(project) DO UPDATE SET kind = "
                "excluded.kind, base_url = excluded.base_url, repo = excluded.repo, token = '', "
                "sealed = excluded.sealed, set_by = excluded.set_by, set_at = excluded.set_at",
                (project, kind, url, named, self._seal(project, token), by, time.time()),
            )

        await self._state.write(upsert)
        forge = self.of(project)
        assert forge is not None
        return forge

    def pull_request(self, session_id: str) -> PullRequest | None:
        row = self.db.execute(
            "SELECT * FROM pull_requests WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            return None
        return PullRequest(row["session_id"], row["project"], row["number"], row["url"])

    def may_press(self, session_id: str, principal: Principal) -> bool:
        """Whether ``principal`` takes part in the conversation (or is the owner)."""
        if principal.is_owner:
            return True
        row = self.db.execute(
            "SELECT 1 FROM sessions WHERE id = ? AND principal_id = ? UNION ALL "
            "SELECT 1 FROM executions WHERE session_id = ? AND submitted_by = ? LIMIT 1",
            (session_id, principal.id, session_id, principal.id),
        ).fetchone()
        return row is not None

    async def open_or_update(
        self,
        session_id: str,
        principal: Principal,
        *,
        branch: str,
        title: str,
        body: str,
    ) -> tuple[PullRequest, bool]:
        """The conversation's pull request, opened or updated; whether it was opened now.

        Raises:
            NotFound: no such conversation, or it works in no project.
            Forbidden: ``principal`` takes no part in the conversation.
            InvalidArgument: the project has no forge.
            ForgeUnavailable: the forge refused or could not be reached.
        """
        row = self.db.execute("SELECT project FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None or row["project"] is None:
            raise NotFound("this conversation works in no project")
        if not self.may_press(session_id, principal):
            raise Forbidden("only the conversation's participants and the owner may do this")
        project = self._projects.get(row["project"])
        forge = self.of(project.name)
        if forge is None:
            raise InvalidArgument(
                f"project {project.name!r} has no forge; see amux project forge",
                project=project.name,
            )
        title = " ".join(title.split())[:TITLE_CHARS] or branch
        body = body[:BODY_CHARS]
        async with self._lock:
            known = self.pull_request(session_id)
            client = _Client(forge, self._seconds)
            if known is not None:
                number, url = await client.update(known.number, title, body)
                opened = False
            else:
                number, url, opened = await client.open(branch, project.default_branch, title, body)
            now = time.time()

            def record(db: sqlite3.Connection) -> None:
                db.execute(
                    "INSERT INTO pull_requests (session_id, project, number, url, opened_by, "
                    "opened_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) "
                    "DO UPDATE SET number = excluded.number, url = excluded.url, "
                    "updated_at = excluded.updated_at",
                    (session_id, project.name, number, url, principal.id, now, now),
                )

            await self._state.write(record)
        return PullRequest(session_id, project.name, number, url), opened


class _Client:
    """GitHub's and GitLab's REST APIs, the few calls a pull request needs."""

    def __init__(self, forge: Forge, seconds: float) -> None:
        self._forge = forge
        self._seconds = seconds

    def _headers(self) -> dict[str, str]:
        if self._forge.kind == "gitlab":
            return {"PRIVATE-TOKEN": self._forge.token}
        return {
            "Authorization": f"Bearer {self._forge.token}",
            "Accept": "application/vnd.github+json",
        }

    def _pulls(self) -> str:
        forge = self._forge
        if forge.kind == "gitlab":
            return f"{forge.base_url}/api/v4/projects/{quote(forge.repo, safe='')}/merge_requests"
        return f"{forge.base_url}/repos/{forge.repo}/pulls"

    async def _call(
        self, method: str, url: str, body: dict[str, Any] | None = None, **params: str
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=self._seconds)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.request(
                    method, url, json=body, params=params or None, headers=self._headers()
                ) as response,
            ):
                text = await response.text()
                if response.status >= 400:
                    raise ForgeUnavailable(
                        f"the forge answered {response.status}: "
                        + _scrubbed(_reason(text), self._forge.token)
                    )
                try:
                    return await response.json(content_type=None)
                except ValueError:
                    raise ForgeUnavailable("the forge's answer is not JSON") from None
        except (aiohttp.ClientError, TimeoutError) as error:
            # The error's own words may hold the URL; never the token, which goes in a header.
            raise ForgeUnavailable(
                f"the forge at {self._forge.base_url} could not be reached: {type(error).__name__}"
            ) from None

    async def open(self, head: str, base: str, title: str, body: str) -> tuple[int, str, bool]:
        """The pull request's number and URL, and whether it is new (not one already open
        from ``head``, which is updated instead)."""
        if self._forge.kind == "gitlab":
            made = await self._call(
                "POST",
                self._pulls(),
                {"source_branch": head, "target_branch": base, "title": title, "description": body},
            )
            return (*_numbered(made, "iid", "web_url"), True)
        owner = self._forge.repo.split("/", 1)[0]
        found = await self._call("GET", self._pulls(), head=f"{owner}:{head}", state="open")
        if isinstance(found, list) and found:
            number, _ = _numbered(found[0], "number", "html_url")
            return (*await self.update(number, title, body), False)
        made = await self._call(
            "POST", self._pulls(), {"head": head, "base": base, "title": title, "body": body}
        )
        return (*_numbered(made, "number", "html_url"), True)

    async def update(self, number: int, title: str, body: str) -> tuple[int, str]:
        if self._forge.kind == "gitlab":
            changed = await self._call(
                "PUT", f"{self._pulls()}/{number}", {"title": title, "description": body}
            )
            return _numbered(changed, "iid", "web_url")
        changed = await self._call(
            "PATCH", f"{self._pulls()}/{number}", {"title": title, "body": body}
        )
        return _numbered(changed, "number", "html_url")


def _reason(text: str) -> str:
    return " ".join(text.split())[:200] or "no reason given"


def _numbered(answer: Any, number: str, url: str) -> tuple[int, str]:
    if not isinstance(answer, dict):
        raise ForgeUnavailable("the forge's answer names no pull request")
    got, link = answer.get(number), answer.get(url)
    if not isinstance(got, int) or not isinstance(link, str) or not link.startswith("http"):
        raise ForgeUnavailable("the forge's answer names no pull request")
    return got, link
