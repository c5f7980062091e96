"""amux and a peer Feishu bridge for coding Agents, side by side in one run.

Run: .venv/bin/python tests/benchmarks/bench_peer.py [--repeats N] [--levels 1,5] [--slots N]

The peer is ControlMesh (``controlmesh`` on PyPI, pinned below), the one bridge from the package
registries that builds every Feishu address from a setting (``feishu.domain``), so it can be
pointed at the fake Feishu on loopback. It is installed once into a virtual environment under
``~/.cache/amux-bench/``; when that install fails (no registry reachable), the script says why
and exits 0.

Both bridges get the same fake Feishu, the same scripted model and the same real Claude CLI
(``tools/agent-clis``; ControlMesh runs the ``claude`` it finds on ``PATH``, so that directory is
put first on its ``PATH``, and both get the model's address in ``ANTHROPIC_BASE_URL``). Both take
their events over Feishu's long connection, which ControlMesh always opens (beside a callback
listener, put on a free loopback port here): the fake pushes each private-chat message event over
its WebSocket. amux is
``create_app`` as ``amux serve`` builds it, run by ``bench_turn``'s machinery (the Claude rows:
each member enrolled beforehand, memory on, the Agent in its bubblewrap sandbox); ControlMesh is
``controlmesh bot`` in a home of its own (``CONTROLMESH_HOME``), as a separate process with its
default settings (``dm_policy`` allow, ``progress_mode`` text).

Each conversation is a member's private chat; both bridges get the same members and chats, as
``bench_turn`` picks them: one member per conversation and wave, the same again in each repeat
(each bridge's first turn in a chat starts its conversation, the later ones continue it). Per
level, a warm-up round and ``--repeats`` rounds: one conversation alone is run twice in a row per
round, ``n`` conversations are pushed at once. Per conversation:

  - event → first message: the push to the fake's arrival of the bridge's first message in the
    chat (amux: its progress card; ControlMesh: whatever it sends first);
  - event → answer shown: to the fake's arrival of the call that shows the model's answer (amux:
    the card update with it; ControlMesh: its text message with it).

CPU per turn is the bridge's own processes over a round, divided by the round's turns, their
child processes excluded: for amux this process's CPU less the fakes' and this driver's threads
(as in ``bench_turn``) plus its local worker's process, so the Claude processes and amux's
per-turn helpers (the sandbox, the MCP servers) are not counted; for ControlMesh ``utime +
stime`` of its process from ``/proc`` (every thread), so the Claude processes it spawns are not
counted either. The load average is printed
before and after. Figures are printed, never asserted; the exit status is non-zero only if a turn
of either bridge fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
import pytest

from tests.benchmarks import bench_turn
from tests.benchmarks.bench_feishu import LoopThread
from tests.benchmarks.bench_turn import (
    ANSWER,
    APP_ID,
    BOT_OPEN_ID,
    CLAUDE,
    LONG_CONNECTION,
    LONG_CONNECTION_ROW,
    Bench,
    Round,
    children,
    cmdline,
    member,
    percentiles,
    process_cpu,
    signer,
    spread,
)
from tests.benchmarks.harness import free_port, header
from tests.fakes.feishu import FakeFeishu
from tests.fakes.model_server import Answer, FakeModelServer

PEER = "controlmesh"
PEER_VERSION = "0.43.0"
CACHE = Path.home() / ".cache" / "amux-bench" / f"{PEER}-{PEER_VERSION}"
TURN_SECONDS = 300.0
START_SECONDS = 120.0
ROUND_GAP_SECONDS = bench_turn.ROUND_GAP_SECONDS


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


# -- the peer's installation -----------------------------------------------------------------


def install_peer() -> Path | str:
    """The peer's entry point, installed into the cache when absent; or why it could not be."""
    entry = CACHE / "bin" / PEER
    if entry.exists():
        return entry
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(CACHE)], check=True, capture_output=True, timeout=300
        )
        subprocess.run(
            [str(CACHE / "bin" / "pip"), "install", "--quiet", f"{PEER}=={PEER_VERSION}"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as failed:
        shutil.rmtree(CACHE, ignore_errors=True)
        detail = getattr(failed, "stderr", b"") or b""
        lines = detail.decode(errors="replace").strip().splitlines()
        # pip's last line names the cause (no index reachable, no such version).
        return f"installing {PEER}=={PEER_VERSION} failed: {lines[-1] if lines else failed}"
    return entry if entry.exists() else f"the install left no {entry}"


# -- the peer's turns ------------------------------------------------------------------------


@dataclass
class PeerTurn:
    label: str
    message_id: str
    chat_id: str
    payload: dict[str, Any]
    sent: float = 0.0
    first: float | None = None
    first_kind: str = ""
    answered: float | None = None
    failed: str | None = None


@dataclass
class PeerRound:
    turns: list[PeerTurn]
    cpu: float
    kinds: dict[str, int] = field(default_factory=dict)
    # The most Claude processes the bridge had running at once.
    running: int = 0


def _chat_of(record: Any) -> tuple[str, str]:
    """The message a bridge's call answers or the chat it writes to, and what it sends."""
    body = record.body if isinstance(record.body, dict) else {}
    kind = str(body.get("msg_type") or "")
    if record.method == "POST" and record.path.endswith("/reply"):
        return record.path.split("/")[-2], kind
    if record.method == "POST" and record.path == "/open-apis/im/v1/messages":
        return str(body.get("reply_to_message_id") or body.get("receive_id") or ""), kind
    return "", ""


class PeerBench:
    def __init__(self, fakes: LoopThread, fake: FakeFeishu, model: FakeModelServer) -> None:
        self.fakes, self.fake, self.model = fakes, fake, model
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, entry: Path, home: Path, claude: str) -> None:
        (home / "config").mkdir(parents=True)
        (home / "user").mkdir()
        config = {
            "provider": "claude",
            "model": "sonnet",
            "language": "en",
            "controlmesh_home": str(home),
            "update_check": False,
            "transport": "feishu",
            "transports": ["feishu"],
            "feishu": {
                "mode": "bot_only",
                "brand": "feishu",
                "app_id": APP_ID,
                "app_secret": self.fake.app_secret,
                "domain": self.fake.url,
                "dm_policy": "allow",
                # Its event callback listener, unused here; its default port may be taken.
                "listener_port": free_port(),
            },
        }
        (home / "config" / "config.json").write_text(json.dumps(config), encoding="utf-8")
        env = dict(
            os.environ,
            CONTROLMESH_HOME=str(home),
            # It links its skills into the CLIs' homes: a home of its own keeps the real one clean.
            HOME=str(home / "user"),
            PATH=f"{Path(claude).parent}:{os.environ.get('PATH', '')}",
        )
        await self.fakes.run(_clear(self.fake.ws_connected))
        log = (home / "controlmesh.log").open("ab")
        self.process = await asyncio.create_subprocess_exec(
            str(entry),
            "bot",
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        connected = asyncio.ensure_future(
            self.fakes.run(asyncio.wait_for(self.fake.ws_connected.wait(), START_SECONDS))
        )
        exited = asyncio.ensure_future(self.process.wait())
        done, _ = await asyncio.wait({connected, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited in done:
            connected.cancel()
            raise RuntimeError(f"{PEER} exited ({self.process.returncode}): see {log.name}")
        exited.cancel()
        await connected

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    def make_turns(self, level: int, rep: int, wave: int, first: int) -> list[PeerTurn]:
        turns = []
        for i in range(level):
            who = member(first + wave * level + i)
            label = f"bench-peer-{level}-{rep * 10 + wave}-{i:03d}"
            text = bench_turn.prompt_of(CLAUDE, label)
            chat = f"oc_p2p_{who['sender_open_id']}"
            stored = self.fake.add_message(chat, text, sender_open_id=who["sender_open_id"])
            payload = signer.message(text, **who, chat_id=chat, message_id=stored.message_id)
            turns.append(PeerTurn(label, stored.message_id, chat, payload))
        return turns

    async def push(self, turn: PeerTurn) -> None:
        turn.sent = time.monotonic()
        ack = await self.fakes.run(self.fake.push(turn.payload))
        if ack.get("code") != 200:
            turn.failed = f"long connection ack {ack.get('code')}"

    async def run_round(self, level: int, rep: int, waves: int, first: int) -> PeerRound:
        assert self.process is not None
        turns: list[PeerTurn] = []
        kinds: dict[str, int] = {}
        running = 0
        cpu = process_cpu(self.process.pid)
        for wave in range(waves):
            batch = self.make_turns(level, rep, wave, first)
            by_key = {t.message_id: t for t in batch} | {t.chat_id: t for t in batch}
            seen = len(self.fake.requests)
            await asyncio.gather(*(self.push(t) for t in batch))
            deadline = time.monotonic() + TURN_SECONDS
            while time.monotonic() < deadline:
                records = self.fake.requests
                while seen < len(records):
                    record = records[seen]
                    seen += 1
                    key, kind = _chat_of(record)
                    turn = by_key.get(key)
                    if turn is None:
                        continue
                    kinds[kind] = kinds.get(kind, 0) + 1
                    if turn.first is None:
                        turn.first, turn.first_kind = record.at, kind
                    if turn.answered is None and ANSWER in json.dumps(record.body):
                        turn.answered = record.at
                if all(t.answered is not None or t.failed for t in batch):
                    break
                if self.process.returncode is not None:
                    break
                agents = [c for c in children(self.process.pid) if b"claude" in cmdline(c)]
                running = max(running, len(agents))
                await asyncio.sleep(0.01)
            for turn in batch:
                if turn.answered is None and turn.failed is None:
                    turn.failed = f"no answer within {TURN_SECONDS:.0f} s"
            turns += batch
        return PeerRound(turns, process_cpu(self.process.pid) - cpu, kinds, running)


async def _clear(event: asyncio.Event) -> None:
    event.clear()


async def run_peer(
    peer: PeerBench, levels: tuple[int, ...], repeats: int
) -> dict[int, list[PeerRound]]:
    # The members and chats ``bench_turn.run_agent`` gives amux: one per conversation and wave,
    # the same again in each repeat, so both bridges get the same events in the same chats.
    results: dict[int, list[PeerRound]] = {}
    first = 0
    for level in levels:
        waves = bench_turn.waves_of(CLAUDE, level, False)
        rounds = []
        for rep in range(repeats + 1):
            await asyncio.sleep(ROUND_GAP_SECONDS)
            done = await peer.run_round(level, rep, waves, first)
            print(
                f"  {PEER} × {level}: repeat {rep or 'warm-up'} "
                f"{sum(t.failed is None for t in done.turns)}/{len(done.turns)} turns",
                flush=True,
            )
            if rep or any(t.failed for t in done.turns):
                rounds.append(done)
            if any(t.failed for t in done.turns):
                break
        results[level] = rounds
        first += level * waves
    return results


# -- report ----------------------------------------------------------------------------------


def _row(
    bridge: str,
    level: int,
    first: list[list[float]],
    answer: list[list[float]],
    cpu: list[float],
    running: int,
    sends: str,
) -> None:
    f50, f99 = percentiles(first)
    a50, a99 = percentiles(answer)
    print(
        f"{bridge:<12} {level:>4}  {spread(f50):>15} {spread(f99):>15}  {spread(a50):>15} "
        f"{spread(a99):>15}  {spread(cpu):>15} {running:>8}  {sends}"
    )


def print_table(
    amux: dict[tuple[str, int], list[Round]], peer: dict[int, list[PeerRound]]
) -> list[str]:
    print(
        "\nper conversation, each repeat's p50 and p99; shown: median over repeats (min–max), ms;"
        "\nCPU per turn: the bridge's own process, its Agents' processes excluded;"
        " at once: the most Agent process trees the bridge had running at a time"
    )
    head = (
        f"{'bridge':<12} {'conv':>4}  {'event→first p50':>15} {'event→first p99':>15}  "
        f"{'event→answer p50':>15} {'event→answer p99':>15}  {'CPU/turn ms':>15} "
        f"{'at once':>8}  first / all"
    )
    print(head)
    print("-" * len(head))
    failed: list[str] = []
    levels = sorted({level for _, level in amux} | set(peer))
    for level in levels:
        rounds = amux.get((CLAUDE + LONG_CONNECTION_ROW, level), [])
        ok = [[t for t in r.turns if t.failed is None] for r in rounds]
        failed += [f"amux {t.label}: {t.failed}" for r in rounds for t in r.turns if t.failed]
        _row(
            "amux",
            level,
            [[t.progress - t.sent for t in turns if t.progress is not None] for turns in ok],
            [[t.final - t.sent for t in turns if t.final is not None] for turns in ok],
            [(r.hub_cpu + r.worker_cpu) / len(r.turns) for r in rounds if r.turns],
            max((r.running for r in rounds), default=0),
            "progress card / card updates"
            + (
                f", {statistics.median(r.feishu_calls / len(r.turns) for r in rounds):.1f}"
                " Feishu calls a turn"
                if rounds
                else ""
            ),
        )
        prounds = peer.get(level, [])
        pok = [[t for t in r.turns if t.failed is None] for r in prounds]
        failed += [f"{PEER} {t.label}: {t.failed}" for r in prounds for t in r.turns if t.failed]
        firsts = sorted({t.first_kind for r in prounds for t in r.turns if t.first_kind})
        sends: dict[str, int] = {}
        for r in prounds:
            for kind, count in r.kinds.items():
                sends[kind] = sends.get(kind, 0) + count
        turns = sum(len(r.turns) for r in prounds) or 1
        _row(
            PEER,
            level,
            [[t.first - t.sent for t in ts if t.first is not None] for ts in pok],
            [[t.answered - t.sent for t in ts if t.answered is not None] for ts in pok],
            [r.cpu / len(r.turns) for r in prounds if r.turns],
            max((r.running for r in prounds), default=0),
            f"{'/'.join(firsts) or 'nothing'} / "
            + ", ".join(f"{n / turns:.1f} {k} a turn" for k, n in sorted(sends.items())),
        )
    return failed


# -- main ------------------------------------------------------------------------------------


async def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", default="1,5", help="conversations at once, comma-separated")
    parser.add_argument("--slots", type=int, default=None, help="amux's; default: as `amux serve`")
    args = parser.parse_args()
    levels = tuple(int(n) for n in args.levels.split(","))

    header("amux and a peer Feishu bridge, side by side")
    from runtime_bridge.config import RuntimeSettings
    from tests.runtime_bridge.conftest import find_agent_cli

    try:
        claude = find_agent_cli("claude")
    except pytest.skip.Exception as missing:
        print(f"{missing.msg}; nothing to compare")
        return 0
    entry = await asyncio.to_thread(install_peer)
    if isinstance(entry, str):
        print(f"{PEER} {PEER_VERSION} could not be installed ({entry}); nothing to compare")
        return 0
    print(f"load average before: {loadavg()}", flush=True)

    fakes, server = LoopThread("bench-fakes"), LoopThread("bench-service")
    fake = FakeFeishu(app_id=APP_ID, bot_open_id=BOT_OPEN_ID)
    model = FakeModelServer([Answer(ANSWER)] * 10_000)
    await fakes.run(fake.__aenter__())
    await fakes.run(model.__aenter__())
    amux: dict[tuple[str, int], list[Round]] = {}
    peer_results: dict[int, list[PeerRound]] = {}
    with tempfile.TemporaryDirectory(prefix="amux-bench-peer-") as tmp:
        root = Path(tmp)
        from bot.service.logs import LogSettings, configure

        log = (root / "serve.log").open("a", encoding="utf-8")
        configure(LogSettings(format="json", level="INFO"), stream=log)
        os.environ.update(
            ANTHROPIC_BASE_URL=model.base_url,
            ANTHROPIC_API_KEY="sk-ant-bench",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        runtime = RuntimeSettings(
            claude=claude, default_cwd=None, work_dir=root / "runtime", slots=args.slots
        )
        print(
            f"amux worker slots: {runtime.slot_count()}"
            + ("" if args.slots else " (as `amux serve` here)")
        )
        peer = PeerBench(fakes, fake, model)
        try:
            async with aiohttp.ClientSession() as http:
                bench = Bench(fakes, server, fake, model, http, root)
                print("amux…", flush=True)
                await fakes.run(_clear(fake.ws_connected))
                await bench_turn.run_agent(
                    bench,
                    root,
                    CLAUDE,
                    levels,
                    args.repeats,
                    False,
                    runtime,
                    amux,
                    LONG_CONNECTION,
                )
            print(f"{PEER}…", flush=True)
            await peer.start(entry, root / "controlmesh", claude)
            peer_results = await run_peer(peer, levels, args.repeats)
        finally:
            await peer.stop()
            import logging

            logging.getLogger().handlers.clear()
            log.close()
            await fakes.run(model.__aexit__())
            await fakes.run(fake.__aexit__())
            fakes.close()
            server.close()
    failed = print_table(amux, peer_results)
    print(f"load average after: {loadavg()}")
    for line in failed[:10]:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
