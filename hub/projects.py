"""Projects: a git repository a chat's conversations check out, and the chats bound to one.

A project names its source (a repository on the worker's host by absolute path, or a remote
the worker clones once), its default branch, the Agent its conversations run and, optionally,
the permission policy they run under instead of ``agents.permissions``. Each project has a
service Principal of its own (``project:<name>``): a bound group's conversations are that
Principal's, so the group shares the project's memory and no member's own memory enters a
group turn. Removing a project keeps that Principal and its memory; adding a project of the
same name again finds them.

Everything is checked before anything is written: a bad name, a path that is not a git
repository, a remote that cannot be listed or that carries credentials in its URL, a missing
default branch. A remote's token never reaches the Hub: the project names a variable of the
worker's environment that holds it.

A chat is bound to at most one project; binding a bound chat is a conflict naming the project
(unbind first). A project chats are bound to cannot be removed: the refusal names the chats.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import posixpath
import re
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from hub.contract import DEFAULT_WORKTREE_DAYS, ProjectKind, ProjectSource, provider_name_problem
from hub.errors import Conflict, InvalidArgument, NotFound
from hub.principals import Principal
from hub.state import State
from hub.sysconfig import PERMISSION_POLICIES

PROJECT_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
# A branch as a project's default: plain ref-name characters, no ``..``, no leading dash.
BRANCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")
CREDENTIAL_ENV = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
REMOTE_SCHEMES = ("https", "http", "ssh", "git", "file")
GIT_SECONDS = 20.0
PRINCIPAL_PREFIX = "project:"
# A repository's own config can name programs git runs (fsmonitor, hooks): none of them run
# for a check the Hub makes, and no system config applies.
_GIT_SAFETY = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "protocol.ext.allow=never",
)
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "/bin/false",
    "SSH_ASKPASS": "/bin/false",
    "GIT_SSH_COMMAND": "ssh -o BatchMode=yes",
}


@dataclass(frozen=True)
class Project:
    """One project as the owner manages it."""

    name: str
    kind: ProjectKind
    source: str
    default_branch: str
    provider: str
    permissions: str | None
    credential_env: str | None
    principal_id: str
    created_at: float

    def source_for_worker(self, worktree_days: int = DEFAULT_WORKTREE_DAYS) -> ProjectSource:
        return ProjectSource(
            self.name,
            self.kind,
            self.source,
            self.default_branch,
            self.credential_env,
            worktree_days,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "default_branch": self.default_branch,
            "provider": self.provider,
            "permissions": self.permissions,
            "credential_env": self.credential_env,
            "principal_id": self.principal_id,
            "created_at": self.created_at,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Project:
        def text(name: str) -> str:
            value = wire.get(name)
            if not isinstance(value, str):
                raise InvalidArgument(f"malformed project: {name} is missing")
            return value

        def optional(name: str) -> str | None:
            value = wire.get(name)
            return value if isinstance(value, str) else None

        kind = text("kind")
        if kind not in ("path", "remote"):
            raise InvalidArgument(f"malformed project: unknown kind {kind!r}")
        created = wire.get("created_at")
        return cls(
            name=text("name"),
            kind="path" if kind == "path" else "remote",
            source=text("source"),
            default_branch=text("default_branch"),
            provider=text("provider"),
            permissions=optional("permissions"),
            credential_env=optional("credential_env"),
            principal_id=text("principal_id"),
            created_at=float(created) if isinstance(created, int | float) else 0.0,
        )


@dataclass(frozen=True)
class Binding:
    """A chat bound to a project."""

    chat_id: str
    project: str
    bound_by: str
    bound_at: float

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def _project(row: sqlite3.Row) -> Project:
    return Project(
        row["name"],
        "path" if row["kind"] == "path" else "remote",
        row["source"],
        row["default_branch"],
        row["provider"],
        row["permissions"],
        row["credential_env"],
        row["principal_id"],
        row["created_at"],
    )


def no_such_project(name: str) -> NotFound:
    return NotFound(f"no project named {name!r}; see amux project list", project=name)


def name_problem(name: str) -> str | None:
    if PROJECT_NAME.fullmatch(name):
        return None
    return f"{name!r} is not a project name: up to 32 of a-z, 0-9 and -, starting with a letter"


def branch_problem(branch: str) -> str | None:
    if (
        BRANCH_NAME.fullmatch(branch)
        and ".." not in branch
        and "//" not in branch
        and not branch.endswith((".lock", "/", "."))
    ):
        return None
    return f"{branch!r} is not a branch name git accepts here"


def remote_problem(url: str) -> str | None:
    """Why ``url`` cannot be a project's remote, in one line; None when it can."""
    try:
        parts = urlsplit(url)
        userinfo = parts.username is not None or parts.password is not None
    except ValueError:
        return f"{url!r} is not a URL"
    if parts.scheme not in REMOTE_SCHEMES or not (parts.netloc or parts.scheme == "file"):
        schemes = ", ".join(f"{s}://" for s in REMOTE_SCHEMES)
        return f"a remote is a URL starting with one of {schemes}"
    if userinfo:
        return (
            "the remote URL carries a user name or token; give the URL without it and name "
            "the worker's environment variable holding the token with --credential-env"
        )
    return None


