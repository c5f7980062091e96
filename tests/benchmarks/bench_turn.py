"""A whole Feishu turn, stage by stage, with 1, 10 and 50 conversations running at once.

Run: .venv/bin/python tests/benchmarks/bench_turn.py [--quick] [--repeats N] [--claude 1,10]
     [--levels 50] [--transports webhook]

The service is the real ``create_app`` as ``amux serve`` builds it (Feishu on, the local Runtime
worker in a process of its own with the bubblewrap sandbox and its default slots; ``--worker
in-process`` runs it inside the service's process instead, for a same-moment comparison), on a
loopback port and an event loop thread of its own. The fake Feishu and the scripted model share
another thread, so their arrival times are not held up by the service's loop; the signed webhook
events are posted from the main thread. The stand-in's rows are measured twice: with events posted
to the webhook, and (rows ``stand-in/lc``) with the service on Feishu's long connection, the fake
pushing each event over its WebSocket and the SDK's ack ending "event → ack". Each conversation is
one member's private chat, every member enrolled beforehand (a first contact's enrolment is
``bench_feishu``'s row). Memory is on for Claude; off for the stand-in, a declared provider that
runs without memory, so that no turn of it adds a notice card. Each row has a warm-up round, then
``--repeats`` rounds of its conversations posted at once (one conversation alone: a few in a row
per round), rounds more than a second apart (the length of Feishu's rate windows, which the bot's
pacing keeps to). Per conversation:

  - event → ack: posting the signed event to its HTTP answer;
  - event → progress card: to the fake's arrival of the bot's reply carrying the card;
  - claim → first model request: the Hub leasing the turn to the worker, to the scripted model's
    first request carrying the conversation's prompt (the stand-in Agent makes none: to the
    stand-in writing its start file, whose mtime is the kernel's coarse clock, a few ms);
  - answer → final card: the model's last request of the turn (the scripted model answers at
    once) or the stand-in's start (it answers at once), to the fake's arrival of the card change
    that shows the finished turn;
  - end to end: event → that final card.

Two Agents: ``tests/fakes/turn_agent.sh``, a stand-in that answers at once, and the real Claude CLI
against the scripted model. Hub CPU per turn is the process's CPU time over a round, less the
threads of the fakes and of this driver, over the round's turns; the worker's is its process's
(``/proc``), its children (the Agents, the sandbox's helpers) not counted; RSS is sampled from
/proc every ``SAMPLE_SECONDS`` for this process (the Hub, plus the fakes' few MB) and for each
turn's process tree (summed VmRSS, so pages shared between processes count once per process).

Baselines, in the same run: a bare aiohttp handler answering the same signed events at the same
concurrency; one bare lark-oapi reply to the fake; the bare CLI from spawn to its first model
request and from the last to its exit (and ``claude --version``, and with one MCP server that
answers at once: the CLI's own MCP start); the bare stand-in from spawn to its start file.

Targets: progress card p99 < 300 ms after the event with 50 conversations; final card
p99 < 250 ms after the answer; launch < 100 ms over the bare CLI. Figures are printed, never
asserted; the script exits non-zero only if a turn fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
import pytest
from aiohttp import web
from pydantic import SecretStr

from bot.service.heap import freeze_startup_heap
from tests.benchmarks.bench_feishu import LoopThread, percentile, start_baseline
from tests.benchmarks.harness import REPO, free_port, header
from tests.fakes.feishu import FakeFeishu, Recorded
from tests.fakes.feishu_events import FeishuSigner
from tests.fakes.model_server import Answer, FakeModelServer

APP_ID = "cli_bench_turn"
BOT_OPEN_ID = "ou_bench_bot"
signer = FeishuSigner(encrypt_key="ek_turn", verification_token="vt_turn", app_id=APP_ID)
TURN_AGENT = REPO / "tests" / "fakes" / "turn_agent.sh"
ANSWER = "The bench answer."
SAMPLE_SECONDS = 0.05
# Feishu's rate windows are one second long: rounds start further apart than that, so a round's
# burst finds them as a burst after a quiet second would, not holding the last round's calls.
ROUND_GAP_SECONDS = 1.1
TURN_SECONDS = 300.0
T = TypeVar("T")


# -- the service -----------------------------------------------------------------------------


def member(n: int) -> dict[str, Any]:
    return {
        "sender_open_id": f"ou_m{n}",
        "sender_union_id": f"on_m{n}",
        "sender_user_id": f"u_m{n}",
    }


def seed(home: Path, members: int, memory: bool) -> None:
    """The Hub an operator set up: an owner, and every member enrolled by alias."""
    from hub.config import HubSettings
    from hub.state import State

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = State(HubSettings(home=home).state_path)
    try:
        state.save_setting("memory.enabled", memory)
        state.add_principal("owner", "user", owner=True)
        for n in range(members):
            principal = state.add_principal(f"m{n}", "user")
            state.add_alias(principal.id, "feishu_union_id", member(n)["sender_union_id"])
    finally:
        state.close()


def feishu_settings(fake: FakeFeishu, provider: str, mode: str = "webhook") -> Any:
    from bot.config import FeishuSettings

    return FeishuSettings(
        mode=mode,
        app_id=APP_ID,
        app_secret=SecretStr(fake.app_secret),
        encrypt_key=SecretStr(signer.encrypt_key),
        verification_token=SecretStr(signer.verification_token),
        domain=fake.url,
        language="en_us",
        provider=provider,
    )


@dataclass
class Service:
    runner: web.AppRunner
    url: str
    claims: dict[str, float]
    # The local worker's own process, as `amux serve` runs it; None when it runs in this one.
    worker_pid: int | None = None


async def start_service(
    home: Path,
    fake: FakeFeishu,
    provider: str,
    runtime: Any,
    mode: str = "webhook",
    worker_process: bool = True,
) -> Service:
    """``create_app`` as ``amux serve`` runs it, noting when the Hub leases each turn."""
    from bot.service.app import WORKER_PROCESS, create_app
    from bot.service.feishu_app import FEISHU
    from bot.service.logs import AccessLogger
    from hub.config import HubSettings
    from hub.rpc import HUB

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    listening = asyncio.Event()
    app = create_app(
        HubSettings(home=home),
        runtime_settings=runtime,
        worker_url=url,
        feishu_settings=feishu_settings(fake, provider, mode),
        hub_listening=listening,
        worker_process=worker_process,
    )
    runner = web.AppRunner(
        app, handle_signals=False, shutdown_timeout=1.0, access_log_class=AccessLogger
    )
    await runner.setup()
    freeze_startup_heap()
    claims: dict[str, float] = {}
    executions = app[HUB].executions
    leased = executions.claim

    async def claim(*args: Any, **kwargs: Any) -> Any:
        claimed = await leased(*args, **kwargs)
        if claimed is not None:
            found = LABEL.findall(claimed.prompt)
            if found:
                claims[found[-1]] = time.monotonic()
        return claimed

    # The lease's moment is the launch's start; the Hub keeps no timestamp of it.
    executions.claim = claim  # type: ignore[method-assign]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    listening.set()
    await asyncio.wait_for(app[FEISHU].identity_known.wait(), 30)
    worker_pid = None
    if worker_process:
        await asyncio.wait_for(app[WORKER_PROCESS].started.wait(), 30)
        worker_pid = app[WORKER_PROCESS].pid
    return Service(runner, url, claims, worker_pid)


# -- one round -------------------------------------------------------------------------------


@dataclass
class Turn:
    label: str
    message_id: str
    body: bytes
    headers: dict[str, str]
    sent: float = 0.0
    acked: float = 0.0
    progress: float | None = None
    claimed: float | None = None
    first_request: float | None = None
    answered: float | None = None
    final: float | None = None
    failed: str | None = None
    # The event as the long connection carries it (unsigned: the connection is the app's own).
    payload: dict[str, Any] | None = None


LABEL = re.compile(r"bench-[a-z]+-\d+-\d+-\d{3}")
STANDIN, CLAUDE = "stand-in", "claude"
LONG_CONNECTION = "long_connection"
# A row of turns whose events came over the long connection is named "<agent>/lc".
LONG_CONNECTION_ROW = "/lc"


def prompt_of(agent: str, label: str) -> str:
    # The stand-in's start file is relative: it lands in the shared workspace it starts in.
    return f"turn t-{label} {label}" if agent == STANDIN else f"Say hello ({label})."


def answer_of(agent: str, label: str) -> str:
    return f"done {label}" if agent == STANDIN else ANSWER


class Watch:
    """Reads the fakes' records as they grow, filling in each turn's stage times."""

    def __init__(self, fake: FakeFeishu, model: FakeModelServer, service: Service) -> None:
        self.fake, self.model, self.service = fake, model, service
        self.turns: dict[str, Turn] = {}
        self.by_message: dict[str, Turn] = {}
        self.by_card: dict[str, Turn] = {}
        self._seen_feishu = len(fake.requests)
        self._seen_model = len(model.requests)
        self.agent = ""

    def expect(self, agent: str, turns: list[Turn]) -> None:
        self.agent = agent
        self.turns = {t.label: t for t in turns}
        self.by_message = {t.message_id: t for t in turns}
        self.by_card = {}

    def poll(self) -> None:
        records = self.fake.requests
        while self._seen_feishu < len(records):
            self._feishu(records[self._seen_feishu])
            self._seen_feishu += 1
        requests = self.model.requests
        while self._seen_model < len(requests):
            request = requests[self._seen_model]
            self._seen_model += 1
            labels = LABEL.findall(json.dumps(request.body))
            turn = self.turns.get(labels[-1]) if labels else None
            if turn is not None:
                if turn.first_request is None:
                    turn.first_request = request.arrived
                turn.answered = request.arrived
        for label, turn in self.turns.items():
            if turn.claimed is None and label in self.service.claims:
                turn.claimed = self.service.claims[label]

    def _feishu(self, record: Recorded) -> None:
        path = record.path
        body = record.body if isinstance(record.body, dict) else {}
        if record.method == "POST" and path.endswith("/reply"):
            turn = self.by_message.get(path.split("/")[-2])
            if turn is None or turn.progress is not None:
                return
            turn.progress = record.at
            content = json.loads(str(body.get("content") or "{}"))
            if content.get("type") == "card":
                self.by_card[content["data"]["card_id"]] = turn
            else:
                turn.failed = f"the first reply is no progress card: {body}"
        elif record.method == "PUT" and path.startswith("/open-apis/cardkit/v1/cards/"):
            turn = self.by_card.get(path.split("/")[-1])
            if turn is None or turn.final is not None:
                return
            card = str((body.get("card") or {}).get("data") or "")
            if answer_of(self.agent, turn.label) in card:
                turn.final = record.at
            elif "Failed" in card or "Something went wrong" in card:
                turn.final = record.at
                turn.failed = card[:500]

    def done(self) -> bool:
        return all(t.final is not None or t.failed for t in self.turns.values())


# -- process figures -------------------------------------------------------------------------


def read_rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0  # Gone, or a kernel thread.


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as listed:
                found += [int(p) for p in listed.read().split()]
        except OSError:
            pass
    return found


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as listed:
            return listed.read()
    except OSError:
        return b""


OWN_CMDLINE = cmdline(os.getpid())


def tree_rss_kb(root: int) -> int:
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        # A child forked but not yet exec'd shares this process's pages: no launch's own.
        if cmdline(pid) != OWN_CMDLINE:
            total += read_rss_kb(pid)
        stack += children(pid)
    return total


class Sampler:
    """Samples this process's RSS and each new child process tree's (a turn's launch)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # Whose children are turns' launches: the worker's process, or this one.
        self.launcher = self.pid
        self.hub_kb: list[int] = []
        self.trees: dict[int, int] = {}
        self.running: list[int] = []
        self._before: set[int] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # Children older than the round (the worker's warm `amux mcp`) are no turn's.
        self._before = set(children(self.launcher))
        self.hub_kb, self.trees, self.running = [], {}, []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.hub_kb.append(read_rss_kb(self.pid))
            roots = [c for c in children(self.launcher) if c not in self._before]
            self.running.append(len(roots))
            for root in roots:
                self.trees[root] = max(self.trees.get(root, 0), tree_rss_kb(root))
            await asyncio.sleep(SAMPLE_SECONDS)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def thread_cpu() -> float:
    return time.thread_time()


def process_cpu(pid: int | None) -> float:
    """A process's own CPU seconds (user and system, not its children's); 0 without one."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            # After the command's closing parenthesis: utime and stime are fields 14 and 15.
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- rounds ----------------------------------------------------------------------------------


@dataclass
class Round:
    turns: list[Turn]
    hub_cpu: float
    # The local worker's process, when it runs in one of its own (launches, the Agents' output).
    worker_cpu: float
    hub_kb: int
    tree_kb: list[int]
    running: int
    # Calls the bot made to Feishu: its client paces them, 50 a second app-wide.
    feishu_calls: int


@dataclass
class Bench:
    fakes: LoopThread
    server: LoopThread
    fake: FakeFeishu
    model: FakeModelServer
    http: aiohttp.ClientSession
    workspace: Path
    sampler: Sampler = field(default_factory=Sampler)
    transport: str = "webhook"

    async def post(self, url: str, turn: Turn) -> None:
        turn.sent = time.monotonic()
        if self.transport == LONG_CONNECTION and turn.payload is not None:
            # Pushed from the fake's own loop, as Feishu's server would: the ack is the SDK's.
            ack = await self.fakes.run(self.fake.push(turn.payload))
            turn.acked = time.monotonic()
            if ack.get("code") != 200:
                turn.failed = f"long connection ack {ack.get('code')}"
            return
        async with self.http.post(
            f"{url}/feishu/events", data=turn.body, headers=turn.headers
        ) as r:
            await r.read()
            turn.acked = time.monotonic()
            if r.status != 200:
                turn.failed = f"webhook answered {r.status}"

    def make_turns(self, agent: str, level: int, rep: int, wave: int, first: int) -> list[Turn]:
        turns = []
        for i in range(level):
            # A member per wave: one alone in a row would soon reach its messages per minute.
            who = member(first + wave * level + i)
            label = f"bench-{agent.replace('-', '')}-{level}-{rep * 10 + wave}-{i:03d}"
            text = prompt_of(agent, label)
            if agent == STANDIN:
                (self.workspace / f"t-{label}.all").touch()
            chat = f"oc_p2p_{who['sender_open_id']}"
            stored = self.fake.add_message(chat, text, sender_open_id=who["sender_open_id"])
            payload = signer.message(text, **who, chat_id=chat, message_id=stored.message_id)
            body, headers = signer.sign(payload)
            turns.append(Turn(label, stored.message_id, body, headers, payload=payload))
        return turns

    async def run_round(
        self,
        service: Service,
        watch: Watch,
        agent: str,
        level: int,
        rep: int,
        waves: int,
        first: int,
    ) -> Round:
        turns: list[Turn] = []
        calls = len(self.fake.requests)
        self.sampler.launcher = service.worker_pid or self.sampler.pid
        self.sampler.start()
        worker = process_cpu(service.worker_pid)
        process, driver = time.process_time(), thread_cpu()
        fakes = await self.fakes.run(_thread_cpu())
        for wave in range(waves):
            batch = self.make_turns(agent, level, rep, wave, first)
            watch.expect(agent, batch)
            await asyncio.gather(*(self.post(service.url, t) for t in batch))
            deadline = time.monotonic() + TURN_SECONDS
            while not watch.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                watch.poll()
            watch.poll()
            turns += batch
        hub_cpu = (
            (time.process_time() - process)
            - (thread_cpu() - driver)
            - (await self.fakes.run(_thread_cpu()) - fakes)
        )
        worker_cpu = process_cpu(service.worker_pid) - worker
        await self.sampler.stop()
        if agent == STANDIN:
            self.standin_times(turns)
        for turn in turns:
            if turn.final is None and turn.failed is None:
                turn.failed = f"no final card within {TURN_SECONDS:.0f} s"
        return Round(
            turns,
            hub_cpu,
            worker_cpu,
            max(self.sampler.hub_kb, default=0),
            list(self.sampler.trees.values()),
            max(self.sampler.running, default=0),
            len(self.fake.requests) - calls,
        )

    def standin_times(self, turns: list[Turn]) -> None:
        """The stand-in's start, from its start file: it answers at once after writing it."""
        offset = time.time() - time.monotonic()
        for turn in turns:
            started = self.workspace / f"t-{turn.label}"
            if started.exists():
                turn.first_request = turn.answered = started.stat().st_mtime - offset


async def _thread_cpu() -> float:
    return thread_cpu()


# -- baselines -------------------------------------------------------------------------------


async def bare_handler(bench: Bench, level: int, waves: int, repeats: int) -> list[list[float]]:
    """Per repeat, the answer times of a handler that reads the body and answers 200."""
    runner, url = await bench.server.run(start_baseline())
    try:
        rounds = []
        for rep in range(repeats + 1):
            samples = []
            for _ in range(waves):
                batch = [
                    Turn("", "", *signer.sign(signer.message("hello", **member(i))))
                    for i in range(level)
                ]
                await asyncio.gather(*(bench.post(url, t) for t in batch))
                samples += [t.acked - t.sent for t in batch]
            if rep:  # The first opens the connections.
                rounds.append(samples)
        return rounds
    finally:
        await bench.server.run(runner.cleanup())


def bare_replies(fake: FakeFeishu, count: int) -> list[float]:
    """Seconds of one lark-oapi reply call to the fake, as the bot's client makes it."""
    import lark_oapi as lark
    from lark_oapi.core.enum import AccessTokenType

    client = (
        lark.Client.builder()
        .app_id(APP_ID)
        .app_secret(fake.app_secret)
        .domain(fake.url)
        .log_level(lark.LogLevel.WARNING)
        .build()
    )
    card = json.dumps(
        {"schema": "2.0", "body": {"elements": [{"tag": "markdown", "content": "…"}]}}
    )
    samples = []
    for n in range(count + 1):  # The first fetches the token and opens the connection.
        parent = fake.add_message("oc_bare_reply", "hello")
        request = (
            lark.BaseRequest.builder()
            .http_method(lark.HttpMethod.POST)
            .uri("/open-apis/im/v1/messages/:message_id/reply")
            .paths({"message_id": parent.message_id})
            .headers({"Content-Type": "application/json; charset=utf-8"})
            .token_types({AccessTokenType.TENANT})
            .body({"msg_type": "interactive", "content": card, "reply_in_thread": True})
            .build()
        )
        start = time.perf_counter()
        raw = client.request(request).raw
        if raw is None or raw.status_code != 200:
            raise RuntimeError(f"the bare reply failed: {raw and raw.content!r}")
        if n:
            samples.append(time.perf_counter() - start)
    return samples


@dataclass
class BareAgent:
    # Spawn → first model request (the stand-in: → its start file).
    start: list[float] = field(default_factory=list)
    # The model's last request (the stand-in: its start file) → the process's exit.
    finish: list[float] = field(default_factory=list)
    version: list[float] = field(default_factory=list)
    # Spawn → first request with one MCP server that answers at once: the CLI's own MCP start.
    minimal_mcp: list[float] = field(default_factory=list)


async def bare_run(
    root: Path, model: FakeModelServer, minimal_mcp: bool = False
) -> tuple[float, float]:
    """The CLI run by hand against the scripted model: spawn → first request, last → exit."""
    from tests.benchmarks.bench_bridge import bare_command

    argv, env, stdin = bare_command("claude", root, model, minimal_mcp)
    workdir = root / "bare-work"
    workdir.mkdir(exist_ok=True)
    seen = len(model.requests)
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
    await asyncio.wait_for(process.communicate((stdin or "").encode()), TURN_SECONDS)
    ended = time.perf_counter()
    arrivals = [r.arrived for r in model.requests[seen:]]
    if process.returncode != 0 or not arrivals:
        raise RuntimeError(f"the bare claude failed ({process.returncode})")
    return min(arrivals) - start, ended - max(arrivals)


async def bare_claude(root: Path, model: FakeModelServer, count: int) -> BareAgent:
    from tests.runtime_bridge.conftest import find_agent_cli

    bare = BareAgent()
    for n in range(count + 1):  # The first warms the disk caches.
        started, finished = await bare_run(root, model)
        with_mcp, _ = await bare_run(root, model, minimal_mcp=True)
        start = time.perf_counter()
        version = await asyncio.create_subprocess_exec(
            find_agent_cli("claude"), "--version", stdout=subprocess.DEVNULL
        )
        await version.wait()
        if n:
            bare.version.append(time.perf_counter() - start)
            bare.start.append(started)
            bare.finish.append(finished)
            bare.minimal_mcp.append(with_mcp)
    return bare


async def bare_standin(workspace: Path, count: int) -> BareAgent:
    bare = BareAgent()
    for n in range(count + 1):
        started = workspace / f"bare-{n}"
        (workspace / f"bare-{n}.all").touch()
        start = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            str(TURN_AGENT),
            cwd=workspace,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        await process.communicate(f"turn {started.name} {n}\n".encode())
        ended = time.perf_counter()
        offset = time.time() - time.perf_counter()
        wrote = started.stat().st_mtime - offset
        if n:
            bare.start.append(wrote - start)
            bare.finish.append(ended - wrote)
    return bare


# -- report ----------------------------------------------------------------------------------

STAGES: dict[str, Callable[[Turn], float | None]] = {
    "event → ack": lambda t: t.acked - t.sent,
    "event → progress card": lambda t: None if t.progress is None else t.progress - t.sent,
    "claim → first model request": lambda t: (
        None if t.first_request is None or t.claimed is None else t.first_request - t.claimed
    ),
    "answer → final card": lambda t: (
        None if t.final is None or t.answered is None else t.final - t.answered
    ),
    "event → final card": lambda t: None if t.final is None else t.final - t.sent,
}
TARGETS = {
    "event → progress card": "p99 < 300 ms at 50",
    "claim → first model request": "< +100 ms over bare",
    "answer → final card": "p99 < 250 ms",
}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def spread(values: list[float]) -> str:
    """Median with the min–max of the repeats, in ms."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{ms(values[0])}"
    return f"{ms(statistics.median(values))} ({ms(min(values))}–{ms(max(values))})"


def percentiles(rounds: list[list[float]]) -> tuple[list[float], list[float]]:
    """Each repeat's p50 and p99."""
    kept = [r for r in rounds if r]
    return [percentile(r, 50) for r in kept], [percentile(r, 99) for r in kept]


@dataclass
class Baselines:
    handler: dict[int, list[list[float]]]
    reply: list[float]
    agents: dict[str, BareAgent]


def baseline_of(stage: str, row: str, level: int, base: Baselines) -> tuple[str, float | None]:
    """What the stage is compared with, and its median in seconds."""
    agent = row.removesuffix(LONG_CONNECTION_ROW)
    bare = base.agents.get(agent)
    if stage == "event → ack":
        _, p99 = percentiles(base.handler[level])
        return "bare handler p99", statistics.median(p99)
    if stage == "event → progress card":
        return "one bare reply", statistics.median(base.reply)
    if stage == "claim → first model request" and bare and bare.start:
        return "bare CLI start" if agent == CLAUDE else "bare stand-in start", statistics.median(
            bare.start
        )
    if stage == "answer → final card" and bare and bare.finish:
        return "bare answer → exit", statistics.median(bare.finish)
    return "", None


def print_table(results: dict[tuple[str, int], list[Round]], base: Baselines, slots: int) -> None:
    print(
        f"\nper conversation, each repeat's p50 and p99; shown: median over repeats (min–max), ms;"
        f" worker slots: {slots}\n(the stand-in makes no model request: its start file stands for"
        f" its first request and its answer; {LONG_CONNECTION_ROW}: the events came over the long"
        " connection)"
    )
    head = (
        f"{'agent':<9} {'conv':>4}  {'stage':<28} {'p50':>15} {'p99':>15}  "
        f"{'baseline (median)':<26} {'p99 vs it':>9}  target"
    )
    print(head)
    print("-" * len(head))
    for (agent, level), rounds in results.items():
        for stage, measure in STAGES.items():
            per_round = [
                [v for v in (measure(t) for t in r.turns if t.failed is None) if v is not None]
                for r in rounds
            ]
            p50, p99 = percentiles(per_round)
            label, baseline = baseline_of(stage, agent, level, base)
            if baseline is None or not p99:
                versus = ""
            elif stage == "event → ack":
                versus = f"{statistics.median(p99) / baseline:.2f}x"
            else:
                versus = f"{(statistics.median(p99) - baseline) * 1000:+.0f}"
            shown = f"{label} {ms(baseline)}" if baseline is not None else ""
            print(
                f"{agent:<9} {level:>4}  {stage:<28} {spread(p50):>15} {spread(p99):>15}  "
                f"{shown:<26} {versus:>9}  {TARGETS.get(stage, '')}"
            )
    print(
        "\nHub (this process, the fakes' threads and the driver's excluded), the local worker's "
        "process, and turns' trees:"
    )
    print(
        f"{'agent':<9} {'conv':>4}  {'CPU per turn ms':>16} {'worker CPU/turn ms':>19} "
        f"{'both':>16} {'Hub RSS peak MB':>16} "
        f"{'turn tree RSS peak MB, median / max':>36} {'trees':>6} {'at once':>8} "
        f"{'Feishu calls/turn':>18}"
    )
    for (agent, level), rounds in results.items():
        cpu = [r.hub_cpu / len(r.turns) for r in rounds]
        worker = [r.worker_cpu / len(r.turns) for r in rounds]
        both = [(r.hub_cpu + r.worker_cpu) / len(r.turns) for r in rounds]
        hub = [r.hub_kb / 1024 for r in rounds]
        trees = [kb / 1024 for r in rounds for kb in r.tree_kb]
        tree = f"{statistics.median(trees):.0f} / {max(trees):.0f}" if trees else "none sampled"
        print(
            f"{agent:<9} {level:>4}  {spread(cpu):>16} {spread(worker):>19} {spread(both):>16} "
            f"{statistics.median(hub):16.0f} {tree:>36} {len(trees):>6} "
            f"{max(r.running for r in rounds):>8} "
            f"{statistics.median(r.feishu_calls / len(r.turns) for r in rounds):18.1f}"
        )
    print("\nbaselines:")
    for level, answers in base.handler.items():
        p50, p99 = percentiles(answers)
        print(
            f"  bare aiohttp handler, {level:>2} at once: p50 {spread(p50)}, p99 {spread(p99)} ms"
        )
    print(f"  one bare lark-oapi reply to the fake: {spread(base.reply)} ms")
    for agent, bare in base.agents.items():
        started = "first request" if agent == CLAUDE else "start file"
        print(
            f"  bare {agent}: spawn → {started} {spread(bare.start)} ms, "
            f"answer → exit {spread(bare.finish)} ms"
            + (f", --version {spread(bare.version)} ms" if bare.version else "")
            + (
                f"; with one minimal MCP server, spawn → first request {spread(bare.minimal_mcp)}"
                " ms"
                if bare.minimal_mcp
                else ""
            )
        )


# -- main ------------------------------------------------------------------------------------


def waves_of(agent: str, level: int, quick: bool) -> int:
    """Bursts per repeat: one conversation alone is run a few times, for its percentiles."""
    if level > 1:
        return 1
    return 1 if quick and agent == CLAUDE else (2 if quick or agent == CLAUDE else 5)


async def run_agent(
    bench: Bench,
    root: Path,
    agent: str,
    levels: tuple[int, ...],
    repeats: int,
    quick: bool,
    runtime: Any,
    results: dict[tuple[str, int], list[Round]],
    transport: str = "webhook",
    worker_process: bool = True,
) -> None:
    row = agent + (LONG_CONNECTION_ROW if transport == LONG_CONNECTION else "")
    home = root / f"{agent}-{transport}-home"
    members = sum(level * waves_of(agent, level, quick) for level in levels)
    seed(home, members, memory=agent == CLAUDE)
    provider = "turn" if agent == STANDIN else "claude"
    service = await bench.server.run(
        start_service(home, bench.fake, provider, runtime, transport, worker_process)
    )
    bench.transport = transport
    if transport == LONG_CONNECTION:
        await bench.fakes.run(asyncio.wait_for(bench.fake.ws_connected.wait(), 30))
    watch = Watch(bench.fake, bench.model, service)
    first = 0
    try:
        for level in levels:
            waves = waves_of(agent, level, quick)
            rounds = []
            for rep in range(repeats + 1):  # The first warms caches, sessions and connections.
                await asyncio.sleep(ROUND_GAP_SECONDS)
                done = await bench.run_round(service, watch, agent, level, rep, waves, first)
                print(
                    f"  {row} × {level}: repeat {rep or 'warm-up'} "
                    f"{sum(t.failed is None for t in done.turns)}/{len(done.turns)} turns",
                    flush=True,
                )
                if rep:
                    rounds.append(done)
                elif any(t.failed for t in done.turns):
                    rounds.append(done)  # Reported as failed below.
                    break
            results[(row, level)] = rounds
            first += level * waves
    finally:
        bench.transport = "webhook"
        await bench.server.run(service.runner.cleanup())


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds")
    parser.add_argument("--repeats", type=int, default=None, help="default 3; quick 1")
    parser.add_argument("--slots", type=int, default=None, help="default: as `amux serve`")
    parser.add_argument(
        "--claude",
        default="1",
        help="conversation counts for the real CLI, comma-separated; 'none' skips it",
    )
    parser.add_argument(
        "--levels",
        default=None,
        help="conversation counts for the stand-in, comma-separated (default 1,10,50; quick 1,10)",
    )
    parser.add_argument(
        "--worker",
        choices=("process", "in-process"),
        default="process",
        help="the local worker in a process of its own, as `amux serve` runs it, or inside the "
        "Hub's process (how it ran before)",
    )
    parser.add_argument(
        "--transports",
        default=f"webhook,{LONG_CONNECTION}",
        help=f"how the stand-in's events arrive, comma-separated: webhook, {LONG_CONNECTION}",
    )
    args = parser.parse_args()
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if args.levels:
        standin_levels = tuple(int(n) for n in args.levels.split(","))
    else:
        standin_levels = (1, 10) if args.quick else (1, 10, 50)
    transports = [t for t in args.transports.split(",") if t]
    claude_levels = () if args.claude == "none" else tuple(int(n) for n in args.claude.split(","))

    from runtime_bridge.config import RuntimeSettings
    from tests.runtime_bridge.conftest import find_agent_cli

    header("A whole Feishu turn, stage by stage")
    fakes, server = LoopThread("bench-fakes"), LoopThread("bench-service")
    fake = FakeFeishu(app_id=APP_ID, bot_open_id=BOT_OPEN_ID)
    # Enough answers that none of the turns gets the fake's default.
    model = FakeModelServer([Answer(ANSWER)] * 10_000)
    await fakes.run(fake.__aenter__())
    await fakes.run(model.__aenter__())
    results: dict[tuple[str, int], list[Round]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="amux-bench-turn-") as tmp,
        tempfile.TemporaryDirectory(prefix="amux-bench-turn-ws-") as shared,
    ):
        root, workspace = Path(tmp), Path(shared)
        # A root worker runs Agents as a uid of their own, which must write their start files.
        os.chmod(workspace, 0o1777)
        from bot.service.logs import LogSettings, configure

        log = (root / "serve.log").open("a", encoding="utf-8")
        configure(LogSettings(format="json", level="INFO"), stream=log)
        # The in-process worker's environment, read once at its start: its gateway's upstream.
        os.environ.update(
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-ant-bench",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        try:
            claude = find_agent_cli("claude")
        except pytest.skip.Exception as missing:
            print(f"{missing.msg}; the claude rows are skipped")
            claude, claude_levels = "", ()
        runtime = RuntimeSettings(
            claude=claude or "claude",
            providers={"turn": str(TURN_AGENT)},
            default_cwd=None,
            work_dir=root / "runtime",
            slots=args.slots,
        )
        # The stand-in writes its start file where it starts: a workspace shared by all turns.
        standin_runtime = runtime.model_copy(update={"default_cwd": workspace})
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                bench = Bench(fakes, server, fake, model, http, workspace)
                print("baselines…", flush=True)
                levels = sorted({*standin_levels, *claude_levels})
                handler = {
                    level: await bare_handler(
                        bench, level, waves_of(STANDIN, level, args.quick), repeats
                    )
                    for level in levels
                }
                reply = await asyncio.to_thread(bare_replies, fake, 5 if args.quick else 20)
                agents = {STANDIN: await bare_standin(workspace, 3 if args.quick else 10)}
                if claude_levels:
                    agents[CLAUDE] = await bare_claude(root, model, 2 if args.quick else 5)
                base = Baselines(handler, reply, agents)
                print("turns…", flush=True)
                for transport in transports:
                    await run_agent(
                        bench,
                        root,
                        STANDIN,
                        standin_levels,
                        repeats,
                        args.quick,
                        standin_runtime,
                        results,
                        transport,
                        args.worker == "process",
                    )
                if claude_levels:
                    await run_agent(
                        bench,
                        root,
                        CLAUDE,
                        claude_levels,
                        repeats,
                        args.quick,
                        runtime,
                        results,
                        worker_process=args.worker == "process",
                    )
        finally:
            import logging

            logging.getLogger().handlers.clear()
            log.close()
            await fakes.run(model.__aexit__())
            await fakes.run(fake.__aexit__())
            fakes.close()
            server.close()
        print_table(results, base, runtime.slot_count())
    failed = [t for rounds in results.values() for r in rounds for t in r.turns if t.failed]
    for turn in failed[:10]:
        print(f"FAILED {turn.label}: {turn.failed}")
    if failed:
        print(f"{len(failed)} turns failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
