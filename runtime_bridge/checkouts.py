"""A project's repository and its conversations' checkouts on a worker's host: pure git work.

Layout, under ``<work_dir>/projects/<name>/``:

    repo.git/            a remote project's bare clone (a path project uses the operator's repo)
    base.git/            the default branch's objects alone, fetched from the project repository:
                         what every checkout of the project borrows
    checkouts/<key>/     one conversation's checkout, its own clone on branch ``amux/<key>``
                         borrowing ``base.git``'s objects, owned by the Agent's uid
    saved/<key>.config   the worker's copy of that checkout's ``.git/config`` (and ``.alternates``)
    used/<key>           when the worker last used that checkout (seconds since the epoch)
    saved/<key>.unpushed the conversation's branch could not be pushed (a remote project)
    incoming/<origin>/   the chat's files sent with a conversation's first message, until the
                         worker moves them into its checkout's ``inbox/`` (see ``incoming_path``)

The project repository holds every conversation's branch, so no checkout borrows its objects:
one conversation's Agent would read what another committed (bound private chats are different
people). Each checkout borrows, through alternates, only ``base.git``: the default branch's
objects, which the worker fetches there and nothing else. What a conversation adds stays in its
checkout's own objects (a checkout made again from its branch fetches that branch alone). The
sandbox binds ``base.git``'s objects read-only, so an Agent reads the default branch's history
and changes none of it, and another conversation's checkout is not in its sandbox at all. Only
the worker writes the project repository: after each turn it commits what the Agent left and
fetches ``amux/<key>`` (that ref only) from the checkout; a remote project's worker then pushes
that branch to the remote, where another worker finds it when the conversation moves there.

A checkout is the Agent's: its ``.git`` may name programs (``core.fsmonitor``, hooks, filter and
diff drivers, includes) or point git at another repository (``commondir``, a ``.git`` file). So
before any git command of its own there the worker puts back its own copy of ``.git/config``,
the alternates and ``HEAD``, drops ``commondir``, and runs git with hooks and fsmonitor off, no
system or global config, an empty HOME and, on a root worker, as the Agent's uid (never root).

What a checkout holds costs what git spends reading it: a sparse file of gigabytes costs the
Agent no disk. So after a turn every git process of the worker's runs within ``GitBounds`` (a
cgroup of the launch's bounds, a deadline per step, killed with what it started past it), a file
too large to commit is left out of the commit, and the summary reads no file over its bound
(``runtime_bridge.branch_summary``).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hub.contract import BRANCH_DIFF_MAX, BranchWork, ProjectSource
from hub.errors import InvalidArgument, Unavailable
from runtime_bridge.branch_summary import (
    COMMIT_FILE_MAX,
    DIFF_FILE_MAX,
    NO_OBJECT,
    Oversized,
    RawListing,
    Tokens,
    bounded_diff,
    changed_files,
    diff_notes,
    not_committed,
    numstat_counts,
    object_sizes,
    plan_diff,
)
from runtime_bridge.providers.confined import Owner, open_dir, open_root, remove_entry, write_file
from runtime_bridge.providers.process import user_switch

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

SHORT_ID_LENGTH = 12
BRANCH_PREFIX = "amux/"
AGENT_NAME = "amux Agent"
AGENT_EMAIL = "agent@amux.invalid"
# The user name a remote's token goes with in HTTP basic authentication.
TOKEN_USER = "x-access-token"
GIT_TIMEOUT_SECONDS = 600.0
# The chat's files in and out of a conversation (the bot's ``inbox/`` and ``outbox/`` in its
# working directory) are not the project's changes: never committed to its branch.
CHAT_FILES = b"/inbox/\n/outbox/\n"
INBOX = "inbox"
DAY_SECONDS = 86400.0
PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
HEX_ID = re.compile(r"[0-9a-f]{16,}")
# Options on every git command the worker runs: nothing a repository's config names runs.
SAFE_OPTIONS = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "commit.gpgSign=false",
    "-c",
    "protocol.ext.allow=never",
)
# On the worker's git work after a turn: no file over the diff's bound is read whole, by git
# add (it streams such a file into a pack), pack-objects (no delta) or diff (binary).
BOUNDED_OPTIONS = ("-c", f"core.bigFileThreshold={DIFF_FILE_MAX}")
# Wall-clock time for committing and publishing a turn's changes, and for summing up its branch.
KEEP_SECONDS = 300.0
SUMMARY_SECONDS = 60.0
_CHUNK = 64 * 1024


class GitTimedOut(Unavailable):
    """A bounded git step ran past its time and was killed."""


class SummaryCut(Unavailable):
    """The branch's summary could not be made within its time; the branch holds the changes."""


@dataclass(frozen=True)
class GitBounds:
    """How the worker's own git work after a turn is bounded. ``confine`` is the command prefix
    every such git process starts under: it joins a control group with the launch's bounds
    (memory, tasks, CPU) and sets its rlimits, as root, before any switch to the Agent's uid.
    Committing and publishing get ``keep_seconds``, the summary ``summary_seconds``: past them
    git is killed."""

    confine: tuple[str, ...] = ()
    keep_seconds: float = KEEP_SECONDS
    summary_seconds: float = SUMMARY_SECONDS