async def git(*args: str, extra_env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run git with the safety options and a timeout; its exit status and its error output."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "LANG": "C",
        **_GIT_ENV,
        **(extra_env or {}),
    }
    process = await asyncio.create_subprocess_exec(
        "git",
        *_GIT_SAFETY,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), GIT_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return -1, f"git gave no answer within {GIT_SECONDS:.0f} s"
    return int(process.returncode or 0), err.decode("utf-8", "replace").strip()


def _credential_header(credential_env: str | None) -> dict[str, str]:
    """Git's configuration, through its environment (never its argv, which others can read),
    sending the token the Hub's own environment holds under ``credential_env``, if any: the
    Hub's in-process worker has the same environment."""
    if credential_env is None:
        return {}
    token = os.environ.get(credential_env)
    if not token:
        return {}
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode("ascii")
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }


async def check_path(path: str, branch: str) -> None:
    """Raises: InvalidArgument: ``path`` is no git repository holding ``branch``."""
    if not path.startswith("/"):
        raise InvalidArgument(f"{path!r} is not an absolute path")
    status, _ = await git("-C", path, "rev-parse", "--git-dir")
    if status != 0:
        raise InvalidArgument(f"{path} is not a git repository on the Hub's host")
    status, _ = await git(
        "-C", path, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"
    )
    if status != 0:
        raise InvalidArgument(f"the repository at {path} has no branch {branch!r}; see --branch")


async def check_remote(url: str, branch: str, credential_env: str | None) -> None:
    """Raises: InvalidArgument: ``url`` cannot be listed, or holds no ``branch``."""
    problem = remote_problem(url)
    if problem is not None:
        raise InvalidArgument(problem)
    status, err = await git(
        "ls-remote",
        "--exit-code",
        "--heads",
        url,
        f"refs/heads/{branch}",
        extra_env=_credential_header(credential_env),
    )
    if status == 2:
        raise InvalidArgument(f"the remote has no branch {branch!r}; see --branch")
    if status != 0:
        # git's own words, cut short: they name the host's answer, never a token we sent.
        reason = err.splitlines()[-1][:200] if err else "no answer"
        raise InvalidArgument(f"the remote cannot be listed: {reason}")


