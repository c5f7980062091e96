"""Project turns through the whole service: the Hub's queue, its in-process worker, the real
sandbox and real git. The Agent is the stand-in ``tests/fakes/project_agent.sh``: it edits files
in its checkout, can be held on a gate file there, tries paths it must not reach, and runs git.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.service.app import create_app
from hub.client import HubClient
from hub.config import HubSettings
from hub.contract import Execution, Session
from hub.rpc import HUB
from hub.services import Hub
from runtime_bridge.checkouts import short_id
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.worker import Worker
from tests.bot.test_bot_flows import ALICE, private_chat, running_bot, signer
from tests.conftest import AMUX, free_port, git, stand_in, until
from tests.fakes.git_server import git_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed"),
]

AGENT = "project_agent.sh"


def operator_repo(path: Path) -> Path:
    path.mkdir()
    git("init", "--quiet", "--initial-branch", "main", cwd=path)
    (path / "app.py").write_text("print('hello')\n")
    git("add", ".", cwd=path)
    git(
        "-c",
        "user.name=op",
        "-c",
        "user.email=op@example.invalid",
        "commit",
        "-qm",
        "start",
        cwd=path,
    )
    return path


@dataclass
class Service:
    hub: Hub
    home: Path
    work_dir: Path
    url: str
    repo: Path

    async def submit(self, prompt: str, session_id: str | None = None) -> tuple[str, Session]:
        owner = self.hub.state.owner()
        assert owner is not None
        execution, session = await self.hub.executions.submit(
            principal_id=owner.id,
            submitted_by=owner.id,
            provider="edit",
            prompt=prompt,
            session_id=session_id,
            project=None if session_id else "web",
        )
        return execution.id, session

    def checkout(self, session: Session) -> Path:
        return self.work_dir / "projects" / "web" / "checkouts" / short_id(session.id)

    def execution(self, execution_id: str) -> Execution:
        return self.hub.executions.describe(execution_id)

    async def finished(self, execution_id: str) -> Execution:
        await until(lambda: self.execution(execution_id).finished, seconds=120)
        return self.execution(execution_id)


@asynccontextmanager
async def serving(tmp_path: Path, workspace_max: str | None = None) -> AsyncIterator[Service]:
    home = tmp_path / "amux-home"
    work_dir = home / "runtime"
    runtime = RuntimeSettings(
        slots=2,
        providers={"edit": str(stand_in(AGENT))},
        sandbox="bwrap",
        work_dir=work_dir,
        workspace_max=workspace_max,
    )
    port = free_port()
    app = create_app(
        HubSettings(home=home),
        runtime_settings=runtime,
        worker_url=f"http://127.0.0.1:{port}",
    )
    async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
        hub = app[HUB]
        owner = hub.state.owner()
        assert owner is not None
        repo = operator_repo(tmp_path / "web")
        await hub.projects.add("web", by=owner.id, path=str(repo), provider="edit")
        yield Service(hub, home, work_dir, f"http://127.0.0.1:{port}", repo)


async def test_two_conversations_of_one_project_run_at_once_each_on_its_own_branch(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as service:
        objects = service.repo / ".git" / "objects"
        first, a = await service.submit("write app.py print('from a')\nhold\n")
        # B tries A's checkout and the project repository's objects and refs.
        a_path = service.checkout(a)
        second, b = await service.submit(
            "write notes/b.txt from b\nhold\n"
            f"try {a_path}/planted.txt\ntry {objects}/planted\n"
            f"try {service.repo}/.git/refs/heads/planted\n"
        )
        b_path = service.checkout(b)
        # Both Agents are inside their turns at the same time, each in its own checkout.
        await until(lambda: (a_path / ".held").exists() and (b_path / ".held").exists(), 120)
        assert service.execution(first).state == service.execution(second).state == "running"
        (a_path / ".open").touch()
        (b_path / ".open").touch()
        done_a, done_b = await service.finished(first), await service.finished(second)

        assert done_a.state == "succeeded", done_a.error
        assert done_b.state == "succeeded", done_b.error
        branch_a, branch_b = f"amux/{short_id(a.id)}", f"amux/{short_id(b.id)}"
        assert done_a.result is not None and done_b.result is not None
        assert done_a.result.text is not None and done_b.result.text is not None
        # git ran inside the sandbox, on the conversation's branch, over the borrowed objects.
        assert f"on {branch_a} after: start" in done_a.result.text
        text_b = done_b.result.text
        assert f"refused {a_path}/planted.txt" in text_b
        assert f"refused {objects}/planted" in text_b
        assert f"refused {service.repo}/.git/refs/heads/planted" in text_b
        assert "reached" not in text_b

        work_a, work_b = done_a.result.branch, done_b.result.branch
        assert work_a is not None and work_b is not None
        assert (work_a.branch, work_a.base, work_a.project) == (branch_a, "main", "web")
        assert [(f.path, f.added, f.removed) for f in work_a.files] == [("app.py", 1, 1)]
        assert work_a.diff is not None and "+print('from a')" in work_a.diff
        assert [f.path for f in work_b.files] == ["notes/b.txt"]
        assert work_b.branch == branch_b

        # Each change is on its own branch of the operator's repository, and only there.
        repo = service.repo
        assert git("rev-parse", branch_a, cwd=repo).strip() == work_a.commit
        assert git("show", f"{branch_a}:app.py", cwd=repo) == "print('from a')\n"
        assert "notes/b.txt" not in git("ls-tree", "-r", "--name-only", branch_a, cwd=repo)
        assert git("show", f"{branch_b}:app.py", cwd=repo) == "print('hello')\n"
        assert git("show", "main:app.py", cwd=repo) == "print('hello')\n"
        assert not (a_path / "planted.txt").exists()
        assert "planted" not in git("branch", "--list", cwd=repo)

        # The conversation's next turn works in the same checkout, on top of its last change.
        third, _ = await service.submit("write more.txt again\n", session_id=a.id)
        done = await service.finished(third)
        assert done.state == "succeeded", done.error
        assert done.result is not None and done.result.branch is not None
        assert {f.path for f in done.result.branch.files} == {"app.py", "more.txt"}
        assert git("log", "-1", "--format=%an: %s", branch_a, cwd=repo).strip() == (
            f"amux Agent: amux: turn {third}"
        )

        # Unused past projects.worktree_days, A's checkout goes at the project's next claim;
        # its branch stays, and A's next turn gets it back with its changes.
        record = service.work_dir / "projects" / "web" / "used" / short_id(a.id)
        record.write_text(f"{float(record.read_text()) - 15 * 86400}\n")
        fourth, _ = await service.submit("write notes/b2.txt again\n", session_id=b.id)
        assert (await service.finished(fourth)).state == "succeeded"
        assert not a_path.exists()
        assert git("rev-parse", branch_a, cwd=repo).strip() == done.result.branch.commit
        fifth, _ = await service.submit("write later.txt later\n", session_id=a.id)
        again = await service.finished(fifth)
        assert again.state == "succeeded", again.error
        assert (a_path / "more.txt").read_text() == "again\n"
        assert (a_path / "app.py").read_text() == "print('from a')\n"

        # `amux runtime plan` shows that checkout as the conversation's working directory.
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AMUX_")},
            "AMUX_HOME": str(service.home),
            "AMUX_HUB_URL": service.url,
            "AMUX_RUNTIME_SANDBOX": "bwrap",
            "AMUX_RUNTIME_PROVIDERS": json.dumps({"edit": str(stand_in(AGENT))}),
        }
        process = await asyncio.create_subprocess_exec(
            AMUX,
            "runtime",
            "plan",
            "--json",
            "--provider",
            "edit",
            "--session",
            a.id,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        assert json.loads(out)["cwd"] == str(a_path)


async def test_a_sparse_file_of_gigabytes_is_not_committed_and_costs_the_workers_git_little(
    tmp_path: Path,
) -> None:
    # No Agent file may outgrow the workspace bound (2G by default): under a larger one a sparse
    # file of 3 GiB takes no disk, so only the worker's git could be made to read it.
    async with serving(tmp_path, workspace_max="4G") as service:
        # What the worker's git children have used at most so far (KiB), this process's own.
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        started = time.monotonic()
        # 3 GiB without a block of disk, beside a note and a text file over the diff's bound
        # (each sorted around it, so git would reach the large file between them).
        execution, session = await service.submit(
            "sparse sparse.bin 3G\nfill table.csv 2M\nwrite notes.txt hello\n"
        )
        done = await service.finished(execution)
        took = time.monotonic() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss

    assert done.state == "succeeded", done.error
    assert done.result is not None and done.result.branch is not None
    work = done.result.branch
    branch = f"amux/{short_id(session.id)}"
    # The result names the file it left out and why; it stays in the checkout, off the branch.
    (said,) = [w for w in done.result.warnings if "sparse.bin" in w]
    assert said == (
        f"not committed to {branch}, too large (over 50 MiB each): sparse.bin (3 GiB); "
        "they stay in the checkout"
    )
    assert (service.checkout(session) / "sparse.bin").stat().st_size == 3 * 1024**3
    assert git("ls-tree", "-r", "--name-only", branch, cwd=service.repo) == (
        "app.py\nnotes.txt\ntable.csv\n"
    )
    # The other files are summed up: the note line by line, the large one named, never read.
    assert [(f.path, f.added, f.removed, f.too_large) for f in work.files] == [
        ("notes.txt", 1, 0, False),
        ("table.csv", None, None, True),
    ]
    assert work.diff is not None and "+hello" in work.diff and "a line of text" not in work.diff
    assert work.diff.endswith("# amux: not in this diff, over 1 MiB: table.csv\n")
    # No git process of the worker's came near reading the 3 GiB (one that read it would hold
    # gigabytes), and the turn did not wait for one to hash it. The measure is every child this
    # test process has reaped, so an earlier test's Agent CLI ending meanwhile (under 1 GiB)
    # may raise it a little; a git that read the file would raise it by gigabytes.
    assert peak <= max(before, 1024 * 1024), f"a child of the worker peaked at {peak} KiB"
    assert took < 60


async def test_a_conversations_agent_cannot_read_what_another_conversation_committed(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as service:
        first, a = await service.submit("write secret.txt only for a\n")
        assert (await service.finished(first)).state == "succeeded"
        branch_a = f"amux/{short_id(a.id)}"
        blob = git("rev-parse", f"{branch_a}:secret.txt", cwd=service.repo).strip()
        commit = git("rev-parse", branch_a, cwd=service.repo).strip()
        # B, made after A's branch is in the project repository, asks its git for A's work.
        second, _ = await service.submit(
            f"git cat-file -p {blob}\ngit cat-file -p {commit}\n"
            "git log --all --format=subject:%s\ngit show main:app.py\n"
        )
        done = await service.finished(second)
        assert done.state == "succeeded", done.error
        assert done.result is not None and done.result.text is not None
        text = done.result.text
        assert "only for a" not in text and first not in text
        assert text.count("git cat-file failed") == 2
        assert "subject:start" in text
        # The default branch it sees, whole.
        assert "print('hello')" in text


async def test_a_plain_conversation_beside_a_project_keeps_its_own_workspace(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as service:
        owner = service.hub.state.owner()
        assert owner is not None
        execution, session = await service.hub.executions.submit(
            principal_id=owner.id, submitted_by=owner.id, provider="edit", prompt="write x.txt x\n"
        )
        done = await service.finished(execution.id)
        assert done.result is not None and done.result.branch is None
        assert session.project is None
        # Its Agent worked where it always has: the Principal's own workspace, not a checkout.
        assert not (service.work_dir / "projects" / "web" / "checkouts").exists() or not any(
            (service.work_dir / "projects" / "web" / "checkouts").iterdir()
        )
        assert list((service.work_dir / "workspaces").glob("*/x.txt"))


async def test_a_project_whose_repository_is_gone_fails_its_turn_saying_so(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as service:
        shutil.rmtree(service.repo)
        execution, session = await service.submit("write app.py gone\n")
        done = await service.finished(execution)
        assert done.state == "failed"
        assert done.error == (
            f"the project web's repository {service.repo} does not exist on this worker's host"
        )
        assert not service.checkout(session).exists()


async def test_a_remote_projects_token_stays_with_the_worker_and_out_of_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "remote-token-9d1c-must-stay-with-the-worker"
    monkeypatch.setenv("WEB_TOKEN", token)
    served = tmp_path / "served"
    served.mkdir()
    upstream = operator_repo(tmp_path / "upstream")
    git("clone", "--quiet", "--bare", str(upstream), str(served / "web.git"), cwd=tmp_path)
    home = tmp_path / "amux-home"
    work_dir = home / "runtime"
    runtime = RuntimeSettings(
        providers={"edit": str(stand_in(AGENT))}, sandbox="bwrap", work_dir=work_dir
    )
    port = free_port()
    app = create_app(HubSettings(home=home), runtime, worker_url=f"http://127.0.0.1:{port}")
    with git_server(served, token) as server:
        async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
            hub = app[HUB]
            owner = hub.state.owner()
            assert owner is not None
            await hub.projects.add(
                "web", by=owner.id, remote=f"{server.url}/web.git", credential_env="WEB_TOKEN",
                provider="edit",
            )  # fmt: skip
            bare = work_dir / "projects" / "web" / "repo.git"
            service = Service(hub, home, work_dir, "", bare)
            execution, _ = await service.submit(
                f"write app.py print('remote')\nenv\nshow {bare}/config\n"
            )
            done = await service.finished(execution)
        assert done.state == "succeeded", done.error
        assert any(server.accepts(header) for header in server.authorizations)
    assert done.result is not None and done.result.text is not None
    assert done.result.branch is not None and [f.path for f in done.result.branch.files] == [
        "app.py"
    ]
    # The worker pushed the conversation's branch to the remote, with the same token.
    branch = done.result.branch.branch
    assert git("show", f"{branch}:app.py", cwd=served / "web.git") == "print('remote')\n"
    assert done.result.warnings == ()
    # Neither the Agent's environment nor anything it could read holds the token.
    assert token not in done.result.text
    assert f"unreadable {bare}/config" in done.result.text
    for path in [*work_dir.rglob("*"), *home.glob("*")]:
        if path.is_file() and not path.is_symlink():
            assert token.encode() not in path.read_bytes(), path


@asynccontextmanager
async def two_workers(tmp_path: Path) -> AsyncIterator[tuple[Service, list[Path]]]:
    """The Hub with no worker of its own and two workers beside it, as `amux runtime worker`
    runs on two hosts: each its own name, work dir and one slot."""
    home = tmp_path / "amux-home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The Hub accepts the workers' provider; without a worker URL it runs no worker itself.
    app = create_app(
        HubSettings(home=home), RuntimeSettings(providers={"edit": str(stand_in(AGENT))})
    )
    async with TestClient(TestServer(app, host="127.0.0.1", port=port)):
        hub = app[HUB]
        owner = hub.state.owner()
        assert owner is not None
        repo = operator_repo(tmp_path / "web")
        await hub.projects.add("web", by=owner.id, path=str(repo), provider="edit")
        stop = asyncio.Event()
        clients: list[HubClient] = []
        tasks: list[asyncio.Task[None]] = []
        work_dirs: list[Path] = []
        for name in ("host-a", "host-b"):
            service = hub.state.add_principal(name, "service")
            token, _ = hub.state.issue_credential(service.id, "cli", label=name)
            work_dir = tmp_path / name
            settings = RuntimeSettings(
                name=name,
                slots=1,
                providers={"edit": str(stand_in(AGENT))},
                sandbox="bwrap",
                work_dir=work_dir,
            )
            client = HubClient(url, token, timeout=60)
            clients.append(client)
            work_dirs.append(work_dir)
            tasks.append(
                asyncio.create_task(Worker(client, url, settings, work_dir).run_forever(stop))
            )
        try:
            yield Service(hub, home, work_dirs[0], url, repo), work_dirs
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in clients:
                await client.close()


async def test_a_project_conversations_later_turn_runs_on_the_worker_holding_its_checkout(
    tmp_path: Path,
) -> None:
    async with two_workers(tmp_path) as (service, work_dirs):
        first, session = await service.submit("write app.py print('first')\n")
        assert (await service.finished(first)).state == "succeeded"
        key = short_id(session.id)
        holders = [w for w in work_dirs if (w / "projects" / "web" / "checkouts" / key).is_dir()]
        assert len(holders) == 1
        (home,) = holders
        (other,) = [w for w in work_dirs if w != home]
        checkout = home / "projects" / "web" / "checkouts" / key

        # Its next turn waits for that worker even while the other has nothing to do; held
        # there, it keeps that worker busy, so a plain turn goes to the other one.
        second, _ = await service.submit("write b.txt second\nhold\n", session_id=session.id)
        await until(lambda: (checkout / ".held").exists(), 120)
        owner = service.hub.state.owner()
        assert owner is not None
        plain, _ = await service.hub.executions.submit(
            principal_id=owner.id, submitted_by=owner.id, provider="edit", prompt="hold\n"
        )
        await until(lambda: list((other / "workspaces").glob("*/.held")), 120)
        assert not (other / "projects" / "web" / "checkouts" / key).exists()
        (checkout / ".open").touch()
        for held in (other / "workspaces").glob("*/.held"):
            held.with_name(".open").touch()
        done = await service.finished(second)
        assert done.state == "succeeded", done.error
        assert done.result is not None and done.result.branch is not None
        assert {f.path for f in done.result.branch.files} == {"app.py", "b.txt"}
        assert (await service.finished(plain.id)).state == "succeeded"


async def test_a_file_sent_with_a_project_conversations_first_message_is_in_its_checkout(
    tmp_path: Path,
) -> None:
    # Through the bot: the real lark-oapi client against the fake Feishu, the in-process worker.
    runtime = RuntimeSettings(
        providers={"edit": str(stand_in(AGENT))}, sandbox="bwrap", work_dir=tmp_path / "runtime"
    )
    async with running_bot(tmp_path, runtime=runtime) as bot:
        repo = operator_repo(tmp_path / "web")
        await bot.hub.projects.add("web", by=bot.ids["alice"], path=str(repo), provider="edit")
        bound = await bot.say("/amux project bind web", ALICE)
        await bot.reply_to(bound)
        assert bot.hub.projects.binding_of(private_chat(ALICE)) is not None

        chat = private_chat(ALICE)
        stored = bot.feishu.add_message(chat, "")
        bot.feishu.resources[(stored.message_id, "file_1")] = b"the numbers are 4 8 15\n"
        message = signer.message(
            "",
            **ALICE,
            chat_id=chat,
            message_id=stored.message_id,
            message_type="file",
            content={"file_key": "file_1", "file_name": "notes.txt"},
        )
        bot.sent[stored.message_id] = message
        status, _ = await bot.post(message)
        assert status == 200
        session = await until(lambda: bot.session_of(stored.message_id), 60)
        assert session.project == "web"
        (execution,) = bot.executions_of(session.id)
        service = Service(bot.hub, tmp_path, runtime.work_dir, bot.url, repo)
        done = await service.finished(execution.id)

    assert done.state == "succeeded", done.error
    assert done.result is not None and done.result.text is not None
    # The Agent, in its checkout, read the file at the path its prompt named.
    path = f"inbox/{stored.message_id}/notes.txt"
    assert f"attached {path}: the numbers are 4 8 15" in done.result.text
    checkout = service.checkout(session)
    assert (checkout / path).read_bytes() == b"the numbers are 4 8 15\n"
    # Nothing of it on the branch, and nothing left waiting anywhere else in the work dir.
    assert done.result.branch is not None and done.result.branch.files == ()
    assert git("ls-tree", "-r", "--name-only", f"amux/{short_id(session.id)}", cwd=repo) == (
        "app.py\n"
    )
    assert list(runtime.work_dir.rglob("notes.txt")) == [checkout / path]
