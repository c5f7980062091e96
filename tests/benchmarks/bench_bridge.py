"""Runtime bridge overhead: launching an Agent through a worker, and the MCP hop per memory call.

1. Launch: time from the worker's claim to the Agent's first model request, for claude, codex
   and pi in a bound (memory on) launch, minus the bare CLI's own time from spawn to its first
   request against the same fake model with the same prompt. Bare codex is ``codex exec``; the
   bridge drives ``codex app-server``, so codex has two more baselines: a bare ``codex
   app-server`` driven as the bridge drives it (``initialize``, ``thread/start``, ``turn/start``)
   in the same reused ``CODEX_HOME`` as ``codex exec``, and the same in a new ``CODEX_HOME``
   each time, as a conversation's first turn has (each conversation keeps its own). The
   bridge's share includes the Hub calls (binding, delegated credential), per-run files, and for
   claude and codex the start of ``amux mcp`` when the CLI waits for its tools before the first
   request.
2. Sandbox: what bubblewrap and the launch's bounds add to a launch, measured on their own:
   building the sandbox (finding installations) and the launch's cgroup, spawning ``/bin/true``
   through the real first step (``agent_exec``: cgroup, limits, keyring, seccomp filter) and
   sandbox argv, and removing the cgroup, against the same spawn without them (``setpriv``, as
   an unsandboxed launch runs, as the same uid).
3. Memory call: ``amux.memory_get`` through the real MCP client SDK → ``amux mcp`` (stdio) → Hub,
   against ``HubClient.memory_get`` straight to the Hub; plus the cold start of ``amux mcp``.
4. Model gateway: one streamed model request (the whole SSE answer read) to the scripted model
   directly, and through the worker's gateway (placeholder swapped, usage counted), interleaved
   on kept-alive connections as a CLI makes them; p50 and p99 per round, the median of the
   rounds with their spread.
5. Network: what a launch's own network namespace and its relay add. Per launch, the same
   sandboxed spawn of ``/bin/true`` with ``--unshare-net``, the relay binding its doors and the
   worker serving them (open and close), against the same sandbox sharing the host's network;
   per model request, a streamed answer read by a client inside the namespace through the model
   door (relay, Unix socket, worker) to the gateway, against the same client outside it straight
   to the gateway, interleaved round by round.
6. CLI start: ``amux --version`` to its exit, and ``amux mcp`` and Claude's permission prompt
   (``runtime_bridge/permission_shim.py``, as a launch's MCP config starts it) from spawn until
   they answer ``initialize`` and ``tools/list`` through the real MCP client SDK (what a Claude
   launch waits for before its first model request), against a bare ``python -c pass``.

Run: .venv/bin/python tests/benchmarks/bench_bridge.py [--samples N] [--only gateway|network|cli]
Targets: < 100 ms added per launch, < 30 ms of it the sandbox's, < 20 ms added per memory call,
< 2 ms added per model request at p50; the network namespace and relay < 30 ms per launch and
< 2 ms per model request at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from hub.client import HubClient
from hub.config import OWNER_TOKEN_FILE
from hub.contract import Claim, Session
from hub.state import State
from runtime_bridge import cgroups
from runtime_bridge.bounds import bounds_from_settings
from runtime_bridge.cgroups import LaunchGroup
from runtime_bridge.codex_rpc import CodexRpc
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.doors import LaunchDoors
from runtime_bridge.egress import Egress
from runtime_bridge.gateway import Gateway, operator_upstreams
from runtime_bridge.launch import LaunchSite, write_seccomp_file
from runtime_bridge.launch_env import DEFAULT_PASS_ENV
from runtime_bridge.network import MODEL, AllowList, door_url
from runtime_bridge.providers import LaunchPlan, LaunchRequest, build_plan
from runtime_bridge.providers.claude import PERMISSION_SHIM
from runtime_bridge.providers.plan import GatewayPass
from runtime_bridge.providers.process import launch_command
from runtime_bridge.worker import Worker
from tests.benchmarks.harness import (
    AMUX,
    REPO,
    enable_memory_offline,
    free_port,
    header,
    ratio,
    stopping,
    time_awaits,
    timing,
    wait_healthy,
)
from tests.fakes.model_server import FakeModelServer
from tests.runtime_bridge.conftest import find_agent_cli
from tests.runtime_bridge.test_providers_codex import codex_config
from tests.runtime_bridge.test_providers_pi import pi_agent_source

PROMPT = "Say hello."
PI_ARGS = ["--provider", "fake", "--model", "fake-model"]
PROVIDERS = ("pi", "claude", "codex")
# The CLIs that start their MCP servers before the first model request.
MCP_CLIS = ("claude", "codex")
MEMORY_CALLS = 50
DOCUMENT = "# Bench\n" + "a line of remembered text\n" * 40
LAUNCH_TARGET_MS = 100.0
SANDBOX_TARGET_MS = 30.0
CALL_TARGET_MS = 20.0
GATEWAY_TARGET_MS = 2.0
GATEWAY_REQUESTS = 300
NETWORK_LAUNCH_TARGET_MS = 30.0
NETWORK_REQUEST_TARGET_MS = 2.0
NETWORK_REQUESTS = 100
# A stand-in Agent for the per-request figure: N streamed model requests on one kept-alive
# connection (stdlib only, as fast to start inside the sandbox as outside), each one's seconds.
REQUEST_CLIENT = """
import http.client, json, sys, time, urllib.parse
url, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
parts = urllib.parse.urlsplit(url)
message = {"role": "user", "content": "hi"}
body = json.dumps({"model": "fake", "stream": True, "messages": [message]})
connection = http.client.HTTPConnection(parts.hostname, parts.port)
took = []
for _ in range(count):
    start = time.perf_counter()
    connection.request("POST", "/v1/messages?beta=true", body, {"x-api-key": key,
        "content-type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 200, answer.status
    took.append(time.perf_counter() - start)
print(json.dumps(took))
"""
CLI_SAMPLES = 7


class TimedWorker(Worker):
    """The real worker, noting when each claim arrived (the start of the launch's clock)."""

    claimed_at: float = 0.0

    async def claim(self) -> Claim | None:
        claimed = await super().claim()
        if claimed is not None:
            self.claimed_at = time.perf_counter()
        return claimed


def offline_env(home: Path, model_url: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-bench",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "OPENAI_API_KEY": "sk-openai-bench",
        "PI_OFFLINE": "1",
    }


def first_request_after(model: FakeModelServer, start: float) -> float | None:
    arrivals = [r.arrived for r in model.requests if r.arrived >= start]
    return min(arrivals) if arrivals else None


async def wait_for(predicate: Callable[[], Any], within: float = 120.0) -> Any:
    deadline = time.monotonic() + within
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing happened within {within}s")
        await asyncio.sleep(0.005)
    return value


MINIMAL_MCP = [sys.executable, "-I", "-S", str(REPO / "tests" / "fakes" / "minimal_mcp.py")]


def bare_command(
    provider: str, root: Path, model: FakeModelServer, minimal_mcp: bool = False
) -> tuple[list[str], dict[str, str], str | None]:
    """The CLI run by hand against the fake: argv, environment, stdin; with ``minimal_mcp``,
    configured with one MCP server that answers everything at once."""
    env = offline_env(root / "bare-home", model.base_url)
    executable = find_agent_cli(provider)
    if provider == "pi":
        # A fresh agent directory per run, as each bridged session gets its own.
        agent_dir = Path(tempfile.mkdtemp(prefix="bare-pi-agent-", dir=root))
        source = pi_agent_source(root / "bare", model)
        shutil.copytree(
            source, agent_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("sessions")
        )
        env["PI_CODING_AGENT_DIR"] = str(agent_dir)
        return [executable, "-p", "--mode", "json", *PI_ARGS], env, PROMPT
    if provider == "claude":
        argv = [executable, "-p", "--output-format", "stream-json", "--verbose"]
        if minimal_mcp:
            config = root / "minimal-mcp.json"
            servers = {"minimal": {"command": MINIMAL_MCP[0], "args": MINIMAL_MCP[1:]}}
            config.write_text(json.dumps({"mcpServers": servers}))
            argv += ["--mcp-config", str(config), "--strict-mcp-config"]
        return argv, env, PROMPT
    codex_home = root / ("bare-codex-home-mcp" if minimal_mcp else "bare-codex-home")
    codex_home.mkdir(exist_ok=True)
    config_text = codex_config(root / "bare", model).read_text()
    if minimal_mcp:
        config_text += (
            f"\n[mcp_servers.minimal]\ncommand = {json.dumps(MINIMAL_MCP[0])}\n"
            f"args = {json.dumps(MINIMAL_MCP[1:])}\n"
        )
    (codex_home / "config.toml").write_text(config_text)
    env["CODEX_HOME"] = str(codex_home)
    return [executable, "exec", "--skip-git-repo-check", PROMPT], env, None


async def bare_launch(
    provider: str, root: Path, model: FakeModelServer, minimal_mcp: bool = False
) -> float:
    """Seconds from spawning the CLI to its first model request."""
    argv, env, stdin = bare_command(provider, root, model, minimal_mcp)
    workdir = root / "bare-work"
    workdir.mkdir(exist_ok=True)
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert process.stdin is not None
    process.stdin.write((stdin or "").encode())
    process.stdin.close()
    arrived = await wait_for(lambda: first_request_after(model, start))
    await asyncio.wait_for(process.wait(), 120)
    return float(arrived - start)


async def bare_app_server(root: Path, model: FakeModelServer, fresh_home: bool) -> float:
    """Seconds from spawning ``codex app-server`` (the bare run's config) to its first model
    request, driven as the bridge drives it; with ``fresh_home``, in a ``CODEX_HOME`` of its own
    that Codex fills on this first start, as a conversation's first turn does."""
    argv, env, _ = bare_command("codex", root, model)
    if fresh_home:
        home = Path(tempfile.mkdtemp(prefix="bare-codex-home-", dir=root))
        shutil.copy(Path(env["CODEX_HOME"]) / "config.toml", home / "config.toml")
        env["CODEX_HOME"] = str(home)
    workdir = root / "bare-work"
    workdir.mkdir(exist_ok=True)
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        argv[0],
        "app-server",
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    rpc = CodexRpc(process.stdout, process.stdin)
    try:
        await rpc.call("initialize", {"clientInfo": {"name": "bench", "version": "0"}})
        await rpc.notify("initialized")
        params = {"cwd": str(workdir), "approvalPolicy": "never", "sandbox": "danger-full-access"}
        opened = await rpc.call("thread/start", params)
        text = [{"type": "text", "text": PROMPT}]
        await rpc.call("turn/start", {"threadId": opened["thread"]["id"], "input": text})
        arrived = await wait_for(lambda: first_request_after(model, start))
        async for note in rpc.notifications():
            if note.method == "turn/completed":
                break
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 120)
        await rpc.close()
    return float(arrived - start)


async def bridged_launch(
    provider: str,
    worker: TimedWorker,
    owner: HubClient,
    model: FakeModelServer,
    binding: str | None,
) -> float:
    """Seconds from the worker's claim to the Agent's first model request."""
    submitted = await owner.call("executions.submit", provider=provider, prompt=PROMPT)
    execution_id = submitted["execution"]["id"]
    worker.claimed_at = 0.0
    claimed_at = await wait_for(lambda: worker.claimed_at)
    arrived = await wait_for(lambda: first_request_after(model, claimed_at))
    while True:
        answer = await owner.call(
            "executions.watch", execution_id=execution_id, after=0, wait_seconds=20
        )
        if answer["state"] in ("succeeded", "failed", "cancelled"):
            break
    if answer["state"] != "succeeded":
        raise RuntimeError(f"{provider} turn {answer['state']}: {answer.get('error')}")
    if (answer.get("result") or {}).get("binding") != binding:
        raise RuntimeError(f"{provider} launch was not bound as {binding}: {answer}")
    return float(arrived - claimed_at)


def amux(home: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env["AMUX_HOME"] = str(home)
    done = subprocess.run([AMUX, *args], env=env, capture_output=True, check=True)
    return done.stdout.decode().strip()


@contextmanager
def serving_hub(home: Path, log_path: Path, memory: bool = True) -> Iterator[str]:
    """``amux serve`` with no worker of its own (memory on unless told); yields its URL."""
    if memory:
        enable_memory_offline(home)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env.update({"AMUX_HOME": str(home), "AMUX_RUNTIME_IN_PROCESS": "false"})
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [AMUX, "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    with stopping(proc):
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/healthz", proc)
        yield url


def import_cost() -> float:
    """Median seconds a fresh interpreter spends importing the MCP server module."""
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", "import runtime_bridge.mcp_server"], cwd=REPO, check=True
        )
        middle = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], cwd=REPO, check=True)
        samples.append((middle - start) - (time.perf_counter() - middle))
    return statistics.median(samples)


@contextlib.asynccontextmanager
async def bridge(
    root: Path, model: FakeModelServer, memory: bool
) -> AsyncIterator[tuple[TimedWorker, HubClient]]:
    """A Hub (memory on or off) and a real worker in this process, for timing launches."""
    name = "bound" if memory else "unbound"
    home = root / f"{name}-amux-home"
    home.mkdir(mode=0o700)
    State(home / "state.sqlite3").close()  # The admin commands only open a Hub's state.
    amux(home, "principal", "add", "bench-runtime", "--service")
    service_token = amux(home, "token", "issue", "bench-runtime")
    amux(home, "principal", "add", "bench-owner", "--owner")
    owner_token = amux(home, "token", "issue", "bench-owner")
    settings = RuntimeSettings(
        name="bench",
        claude=find_agent_cli("claude"),
        codex=find_agent_cli("codex"),
        pi=find_agent_cli("pi"),
        pi_args=PI_ARGS,
        pi_agent_dir=pi_agent_source(root / "bridged", model),
        codex_config=codex_config(root / "bridged", model),
        pass_env=[*DEFAULT_PASS_ENV, "PI_OFFLINE"],
        work_dir=root / f"{name}-runtime",
    )
    base_env = offline_env(root / "bridged-home", model.base_url)
    with serving_hub(home, root / f"{name}-hub.log", memory) as url:
        async with (
            HubClient(url, service_token, timeout=60) as service,
            HubClient(url, owner_token, timeout=60) as owner,
        ):
            worker = TimedWorker(service, url, settings, root / f"{name}-runtime", base_env)
            stop = asyncio.Event()
            running = asyncio.create_task(worker.run_forever(stop))
            try:
                yield worker, owner
            finally:
                stop.set()
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running


async def launches(root: Path, samples: int, providers: tuple[str, ...]) -> None:
    print(f"\nlaunch: spawn or claim → first model request, {samples} samples each")
    async with (
        FakeModelServer() as model,
        bridge(root, model, memory=False) as (plain, plain_owner),
        bridge(root, model, memory=True) as (bound, bound_owner),
    ):
        for provider in providers:
            # One warm-up each, so disk caches favour no side.
            await bare_launch(provider, root, model)
            await bridged_launch(provider, plain, plain_owner, model, None)
            await bridged_launch(provider, bound, bound_owner, model, "global")
            bare = timing([await bare_launch(provider, root, model) for _ in range(samples)])
            # The CLI's own MCP start-up, with a server that costs next to nothing: what a
            # memory launch pays before anything of amux's runs.
            minimal = (
                timing([await bare_launch(provider, root, model, True) for _ in range(samples)])
                if provider in MCP_CLIS
                else None
            )
            servers = (
                [
                    timing([await bare_app_server(root, model, fresh) for _ in range(samples)])
                    for fresh in (False, True)
                ]
                if provider == "codex"
                else []
            )
            unbound = timing(
                [
                    await bridged_launch(provider, plain, plain_owner, model, None)
                    for _ in range(samples)
                ]
            )
            with_memory = timing(
                [
                    await bridged_launch(provider, bound, bound_owner, model, "global")
                    for _ in range(samples)
                ]
            )
            added = (with_memory.median - bare.median) * 1000
            verdict = "meets" if added < LAUNCH_TARGET_MS else "misses"
            print(f"  {provider}")
            print(f"    bare CLI          {bare.ms()}")
            if minimal is not None:
                print(
                    f"    bare CLI + minimal MCP server {minimal.ms()}  "
                    f"added {(minimal.median - bare.median) * 1000:7.1f} ms (the CLI's MCP start)"
                )
            for server, home in zip(servers, ("reused", "new"), strict=False):
                print(
                    f"    bare app-server turn, {home} CODEX_HOME {server.ms()}  "
                    f"added {(server.median - bare.median) * 1000:7.1f} ms"
                )
            print(
                f"    bridged, no memory {unbound.ms()}  "
                f"added {(unbound.median - bare.median) * 1000:7.1f} ms"
            )
            print(
                f"    bridged, memory    {with_memory.ms()}  added {added:7.1f} ms "
                f"({ratio(with_memory.median, bare.median)}) {verdict} < {LAUNCH_TARGET_MS:.0f} ms"
            )
            if minimal is not None:
                print(
                    f"    amux's own share: memory launch minus bare + minimal MCP"
                    f" {(with_memory.median - minimal.median) * 1000:7.1f} ms"
                )
            if servers:
                fresh_server = servers[1]
                print(
                    f"    memory launch minus the bare app-server turn in a new CODEX_HOME"
                    f" {(with_memory.median - fresh_server.median) * 1000:7.1f} ms"
                )


async def memory_calls(root: Path) -> None:
    home = root / "mcp-amux-home"
    with serving_hub(home, root / "mcp-hub.log") as url:
        token = (home / OWNER_TOKEN_FILE).read_text().strip()
        async with HubClient(url, token, binding="global") as hub:
            await hub.memory_upsert("topics/bench.md", DOCUMENT, "absent")
            direct = await time_awaits(lambda: hub.memory_get("topics/bench.md"), MEMORY_CALLS)

        agent_home = root / "mcp-agent-home"
        agent_home.mkdir()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "AMUX_HOME": str(agent_home),
            "AMUX_HUB_URL": url,
            "AMUX_TOKEN": token,
            "AMUX_MEMORY_BINDING": "global",
        }
        cli = StdioServerParameters(command=AMUX, args=["mcp"], env=env, cwd=REPO)
        module = StdioServerParameters(
            command=sys.executable, args=["-m", "runtime_bridge.mcp_server"], env=env, cwd=REPO
        )
        cold: dict[str, list[float]] = {"amux mcp": [], "python -m runtime_bridge.mcp_server": []}
        hops: list[float] = []
        with (root / "mcp-stderr.log").open("a", encoding="utf-8") as errlog:
            for _ in range(3):
                for name, params in (
                    ("amux mcp", cli),
                    ("python -m runtime_bridge.mcp_server", module),
                ):
                    start = time.perf_counter()
                    async with (
                        stdio_client(params, errlog=errlog) as (read, write),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        await session.list_tools()
                        cold[name].append(time.perf_counter() - start)
                        if name != "amux mcp":
                            continue
                        check = await session.call_tool(
                            "amux.memory_get", {"path": "topics/bench.md"}
                        )
                        if check.is_error:
                            raise RuntimeError(f"amux mcp failed: {check}")
                        hop = await time_awaits(
                            lambda: session.call_tool(
                                "amux.memory_get", {"path": "topics/bench.md"}
                            ),
                            MEMORY_CALLS,
                        )
                        hops.append(hop.median)
    imported = await asyncio.to_thread(import_cost)
    hop_median = statistics.median(hops)
    added = (hop_median - direct.median) * 1000
    verdict = "meets" if added < CALL_TARGET_MS else "misses"
    print(f"\nmemory call: memory.get of a {len(DOCUMENT)}-byte document, {MEMORY_CALLS} calls")
    print(f"  direct HubClient     {direct.ms()}")
    print(f"  MCP → amux mcp → Hub {hop_median * 1000:6.1f} ms (median of 3 server runs)")
    print(
        f"  added per call {added:6.1f} ms ({ratio(hop_median, direct.median)}) "
        f"{verdict} < {CALL_TARGET_MS:.0f} ms"
    )
    print("MCP server cold start (spawn → initialize → tools listed), 3 runs each:")
    for name, samples in cold.items():
        print(f"  {name:36} {', '.join(f'{c * 1000:.0f}' for c in samples)} ms")
    print(f"  importing runtime_bridge.mcp_server alone: {imported * 1000:.0f} ms")


def spread(samples: list[float]) -> str:
    """Median with the min–max of the runs, in ms."""
    ms = sorted(s * 1000 for s in samples)
    return f"{statistics.median(ms):6.1f} ms (min {ms[0]:.1f}, max {ms[-1]:.1f})"


async def spawn_seconds(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.DEVNULL
    )
    if await process.wait() != 0:
        raise RuntimeError(f"{argv[0]} failed")
    return time.perf_counter() - start


def launch_site(root: Path, name: str) -> tuple[LaunchSite, Session]:
    """A worker's launch site under ``root`` with one Session's directories and run ``e1``
    made, and the seccomp filter written, as a worker has them before its first launch."""
    work_dir = root / f"{name}-runtime"
    settings = RuntimeSettings(name="bench", claude=find_agent_cli("claude"), work_dir=work_dir)
    site = LaunchSite(settings, work_dir, amux_home=root / f"{name}-home")
    session = Session("s1", "p1", "claude", None, None, None, "unbound", None)
    for directory in (site.workspace(session), site.session_home("s1"), site.run_dir("e1")):
        directory.mkdir(parents=True)
    write_seccomp_file(work_dir)
    return site, session


def claude_launch(
    site: LaunchSite, session: Session, gateway: GatewayPass | None = None
) -> tuple[LaunchRequest, LaunchPlan]:
    """Run ``e1``'s request and plan for Claude, as a worker would run it: on a root host, as
    the Principal's own uid."""
    request = site.request(
        provider="claude",
        prompt="",
        session=session,
        execution_id="e1",
        memory=None,
        base_env=dict(os.environ),
        own_home=True,
        gateway=gateway,
    )
    return request, dataclasses.replace(build_plan(request), run_as=site.agent_identity("p1"))


async def sandbox_cost(root: Path, samples: int) -> None:
    if shutil.which("bwrap") is None:
        print("\nsandbox: bwrap is not installed; skipped")
        return
    site, session = launch_site(root, "sandbox")
    request, plain = claude_launch(site, session)
    bounds = bounds_from_settings(site.settings)
    builds: list[float] = []
    removals: list[float] = []
    bare: list[float] = []
    boxed: list[float] = []
    for n in range(samples + 1):  # The first round warms caches and is dropped.
        start = time.perf_counter()
        sandboxed = site.sandbox(plain, request)
        group = LaunchGroup.create(f"bench-{os.getpid()}-{n}", bounds)
        procs = group.procs_files if group is not None else ()
        sandboxed = dataclasses.replace(sandboxed, confine=site.confinement(procs))
        built = time.perf_counter() - start
        unboxed = await spawn_seconds(launch_command(plain, ["/bin/true"]), dict(plain.env))
        inside = await spawn_seconds(launch_command(sandboxed, ["/bin/true"]), dict(plain.env))
        start = time.perf_counter()
        if group is not None:
            group.hit()
            group.remove()
        removals.append(time.perf_counter() - start)
        builds.append(built)
        bare.append(unboxed)
        boxed.append(inside)
    builds, removals, bare, boxed = builds[1:], removals[1:], bare[1:], boxed[1:]
    added = [b + r + (x - u) for b, r, x, u in zip(builds, removals, boxed, bare, strict=True)]
    verdict = "meets" if statistics.median(added) * 1000 < SANDBOX_TARGET_MS else "misses"
    print(
        f"\nsandbox: spawn of /bin/true with and without bwrap and the launch's bounds "
        f"({cgroups.mechanism()}), {samples} interleaved runs"
    )
    print(f"  build the sandbox argv and the launch's cgroup {spread(builds)}")
    print(f"  remove the launch's cgroup  {spread(removals)}")
    print(f"  spawn, no sandbox           {spread(bare)}")
    print(f"  spawn, sandboxed and bounded {spread(boxed)}")
    print(
        f"  added per launch            {spread(added)} "
        f"({ratio(statistics.median(boxed), statistics.median(bare))} of the bare spawn) "
        f"{verdict} < {SANDBOX_TARGET_MS:.0f} ms"
    )


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def gateway_cost(rounds: int) -> None:
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with FakeModelServer() as model:
        env = {"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "sk-operator-bench"}
        async with Gateway(operator_upstreams(env)) as gateway:
            grant = gateway.open()
            key = grant.keys["anthropic"]

            async def streamed(session: aiohttp.ClientSession, url: str) -> float:
                start = time.perf_counter()
                async with session.post(url, json=body, headers={"x-api-key": key}) as answer:
                    await answer.read()
                    assert answer.status == 200, answer.status
                return time.perf_counter() - start

            names = ("direct p50", "direct p99", "gateway p50", "gateway p99")
            stats: dict[str, list[float]] = {name: [] for name in names}
            added: list[float] = []
            async with aiohttp.ClientSession() as session:
                direct_url = f"{model.base_url}/v1/messages?beta=true"
                gateway_url = f"{gateway.url}/v1/messages?beta=true"
                for n in range(rounds + 1):  # The first round warms connections and is dropped.
                    direct: list[float] = []
                    through: list[float] = []
                    for _ in range(GATEWAY_REQUESTS):
                        direct.append(await streamed(session, direct_url))
                        through.append(await streamed(session, gateway_url))
                    if n == 0:
                        continue
                    for name, samples in (("direct", direct), ("gateway", through)):
                        stats[f"{name} p50"].append(percentile(samples, 0.5))
                        stats[f"{name} p99"].append(percentile(samples, 0.99))
                    added.append(percentile(through, 0.5) - percentile(direct, 0.5))
            grant.close()
    counted = grant.usage.requests
    verdict = "meets" if statistics.median(added) * 1000 < GATEWAY_TARGET_MS else "misses"
    print(
        f"\ngateway: a streamed /v1/messages answer, {GATEWAY_REQUESTS} requests each way per "
        f"round, {rounds} rounds (median of rounds, min–max)"
    )
    for name, samples in stats.items():
        print(f"  {name:24} {spread(samples)}")
    print(f"  added per request at p50  {spread(added)} {verdict} < {GATEWAY_TARGET_MS:.0f} ms")
    print(f"  usage counted for {counted} of {GATEWAY_REQUESTS * (rounds + 1)} gateway requests")


async def network_cost(root: Path, samples: int, rounds: int) -> None:
    if shutil.which("bwrap") is None:
        print("\nnetwork: bwrap is not installed; skipped")
        return
    site, session = launch_site(root, "network")
    async with FakeModelServer() as model:
        env = {"ANTHROPIC_BASE_URL": model.base_url, "ANTHROPIC_API_KEY": "sk-operator-bench"}
        async with Gateway(operator_upstreams(env)) as gateway:
            grant = gateway.open()
            request, plain = claude_launch(site, session, grant.access)

            async def nothing(host: str, port: int, reason: str) -> None:
                return None

            def doors(plan: LaunchPlan) -> LaunchDoors:
                egress = Egress(AllowList(), nothing)
                return LaunchDoors(
                    plan.doors,
                    gateway_url=gateway.url,
                    hub_url="http://127.0.0.1:9",
                    egress=egress,
                    owner=plan.run_as,
                )

            shared: list[float] = []
            isolated: list[float] = []
            for n in range(samples + 1):  # The first round warms caches and is dropped.
                start = time.perf_counter()
                host = site.sandbox(plain, request, isolate=False)
                await spawn_seconds(launch_command(host, ["/bin/true"]), dict(host.env))
                host_took = time.perf_counter() - start
                start = time.perf_counter()
                own = site.sandbox(plain, request, isolate=True)
                async with doors(own):
                    await spawn_seconds(launch_command(own, ["/bin/true"]), dict(own.env))
                own_took = time.perf_counter() - start
                if n:
                    shared.append(host_took)
                    isolated.append(own_took)
            added = [i - h for i, h in zip(isolated, shared, strict=True)]
            own = site.sandbox(plain, request, isolate=True)
            key = grant.keys["anthropic"]
            client = [sys.executable, "-I", "-S", "-c", REQUEST_CLIENT]
            stats: dict[str, list[float]] = {
                "direct p50": [],
                "direct p99": [],
                "relay p50": [],
                "relay p99": [],
            }
            request_added: list[float] = []
            async with doors(own):
                for n in range(rounds + 1):
                    direct = await client_timings(
                        [*client, gateway.url, key, str(NETWORK_REQUESTS)], dict(own.env)
                    )
                    through = await client_timings(
                        launch_command(own, [*client, door_url(MODEL), key, str(NETWORK_REQUESTS)]),
                        dict(own.env),
                    )
                    if n == 0:
                        continue
                    for name, measured in (("direct", direct), ("relay", through)):
                        stats[f"{name} p50"].append(percentile(measured, 0.5))
                        stats[f"{name} p99"].append(percentile(measured, 0.99))
                    request_added.append(percentile(through, 0.5) - percentile(direct, 0.5))
            grant.close()
    launch_ms = statistics.median(added) * 1000
    launch_verdict = "met" if launch_ms < NETWORK_LAUNCH_TARGET_MS else "missed"
    request_verdict = (
        "met" if statistics.median(request_added) * 1000 < NETWORK_REQUEST_TARGET_MS else "missed"
    )
    print(
        f"\nnetwork: a sandboxed spawn of /bin/true with its own namespace, relay and doors vs "
        f"sharing the host's network, {samples} interleaved launches (median, min–max)"
    )
    print(f"  sandboxed, host network      {spread(shared)}")
    print(f"  sandboxed, own namespace     {spread(isolated)}")
    print(
        f"  added per launch             {spread(added)} target < "
        f"{NETWORK_LAUNCH_TARGET_MS:.0f} ms: {launch_verdict}"
    )
    print(
        f"  a streamed /v1/messages answer, {NETWORK_REQUESTS} requests per round each way, "
        f"{rounds} rounds ({rounds * NETWORK_REQUESTS} per way; median of rounds, min–max)"
    )
    for name, measured in stats.items():
        print(f"  {name:28} {spread(measured)}")
    print(
        f"  added per request at p50     {spread(request_added)} target < "
        f"{NETWORK_REQUEST_TARGET_MS:.0f} ms: {request_verdict}"
    )


async def client_timings(argv: list[str], env: dict[str, str]) -> list[float]:
    """The per-request seconds the stand-in client printed."""
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"the request client failed: {err.decode(errors='replace')[-500:]}")
    return [float(seconds) for seconds in json.loads(out)]


async def tools_listed_seconds(argv: list[str], env: dict[str, str], errlog: TextIO) -> float:
    """Seconds from spawning ``argv`` until it has answered initialize and tools/list."""
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=REPO)
    start = time.perf_counter()
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = (await session.list_tools()).tools
        elapsed = time.perf_counter() - start
    if not listed:
        raise RuntimeError(f"{' '.join(argv)} listed no tools")
    return elapsed


