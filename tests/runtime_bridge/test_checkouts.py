"""A project's checkouts on a worker's host: one clone and branch per conversation, published
by the worker alone, summed up against the default branch, pruned, and never a way for an
Agent to make the worker run a program of its choosing.

Real git throughout; a remote project is served by ``git http-backend`` on loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from hub.contract import BRANCH_DIFF_MAX, ProjectSource
from hub.errors import InvalidArgument, Unavailable
from runtime_bridge.bounds import Bounds, GiB, MiB
from runtime_bridge.cgroups import LaunchGroup
from runtime_bridge.checkouts import GitBounds, Projects, SummaryCut, branch_of, short_id
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import LaunchSite
from runtime_bridge.providers.confined import Owner
from tests.fakes.git_server import git_server

FIRST = "0123456789abcdef0123456789abcdef"
SECOND = "fedcba9876543210fedcba9876543210"
TOKEN = "remote-token-must-stay-outside-9f8e"


def git(*args: str, cwd: Path | None = None) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "operator",
        "GIT_AUTHOR_EMAIL": "operator@example.invalid",
        "GIT_COMMITTER_NAME": "operator",
        "GIT_COMMITTER_EMAIL": "operator@example.invalid",
    }
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def area() -> Iterator[Path]:
    """A directory an Agent's uid can pass through (a root worker runs git there as that uid)."""
    with tempfile.TemporaryDirectory(prefix="amux-projects-") as made:
        os.chmod(made, 0o755)
        yield Path(made)


@pytest.fixture
def owner() -> Owner:
    return (65534, 65534) if os.geteuid() == 0 else None


def projects_in(work_dir: Path, env: Mapping[str, str] = os.environ) -> Projects:
    """The worker's projects, its git in a checkout jailed as a sandboxed worker's is."""
    sandbox = "bwrap" if shutil.which("bwrap") else "off"
    site = LaunchSite(RuntimeSettings(sandbox=sandbox, work_dir=work_dir), work_dir)
    return Projects(work_dir, env, site.git_sandbox)


def operator_repo(area: Path) -> Path:
    repo = area / "web"
    repo.mkdir()
    git("init", "--quiet", "--initial-branch", "main", cwd=repo)
    (repo / "app.py").write_text("print('hello')\n")
    (repo / "README").write_text("web\n")
    git("add", ".", cwd=repo)
    git("commit", "--quiet", "-m", "start", cwd=repo)
    return repo


def path_project(repo: Path, **options: object) -> ProjectSource:
    return ProjectSource("web", "path", str(repo), "main", **options)  # type: ignore[arg-type]


