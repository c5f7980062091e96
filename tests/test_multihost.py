"""The Hub and two Runtime workers as three hosts: network namespaces joined by veth pairs.

The test builds its own network: a namespace for the Hub with a bridge on a private /24, and one
namespace per worker, each linked to the bridge by a veth pair. No namespace has a route anywhere
else, so all traffic stays on those links. Each worker runs a scripted stand-in for ``claude``
that speaks its stream-json output; a prompt containing ``hold`` makes it wait for a release file
in its working directory, which lets the test pin one turn on each worker, then kill one worker
mid-turn and watch the Hub hand the turn to the surviving worker.

A project test adds a git host beside the Hub (``git daemon`` in the Hub's namespace): the
workers share no disk, each clones the project's remote into its own work dir, and a
conversation's branch travels between them only through that remote.

Needs root and iproute2; skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hub.executions import moves_to_worker
from runtime_bridge.checkouts import short_id
from tests.conftest import AMUX, git, stand_in, wait_until

pytestmark = pytest.mark.e2e

IP = shutil.which("ip")
PORT = 8765
LEASE_SECONDS = "2"

FAKE_CLAUDE = textwrap.dedent(
    """\
    #!{python}
    # Stand-in for `claude -p --output-format stream-json`: the prompt arrives on stdin.
    import json, os, pathlib, sys, time, uuid

    prompt = sys.stdin.read()
    cwd = pathlib.Path.cwd()
    def say(message):
        print(json.dumps(message), flush=True)
    session = "s-" + uuid.uuid4().hex[:8]
    say({{"type": "system", "subtype": "init", "session_id": session}})
    say({{"type": "assistant", "session_id": session,
          "message": {{"content": [{{"type": "text", "text": "working in " + str(cwd)}}]}}}})
    if "hold" in prompt:
        (cwd / f"started-{{os.getpid()}}").write_text(prompt)
        deadline = time.monotonic() + 120
        while not (cwd / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    say({{"type": "result", "subtype": "success", "session_id": session,
          "result": f"done: {{prompt.strip()}} @ {{cwd}}", "usage": {{}}}})
    """
)

RPC_SCRIPT = textwrap.dedent(
    """\
    import json, sys, urllib.error, urllib.request
    url, token, method, params = sys.argv[1:5]
    request = urllib.request.Request(
        f"{url}/rpc/v1/{method}", data=params.encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=40) as response:
            print(json.dumps({"status": response.status, "body": json.loads(response.read())}))
    except urllib.error.HTTPError as err:
        print(json.dumps({"status": err.code, "body": json.loads(err.read())}))
    except OSError as err:
        print(json.dumps({"status": 0, "body": {"error": str(err)}}))
    """
)


def ip(*args: str) -> None:
    assert IP is not None
    done = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Network:
    """Three namespaces: the Hub's, with a bridge, and one per worker linked to it."""

    tag: str
    subnet: str
    namespaces: list[str] = field(default_factory=list)

    @property
    def hub_ns(self) -> str:
        return f"amux-h-{self.tag}"

    def worker_ns(self, index: int) -> str:
        return f"amux-w{index}-{self.tag}"

    @property
    def hub_address(self) -> str:
        return f"{self.subnet}.1"

    def build(self, workers: int) -> None:
        for ns in [self.hub_ns, *(self.worker_ns(i) for i in range(1, workers + 1))]:
            ip("netns", "add", ns)
            self.namespaces.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        bridge = "br0"
        ip("-n", self.hub_ns, "link", "add", bridge, "type", "bridge")
        ip("-n", self.hub_ns, "addr", "add", f"{self.hub_address}/24", "dev", bridge)
        ip("-n", self.hub_ns, "link", "set", bridge, "up")
        for i in range(1, workers + 1):
            hub_end, worker_end = f"vh{i}", f"vw{i}"
            ip(
                "link", "add", hub_end, "netns", self.hub_ns, "type", "veth",
                "peer", "name", worker_end, "netns", self.worker_ns(i),
            )  # fmt: skip
            ip("-n", self.hub_ns, "link", "set", hub_end, "master", bridge)
            ip("-n", self.hub_ns, "link", "set", hub_end, "up")
            address = f"{self.subnet}.{10 + i}/24"
            ip("-n", self.worker_ns(i), "addr", "add", address, "dev", worker_end)
            ip("-n", self.worker_ns(i), "link", "set", worker_end, "up")

    def teardown(self) -> None:
        for ns in reversed(self.namespaces):
            subprocess.run([IP or "ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.fixture
def network() -> Iterator[Network]:
    if IP is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = secrets.token_hex(3)
    net = Network(tag, f"10.213.{secrets.randbelow(250) + 1}")
    try:
        net.build(workers=2)
    except RuntimeError as error:
        net.teardown()
        pytest.skip(f"cannot create network namespaces here: {error}")
    try:
        yield net
    finally:
        net.teardown()


@dataclass
class Host:
    """A process running inside one namespace, in its own process group."""

    ns: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [IP or "ip", "netns", "exec", self.ns, *self.argv],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL the host's whole process group: the worker and the Agent it runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env.update(values)
    return env


@dataclass
class Cluster:
    net: Network
    root: Path
    hub: Host
    workers: list[Host]
    work_dirs: list[Path]
    owner_token: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.net.hub_address}:{PORT}"

    def rpc(self, method: str, ns: str | None = None, **params: Any) -> tuple[int, Any]:
        """A Hub RPC call made from inside a namespace (the Hub's own by default)."""
        done = subprocess.run(
            [
                IP or "ip", "netns", "exec", ns or self.net.hub_ns, sys.executable, "-c",
                RPC_SCRIPT, self.url, self.owner_token, method, json.dumps(params),
            ],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        return answer["status"], answer["body"]

    def held_on(self, index: int) -> list[Path]:
        # The owner's turns run in its own workspace under the worker's work dir.
        return sorted((self.work_dirs[index] / "workspaces").glob("*/started-*"))

    def logs(self) -> str:
        return "\n".join(
            f"--- {host.log.name}\n{host.log.read_text(errors='replace')}"
            for host in [self.hub, *self.workers]
            if host.log.exists()
        )


@contextmanager
def running_cluster(
    network: Network,
    tmp_path: Path,
    hub_env: dict[str, str] | None = None,
    worker_env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """`amux serve` in the Hub's namespace and `amux runtime worker` in each worker's."""
    home = tmp_path / "hub-home"
    fake = tmp_path / "fake-claude"
    fake.write_text(FAKE_CLAUDE.format(python=sys.executable))
    fake.chmod(0o755)
    hub = Host(
        network.hub_ns,
        [AMUX, "serve", "--host", network.hub_address, "--port", str(PORT)],
        clean_env(
            AMUX_HOME=str(home),
            AMUX_LEASE_SECONDS=LEASE_SECONDS,
            AMUX_RUNTIME_IN_PROCESS="false",
            AMUX_LOG_FORMAT="json",
            **(hub_env or {}),
        ),
        tmp_path / "hub.log",
    )
    cluster = Cluster(network, tmp_path, hub, [], [])
    hub.start()
    try:
        wait_until(lambda: (home / "owner.token").exists(), 30)
        cluster.owner_token = (home / "owner.token").read_text().strip()
        wait_until(lambda: cluster.rpc("system.whoami")[0] == 200, 30)
        # Local administration on the Hub host: one service Principal and token per worker host.
        for i in (1, 2):
            admin = clean_env(AMUX_HOME=str(home))
            name = f"host-{i}"
            subprocess.run(
                [AMUX, "principal", "add", name, "--service"], env=admin, check=True,
                capture_output=True, timeout=60,
            )  # fmt: skip
            issued = subprocess.run(
                [AMUX, "token", "issue", name], env=admin, check=True, capture_output=True,
                text=True, timeout=60,
            )  # fmt: skip
            token = issued.stdout.strip()
            work_dir = tmp_path / f"worker-{i}"
            cluster.work_dirs.append(work_dir)
            worker = Host(
                network.worker_ns(i),
                [AMUX, "runtime", "worker", "--hub", cluster.url],
                clean_env(
                    AMUX_HOME=str(tmp_path / f"worker-{i}-home"),
                    AMUX_TOKEN=token,
                    AMUX_RUNTIME_NAME=name,
                    AMUX_RUNTIME_WORK_DIR=str(work_dir),
                    AMUX_RUNTIME_CLAUDE=str(fake),
                    # One turn at a time per host, so two held turns land on both hosts.
                    AMUX_RUNTIME_SLOTS="1",
                    **(worker_env or {}),
                ),
                tmp_path / f"worker-{i}.log",
            )
            cluster.workers.append(worker)
            worker.start()
        wait_until(lambda: cluster.rpc("system.capabilities")[1]["runtime"]["workers"] == 2, 30)
        yield cluster
    finally:
        for host in [*cluster.workers, hub]:
            host.stop()


@pytest.fixture
def cluster(network: Network, tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(network, tmp_path) as running:
        yield running


def submit(cluster: Cluster, prompt: str) -> str:
    status, body = cluster.rpc("executions.submit", provider="claude", prompt=prompt)
    assert status == 200, body
    return str(body["execution"]["id"])


def finished(cluster: Cluster, execution_id: str) -> dict[str, Any] | None:
    status, body = cluster.rpc("executions.watch", execution_id=execution_id, after=0)
    assert status == 200, body
    return body if body["state"] in ("succeeded", "failed", "cancelled") else None


def test_workers_on_two_hosts_run_turns_and_a_killed_workers_turn_is_retried_on_the_other(
    cluster: Cluster,
) -> None:
    # The workers' own namespaces reach the Hub only over their veth links.
    status, _ = cluster.rpc("system.whoami", ns=cluster.net.worker_ns(1))
    assert status == 200

    # Two held turns: each worker runs one turn at a time here, so each host takes one.
    first = submit(cluster, "hold: first conversation")
    second = submit(cluster, "hold: second conversation")
    try:
        wait_until(lambda: cluster.held_on(0) and cluster.held_on(1), 30)
    except AssertionError:
        raise AssertionError(f"turns did not reach both hosts:\n{cluster.logs()}") from None
    on_host_1 = cluster.held_on(0)[0].read_text()
    victim = second if "second" in on_host_1 else first
    survivor = first if victim == second else second

    # Kill host 1's worker, and the Agent it runs, in the middle of its turn.
    cluster.workers[0].kill()
    # Host 2 finishes its own turn, then picks up the one host 1 lost once its lease expires.
    (held,) = cluster.held_on(1)
    (held.parent / "release").write_text("go")
    done = wait_until(lambda: finished(cluster, survivor), 60)
    assert done["state"] == "succeeded", done
    assert str(cluster.work_dirs[1]) in done["result"]["text"]

    retried = wait_until(lambda: finished(cluster, victim), 60)
    assert retried["state"] == "succeeded", (retried, cluster.logs())
    assert retried["attempts"] == 2
    # Visible, not silent: the turn's own events say the worker was lost and it was retried.
    texts = [event["text"] for event in retried["events"]]
    assert "the worker running this turn was lost; retrying" in texts
    assert str(cluster.work_dirs[1]) in retried["result"]["text"]
    assert "hold" in retried["result"]["text"]

    # A fresh conversation still runs: nothing is stuck behind the lost worker.
    after = submit(cluster, "a third conversation")
    third = wait_until(lambda: finished(cluster, after), 30)
    assert third["state"] == "succeeded"
    assert third["result"]["text"].startswith("done: a third conversation @ ")


AGENT = "project_agent.sh"
GIT_PORT = 9418
# Short, so that the test sees a gone worker's conversation move; far above how often a live
# worker is seen (every few seconds).
HOME_WORKER_SECONDS = 15


def served_repository(served: Path) -> Path:
    """The project's repository as its git host keeps it: bare, with ``main``."""
    work = served.parent / "upstream"
    work.mkdir()
    git("init", "--quiet", "--initial-branch", "main", cwd=work)
    (work / "app.py").write_text("print('hello')\n")
    git("add", ".", cwd=work)
    git("-c", "user.name=op", "-c", "user.email=op@example.invalid", "commit", "-qm", "start",
        cwd=work)  # fmt: skip
    served.mkdir()
    git("clone", "--quiet", "--bare", str(work), str(served / "web.git"), cwd=served)
    return served / "web.git"


@dataclass
class ProjectCluster:
    cluster: Cluster
    remote: Path  # the git host's bare repository

    def submit(self, prompt: str, session_id: str | None = None) -> tuple[str, str]:
        extra: dict[str, Any] = {"session_id": session_id} if session_id else {"project": "web"}
        status, body = self.cluster.rpc(
            "executions.submit", provider="edit", prompt=prompt, **extra
        )
        assert status == 200, body
        return str(body["execution"]["id"]), str(body["session"]["id"])

    def plain(self, prompt: str) -> str:
        status, body = self.cluster.rpc("executions.submit", provider="edit", prompt=prompt)
        assert status == 200, body
        return str(body["execution"]["id"])

    def finished(self, execution_id: str, seconds: float = 90) -> dict[str, Any]:
        try:
            return dict(wait_until(lambda: finished(self.cluster, execution_id), seconds))
        except AssertionError:
            raise AssertionError(f"{execution_id} did not finish:\n{self.cluster.logs()}") from None

    def state(self, execution_id: str) -> str:
        status, body = self.cluster.rpc("executions.watch", execution_id=execution_id, after=0)
        assert status == 200, body
        return str(body["state"])

    def checkout(self, host: int, session_id: str) -> Path:
        key = short_id(session_id)
        return self.cluster.work_dirs[host] / "projects" / "web" / "checkouts" / key

    def held(self, host: int) -> list[Path]:
        return sorted((self.cluster.work_dirs[host] / "workspaces").glob("*/.held"))


@pytest.fixture
def project_cluster(network: Network, tmp_path: Path) -> Iterator[ProjectCluster]:
    remote = served_repository(tmp_path / "served")
    daemon = Host(
        network.hub_ns,
        [
            "git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
            f"--base-path={remote.parent}", f"--listen={network.hub_address}",
            f"--port={GIT_PORT}", str(remote.parent),
        ],
        clean_env(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null"),
        tmp_path / "git-daemon.log",
    )  # fmt: skip
    daemon.start()
    try:
        url = f"git://{network.hub_address}:{GIT_PORT}/web.git"
        listed = [IP or "ip", "netns", "exec", network.worker_ns(1), "git", "ls-remote", url]
        wait_until(
            lambda: subprocess.run(listed, capture_output=True, timeout=30).returncode == 0, 30
        )
        providers = json.dumps({"edit": str(stand_in(AGENT))})
        with running_cluster(
            network,
            tmp_path,
            hub_env={
                "AMUX_RUNTIME_PROVIDERS": providers,
                "AMUX_HOME_WORKER_SECONDS": str(HOME_WORKER_SECONDS),
            },
            worker_env={"AMUX_RUNTIME_PROVIDERS": providers},
        ) as cluster:
            status, body = cluster.rpc("projects.add", name="web", remote=url, provider="edit")
            assert status == 200, body
            yield ProjectCluster(cluster, remote)
    finally:
        daemon.stop()


def test_a_project_conversation_stays_on_its_host_and_moves_by_its_branch_once_that_host_is_gone(
    project_cluster: ProjectCluster,
) -> None:
    project = project_cluster
    first, session = project.submit("write app.py print('first')\n")
    assert project.finished(first)["state"] == "succeeded"
    branch = f"amux/{short_id(session)}"
    (home,) = [i for i in (0, 1) if project.checkout(i, session).is_dir()]
    other = 1 - home
    # The branch is on the git host, where any worker can fetch it; the other host has no
    # checkout of the conversation.
    assert git("show", f"{branch}:app.py", cwd=project.remote) == "print('first')\n"
    assert not project.checkout(other, session).exists()

    # Keep the home host busy with a held plain turn, and the other host idle.
    held = project.plain("hold\n")
    wait_until(lambda: project.held(0) or project.held(1), 60)
    if project.held(other):
        pinned = project.plain("hold\n")  # the other host is busy: this one goes home
        wait_until(lambda: project.held(home), 60)
        (project.held(other)[0].parent / ".open").touch()
        assert project.finished(held)["state"] == "succeeded"
        held = pinned
    # The conversation's next turn waits for its home host, although the other one is idle:
    # a plain turn submitted after it runs there and finishes first.
    second, _ = project.submit("write b.txt second\n", session)
    plain = project.plain("write plain.txt plain\n")
    assert project.finished(plain)["state"] == "succeeded"
    assert list((project.cluster.work_dirs[other] / "workspaces").glob("*/plain.txt"))
    assert project.state(second) == "queued"
    assert not project.checkout(other, session).exists()
    (project.held(home)[0].parent / ".open").touch()
    assert project.finished(held)["state"] == "succeeded"
    done = project.finished(second)
    assert done["state"] == "succeeded", done
    assert {f["path"] for f in done["result"]["branch"]["files"]} == {"app.py", "b.txt"}
    assert project.checkout(home, session).joinpath("b.txt").read_text() == "second\n"

    # The home host dies for good. Once it has not been seen for AMUX_HOME_WORKER_SECONDS, the
    # other host takes the conversation's next turn in a checkout made from the branch the
    # git host has: the Agent finds both earlier turns' work, and its own change is pushed.
    project.cluster.workers[home].kill()
    third, _ = project.submit("write c.txt third\nshow b.txt\n", session)
    moved = project.finished(third, 120)
    assert moved["state"] == "succeeded", (moved, project.cluster.logs())
    texts = [event["text"] for event in moved["events"]]
    gone, taker = f"host-{home + 1}", f"host-{other + 1}"
    assert moves_to_worker(gone, taker, HOME_WORKER_SECONDS) in texts
    answer = moved["result"]["text"]
    assert "second" in answer and f"on {branch} after: amux: turn {second}" in answer
    assert {f["path"] for f in moved["result"]["branch"]["files"]} == {"app.py", "b.txt", "c.txt"}
    assert project.checkout(other, session).joinpath("app.py").read_text() == "print('first')\n"
    assert git("show", f"{branch}:c.txt", cwd=project.remote) == "third\n"
    assert git("log", "-1", "--format=%s", branch, cwd=project.remote).strip() == (
        f"amux: turn {third}"
    )
