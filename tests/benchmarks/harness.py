"""What the benchmark scripts share: a Hub process with memory on, timing and reporting.

The scripts print figures and ratios; they never pass or fail. Importing them does no work.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AMUX = shutil.which("amux", path=str(Path(sys.executable).parent)) or "amux"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up within {timeout}s")


@dataclass(frozen=True)
class HubServer:
    url: str
    token: str
    home: Path
    # The `amux serve` process, so a benchmark can read its CPU time from /proc.
    pid: int = 0

    @property
    def scope(self) -> Path:
        return self.home / "memory" / "global"


def enable_memory_offline(home: Path) -> None:
    """Save memory.enabled before the Hub starts, so it runs with memory on and no restart."""
    from hub.config import HubSettings
    from hub.state import State

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = State(HubSettings(home=home).state_path)
    state.save_setting("memory.enabled", True)
    state.close()


@contextmanager
def stopping(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def hub_server(home: Path, **environ: str) -> Iterator[HubServer]:
    """``amux serve`` on a free loopback port over ``home`` (memory enabled), with ``environ``."""
    from hub.config import OWNER_TOKEN_FILE

    enable_memory_offline(home)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env["AMUX_HOME"] = str(home)
    env.update(environ)
    with (home.parent / f"hub-{port}.log").open("ab") as log:
        proc = subprocess.Popen(
            [AMUX, "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    with stopping(proc):
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/healthz", proc)
        token = (home / OWNER_TOKEN_FILE).read_text().strip()
        yield HubServer(url, token, home, proc.pid)


@dataclass(frozen=True)
class Timing:
    median: float
    best: float

    def ms(self) -> str:
        return f"{self.median * 1000:6.1f} ms (best {self.best * 1000:5.1f})"


def timing(samples: list[float]) -> Timing:
    return Timing(statistics.median(samples), min(samples))


def time_calls(work: Callable[[], object], repeat: int) -> Timing:
    """Wall time of ``work`` over ``repeat`` runs after one warm-up run."""
    work()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return timing(samples)


async def time_awaits(work: Callable[[], Awaitable[object]], repeat: int) -> Timing:
    """Wall time of awaiting ``work()`` over ``repeat`` runs after one warm-up run."""
    await work()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await work()
        samples.append(time.perf_counter() - start)
    return timing(samples)


def header(title: str) -> None:
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"== {title} ==")
    print(f"machine: {os.cpu_count()} CPUs, load average {load}, Python {sys.version.split()[0]}")


def ratio(ours: float, baseline: float) -> str:
    return f"{ours / baseline:.2f}x" if baseline else "n/a"