async def cli_start(root: Path, samples: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    # Nothing listens there: listing the tools must not wait for the Hub.
    env.update({"AMUX_HOME": str(root / "cli-home"), "AMUX_HUB_URL": "http://127.0.0.1:9"})
    env["AMUX_TOKEN"] = "bench"
    rows: dict[str, list[float]] = {
        "python -c pass": [],
        "amux --version": [],
        "amux mcp: tools listed": [],
        "permission prompt: tools listed": [],
    }
    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230 (opening devnull does not block)
        for n in range(samples + 1):  # The first round warms the page cache and is dropped.
            bare = await spawn_seconds([sys.executable, "-c", "pass"], env)
            version = await spawn_seconds([AMUX, "--version"], env)
            mcp = await tools_listed_seconds([AMUX, "mcp"], env, errlog)
            prompt = await tools_listed_seconds(
                [sys.executable, "-I", "-S", str(PERMISSION_SHIM)], env, errlog
            )
            if n == 0:
                continue
            for name, seconds in zip(rows, (bare, version, mcp, prompt), strict=True):
                rows[name].append(seconds)
    print(f"\ncli: start of the amux entry point, {samples} interleaved runs (median, min–max)")
    for name, measured in rows.items():
        print(f"  {name:38} {spread(measured)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=("launch", "calls", "sandbox", "gateway", "network", "cli"),
        default=None,
    )
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    args = parser.parse_args()
    header("Runtime bridge overhead")
    with tempfile.TemporaryDirectory(prefix="amux-bench-bridge-") as tmp:
        root = Path(tmp)
        if args.only in (None, "cli"):
            await cli_start(root, max(args.samples, CLI_SAMPLES))
        if args.only in (None, "gateway"):
            await gateway_cost(max(args.samples, 5))
        if args.only in (None, "sandbox"):
            await sandbox_cost(root, max(args.samples, 15))
        if args.only in (None, "network"):
            await network_cost(root, max(args.samples, 15), max(args.samples, 3))
        if args.only in (None, "calls"):
            await memory_calls(root)
        if args.only in (None, "launch"):
            await launches(root, args.samples, tuple(args.providers.split(",")))


if __name__ == "__main__":
    asyncio.run(main())