class Projects:
    """The projects and chat bindings in the Hub's state database."""

    def __init__(self, state: State, providers: tuple[str, ...] = ()) -> None:
        self._state = state
        self.db = state.db
        self._providers = providers

    def all(self) -> list[Project]:
        rows = self.db.execute("SELECT * FROM projects ORDER BY name").fetchall()
        return [_project(row) for row in rows]

    def get(self, name: str) -> Project:
        """Raises: NotFound: no such project."""
        row = self.db.execute("SELECT * FROM projects WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise no_such_project(name)
        return _project(row)

    def find(self, name: str) -> Project | None:
        row = self.db.execute("SELECT * FROM projects WHERE name = ?", (name,)).fetchone()
        return _project(row) if row is not None else None

    def chats(self, name: str) -> list[Binding]:
        rows = self.db.execute(
            "SELECT * FROM chat_projects WHERE project = ? ORDER BY bound_at", (name,)
        ).fetchall()
        return [Binding(r["chat_id"], r["project"], r["bound_by"], r["bound_at"]) for r in rows]

    def binding_of(self, chat_id: str) -> Project | None:
        """The project ``chat_id`` is bound to; None for an unbound chat."""
        row = self.db.execute(
            "SELECT p.* FROM chat_projects c JOIN projects p ON p.name = c.project "
            "WHERE c.chat_id = ?",
            (chat_id,),
        ).fetchone()
        return _project(row) if row is not None else None

    def of_principal(self, principal_id: str) -> Project | None:
        """The project whose service Principal ``principal_id`` is; None for anyone else."""
        row = self.db.execute(
            "SELECT * FROM projects WHERE principal_id = ?", (principal_id,)
        ).fetchone()
        return _project(row) if row is not None else None

    def principal_of(self, name: str) -> Principal:
        """The project's service Principal. Raises: NotFound: no such project."""
        principal = self._state.principal(self.get(name).principal_id)
        if principal is None:
            raise no_such_project(name)
        return principal

    async def add(
        self,
        name: str,
        *,
        by: str,
        path: str | None = None,
        remote: str | None = None,
        credential_env: str | None = None,
        branch: str = "main",
        provider: str = "claude",
        permissions: str | None = None,
    ) -> Project:
        """Check everything, then add the project and its service Principal in one commit.

        Raises:
            InvalidArgument: a bad name, source, branch, provider, policy or variable name.
            Conflict: a project of that name exists.
        """
        problem = name_problem(name) or branch_problem(branch) or provider_name_problem(provider)
        if problem is not None:
            raise InvalidArgument(problem)
        if self._providers and provider not in self._providers:
            raise InvalidArgument(
                f"unknown provider {provider!r}; accepted: {', '.join(self._providers)}"
            )
        if permissions is not None and permissions not in PERMISSION_POLICIES:
            raise InvalidArgument(f"permissions must be one of {', '.join(PERMISSION_POLICIES)}")
        if (path is None) == (remote is None):
            raise InvalidArgument("give the project's source: either a path or a remote")
        if credential_env is not None:
            if remote is None:
                raise InvalidArgument("a credential variable is for a remote, not a path")
            if not CREDENTIAL_ENV.fullmatch(credential_env) or credential_env.startswith("AMUX_"):
                raise InvalidArgument(
                    f"{credential_env!r} is not an environment variable name for a token: "
                    "A-Z, 0-9 and _, not starting with AMUX_"
                )
        if self.find(name) is not None:
            raise Conflict(f"a project named {name!r} already exists", project=name)
        if path is not None:
            source, kind = posixpath.normpath(path) if path.startswith("/") else path, "path"
            await check_path(source, branch)
        else:
            assert remote is not None
            source, kind = remote, "remote"
            await check_remote(remote, branch, credential_env)

        def insert(db: sqlite3.Connection) -> Project:
            if self.find(name) is not None:
                raise Conflict(f"a project named {name!r} already exists", project=name)
            principal = self._service_principal(name)
            now = time.time()
            db.execute(
                "INSERT INTO projects (name, kind, source, default_branch, provider, "
                "permissions, credential_env, principal_id, created_by, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    kind,
                    source,
                    branch,
                    provider,
                    permissions,
                    credential_env,
                    principal.id,
                    by,
                    now,
                ),
            )
            return self.get(name)

        project: Project = await self._state.write(insert)
        return project

    def _service_principal(self, name: str) -> Principal:
        principal_name = PRINCIPAL_PREFIX + name
        with contextlib.suppress(NotFound):
            existing = self._state.principal_by_name(principal_name)
            if existing.kind == "service":
                return existing
            raise Conflict(
                f"a person is named {principal_name!r}; rename them before adding this project"
            )
        return self._state.add_principal(principal_name, "service")

    async def remove(self, name: str) -> Project:
        """Raises: NotFound: no such project. Conflict: chats are bound to it (named)."""

        def delete(db: sqlite3.Connection) -> Project:
            project = self.get(name)
            bound = self.chats(name)
            if bound:
                chats = ", ".join(b.chat_id for b in bound)
                raise Conflict(
                    f"chats are bound to project {name!r}: {chats}; unbind them first",
                    project=name,
                    chats=[b.chat_id for b in bound],
                )
            db.execute("DELETE FROM projects WHERE name = ?", (name,))
            return project

        project: Project = await self._state.write(delete)
        return project

    async def bind(self, chat_id: str, name: str, by: str) -> Project:
        """Raises: NotFound: no such project. Conflict: the chat is bound already."""
        if not chat_id:
            raise InvalidArgument("no chat to bind")

        def insert(db: sqlite3.Connection) -> Project:
            project = self.get(name)
            current = self.binding_of(chat_id)
            if current is not None:
                raise Conflict(
                    f"this chat is bound to project {current.name!r}; unbind it first",
                    project=current.name,
                )
            db.execute(
                "INSERT INTO chat_projects (chat_id, project, bound_by, bound_at) "
                "VALUES (?, ?, ?, ?)",
                (chat_id, name, by, time.time()),
            )
            return project

        project: Project = await self._state.write(insert)
        return project

    async def unbind(self, chat_id: str, expected: str | None = None) -> Project:
        """Unbind the chat; with ``expected``, only from that project (what a card showed).

        Raises: NotFound: the chat is bound to no project. Conflict: it is bound to another
        project than ``expected``.
        """

        def delete(db: sqlite3.Connection) -> Project:
            current = self.binding_of(chat_id)
            if current is None:
                raise NotFound("this chat is bound to no project")
            if expected is not None and current.name != expected:
                raise Conflict(
                    f"this chat is bound to project {current.name!r}, not {expected!r}",
                    project=current.name,
                )
            db.execute("DELETE FROM chat_projects WHERE chat_id = ?", (chat_id,))
            return current

        project: Project = await self._state.write(delete)
        return project
