"""With AMUX_RUNTIME_LAUNCHER=agent-sandbox a worker runs each turn's Agent in a pod of its own:
it claims the pod from agent-sandbox, streams the Agent's stdio over the pod's exec websocket,
and deletes the claim whenever the turn ends. Against a loopback Kubernetes API (the official
``kubernetes`` client, a real worker, a real stand-in Agent run by the fake's exec)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client
from pydantic import ValidationError

from bot.service.app import create_app
from hub.client import HubClient
from hub.config import HubSettings
from hub.rpc import HUB
from hub.services import Hub
from runtime_bridge.checkouts import short_id
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.kube_launcher import (
    EXECUTION_LABEL,
    WORKER_LABEL,
    KubernetesLauncher,
    PodInput,
)
from runtime_bridge.launchers import configured_launcher
from runtime_bridge.providers import LOCAL
from runtime_bridge.providers.errors import SandboxUnavailable
from runtime_bridge.worker import Worker
from tests.conftest import free_port, git, stand_in, until
from tests.fakes.kube_api import FakeKube
from tests.runtime_bridge.test_projects_e2e import operator_repo

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NAMESPACE = "agents"
WORKER_POD = ("amux-worker-7d9f-abcde", "0b6f7e62-3c3e-4a8e-9d4c-2f1d5e6a7b8c")


@dataclass
class Cluster:
    hub: Hub
    kube: FakeKube
    owner_id: str

    async def submit(self, provider: str, prompt: str) -> str:
        execution, _ = await self.hub.executions.submit(
            principal_id=self.owner_id, submitted_by=self.owner_id, provider=provider, prompt=prompt
        )
        return execution.id


# Says which of the paths it is given (one a line) it finds, edits its workspace, and counts its
# turns in its HOME: what a resumed conversation finds there is what its earlier turns left.
PROBE = """#!/bin/sh
said=""
while IFS= read -r path; do
  [ -n "$path" ] || continue
  if [ -e "$path" ]; then said="$said $path=present"; else said="$said $path=absent"; fi