def test_each_conversation_works_on_its_own_branch_and_the_result_sums_it_up(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    source = path_project(repo)
    warnings: list[str] = []
    first = projects.prepare(source, FIRST, owner, warnings)
    second = projects.prepare(source, SECOND, owner, warnings)
    assert first.path != second.path and first.branch == branch_of(FIRST)
    assert first.branch == f"amux/{short_id(FIRST)}" and short_id(FIRST) != short_id(SECOND)
    assert (first.path / "app.py").read_text() == "print('hello')\n"
    if owner is not None:
        assert first.path.stat().st_uid == owner[0]

    (first.path / "app.py").write_text("print('hello, team')\nprint('again')\n")
    (first.path / "logo.png").write_bytes(b"\x89PNG\0\0\x01binary")
    (second.path / "NOTES").write_text("second only\n")
    # What the chat sent in and what the Agent leaves for the chat stay off the branch.
    for chat_dir in ("inbox/m1", "outbox"):
        (first.path / chat_dir).mkdir(parents=True)
        (first.path / chat_dir / "screenshot.png").write_bytes(b"\x89PNG")
    work = projects.finish(first, "e-first", owner, warnings)
    other = projects.finish(second, "e-second", owner, warnings)
    assert warnings == []

    assert work.branch == first.branch and work.base == "main" and work.project == "web"
    assert {f.path: (f.added, f.removed) for f in work.files} == {
        "app.py": (2, 1),
        "logo.png": (None, None),
    }
    assert work.files_total == 2 and not work.diff_truncated
    assert work.diff is not None and "+print('hello, team')" in work.diff
    assert work.commit == git("rev-parse", first.branch, cwd=repo).strip()
    assert [f.path for f in other.files] == ["NOTES"]
    # Each change is on its own branch only, and the default branch is untouched.
    assert "app.py" in git("diff", "--name-only", f"main...{first.branch}", cwd=repo)
    assert "NOTES" not in git("ls-tree", "-r", "--name-only", first.branch, cwd=repo)
    assert "app.py" not in git("diff", "--name-only", f"main...{second.branch}", cwd=repo)
    assert git("log", "-1", "--format=%an|%s", first.branch, cwd=repo).strip() == (
        "amux Agent|amux: turn e-first"
    )
    assert git("rev-list", "--count", "main", cwd=repo).strip() == "1"

    # The next turn of the conversation picks up where it left off.
    again = projects.prepare(source, FIRST, owner, warnings)
    assert (again.path / "logo.png").exists()
    assert projects.finish(again, "e-third", owner, warnings).commit == work.commit


def test_a_hostile_checkout_config_runs_nothing_of_the_agents_in_the_worker(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    source = path_project(repo)
    checkout = projects.prepare(source, FIRST, owner, [])
    marker = area / "ran"
    program = area / "evil.sh"
    program.write_text(f"#!/bin/sh\ntouch {marker}\ncat\n")
    program.chmod(0o755)
    hooks = checkout.path / "hooks"
    hooks.mkdir()
    for hook in ("pre-commit", "post-commit", "commit-msg", "pre-auto-gc"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / hook).chmod(0o755)
        (checkout.path / ".git" / "hooks" / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (checkout.path / ".git" / "hooks" / hook).chmod(0o755)
    with (checkout.path / ".git" / "config").open("a") as config:
        config.write(
            f"[core]\n\tfsmonitor = {program}\n\thooksPath = {hooks}\n"
            f'[filter "evil"]\n\tclean = {program}\n\tsmudge = {program}\n'
            f'[diff "evil"]\n\ttextconv = {program}\n\tcommand = {program}\n'
            f"[include]\n\tpath = {area / 'more.config'}\n"
        )
    (checkout.path / ".gitattributes").write_text("* filter=evil diff=evil\n")
    (checkout.path / ".git" / "commondir").write_text(str(repo / ".git") + "\n")
    (checkout.path / "app.py").write_text("changed\n")

    work = projects.finish(checkout, "e-hostile", owner, [])
    assert not marker.exists()
    assert {f.path for f in work.files} == {
        "app.py",
        ".gitattributes",
        "hooks/pre-commit",
        "hooks/post-commit",
        "hooks/commit-msg",
        "hooks/pre-auto-gc",
    }
    # The worker's own config is back; the Agent's lines are gone.
    assert "fsmonitor" not in (checkout.path / ".git" / "config").read_text()
    assert not (checkout.path / ".git" / "commondir").exists()
    assert git("rev-list", "--count", "main", cwd=repo).strip() == "1"


def test_a_git_file_pointing_at_another_conversation_is_not_followed(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    source = path_project(repo)
    mine = projects.prepare(source, FIRST, owner, [])
    theirs = projects.prepare(source, SECOND, owner, [])
    (theirs.path / "theirs.txt").write_text("theirs\n")
    projects.finish(theirs, "e-theirs", owner, [])
    before = git("rev-parse", theirs.branch, cwd=repo)
    subprocess.run(["rm", "-rf", str(mine.path / ".git")], check=True)
    (mine.path / ".git").write_text(f"gitdir: {theirs.path / '.git'}\n")
    (mine.path / "app.py").write_text("planted\n")
    warnings: list[str] = []
    work = projects.finish(mine, "e-planted", owner, warnings)
    assert "replaced its checkout's .git" in warnings[0]
    assert work.files == ()
    assert git("rev-parse", theirs.branch, cwd=repo) == before
    assert git("status", "--porcelain", cwd=theirs.path) == ""
    # The next turn starts again, cleanly, from its own branch.
    again = projects.prepare(source, FIRST, owner, [])
    assert (again.path / "app.py").read_text() == "print('hello')\n"


def test_a_ref_linked_to_another_conversations_branch_publishes_nothing_of_theirs(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    source = path_project(repo)
    mine = projects.prepare(source, FIRST, owner, [])
    theirs = projects.prepare(source, SECOND, owner, [])
    (theirs.path / "secret.txt").write_text("theirs only\n")
    their_commit = projects.finish(theirs, "e-theirs", owner, []).commit
    ref = mine.path / ".git" / "refs" / "heads" / mine.branch
    ref.unlink()
    ref.symlink_to(theirs.path / ".git" / "refs" / "heads" / theirs.branch)
    (mine.path / "mine.txt").write_text("mine\n")
    try:
        projects.finish(mine, "e-linked", owner, [])
    except Unavailable:
        pass  # Refusing the turn's commit is as good as keeping it apart.
    assert git("rev-parse", theirs.branch, cwd=repo).strip() == their_commit
    mine_now = git("rev-parse", mine.branch, cwd=repo).strip()
    assert mine_now != their_commit
    assert "secret.txt" not in git("ls-tree", "-r", "--name-only", mine_now, cwd=repo)


def test_a_conversations_checkout_holds_no_object_another_conversation_committed(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    source = path_project(repo, worktree_days=3)
    theirs = projects.prepare(source, SECOND, owner, [])
    (theirs.path / "secret.txt").write_text("theirs only\n")
    projects.finish(theirs, "e-theirs", owner, [])
    secret = git("rev-parse", f"{theirs.branch}:secret.txt", cwd=repo).strip()
    commit = git("rev-parse", theirs.branch, cwd=repo).strip()
    main = git("rev-parse", "main", cwd=repo).strip()
    # Made after theirs was published, and made again from its own branch once pruned.
    mine = projects.prepare(source, FIRST, owner, [])
    (mine.path / "mine.txt").write_text("mine\n")
    projects.finish(mine, "e-mine", owner, [])
    record = area / "work" / "projects" / "web" / "used" / mine.key
    record.write_text(f"{float(record.read_text()) - 4 * 86400}\n")
    assert projects.prune(source) == [mine.key]
    for checkout in (mine, projects.prepare(source, FIRST, owner, [])):
        git_dir = ["--git-dir", str(checkout.path / ".git")]
        for name in (secret, commit):
            found = subprocess.run(
                ["git", "-c", "safe.directory=*", *git_dir, "cat-file", "-e", name],
                capture_output=True,
            )
            assert found.returncode != 0, name
        assert "e-theirs" not in git(*git_dir, "log", "--all", "--format=%s")
        # The default branch and its own branch it still has.
        assert git(*git_dir, "show", f"{main}:app.py") == "print('hello')\n"
        assert git(*git_dir, "show", f"{mine.branch}:mine.txt") == "mine\n"
    assert not (mine.path / "secret.txt").exists()


def test_an_old_checkout_is_pruned_its_branch_stays_and_the_next_turn_recreates_it(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    work_dir = area / "work"
    projects = projects_in(work_dir)
    source = path_project(repo, worktree_days=3)
    checkout = projects.prepare(source, FIRST, owner, [])
    (checkout.path / "feature.txt").write_text("kept on the branch\n")
    commit = projects.finish(checkout, "e-one", owner, []).commit
    record = work_dir / "projects" / "web" / "used" / checkout.key
    record.write_text(f"{float(record.read_text()) - 4 * 86400}\n")

    assert projects.prune(source) == [checkout.key]
    assert not checkout.path.exists()
    assert f"amux/{checkout.key}" in git("branch", "--list", "amux/*", cwd=repo)
    assert git("rev-parse", checkout.branch, cwd=repo).strip() == commit

    again = projects.prepare(source, FIRST, owner, [])
    assert again.path == checkout.path
    assert (again.path / "feature.txt").read_text() == "kept on the branch\n"
    assert git("--git-dir", str(again.path / ".git"), "branch", "--show-current").strip() == (
        checkout.branch
    )


def test_the_next_claim_of_the_project_prunes_its_old_checkouts(area: Path, owner: Owner) -> None:
    repo = operator_repo(area)
    work_dir = area / "work"
    projects = projects_in(work_dir)
    source = path_project(repo, worktree_days=1)
    old = projects.prepare(source, FIRST, owner, [])
    record = work_dir / "projects" / "web" / "used" / old.key
    record.write_text(f"{float(record.read_text()) - 2 * 86400}\n")
    projects.prepare(source, SECOND, owner, [])
    assert not old.path.exists()


def test_a_checkout_used_recently_is_kept(area: Path, owner: Owner) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    source = path_project(repo, worktree_days=3)
    checkout = projects.prepare(source, FIRST, owner, [])
    assert projects.prune(source) == []
    assert checkout.path.is_dir()


def test_a_path_that_is_not_a_repository_is_refused_and_nothing_is_made(
    area: Path, owner: Owner
) -> None:
    plain = area / "plain"
    plain.mkdir()
    projects = projects_in(area / "work")
    with pytest.raises(InvalidArgument, match="is not a git repository"):
        projects.prepare(path_project(plain), FIRST, owner, [])
    with pytest.raises(InvalidArgument, match="does not exist"):
        projects.prepare(path_project(area / "missing"), FIRST, owner, [])
    assert list((area / "work" / "projects" / "web" / "checkouts").iterdir()) == []


def test_a_large_diff_is_cut_and_said_to_be(area: Path, owner: Owner) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    checkout = projects.prepare(path_project(repo), FIRST, owner, [])
    for n in range(60):
        (checkout.path / f"file{n:02}.txt").write_text(f"line {n}\n" * 800)
    work = projects.finish(checkout, "e-big", owner, [])
    assert work.files_total == 60 and len(work.files) == 50
    assert work.diff is not None and work.diff_truncated
    assert len(work.diff.encode()) <= BRANCH_DIFF_MAX and work.diff.endswith("\n")


def test_a_remote_project_is_cloned_with_the_workers_token_which_no_file_keeps(
    area: Path, owner: Owner
) -> None:
    served = area / "served"
    served.mkdir()
    upstream = operator_repo(area)
    git("clone", "--quiet", "--bare", str(upstream), str(served / "web.git"))
    work_dir = area / "work"
    env = {**os.environ, "WEB_TOKEN": TOKEN}
    projects = projects_in(work_dir, env)
    with git_server(served, TOKEN) as server:
        source = ProjectSource("web", "remote", f"{server.url}/web.git", "main", "WEB_TOKEN")
        warnings: list[str] = []
        checkout = projects.prepare(source, FIRST, owner, warnings)
        assert warnings == []
        assert any(server.accepts(header) for header in server.authorizations)
        assert (checkout.path / "app.py").is_file()
        (checkout.path / "app.py").write_text("remote change\n")
        work = projects.finish(checkout, "e-remote", owner, warnings)
        assert [f.path for f in work.files] == ["app.py"]
        repo = work_dir / "projects" / "web" / "repo.git"
        # The conversation's next turn works in its checkout without asking the remote again.
        asked = len(server.authorizations)
        projects.prepare(source, FIRST, owner, warnings)
        assert len(server.authorizations) == asked and warnings == []
        assert git("--git-dir", str(repo), "rev-parse", checkout.branch).strip() == work.commit

        # Without the token the remote refuses: cloning fails clearly and leaves nothing.
        anonymous = projects_in(area / "other-work", {**os.environ, "WEB_TOKEN": "wrong"})
        with pytest.raises(Unavailable, match="cannot be cloned"):
            anonymous.prepare(source, FIRST, owner, [])
        assert not (area / "other-work" / "projects" / "web" / "repo.git").exists()

    # The server is gone: the next conversation starts from the copy fetched before, warned.
    later = projects.prepare(source, SECOND, owner, warnings)
    assert "could not be fetched" in warnings[0]
    assert (later.path / "app.py").read_text() == "print('hello')\n"
    for root in (work_dir,):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert TOKEN.encode() not in path.read_bytes(), path

    unset = projects_in(area / "third-work")
    with pytest.raises(InvalidArgument, match="WEB_TOKEN is not set"):
        unset.prepare(source, FIRST, owner, [])


def test_a_conversation_moved_between_workers_continues_from_the_branch_its_remote_holds(
    area: Path, owner: Owner
) -> None:
    operator_repo(area)
    remote = area / "remote.git"
    git("clone", "--quiet", "--bare", str(area / "web"), str(remote))
    source = ProjectSource("web", "remote", f"file://{remote}", "main")
    host_a, host_b = projects_in(area / "a"), projects_in(area / "b")
    warnings: list[str] = []
    on_a = host_a.prepare(source, FIRST, owner, warnings)
    (on_a.path / "one.txt").write_text("one\n")
    host_a.finish(on_a, "e-1", owner, warnings)
    assert git("--git-dir", str(remote), "show", f"{on_a.branch}:one.txt") == "one\n"

    # Host b takes the conversation over: its checkout comes from the branch on the remote.
    on_b = host_b.prepare(source, FIRST, owner, warnings, moved_from="host-a")
    assert (on_b.path / "one.txt").read_text() == "one\n"
    (on_b.path / "two.txt").write_text("two\n")
    host_b.finish(on_b, "e-2", owner, warnings)
    # Back on host a, its old checkout is not reused: it lacks host b's turn.
    again = host_a.prepare(source, FIRST, owner, warnings, moved_from="host-b")
    assert (again.path / "two.txt").read_text() == "two\n"
    assert warnings == []

    # A push the remote refuses is said once, and the branch is kept on the worker.
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'pushes are closed' >&2\nexit 1\n")
    hook.chmod(0o755)
    (again.path / "three.txt").write_text("three\n")
    work = host_a.finish(again, "e-3", owner, warnings)
    assert len(warnings) == 1 and "could not be pushed" in warnings[0]
    assert "no other worker can continue this conversation" in warnings[0]
    assert "three.txt" in {f.path for f in work.files}
    (again.path / "four.txt").write_text("four\n")
    host_a.finish(again, "e-4", owner, warnings)
    assert len(warnings) == 1
    assert "three.txt" not in git("--git-dir", str(remote), "ls-tree", "--name-only", on_a.branch)
    # Made again on this worker later, its copy ahead of the remote's is kept, not fetched over.
    hook.unlink()
    kept = host_a.prepare(source, FIRST, owner, warnings, moved_from="host-b")
    assert (kept.path / "four.txt").read_text() == "four\n"
    assert len(warnings) == 1
    # A reviewer adds a commit to the branch on the remote: a worker whose copy is behind
    # takes it up; this one, whose copy went another way, goes on from its own and says so.
    elsewhere = area / "elsewhere"
    git("clone", "--quiet", "--branch", on_a.branch, str(remote), str(elsewhere))
    (elsewhere / "reviewer.txt").write_text("fix\n")
    git("add", ".", cwd=elsewhere)
    git("commit", "--quiet", "-m", "review", cwd=elsewhere)
    git("push", "--quiet", "origin", on_a.branch, cwd=elsewhere)
    behind = host_b.prepare(source, FIRST, owner, warnings, moved_from="host-a")
    assert (behind.path / "reviewer.txt").read_text() == "fix\n"
    assert len(warnings) == 1
    diverged = host_a.prepare(source, FIRST, owner, warnings, moved_from="host-b")
    assert "went another way" in warnings[-1]
    assert not (diverged.path / "reviewer.txt").exists()
    assert (diverged.path / "four.txt").read_text() == "four\n"


def test_a_path_project_moved_to_a_host_without_its_branch_starts_again_and_says_so(
    area: Path, owner: Owner
) -> None:
    source = path_project(operator_repo(area))
    warnings: list[str] = []
    checkout = projects_in(area / "work").prepare(
        source, FIRST, owner, warnings, moved_from="host-a"
    )
    assert warnings == [
        f"this conversation's branch {checkout.branch} is not in the project web's repository "
        "on this worker (its checkout was on worker host-a); this turn starts again from main"
    ]
    assert (checkout.path / "app.py").read_text() == "print('hello')\n"


def test_files_waiting_for_a_conversations_checkout_move_into_its_inbox_and_follow_no_link(
    area: Path, owner: Owner
) -> None:
    source = path_project(operator_repo(area))
    projects = projects_in(area / "work")
    checkout = projects.prepare(source, FIRST, owner, [])
    # The Agent left a link where the inbox goes, pointing out of its checkout.
    outside = area / "outside"
    outside.mkdir()
    (checkout.path / "inbox").symlink_to(outside)
    staged = projects.incoming_path("web", "feishu:oc_1:om_1")
    (staged / "inbox" / "om_1").mkdir(parents=True)
    (staged / "inbox" / "om_1" / "notes.txt").write_text("sent\n")
    again = projects.prepare(source, FIRST, owner, [], origin="feishu:oc_1:om_1")
    inbox = again.path / "inbox"
    assert not inbox.is_symlink() and (inbox / "om_1" / "notes.txt").read_text() == "sent\n"
    assert list(outside.iterdir()) == [] and not staged.exists()
    # Another conversation's origin finds nothing of it.
    other = projects.prepare(source, SECOND, owner, [], origin="feishu:oc_1:om_2")
    assert not (other.path / "inbox").exists()

    # Files for a first message whose turn never ran go with the project's old checkouts.
    forgotten = projects.incoming_path("web", "feishu:oc_1:om_3")
    (forgotten / "inbox").mkdir(parents=True)
    os.utime(forgotten, (0, 0))
    projects.prune(source)
    assert not forgotten.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker writes as another user only as root")
def test_a_root_worker_publishes_into_the_operators_repository_as_its_owner(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    operator = (4321, 4321)
    for path in (repo, *repo.rglob("*")):
        os.lchown(path, *operator)
    projects = projects_in(area / "work")
    source = path_project(repo)
    warnings: list[str] = []
    checkout = projects.prepare(source, FIRST, owner, warnings)
    for turn in ("e-1", "e-2", "e-3"):
        (checkout.path / f"{turn}.txt").write_text(f"{turn}\n")
        (checkout.path / "big.bin").write_bytes(os.urandom(4096) * (3 if turn == "e-2" else 1))
        work = projects.finish(checkout, turn, owner, warnings)
    projects.finish(checkout, "e-4", owner, warnings)  # nothing new: nothing to publish
    assert warnings == []
    assert {f.path for f in work.files} == {"e-1.txt", "e-2.txt", "e-3.txt", "big.bin"}
    assert git("rev-parse", checkout.branch, cwd=repo).strip() == work.commit
    assert git("log", "-1", "--format=%s", checkout.branch, cwd=repo).strip() == "amux: turn e-3"

    # Everything the worker wrote is the operator's, so the operator's own git goes on working.
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in repo.rglob("*")} == {operator}

    def as_operator(*args: str) -> None:
        subprocess.run(
            ["git", *args],
            cwd=repo,
            env={
                "PATH": os.environ["PATH"],
                "HOME": "/nonexistent",
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": "/dev/null",
            },
            user=operator[0],
            group=operator[1],
            extra_groups=[],
            capture_output=True,
            check=True,
        )

    as_operator("merge", "--quiet", "--no-edit", checkout.branch)
    as_operator("gc", "--quiet")
    as_operator("branch", "amux/reviewed", checkout.branch)
    assert (repo / "e-3.txt").read_text() == "e-3\n"


def test_a_file_sent_to_a_pruned_conversation_survives_its_checkout_being_made_again(
    area: Path, owner: Owner
) -> None:
    source = path_project(operator_repo(area))
    projects = projects_in(area / "work")
    checkout = projects.prepare(source, FIRST, owner, [])
    (checkout.path / "inbox" / "m1").mkdir(parents=True)
    (checkout.path / "inbox" / "m1" / "old.txt").write_text("kept from before\n")
    projects.finish(checkout, "e-1", owner, [])
    shutil.rmtree(checkout.path)  # pruned
    # The bot saves a later message's file where the checkout is, before the worker makes it.
    (checkout.path / "inbox" / "m2").mkdir(parents=True)
    (checkout.path / "inbox" / "m2" / "new.txt").write_text("sent after the prune\n")
    again = projects.prepare(source, FIRST, owner, [])
    assert (again.path / "inbox" / "m2" / "new.txt").read_text() == "sent after the prune\n"
    assert (again.path / ".git").is_dir() and (again.path / "app.py").is_file()
    # A checkout made again for a conversation moved back keeps its chat files too.
    moved = projects.prepare(source, FIRST, owner, [], moved_from="host-b")
    assert (moved.path / "inbox" / "m2" / "new.txt").read_text() == "sent after the prune\n"
    assert not list((area / "work" / "projects" / "web" / "incoming").iterdir())


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_the_workers_git_after_a_turn_runs_in_the_control_group_it_is_given(
    area: Path, owner: Owner, sandbox: str
) -> None:
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("bwrap (bubblewrap) is not installed")
    bounds = Bounds(
        memory_bytes=256 * MiB, tasks=64, cpu=1.0, open_files=256, workspace_bytes=1 * GiB
    )
    group = LaunchGroup.create(f"test-git-{uuid.uuid4().hex}", bounds)
    if group is None:
        pytest.skip("no usable cgroups with memory and pids here (root is needed)")
    try:
        repo = operator_repo(area)
        work_dir = area / "work"
        site = LaunchSite(RuntimeSettings(sandbox=sandbox, work_dir=work_dir), work_dir)
        projects = Projects(work_dir, os.environ, site.git_sandbox)
        checkout = projects.prepare(path_project(repo), FIRST, owner, [])
        (checkout.path / "notes.txt").write_text("hello\n")
        confine = site.git_confinement(group.procs_files, ())
        work = projects.finish(checkout, "e-1", owner, [], GitBounds(confine))
        assert [(f.path, f.added) for f in work.files] == [("notes.txt", 1)]
        if owner is not None:
            # Committed as the Agent's uid, whether a jail or the worker switched to it.
            objects = checkout.path / ".git" / "objects"
            assert {p.stat().st_uid for p in objects.rglob("*") if p.is_file()} == {owner[0]}
        # The kernel charged the group with git's memory, within the group's bound.
        peaks = [
            int(path.read_text())
            for directory in group.directories
            for path in (directory / "memory.peak", directory / "memory.max_usage_in_bytes")
            if path.exists()
        ]
        assert peaks and 0 < max(peaks) <= 256 * MiB
    finally:
        group.remove()


def test_git_past_its_time_is_killed_and_the_summary_is_said_to_be_cut_short(
    area: Path, owner: Owner
) -> None:
    repo = operator_repo(area)
    projects = projects_in(area / "work")
    checkout = projects.prepare(path_project(repo), FIRST, owner, [])
    (checkout.path / "notes.txt").write_text("hello\n")
    # A git that hangs listing the branch's changes, holding its output open.
    hanging = ("/bin/sh", "-c", 'case " $* " in *" --raw "*) sleep 60;; esac; exec "$@"', "git")
    started = time.monotonic()
    with pytest.raises(SummaryCut) as cut:
        projects.finish(checkout, "e-slow", owner, [], GitBounds(hanging, summary_seconds=2))
    assert time.monotonic() - started < 30
    assert cut.value.message == (
        f"the summary of this conversation's branch {checkout.branch} was cut short "
        "(git diff took longer than 2 s); the branch holds this turn's changes"
    )
    # What the turn left was kept all the same.
    assert git("show", f"{checkout.branch}:notes.txt", cwd=repo) == "hello\n"
