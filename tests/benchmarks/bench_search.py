"""memory.search over 1,024 documents / 8 MiB through the Hub RPC, against `grep -rFil`.

Each query kind is timed in ROUNDS rounds of TURNS turns, the Hub and grep taking turns, so load
from elsewhere hits both alike; a round's figure is its median, and the summary is the median of
the rounds with their min–max.

Run: .venv/bin/python tests/benchmarks/bench_search.py
Target: a warm search at most 1.0x `grep -rFil` over the same files, for every query kind.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.harness import Timing, header, hub_server, ratio, time_awaits, timing

DOCS = 1024
REPEAT = 21
ROUNDS = 5
TURNS = 9
TARGET = 1.0
ENGLISH = (
    "the team agreed to review every change before release and to keep notes short "
    "deploy staging production incident owner follow up decision reason context meeting "
    "preference language format summary evidence question answer test build cache"
).split()
CHINESE = [
    "我们的",
    "团队",
    "决定",
    "每次",
    "发布前",
    "先审核",
    "代码",
    "记录",
    "偏好",
    "会议",
    "结论",
    "证据",
    "问题",
    "测试",
    "构建",
    "缓存",
    "部署",
    "生产环境",
    "负责人",
    "跟进",
]
QUERIES = {
    "English, 2 keywords": "kubernetes rollback",
    "Chinese, 1 keyword": "发布流程",
    "no match": "zyzzyva",
    # In nearly every document: every one is a candidate to score, where grep stops reading a
    # file at its first match.
    "common word": "release",
}


def document(rng: random.Random, index: int, size: int) -> bytes:
    """A document of exactly ``size`` bytes, half English and half Chinese prose."""
    lines = [f"# Note {index}"]
    used = len(lines[0]) + 1
    while used < size:
        if rng.random() < 0.5:
            line = " ".join(rng.choice(ENGLISH) for _ in range(rng.randrange(6, 18)))
        else:
            line = "".join(rng.choice(CHINESE) for _ in range(rng.randrange(4, 14)))
        lines.append(line)
        used += len(line.encode()) + 1
    # A few documents mention the keywords, somewhere in their second half.
    roll = rng.random()
    where = rng.randrange(len(lines) // 2, len(lines))
    if roll < 0.03:
        lines.insert(where, "we rolled back the Kubernetes deploy")
    elif roll < 0.06:
        lines.insert(where, "修订了发布流程的第二步")
    elif roll < 0.08:
        lines.insert(where, "Rollback plan: ask the owner")
    data = "\n".join(lines).encode()[:size]
    # Cutting may split a character; pad the remainder with ASCII so the size is exact.
    text = data.decode("utf-8", "ignore")
    return (text + "\n" + "." * size).encode()[:size]


def build_scope(scope: Path, docs: int, size: int, seed: int) -> int:
    rng = random.Random(seed)
    total = 0
    for i in range(docs):
        path = scope / f"area-{i % 16:02}" / f"note-{i:04}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = document(rng, i, size)
        path.write_bytes(data)
        total += len(data)
    return total


def grep_files(scope: Path, query: str) -> list[str]:
    args = ["grep", "-rFil"]
    for term in query.split():
        args += ["-e", term]
    done = subprocess.run([*args, str(scope)], capture_output=True, check=False)
    return done.stdout.decode().split()


async def bench(base: Path) -> None:
    from hub.client import HubClient

    home = base / "home-8mib"
    total = build_scope(home / "memory" / "global", DOCS, 8 * 1024, seed=1)
    print(f"scope: {DOCS} documents, {total / 1024 / 1024:.2f} MiB; median of {REPEAT} turns each")
    # Older than the Hub's window for just-changed files, so the first scan fills its cache.
    await asyncio.sleep(2.5)
    with hub_server(home) as server:
        async with HubClient(server.url, server.token) as hub:
            loop = asyncio.get_running_loop()
            query = QUERIES["English, 2 keywords"]
            start = time.perf_counter()
            await hub.memory_search(query, limit=20)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            await loop.run_in_executor(None, grep_files, server.scope, query)
            grep_once = time.perf_counter() - start
            print(
                f"{'cold, English':<20} hub {cold * 1000:6.1f} ms (first scan after start)  "
                f"grep {grep_once * 1000:6.1f} ms  hub/grep {ratio(cold, grep_once)}"
            )
            for label, query in QUERIES.items():
                result = await hub.memory_search(query, limit=20)
                rounds = [
                    await side_by_side(
                        partial(hub.memory_search, query, limit=20),
                        partial(loop.run_in_executor, None, grep_files, server.scope, query),
                        TURNS,
                    )
                    for _ in range(ROUNDS)
                ]
                matched = len(await loop.run_in_executor(None, grep_files, server.scope, query))
                ours = spread([r[0].median for r in rounds])
                grep = spread([r[1].median for r in rounds])
                ratios = spread([r[0].median / r[1].median for r in rounds])
                verdict = "met" if ratios[0] <= TARGET else "missed"
                print(
                    f"{label:<20} hub {ms(ours)}  grep {ms(grep)}  hub/grep "
                    f"{ratios[0]:.2f} ({ratios[1]:.2f}–{ratios[2]:.2f})x  "
                    f"target <= {TARGET:.1f}x grep: {verdict}"
                )
                print(
                    f"{'':<20} incomplete={result['incomplete']} "
                    f"scanned_files={result['scanned_files']} matches={len(result['matches'])} "
                    f"truncated={result['truncated']} grep_files={matched}"
                )

    home = base / "home-16mib"
    total = build_scope(home / "memory" / "global", DOCS, 16 * 1024, seed=2)
    print(f"scope: {DOCS} documents, {total / 1024 / 1024:.2f} MiB")
    with hub_server(home) as server:
        async with HubClient(server.url, server.token) as hub:
            result = await hub.memory_search("kubernetes rollback", limit=20)
            ours = await time_awaits(partial(hub.memory_search, "kubernetes rollback"), REPEAT)
            print(
                f"{'16 MiB scope':<20} hub {ours.ms()}  incomplete={result['incomplete']} "
                f"scanned_files={result['scanned_files']}"
            )


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, min and max."""
    return statistics.median(values), min(values), max(values)


def ms(figures: tuple[float, float, float]) -> str:
    median, low, high = (value * 1000 for value in figures)
    return f"{median:5.1f} ({low:.1f}–{high:.1f}) ms"


async def side_by_side(
    ours: Callable[[], Awaitable[object]],
    theirs: Callable[[], Awaitable[object]],
    turns: int = REPEAT,
) -> tuple[Timing, Timing]:
    """Time both ``turns`` times, taking turns, so load from elsewhere hits both alike."""
    await ours()
    await theirs()
    samples: tuple[list[float], list[float]] = ([], [])
    for _ in range(turns):
        for work, into in ((ours, samples[0]), (theirs, samples[1])):
            start = time.perf_counter()
            await work()
            into.append(time.perf_counter() - start)
    return timing(samples[0]), timing(samples[1])


def main() -> None:
    header("memory.search vs grep -rFil")
    with tempfile.TemporaryDirectory(prefix="amux-bench-") as tmp:
        asyncio.run(bench(Path(tmp)))


if __name__ == "__main__":
    main()