done
echo "written in the pod" >> edited.txt
echo turn >> "$HOME/turns"
echo "turns=$(wc -l < "$HOME/turns")$said"
"""
# Changes its workspace and its HOME, and leaves the workspace a link to outside it.
ESCAPING = """#!/bin/sh
cat > /dev/null
echo "changed in the pod" > edited.txt
echo turn >> "$HOME/turns"
ln -s ../../runs escape
echo done
"""

# Edits its workspace, then says so in the file its prompt names (outside the work directory,
# which the fake's pods share with this host) and waits to be stopped.
HELD = """#!/bin/sh
IFS= read -r started
echo "written before the Stop" > edited.txt
touch "$started"
exec sleep 600
"""


@asynccontextmanager
async def cluster(
    tmp_path: Path, kube: FakeKube, ready_seconds: float = 30.0, back_bytes: int = 2 * 1024**3
) -> AsyncIterator[Cluster]:
    """A Hub, the fake API server and a worker launching through agent-sandbox, serving."""
    kube.work_dir = tmp_path / "host-a"
    failing = tmp_path / "failing_agent.sh"
    failing.write_text("#!/bin/sh\ncat > /dev/null\necho 'no model answered' >&2\nexit 3\n")
    failing.chmod(0o755)
    probe = tmp_path / "probe_agent.sh"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    escaping = tmp_path / "escaping_agent.sh"
    escaping.write_text(ESCAPING)
    escaping.chmod(0o755)
    held = tmp_path / "held_agent.sh"
    held.write_text(HELD)
    held.chmod(0o755)
    providers = {
        "held": str(held),
        "echo": str(stand_in("echo_agent.sh")),
        "gate": str(stand_in("gate_agent.sh")),
        "failing": str(failing),
        "probe": str(probe),
        "escaping": str(escaping),
        "edit": str(stand_in("project_agent.sh")),
    }
    settings = RuntimeSettings(
        name="host-a",
        slots=1,
        providers=providers,
        sandbox="off",
        launcher="agent-sandbox",
        # The fake runs each pod's command on this host: the worker's pod address is loopback.
        pod_ip="127.0.0.1",
        gateway_port=free_port(),
        work_dir=tmp_path / "host-a",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Short leases: the worker hears of a Stop at its next heartbeat.
    app = create_app(
        HubSettings(home=tmp_path / "amux-home", lease_seconds=3),
        RuntimeSettings(providers=providers, in_process=False),
    )
    async with (
        TestClient(TestServer(app, host="127.0.0.1", port=port)),
        TestClient(TestServer(kube.app(), host="127.0.0.1")) as api,
    ):
        configuration = client.Configuration()
        configuration.host = str(api.make_url("")).rstrip("/")
        launcher = KubernetesLauncher(
            configuration, NAMESPACE, "amux-agent", "host-a", WORKER_POD, ready_seconds, back_bytes
        )
        hub = app[HUB]
        owner = hub.state.owner()
        assert owner is not None
        service = hub.state.add_principal("host-a", "service")
        token, _ = hub.state.issue_credential(service.id, "cli", label="host-a")
        hub_client = HubClient(url, token, timeout=60)
        worker = Worker(hub_client, url, settings, tmp_path / "host-a", launcher=launcher)
        stop = asyncio.Event()
        serving = asyncio.create_task(worker.run_forever(stop))
        try:
            yield Cluster(hub, kube, owner.id)
        finally:
            stop.set()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await hub_client.close()
            launcher.close()


async def test_a_turns_answer_streams_back_from_its_own_pod_and_its_claim_is_then_deleted(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        execution = await c.submit("echo", "hello from a pod")
        await until(lambda: c.hub.executions.describe(execution).finished, seconds=60)
        done = c.hub.executions.describe(execution)
        assert done.state == "succeeded", done.error
        assert done.result is not None and done.result.text == "hello from a pod"
        # One claim, labelled with the worker and the turn, owned by the worker's pod: deleted.
        (claim,) = [e.obj for e in kube.events if e.kind == "ADDED"]
        metadata = claim["metadata"]
        assert metadata["labels"][WORKER_LABEL] == "host-a"
        assert metadata["labels"][EXECUTION_LABEL] == execution
        (reference,) = metadata["ownerReferences"]
        assert (reference["kind"], reference["name"], reference["uid"]) == ("Pod", *WORKER_POD)
        assert claim["spec"] == {"warmPoolRef": {"name": "amux-agent"}}
        assert kube.deleted == [metadata["name"]] and not kube.claims
        # The pod ran a script streamed in with the run directory, which removed itself.
        (_, (shell, script), *_) = kube.execs
        assert shell == "/bin/sh"
        (root,) = kube.roots.values()
        assert kube.work_dir is not None
        in_pod = root / Path(script).relative_to(kube.work_dir)
        await until(lambda: not Path(script).exists() and not in_pod.exists())


async def test_an_agent_that_fails_in_its_pod_fails_the_turn_with_its_status_and_stderr(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        execution = await c.submit("failing", "hello")
        await until(lambda: c.hub.executions.describe(execution).finished, seconds=60)
        done = c.hub.executions.describe(execution)
        assert done.state == "failed"
        assert done.error == "failing exited with status 3: no model answered"
        assert len(kube.deleted) == 1 and not kube.claims


async def test_a_stop_deletes_the_turns_claim_and_ends_its_agent(tmp_path: Path) -> None:
    kube = FakeKube()
    gate = tmp_path / "gate"
    async with cluster(tmp_path, kube) as c:
        execution = await c.submit("gate", f"{gate}\n")
        await until(lambda: Path(f"{gate}.runs").exists(), seconds=60)
        assert len(kube.claims) == 1

        await c.hub.executions.cancel(execution)
        await until(lambda: c.hub.executions.describe(execution).finished, seconds=30)
        assert c.hub.executions.describe(execution).state == "cancelled"
        await until(lambda: not kube.claims)
        assert len(kube.deleted) == 1
        # The Agent went with its pod, killed mid-turn.
        await until(lambda: not any(kube.running.values()))


async def test_a_claim_an_earlier_run_of_the_worker_left_is_deleted_when_it_starts(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    labels = {WORKER_LABEL: "host-a", EXECUTION_LABEL: "lost-turn"}
    kube.add_claim({"metadata": {"name": "amux-left", "labels": labels}, "spec": {}})
    someone_elses = {WORKER_LABEL: "host-b"}
    kube.add_claim({"metadata": {"name": "amux-other", "labels": someone_elses}, "spec": {}})
    async with cluster(tmp_path, kube):
        await until(lambda: "amux-left" in kube.deleted, seconds=30)
        assert "amux-other" in kube.claims


async def test_a_pod_that_never_becomes_ready_fails_the_turn_and_its_claim_is_deleted(
    tmp_path: Path,
) -> None:
    kube = FakeKube(ready=False)
    async with cluster(tmp_path, kube, ready_seconds=2) as c:
        execution = await c.submit("echo", "hello")
        await until(lambda: c.hub.executions.describe(execution).finished, seconds=60)
        done = c.hub.executions.describe(execution)
        assert done.state == "failed"
        assert done.error is not None
        assert "no sandbox pod was ready for this turn within 2 s" in done.error
        assert "SandboxNotReady" in done.error
        assert len(kube.deleted) == 1 and not kube.claims
        assert not kube.execs


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"sandbox": "bwrap", "pod_ip": "10.0.0.7"}, "set AMUX_RUNTIME_SANDBOX=off"),
        ({"sandbox": "off"}, "needs AMUX_RUNTIME_POD_IP"),
    ],
)
def test_agent_sandbox_settings_that_cannot_work_are_refused_with_what_to_set(
    settings: dict[str, str], said: str
) -> None:
    with pytest.raises(ValidationError, match=said):
        RuntimeSettings(launcher="agent-sandbox", **settings)  # type: ignore[arg-type]


def test_agents_in_pods_are_told_the_gateway_at_the_worker_pods_address() -> None:
    settings = RuntimeSettings(launcher="agent-sandbox", sandbox="off", pod_ip="10.0.0.7")
    assert settings.gateway_address() == ("0.0.0.0", 8790, "10.0.0.7")
    assert RuntimeSettings().gateway_address() == ("127.0.0.1", 0, None)


def test_a_worker_without_a_cluster_to_reach_refuses_to_start_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    settings = RuntimeSettings(launcher="agent-sandbox", sandbox="off", pod_ip="10.0.0.7")
    with pytest.raises(SandboxUnavailable, match="found no cluster") as raised:
        configured_launcher(settings)
    assert raised.value.code == "sandbox_unavailable"


def test_a_worker_outside_a_cluster_uses_its_kubeconfig_and_its_contexts_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ai"}}
                ],
                "current-context": "x",
            }
        )
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    settings = RuntimeSettings(
        launcher="agent-sandbox", sandbox="off", pod_ip="10.0.0.7", name="w-1"
    )
    launcher = configured_launcher(settings)
    assert isinstance(launcher, KubernetesLauncher)
    try:
        assert (launcher.namespace, launcher.worker, launcher.owner) == ("ai", "w-1", None)
    finally:
        launcher.close()
    assert configured_launcher(RuntimeSettings()) is LOCAL


async def test_writing_to_an_agent_whose_pod_went_away_fails_at_once_rather_than_waiting() -> None:
    def send(data: bytes) -> None:
        raise ConnectionResetError("the pod is gone")

    stdin = PodInput(send, lambda: None)
    try:
        stdin.write(b"the prompt")
        with pytest.raises(BrokenPipeError):
            await stdin.drain()
        with pytest.raises(BrokenPipeError):
            async with asyncio.timeout(5):
                stdin.write(b"a reply to a permission request")
                await stdin.drain()
    finally:
        await stdin.aclose()


async def turn(c: Cluster, provider: str, prompt: str, session: str | None = None) -> Any:
    execution, conversation = await c.hub.executions.submit(
        principal_id=c.owner_id,
        submitted_by=c.owner_id,
        provider=provider,
        prompt=prompt,
        session_id=session,
    )
    await until(lambda: c.hub.executions.describe(execution.id).finished, seconds=60)
    return c.hub.executions.describe(execution.id), conversation.id


async def test_an_agent_in_its_pod_finds_no_other_conversations_files_and_its_own_come_back(
    tmp_path: Path,
) -> None:
    work = tmp_path / "host-a"
    planted = [
        work / "workspaces" / "someone-else" / "notes.txt",
        work / "runs" / "another-turn" / "agent-config" / "memory" / "connection.json",
        work / "sessions" / "another-conversation" / "home" / ".claude.json",
    ]
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not yours")
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        ask = "\n".join(str(p) for p in planted) + "\n"
        done, session = await turn(c, "probe", ask)
        assert done.state == "succeeded", done.error
        assert done.result is not None
        assert done.result.text == "turns=1" + "".join(f" {p}=absent" for p in planted)
        # What the Agent wrote in its pod is the worker's once the turn is over.
        (edited,) = (work / "workspaces").glob("*/edited.txt")
        assert edited.read_text() == "written in the pod\n"
        # The next turn of the conversation finds what the first left: its HOME came back.
        again, _ = await turn(c, "probe", "again", session)
        assert again.state == "succeeded", again.error
        assert again.result is not None and again.result.text == "turns=2"
        assert edited.read_text() == "written in the pod\n" * 2
        assert len(kube.deleted) == 2 and not kube.claims


async def test_a_workspace_the_pod_leaves_with_a_link_out_of_it_is_refused_and_the_turn_fails(
    tmp_path: Path,
) -> None:
    work = tmp_path / "host-a"
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        done, _ = await turn(c, "probe", "first")
        assert done.state == "succeeded", done.error
        (edited,) = (work / "workspaces").glob("*/edited.txt")

        # Another conversation of the same person: the same workspace.
        refused, conversation = await turn(c, "escaping", "hello")
        assert refused.state == "failed"
        assert refused.error is not None
        assert refused.error.startswith(f"what the pod left in {edited.parent} was refused")
        assert "the worker keeps the copies from before the turn" in refused.error
        # The worker's copy is the one from before the turn; nothing was left beside it.
        assert edited.read_text() == "written in the pod\n"
        assert not (edited.parent / "escape").is_symlink()
        # Nor did its HOME come back, whose native session would tell of edits that were not.
        home = work / "sessions" / conversation / "home"
        assert home.is_dir() and not (home / "turns").exists()
        assert sorted(p.name for p in edited.parent.parent.iterdir()) == [edited.parent.name]
        assert not kube.claims


async def test_a_project_conversations_agent_edits_its_checkout_in_its_pod_and_its_branch_has_it(
    tmp_path: Path,
) -> None:
    repo = operator_repo(tmp_path / "web")
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        await c.hub.projects.add("web", by=c.owner_id, path=str(repo), provider="edit")
        execution, session = await c.hub.executions.submit(
            principal_id=c.owner_id,
            submitted_by=c.owner_id,
            provider="edit",
            prompt="write app.py print('from a pod')\n",
            project="web",
        )
        await until(lambda: c.hub.executions.describe(execution.id).finished, seconds=60)
        done = c.hub.executions.describe(execution.id)
        assert done.state == "succeeded", done.error
        branch = f"amux/{short_id(session.id)}"
        # git ran in the pod over the default branch's objects the checkout borrows.
        assert done.result is not None and done.result.text is not None
        assert f"on {branch} after: start" in done.result.text
        work = done.result.branch
        assert work is not None and work.branch == branch
        assert [(f.path, f.added, f.removed) for f in work.files] == [("app.py", 1, 1)]
        assert git("show", f"{branch}:app.py", cwd=repo) == "print('from a pod')\n"
        assert git("show", "main:app.py", cwd=repo) == "print('hello')\n"


async def test_a_pods_tree_larger_than_the_bound_is_not_taken_back_and_the_turn_fails(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    async with cluster(tmp_path, kube, back_bytes=8 * 1024) as c:
        done, _ = await turn(c, "probe", "hello")
        assert done.state == "failed"
        assert done.error is not None
        assert "is larger than 8 KiB: nothing of the turn's files was brought back" in done.error
        assert not list((tmp_path / "host-a" / "workspaces").glob("*/edited.txt"))
        assert not kube.claims


async def test_a_stopped_agents_edits_come_back_before_its_pod_is_deleted(tmp_path: Path) -> None:
    started = tmp_path / "started"
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        execution = await c.submit("held", f"{started}\n")
        await until(started.exists, seconds=60)
        await c.hub.executions.cancel(execution)
        await until(lambda: c.hub.executions.describe(execution).finished, seconds=30)
        assert c.hub.executions.describe(execution).state == "cancelled"
        await until(lambda: not kube.claims)
        (edited,) = (tmp_path / "host-a" / "workspaces").glob("*/edited.txt")
        assert edited.read_text() == "written before the Stop\n"
        await until(lambda: not any(kube.running.values()))


async def test_a_conversation_working_outside_the_work_directory_is_refused_before_a_claim(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kube = FakeKube()
    async with cluster(tmp_path, kube) as c:
        execution, _ = await c.hub.executions.submit(
            principal_id=c.owner_id,
            submitted_by=c.owner_id,
            provider="probe",
            prompt="hello",
            cwd=str(elsewhere),
        )
        await until(lambda: c.hub.executions.describe(execution.id).finished, seconds=60)
        done = c.hub.executions.describe(execution.id)
        assert done.state == "failed"
        assert done.error == (
            f"{elsewhere} lies outside the worker's work directory {tmp_path / 'host-a'}: a "
            "sandbox pod is given only the launch's own directories within it"
        )
        assert not kube.events and not kube.execs