class _Limit:
    """One bounded step: its confinement and its deadline."""

    def __init__(self, confine: tuple[str, ...], seconds: float) -> None:
        self.confine = confine
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def remaining(self, args: Sequence[str]) -> float:
        """Raises: GitTimedOut: no time is left for ``args``."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.expired(args)
        return left

    def expired(self, args: Sequence[str]) -> GitTimedOut:
        return GitTimedOut(f"git {_command(args)} took longer than {self.seconds:g} s")


def short_id(session_id: str) -> str:
    """A conversation's key in paths and its branch name: a prefix of its Session id (a hash's,
    for an id that is not hex), stable and long enough that two conversations never share one."""
    if HEX_ID.fullmatch(session_id):
        return session_id[:SHORT_ID_LENGTH]
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:SHORT_ID_LENGTH]


def branch_of(session_id: str) -> str:
    return BRANCH_PREFIX + short_id(session_id)


def check_project_name(name: str) -> None:
    """Raises: InvalidArgument: ``name`` cannot name a directory of the worker's."""
    if not PROJECT_NAME.fullmatch(name) or name in (".", ".."):
        raise InvalidArgument(f"{name!r} is not a project name")


@dataclass(frozen=True)
class Checkout:
    """One conversation's checkout, as a launch and the end of its turn need it."""

    project: ProjectSource
    key: str
    path: Path
    repository: Path  # the project repository's git directory (written only by the worker)
    # What the checkout borrows, read-only in the sandbox: the default branch's objects alone
    # (``base.git``), never the project repository's, which hold every conversation's.
    objects: Path

    @property
    def branch(self) -> str:
        return BRANCH_PREFIX + self.key


# The command prefix a worker's git command in a checkout runs under, given the checkout, the
# objects it borrows and the Agent's uid: a sandbox showing only those two (see
# ``LaunchSite.git_sandbox``), so no link the Agent left there leads git anywhere else.
Jail = Callable[[Path, Path, Owner], tuple[str, ...]]


class Projects:
    """The projects of one worker's work dir. ``env`` is the worker's own environment, where a
    remote's credential is read (never a launch's). Without a ``jail`` (the sandbox off) git in
    a checkout runs as the Agent's uid directly."""

    def __init__(self, work_dir: Path, env: Mapping[str, str], jail: Jail | None = None) -> None:
        self.root = work_dir / "projects"
        self.env = env
        self.jail = jail

    def project_dir(self, name: str) -> Path:
        check_project_name(name)
        return self.root / name

    def checkout_path(self, name: str, session_id: str) -> Path:
        """Where a conversation's checkout is (or will be), without making anything."""
        return self.project_dir(name) / "checkouts" / short_id(session_id)

    def incoming_path(self, name: str, origin: str) -> Path:
        """Where the chat's files sent with a conversation's first message wait for its
        checkout: before that message is queued the conversation has no Session, so no
        checkout. Keyed by the conversation's origin (its chat topic, a new one after New
        conversation), which its Session keeps; the worker moves them in (``prepare``)."""
        digest = hashlib.sha256(origin.encode("utf-8")).hexdigest()[:32]
        return self.project_dir(name) / "incoming" / digest

    # -- the project repository -------------------------------------------------------------

    def _env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        home = self.root / ".home"
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o755)
        return {
            "PATH": self.env.get("PATH", os.defpath),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "/bin/false",
            "GIT_AUTHOR_NAME": AGENT_NAME,
            "GIT_AUTHOR_EMAIL": AGENT_EMAIL,
            "GIT_COMMITTER_NAME": AGENT_NAME,
            "GIT_COMMITTER_EMAIL": AGENT_EMAIL,
            **(env or {}),
        }

    def _argv(
        self,
        args: Sequence[str],
        owner: Owner,
        prefix: tuple[str, ...],
        limit: _Limit | None,
    ) -> tuple[list[str], Owner]:
        """The command line, and the uid subprocess must switch to (None: the command does)."""
        as_other = owner is not None and os.geteuid() == 0 and not prefix
        front: tuple[str, ...] = ()
        options: tuple[str, ...] = SAFE_OPTIONS
        if limit is not None:
            options = (*SAFE_OPTIONS, *BOUNDED_OPTIONS)
            front = limit.confine
            if front and as_other and owner is not None:
                # Joining the control group takes root: the uid changes after it, not before.
                setpriv = shutil.which("setpriv")
                if setpriv is None:
                    raise Unavailable("setpriv is needed to run git as the Agent's user")
                front = (*front, *user_switch(setpriv, *owner))
                as_other = False
        return [*front, *prefix, "git", *options, *args], owner if as_other else None

    def _git(
        self,
        args: Sequence[str],
        *,
        cwd: Path | None = None,
        owner: Owner = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        prefix: tuple[str, ...] = (),
        input: str | None = None,
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
        limit: _Limit | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run git with nothing of the user's or system's config, hooks or fsmonitor; under
        ``prefix`` (a jail, which switches to the Agent's uid itself) or on a root worker as
        ``owner`` when given; with ``limit``, confined and killed at its deadline
        (``GitTimedOut``). ``stdin`` and ``stdout`` are files the worker opened: the process
        reads or writes them whatever its uid may open. A failure is ``Unavailable`` with git's
        own words."""
        argv, switch = self._argv(args, owner, prefix, limit)
        timeout = limit.remaining(args) if limit is not None else GIT_TIMEOUT_SECONDS
        # A process group of its own: on timeout git goes with whatever it started (a
        # transport, upload-pack), which would otherwise hold its output open.
        with subprocess.Popen(
            argv,
            cwd=cwd,
            env=self._env(env),
            stdin=subprocess.PIPE if input is not None else stdin,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            user=switch[0] if switch else None,
            group=switch[1] if switch else None,
            extra_groups=[] if switch else None,
        ) as process:
            try:
                out, err = process.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired as error:
                _kill_group(process)
                process.communicate()
                if limit is not None:
                    raise limit.expired(args) from error
                raise Unavailable(f"git {_command(args)} took too long") from error
        done = subprocess.CompletedProcess(argv, process.returncode, out or "", err or "")
        if check and done.returncode != 0:
            raise _failed(args, done.returncode, done.stderr)
        return done

    def _stream(
        self,
        args: Sequence[str],
        consume: Callable[[bytes], bool],
        limit: _Limit,
        *,
        cwd: Path | None = None,
        owner: Owner = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        """Run git under ``limit``, handing what it writes to ``consume`` as it comes, so no
        more of it is held than ``consume`` keeps; git is stopped once ``consume`` says False.

        Raises:
            GitTimedOut: the deadline passed (git was killed); ``consume`` has had what came.
            Unavailable: git failed.
        """
        argv, switch = self._argv(args, owner, prefix, limit)
        expired = threading.Event()
        with (
            tempfile.TemporaryFile() as stderr,
            subprocess.Popen(
                argv,
                cwd=cwd,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
                user=switch[0] if switch else None,
                group=switch[1] if switch else None,
                extra_groups=[] if switch else None,
            ) as process,
        ):
            output = process.stdout
            assert isinstance(output, io.BufferedReader)

            def kill() -> None:
                expired.set()
                _kill_group(process)

            timer = threading.Timer(limit.remaining(args), kill)
            timer.start()
            stopped = False
            try:
                while chunk := output.read1(_CHUNK):
                    if not consume(chunk):
                        stopped = True
                        _kill_group(process)
                        break
                status = process.wait()
            finally:
                timer.cancel()
            if expired.is_set():
                raise limit.expired(args)
            if status != 0 and not stopped:
                stderr.seek(0)
                raise _failed(args, status, stderr.read(4096).decode("utf-8", "replace"))

    def _credential_env(self, source: ProjectSource) -> dict[str, str]:
        """The remote's token for this git process only: an HTTP header through the process
        environment, never argv, a URL or a file."""
        if source.kind != "remote" or not source.credential_env:
            return {}
        token = self.env.get(source.credential_env)
        if not token:
            raise InvalidArgument(
                f"the project {source.name}'s credential variable {source.credential_env} is "
                "not set in the worker's environment"
            )
        basic = base64.b64encode(f"{TOKEN_USER}:{token}".encode()).decode("ascii")
        return {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
        }

    def repository(
        self,
        source: ProjectSource,
        warnings: list[str],
        refresh: bool = True,
        branch: str | None = None,
    ) -> tuple[Path, Path]:
        """The project repository's git directory and objects directory, a remote one cloned
        (once) or, with ``refresh``, fetched first: its default branch, and ``branch`` (a
        conversation's, where a worker that ran its earlier turns pushed it) as
        ``refs/remotes/origin/<branch>`` when the remote has it (see ``_take_remote_branch``).
        A failed fetch is a warning when a copy exists.

        Raises:
            InvalidArgument: the path is not a git repository here, or the credential is unset.
            Unavailable: the remote cannot be cloned.
        """
        if source.kind == "path":
            path = Path(source.source)
            if not path.is_absolute() or not path.is_dir():
                raise InvalidArgument(
                    f"the project {source.name}'s repository {source.source} does not exist on "
                    "this worker's host"
                )
            found = self._git(
                [
                    "-c",
                    "safe.directory=*",
                    "rev-parse",
                    "--path-format=absolute",
                    "--git-common-dir",
                ],
                cwd=path,
                check=False,
            )
            if found.returncode != 0:
                raise InvalidArgument(
                    f"the project {source.name}'s path {source.source} is not a git repository"
                )
            git_dir = Path(found.stdout.strip())
            return git_dir, git_dir / "objects"
        if "://" in source.source and "@" in source.source.split("://", 1)[1].split("/", 1)[0]:
            raise InvalidArgument("a project's remote URL must not carry credentials")
        git_dir = self.project_dir(source.name) / "repo.git"
        auth = self._credential_env(source)
        if not (git_dir / "HEAD").is_file():
            partial = git_dir.with_name(f".repo.{os.getpid()}.git")
            shutil.rmtree(partial, ignore_errors=True)
            git_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._git(
                    ["clone", "--bare", "--quiet", "--", source.source, str(partial)], env=auth
                )
            except Unavailable as error:
                shutil.rmtree(partial, ignore_errors=True)
                raise Unavailable(
                    f"the project {source.name}'s remote cannot be cloned ({error.message})"
                ) from error
            os.replace(partial, git_dir)
        elif refresh:
            refs = [f"+refs/heads/{source.default_branch}:refs/heads/{source.default_branch}"]
            if branch is not None:
                # A pattern: a branch the remote lacks (a new conversation's) is no error.
                refs.append(f"+refs/heads/{branch}*:refs/remotes/origin/{branch}*")
            fetched = self._git(
                ["--git-dir", str(git_dir), "fetch", "--quiet", "--no-tags", "origin", *refs],
                env=auth,
                check=False,
            )
            if fetched.returncode != 0:
                warnings.append(
                    f"the project {source.name}'s remote could not be fetched; this "
                    "conversation starts from the copy fetched before"
                )
        return git_dir, git_dir / "objects"

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """One worker process at a time on a project's repository (clone, fetch, publish)."""
        directory = self.project_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- a conversation's checkout ----------------------------------------------------------

    def prepare(
        self,
        source: ProjectSource,
        session_id: str,
        owner: Owner,
        warnings: list[str],
        moved_from: str | None = None,
        origin: str | None = None,
    ) -> Checkout:
        """The conversation's checkout, ready for a turn: made on ``amux/<key>`` from the
        default branch (or from its branch, when it was pruned), else restored to the worker's
        config. Checkouts of the project unused for its ``worktree_days`` are removed first; a
        remote project is fetched (its default branch and the conversation's) before a
        checkout is made, not before every turn.

        ``moved_from`` names the worker the conversation comes from (the Hub found it gone):
        any checkout of it here is older than its branch, so it is made again from the branch.
        Files the chat sent for the conversation before it had a checkout (by its ``origin``)
        are moved into the checkout's ``inbox/``.

        Raises:
            InvalidArgument, Unavailable: the repository cannot be had, or git refused.
        """
        key = short_id(session_id)
        directory = self.project_dir(source.name)
        with self._locked(source.name):
            self._ready_directories(directory, owner)
            path = directory / "checkouts" / key
            fresh = moved_from is not None or not self._sound(source, key, path)
            repository, _ = self.repository(
                source, warnings, refresh=fresh, branch=BRANCH_PREFIX + key
            )
            self.prune(source, keep=key)
            objects = self._base(source, repository, refresh=fresh)
            checkout = Checkout(source, key, path, repository, objects)
            if fresh:
                if source.kind == "remote":
                    self._take_remote_branch(checkout, warnings)
                if moved_from is not None and not self._has_branch(repository, checkout.branch):
                    warnings.append(
                        f"this conversation's branch {checkout.branch} is not in the project "
                        f"{source.name}'s repository on this worker (its checkout was on worker "
                        f"{moved_from}); this turn starts again from {source.default_branch}"
                    )
                kept = self._set_inbox_aside(checkout)
                self._create(checkout, owner)
                self._restore(checkout, owner)
                self._take_incoming(checkout, kept, owner)
            else:
                self._restore(checkout, owner)
            if origin is not None:
                staged = self.incoming_path(source.name, origin)
                self._take_incoming(checkout, staged, owner)
            self._record_use(checkout)
        return checkout

    def _base(self, source: ProjectSource, repository: Path, refresh: bool) -> Path:
        """The objects directory of the project's ``base.git`` (made once), with ``refresh``
        first brought up to the repository's default branch: a fetch of that branch alone,
        so it never holds a conversation's objects. Nothing in it is ever pruned (no gc):
        checkouts borrow its objects, and a default branch moved back must not take from
        them what their history still names."""
        base = self.project_dir(source.name) / "base.git"
        if not (base / "HEAD").is_file():
            partial = base.with_name(f".base.{os.getpid()}.git")
            shutil.rmtree(partial, ignore_errors=True)
            # Readable by every Agent uid, whatever the worker's umask: each borrows from it.
            self._git(["init", "--quiet", "--bare", "--shared=0644", str(partial)])
            for name, value in (("gc.auto", "0"), ("maintenance.auto", "false")):
                self._git(["--git-dir", str(partial), "config", name, value])
            partial.chmod(0o755)
            os.replace(partial, base)
            refresh = True
        ref = f"refs/heads/{source.default_branch}"
        if refresh and self._has_ref(repository, ref):
            self._git(
                [
                    "--git-dir",
                    str(base),
                    "fetch",
                    "--quiet",
                    "--no-tags",
                    "--no-write-fetch-head",
                    "--upload-pack",
                    _upload_pack(),
                    str(repository),
                    f"+{ref}:{ref}",
                ]
            )
        return base / "objects"

    def _set_inbox_aside(self, checkout: Checkout) -> Path:
        """Keep the chat's files of a checkout about to be made again (pruned, or left by a
        worker that had the conversation before): the bot saves a later message's files at
        the checkout's path whether or not it is there. Whatever stands at ``inbox`` is moved,
        not followed; ``_take_incoming`` keeps it only if it is a directory."""
        kept = self.project_dir(checkout.project.name) / "incoming" / f".kept-{checkout.key}"
        shutil.rmtree(kept, ignore_errors=True)
        try:
            fd = os.open(checkout.path, _DIR)
        except OSError:
            return kept
        try:
            kept.mkdir(parents=True, mode=0o700)
            into = os.open(kept, _DIR)
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.rename(INBOX, INBOX, src_dir_fd=fd, dst_dir_fd=into)
            finally:
                os.close(into)
        finally:
            os.close(fd)
        return kept

    def _take_incoming(self, checkout: Checkout, staged: Path, owner: Owner) -> None:
        """Move what waits in ``staged`` (``inbox/<message>/`` entries, saved as the Agent's
        uid) into the checkout's ``inbox/``, at the same paths the prompt names. Nothing in
        the checkout is followed: an entry of the Agent's in the way is removed, not written
        through."""
        try:
            source = os.open(staged / INBOX, _DIR)
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)
            return
        grant = owner if os.geteuid() == 0 else None
        try:
            with open_root(checkout.path) as root, open_dir(root, Path(INBOX), grant) as inbox:
                for name in os.listdir(source):
                    remove_entry(inbox, name)
                    os.rename(name, name, src_dir_fd=source, dst_dir_fd=inbox)
        finally:
            os.close(source)
            shutil.rmtree(staged, ignore_errors=True)

    def _take_remote_branch(self, checkout: Checkout, warnings: list[str]) -> None:
        """Move the conversation's branch here up to the remote's copy when that one is ahead
        (another worker ran its later turns). A copy here that is ahead (its push failed) is
        kept; one that went another way than the remote's is kept too, and said."""
        repo = ["-c", "safe.directory=*", "--git-dir", str(checkout.repository)]
        local, remote = f"refs/heads/{checkout.branch}", f"refs/remotes/origin/{checkout.branch}"
        if not self._has_ref(checkout.repository, remote):
            return
        if self._has_branch(checkout.repository, checkout.branch):
            ahead = self._git([*repo, "merge-base", "--is-ancestor", local, remote], check=False)
            if ahead.returncode != 0:
                behind = self._git(
                    [*repo, "merge-base", "--is-ancestor", remote, local], check=False
                )
                if behind.returncode != 0:
                    warnings.append(
                        f"this conversation's branch {checkout.branch} on the project "
                        f"{checkout.project.name}'s remote went another way than this worker's "
                        "copy; this turn continues from this worker's copy"
                    )
                return
        self._git([*repo, "update-ref", local, remote])

    def _ready_directories(self, directory: Path, owner: Owner) -> None:
        for path in (
            self.root,
            directory,
            directory / "checkouts",
            directory / "saved",
            directory / "used",
        ):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if owner is not None and os.geteuid() == 0:
            # An Agent's uid passes through to its own checkout and reads the objects it
            # borrows; it lists nothing here.
            for path in (self.root, directory, directory / "checkouts"):
                path.chmod(0o711)

    def _sound(self, source: ProjectSource, key: str, path: Path) -> bool:
        """Whether the checkout at ``path`` is one the worker made: a directory whose ``.git``
        is a directory (a link or a ``.git`` file could send git to another repository)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            info = os.stat(".git", dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        finally:
            os.close(fd)
        saved = self.project_dir(source.name) / "saved" / f"{key}.config"
        if not (stat.S_ISDIR(info.st_mode) and saved.is_file()):
            return False
        # A checkout that borrows anything but the default branch's objects (one made when
        # checkouts borrowed the whole project repository) is made again from its branch.
        base = self.project_dir(source.name) / "base.git" / "objects"
        alternates = saved.with_name(f"{key}.alternates")
        try:
            return alternates.read_bytes().strip() == os.fsencode(base)
        except OSError:
            return False

    def _saved(self, checkout: Checkout, what: str) -> Path:
        return self.project_dir(checkout.project.name) / "saved" / f"{checkout.key}.{what}"

    def _has_branch(self, repository: Path, branch: str) -> bool:
        return self._has_ref(repository, f"refs/heads/{branch}")

    def _has_ref(self, repository: Path, ref: str) -> bool:
        found = self._git(
            [
                "-c",
                "safe.directory=*",
                "--git-dir",
                str(repository),
                "rev-parse",
                "--verify",
                "--quiet",
                f"{ref}^{{commit}}",
            ],
            check=False,
        )
        return found.returncode == 0

    def _create(self, checkout: Checkout, owner: Owner) -> None:
        """Clone the checkout afresh as the worker, save its config, then hand it to the
        Agent's uid (nobody else has reached it yet, so nothing in it is followed)."""
        shutil.rmtree(checkout.path, ignore_errors=True)
        branch = checkout.branch
        base = checkout.project.default_branch
        resumed = self._has_branch(checkout.repository, branch)
        start = branch if resumed else base
        if not resumed and not self._has_branch(checkout.repository, base):
            raise InvalidArgument(
                f"the project {checkout.project.name} has no branch {base!r} to start from"
            )
        # Through the transport (never hard links or the repository's objects directory as
        # alternates), the one branch: the checkout gets what that branch holds beyond the
        # default branch's objects it borrows, and nothing of another conversation's.
        self._git(
            [
                "-c",
                "safe.directory=*",
                "clone",
                "--quiet",
                "--no-local",
                "--single-branch",
                "--no-tags",
                "--reference",
                str(checkout.objects.parent),
                "--upload-pack",
                _upload_pack(),
                "--branch",
                start,
                "--",
                str(checkout.repository),
                str(checkout.path),
            ]
        )
        git_dir = checkout.path / ".git"
        if not resumed:
            self._git(
                [
                    "--git-dir",
                    str(git_dir),
                    "--work-tree",
                    str(checkout.path),
                    "switch",
                    "--quiet",
                    "-c",
                    branch,
                ],
                cwd=checkout.path,
            )
        # The checkout never reaches back into the project repository by a remote.
        self._git(["--git-dir", str(git_dir), "remote", "remove", "origin"])
        self._saved(checkout, "config").write_bytes((git_dir / "config").read_bytes())
        alternates = git_dir / "objects" / "info" / "alternates"
        self._saved(checkout, "alternates").write_bytes(alternates.read_bytes())
        if owner is not None and os.geteuid() == 0:
            for path in (checkout.path, *checkout.path.rglob("*")):
                os.lchown(path, *owner)

    def _restore(self, checkout: Checkout, owner: Owner) -> None:
        """Put back the worker's own ``.git/config``, alternates and ``HEAD`` and drop what
        would send git elsewhere, each written without following anything the Agent left."""
        grant = owner if os.geteuid() == 0 else None
        with open_root(checkout.path) as root, open_dir(root, Path(".git"), grant) as git_fd:
            config = self._saved(checkout, "config").read_bytes()
            write_file(git_fd, "config", config, 0o644, grant)
            write_file(
                git_fd, "HEAD", f"ref: refs/heads/{checkout.branch}\n".encode(), 0o644, grant
            )
            for name in ("commondir", "config.worktree"):
                remove_entry(git_fd, name)
            with open_dir(git_fd, Path("objects") / "info", grant) as info:
                alternates = self._saved(checkout, "alternates").read_bytes()
                write_file(info, "alternates", alternates, 0o644, grant)
            with open_dir(git_fd, Path("info"), grant) as info:
                write_file(info, "exclude", CHAT_FILES, 0o644, grant)

    def _record_use(self, checkout: Checkout) -> None:
        record = self.project_dir(checkout.project.name) / "used" / checkout.key
        partial = record.with_name(f".{checkout.key}.{os.getpid()}")
        partial.write_text(f"{time.time():.3f}\n")
        os.replace(partial, record)

    def finish(
        self,
        checkout: Checkout,
        turn: str,
        owner: Owner,
        warnings: list[str],
        bounds: GitBounds | None = None,
    ) -> BranchWork:
        """After a turn: commit what the Agent left on its branch (as the Agent's uid, under the
        worker's config; a file over ``COMMIT_FILE_MAX`` is left out and named in
        ``warnings``), publish that branch alone into the project repository, and sum up what
        the branch changed against the default branch. Each git process runs within
        ``bounds``.

        Raises:
            GitTimedOut: committing or publishing ran past its time (nothing more was kept).
            SummaryCut: the summary ran past its time (the branch holds the changes).
            Unavailable: git failed.
        """
        bounds = bounds or GitBounds()
        with self._locked(checkout.project.name):
            sound = self._sound(checkout.project, checkout.key, checkout.path)
            if sound:
                keeping = _Limit(bounds.confine, bounds.keep_seconds)
                self._restore(checkout, owner)
                self._commit(checkout, turn, owner, keeping, warnings)
                self._publish(checkout, owner, keeping)
                if checkout.project.kind == "remote":
                    self._push(checkout, warnings, keeping)
            else:
                warnings.append(
                    "the Agent replaced its checkout's .git, so this turn's changes were not "
                    "kept; the next turn starts again from the conversation's branch"
                )
                shutil.rmtree(checkout.path, ignore_errors=True)
            self._record_use(checkout)
            summing = _Limit(bounds.confine, bounds.summary_seconds)
            try:
                return self.summary(checkout, owner, summing, in_checkout=sound)
            except GitTimedOut as error:
                raise SummaryCut(
                    f"the summary of this conversation's branch {checkout.branch} was cut short "
                    f"({error.message}); the branch holds this turn's changes"
                ) from error

    def _jail(self, checkout: Checkout, owner: Owner) -> tuple[str, ...]:
        return self.jail(checkout.path, checkout.objects, owner) if self.jail else ()

    def _in_checkout(
        self,
        checkout: Checkout,
        args: Sequence[str],
        owner: Owner,
        check: bool = True,
        input: str | None = None,
        stdin: IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
        limit: _Limit | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return self._git(
            self._checkout_args(checkout, args),
            cwd=checkout.path,
            owner=owner,
            check=check,
            prefix=self._jail(checkout, owner),
            input=input,
            stdin=stdin,
            stdout=stdout,
            limit=limit,
        )

    def _stream_in_checkout(
        self,
        checkout: Checkout,
        args: Sequence[str],
        owner: Owner,
        consume: Callable[[bytes], bool],
        limit: _Limit,
    ) -> None:
        self._stream(
            self._checkout_args(checkout, args),
            consume,
            limit,
            cwd=checkout.path,
            owner=owner,
            prefix=self._jail(checkout, owner),
        )

    @staticmethod
    def _checkout_args(checkout: Checkout, args: Sequence[str]) -> list[str]:
        git_dir = checkout.path / ".git"
        return ["--git-dir", str(git_dir), "--work-tree", str(checkout.path), *args]

    def _commit(
        self, checkout: Checkout, turn: str, owner: Owner, limit: _Limit, warnings: list[str]
    ) -> None:
        """Stage and commit everything the Agent left but files too large to commit: hashing a
        file costs its whole apparent size (a sparse ``truncate -s 3G`` file costs no disk),
        so those stay in the checkout, uncommitted, and the turn's result names them."""
        oversized = self._oversized(checkout, owner, limit)
        spec = b"".join(
            pathspec + b"\0"
            for pathspec in (b".", *(b":(exclude,literal)" + f.name for f in oversized))
        )
        with tempfile.TemporaryFile(dir=self.project_dir(checkout.project.name)) as paths:
            paths.write(spec)
            paths.seek(0)
            self._in_checkout(
                checkout,
                ["add", "--all", "--pathspec-from-file=-", "--pathspec-file-nul"],
                owner,
                stdin=paths,
                limit=limit,
            )
        said = not_committed(checkout.branch, oversized)
        if said is not None:
            warnings.append(said)
        staged = self._in_checkout(
            checkout, ["diff", "--cached", "--quiet"], owner, check=False, limit=limit
        )
        if staged.returncode != 0:
            message = f"amux: turn {turn}"
            self._in_checkout(
                checkout,
                ["commit", "--quiet", "--no-verify", "-m", message],
                owner,
                limit=limit,
            )

    def _oversized(self, checkout: Checkout, owner: Owner, limit: _Limit) -> list[Oversized]:
        """The files ``git add --all`` would hash (untracked and not ignored, or modified) whose
        apparent size is over ``COMMIT_FILE_MAX``. Git lists them, jailed; the worker only
        ``lstat``s what it lists, following no link at the end."""
        found: list[Oversized] = []
        tokens = Tokens()
        root = os.fsencode(checkout.path)

        def take(chunk: bytes) -> bool:
            for name in tokens.feed(chunk):
                if not name:
                    continue
                try:
                    info = os.lstat(os.path.join(root, name))
                except OSError:
                    continue  # Deleted, which is what a modified entry may be.
                if stat.S_ISREG(info.st_mode) and info.st_size > COMMIT_FILE_MAX:
                    found.append(Oversized(name, info.st_size))
            return True

        self._stream_in_checkout(
            checkout,
            ["ls-files", "-z", "--others", "--modified", "--exclude-standard"],
            owner,
            take,
            limit,
        )
        return found

    def _publish(self, checkout: Checkout, owner: Owner, limit: _Limit) -> None:
        """Bring the conversation's branch, and only it, into the project repository."""
        if os.geteuid() == 0:
            info = os.stat(checkout.repository)
            if info.st_uid != 0:
                # The operator's own repository (a path project's): what a root worker's git
                # wrote there would be root's, and the operator's git could no longer add to
                # the directories it made. It is written as its owner instead.
                self._publish_as(checkout, owner, (info.st_uid, info.st_gid), limit)
                return
        ref = f"refs/heads/{checkout.branch}"
        # A local fetch hands its other end none of its -c options: the checkout's side (a
        # repository of the Agent's uid) gets them, and is named safe, on its own command line.
        # Jailed like every other command there: the Agent's links lead nowhere.
        safe = f"safe.directory={checkout.path / '.git'}"
        upload_pack = shlex.join(
            [*self._jail(checkout, owner), "git", *SAFE_OPTIONS, "-c", safe, "upload-pack"]
        )
        self._git(
            [
                "-c",
                "safe.directory=*",
                "--git-dir",
                str(checkout.repository),
                "fetch",
                "--quiet",
                "--no-tags",
                "--no-write-fetch-head",
                "--upload-pack",
                upload_pack,
                str(checkout.path / ".git"),
                f"+{ref}:{ref}",
            ],
            limit=limit,
        )

    def _publish_as(
        self, checkout: Checkout, owner: Owner, keeper: tuple[int, int], limit: _Limit
    ) -> None:
        """Publish into a repository owned by ``keeper``: the checkout's new objects packed
        in its jail (as the Agent's uid) into a file of the worker's, then indexed into the
        repository and the branch moved, both as ``keeper``. Neither side can reach the
        other's files: each is handed the open file."""
        ref = f"refs/heads/{checkout.branch}"
        repo = ["-c", "safe.directory=*", "--git-dir", str(checkout.repository)]
        at = checkout.repository
        tip = self._in_checkout(
            checkout, ["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], owner, limit=limit
        ).stdout.strip()
        if not HEX_ID.fullmatch(tip):
            raise Unavailable(f"the checkout's branch {checkout.branch} names no commit")
        old = self._git(
            [*repo, "rev-parse", "--verify", "--quiet", ref], check=False, limit=limit
        )
        previous = old.stdout.strip() if old.returncode == 0 else ""
        if tip == previous:
            return
        there = self._git(
            [*repo, "cat-file", "-e", f"{tip}^{{commit}}"], check=False, limit=limit
        )
        if there.returncode != 0:
            # Only what the repository lacks: the pack may lean on what it has (thin).
            basis = [
                found.stdout.strip()
                for found in (
                    self._git(
                        [*repo, "rev-parse", "--verify", "--quiet", name],
                        check=False,
                        limit=limit,
                    )
                    for name in (ref, f"refs/heads/{checkout.project.default_branch}")
                )
                if found.returncode == 0 and found.stdout.strip()
            ]
            wanted = "".join(f"{line}\n" for line in [tip, *(f"^{b}" for b in basis)])
            directory = self.project_dir(checkout.project.name)
            with tempfile.TemporaryFile(dir=directory) as pack:
                self._in_checkout(
                    checkout,
                    ["pack-objects", "--stdout", "--revs", "--thin", "--quiet"],
                    owner,
                    input=wanted,
                    stdout=pack,
                    limit=limit,
                )
                pack.seek(0)
                self._git(
                    [*repo, "index-pack", "--stdin", "--fix-thin"],
                    cwd=at,
                    owner=keeper,
                    stdin=pack,
                    limit=limit,
                )
        self._git(
            [*repo, "update-ref", "-m", "amux: publish", ref, tip, previous],
            cwd=at,
            owner=keeper,
            limit=limit,
        )

    def _push(self, checkout: Checkout, warnings: list[str], limit: _Limit) -> None:
        """Push the conversation's branch from the worker's clone to the project's remote, so
        that it can be reviewed there and another worker can continue the conversation from it.
        Never forced: a branch someone else moved on the remote is not overwritten. A failure
        is said once, until a push succeeds again."""
        ref = f"refs/heads/{checkout.branch}"
        try:
            pushed = self._git(
                [
                    "--git-dir",
                    str(checkout.repository),
                    "push",
                    "--quiet",
                    "--no-verify",
                    "origin",
                    f"{ref}:{ref}",
                ],
                env=self._credential_env(checkout.project),
                check=False,
                limit=limit,
            )
            reason = None if pushed.returncode == 0 else _first_line(pushed.stderr)
        except GitTimedOut as error:
            reason = error.message
        marker = self._saved(checkout, "unpushed")
        if reason is None:
            marker.unlink(missing_ok=True)
            return
        if not marker.exists():
            marker.write_text(reason + "\n")
            warnings.append(
                f"this conversation's branch {checkout.branch} could not be pushed to the "
                f"project {checkout.project.name}'s remote ({reason}); it "
                "stays on this worker, and no other worker can continue this conversation"
            )

    def summary(
        self,
        checkout: Checkout,
        owner: Owner = None,
        limit: _Limit | None = None,
        in_checkout: bool = True,
    ) -> BranchWork:
        """What the conversation's branch holds against the default branch, within the budgets
        of ``branch_summary``: no file over its bound is read. Git runs in the checkout, jailed
        as the Agent's uid, against ``base.git``'s default branch, which the checkout borrows;
        a checkout that is gone (``in_checkout`` False) is summed up from the project
        repository instead, as the worker.

        Raises:
            GitTimedOut: git ran past ``limit`` before the files were known (a diff cut short
                by it is said in its notes instead).
            Unavailable: git failed.
        """
        limit = limit or _Limit((), SUMMARY_SECONDS)
        repo = ["-c", "safe.directory=*", "--git-dir", str(checkout.repository)]
        branch = f"refs/heads/{checkout.branch}"
        base = checkout.project.default_branch
        head = self._git(
            [*repo, "rev-parse", "--verify", "--quiet", branch], check=False, limit=limit
        )
        commit = head.stdout.strip() or None if head.returncode == 0 else None
        if commit is None:
            return BranchWork(
                checkout.project.name, checkout.branch, base, None, (), 0, None, False
            )
        run: Callable[[Sequence[str], str], subprocess.CompletedProcess[str]]
        stream: Callable[[Sequence[str], Callable[[bytes], bool]], None]
        if in_checkout:
            # The default branch's tip the checkout borrows (the worker's own repository).
            found = self._git(
                ["--git-dir", str(checkout.objects.parent), "rev-parse", "--verify", "--quiet",
                 f"refs/heads/{base}^{{commit}}"],
                limit=limit,
            )  # fmt: skip
            span = f"{found.stdout.strip()}...{branch}"

            def run(args: Sequence[str], input: str) -> subprocess.CompletedProcess[str]:
                return self._in_checkout(checkout, args, owner, input=input, limit=limit)

            def stream(args: Sequence[str], consume: Callable[[bytes], bool]) -> None:
                self._stream_in_checkout(checkout, args, owner, consume, limit)
        else:
            span = f"refs/heads/{base}...{branch}"

            def run(args: Sequence[str], input: str) -> subprocess.CompletedProcess[str]:
                return self._git([*repo, *args], input=input, limit=limit)

            def stream(args: Sequence[str], consume: Callable[[bytes], bool]) -> None:
                self._stream([*repo, *args], consume, limit)

        plain = ["--no-renames", "--no-ext-diff", "--no-textconv"]
        listing = RawListing()
        numstat = bytearray()
        stream(["diff", "--raw", "-z", "--abbrev=40", *plain, span], _feeding(listing.feed))
        oids = sorted({o for e in listing.entries for o in (e.old, e.new)} - {NO_OBJECT})
        batch = "".join(f"{oid}\n" for oid in oids)
        sizes = (
            object_sizes(
                run(["cat-file", "--batch-check=%(objectname) %(objectsize)"], batch).stdout
            )
            if oids
            else {}
        )
        plan = plan_diff(listing, sizes)
        counted = [os.fsdecode(e.name) for e in plan.listed if e.name not in plan.too_large]
        if counted:
            numstat_args = ["--literal-pathspecs", "diff", "--numstat", "-z", *plain, span]
            stream([*numstat_args, "--", *counted], _feeding(numstat.extend))
        diff: str | None = None
        truncated = False
        if plan.included:
            data = bytearray()

            def keep(chunk: bytes) -> bool:
                data.extend(chunk[: BRANCH_DIFF_MAX + 1 - len(data)])
                return len(data) <= BRANCH_DIFF_MAX

            cut_short = None
            try:
                stream(
                    ["--literal-pathspecs", "diff", "--no-color", *plain, span, "--",
                     *map(os.fsdecode, plan.included)],
                    keep,
                )  # fmt: skip
            except GitTimedOut as error:
                cut_short = error.message
            diff, cut = bounded_diff(bytes(data), diff_notes(plan, cut_short))
            truncated = cut or cut_short is not None or plan.left_out > 0
        return BranchWork(
            project=checkout.project.name,
            branch=checkout.branch,
            base=base,
            commit=commit,
            files=changed_files(plan, numstat_counts(bytes(numstat))),
            files_total=listing.total,
            diff=diff or None,
            diff_truncated=truncated,
        )

    # -- pruning ----------------------------------------------------------------------------

    def prune(
        self, source: ProjectSource, keep: str | None = None, now: float | None = None
    ) -> list[str]:
        """Remove the project's checkouts unused for ``worktree_days`` (their branches stay in
        the project repository); the keys removed."""
        directory = self.project_dir(source.name)
        used = directory / "used"
        limit = (time.time() if now is None else now) - source.worktree_days * DAY_SECONDS
        removed: list[str] = []
        # Files sent with a first message whose turn never ran (refused, cancelled) go too.
        incoming = directory / "incoming"
        for staged in sorted(incoming.iterdir()) if incoming.is_dir() else []:
            if staged.lstat().st_mtime < limit:
                shutil.rmtree(staged, ignore_errors=True)
        if not used.is_dir():
            return removed
        for record in sorted(used.iterdir()):
            key = record.name
            if key == keep or key.startswith("."):
                continue
            try:
                last = float(record.read_text().strip() or 0)
            except (OSError, ValueError):
                last = 0.0
            if last >= limit:
                continue
            shutil.rmtree(directory / "checkouts" / key, ignore_errors=True)
            for what in ("config", "alternates", "unpushed"):
                (directory / "saved" / f"{key}.{what}").unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            removed.append(key)
        return removed


def _upload_pack() -> str:
    """The repository's side of a local clone or fetch into a repository of the worker's: it
    gets none of the -c options (git clears them for it), so they are on its command line, and
    an operator's repository not owned by the worker is named safe there."""
    return shlex.join(["git", *SAFE_OPTIONS, "-c", "safe.directory=*", "upload-pack"])


def _first_line(stderr: str) -> str:
    """What git said first, for a warning."""
    said = [line.strip() for line in stderr.splitlines() if line.strip()]
    return said[0].removeprefix("fatal: ").removeprefix("error: ") if said else "no reason given"


def _command(args: Sequence[str]) -> str:
    """The git subcommand among ``args`` (past ``-c`` and ``--git-dir`` options), for errors."""
    words = iter(args)
    for word in words:
        if word in ("-c", "--git-dir", "--work-tree", "-C"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "command"


def _kill_group(process: subprocess.Popen[Any]) -> None:
    """Kill ``process`` and the process group it leads (it was started in a session of its
    own), unless it has been waited for already (its pid may be another's by then)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _failed(args: Sequence[str], status: int, stderr: str) -> Unavailable:
    said = [line for line in stderr.splitlines() if line.strip()]
    reason = said[0].removeprefix("fatal: ") if said else f"status {status}"
    return Unavailable(f"git {_command(args)} failed: {reason}")


def _feeding(feed: Callable[[bytes], object]) -> Callable[[bytes], bool]:
    """A consumer that takes all of git's output (``feed`` keeps only what it bounds)."""

    def consume(chunk: bytes) -> bool:
        feed(chunk)
        return True

    return consume
