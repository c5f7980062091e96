"""Fixtures shared by every test package: a Hub in-process, a Hub as a real process, the CLI."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.service.app import create_app
from hub.config import OWNER_TOKEN_FILE, HubSettings
from hub.state import State

REPO = Path(__file__).resolve().parent.parent
AMUX = shutil.which("amux", path=str(Path(sys.executable).parent)) or "amux"
# The module `amux serve` runs its local worker as, in its own process.
WORKER_PROCESS = "bot.service.worker_process"


def git(*args: str, cwd: Path) -> str:
    """``git ARGS`` in ``cwd`` with no user or system configuration; its output."""
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def make_repo(path: Path, branch: str = "main") -> Path:
    """A git repository at ``path`` with one commit (a README) on ``branch``."""
    path.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", branch], cwd=path, check=True)
    (path / "README.md").write_text("hello\n")
    subprocess.run([*git, "add", "README.md"], cwd=path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], cwd=path, check=True)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Any, timeout: float = 15.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def processes_tagged(tag: str) -> list[int]:
    """The live processes whose command line contains ``tag``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


async def until(predicate: Any, seconds: float = 60.0, interval: float = 0.02) -> Any:
    """``wait_until`` for tests whose fakes share the event loop, which must never block."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {seconds}s")
        await asyncio.sleep(interval)


def parent_of(pid: int) -> int | None:
    """The parent pid of a live process, or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may hold spaces or parentheses of its own.
    return int(stat.rpartition(")")[2].split()[1])


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class HubProcess:
    """``amux serve`` running as a real process on a free loopback port."""

    home: Path
    port: int
    extra_env: dict[str, str] = field(default_factory=dict)
    # A command the Hub runs under, such as strace; ``stop`` signals the Hub itself through it.
    prefix: list[str] = field(default_factory=list)
    # Leave AMUX_HOME unset, as `make serve` does: the Hub and the CLI then find their home as
    # the default relative `.amux` under their cwd, which is ``home.parent``.
    default_home: bool = False
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def __post_init__(self) -> None:
        if self.default_home:
            assert self.home.name == ".amux", "the default home is .amux under the cwd"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def owner_token(self) -> str:
        return (self.home / OWNER_TOKEN_FILE).read_text().strip()

    def env(self, **overrides: str) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("AMUX_") or k in self.extra_env
        }
        env.update(self.extra_env)
        if not self.default_home:
            env["AMUX_HOME"] = str(self.home)
        env["AMUX_HUB_URL"] = self.url
        env.update(overrides)
        return env

    def start(self) -> None:
        self.log_path = self.home.parent / f"hub-{self.port}.log"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*self.prefix, AMUX, "serve", "--port", str(self.port)],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.home.parent,
        )
        log.close()
        self.wait_healthy()

    def _served(self) -> int | None:
        assert self.proc is not None
        if not self.prefix:
            return self.proc.pid
        children = [pid for pid in processes_tagged("serve") if parent_of(pid) == self.proc.pid]
        return children[0] if len(children) == 1 else None

    @property
    def pid(self) -> int:
        """The pid of ``amux serve`` itself: the prefix command's child when there is one."""
        served = self._served()
        assert served is not None, f"no single amux serve runs under {self.prefix[0]}"
        return served

    def worker_pids(self) -> list[int]:
        """The local worker's process, a child of ``amux serve`` (none before it starts)."""
        return [p for p in processes_tagged(WORKER_PROCESS) if parent_of(p) == self.pid]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_healthy(self, timeout: float = 60.0) -> None:
        # With the bot on, amux serve imports lark-oapi before it listens: seconds on a quiet
        # machine, tens of seconds on a busy 2-core one. The wait ends as soon as it answers.
        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"amux serve exited early:\n{self.log()}")
            return self.healthy()

        wait_until(up, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def rpc(
        self,
        method: str,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> tuple[int, Any]:
        """A raw Hub RPC call with urllib (independent of our client)."""
        request = urllib.request.Request(
            f"{self.url}/rpc/v1/{method}",
            data=json.dumps(params).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {token or self.owner_token}",
                **(headers or {}),
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def cli(
        self,
        *args: str,
        input: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> CliResult:
        data = input.encode() if isinstance(input, str) else input
        done = subprocess.run(
            [AMUX, *args],
            input=data,
            capture_output=True,
            env={**self.env(), **(env or {})},
            timeout=timeout,
            cwd=self.home.parent,
            check=False,
        )
        return CliResult(
            done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode()
        )

    def on_a_terminal(self, answer: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The CLI with a terminal on stdin that types ``answer``."""
        main, side = pty.openpty()
        try:
            os.write(main, answer.encode())
            return subprocess.run(
                [AMUX, *args],
                stdin=side,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(main)
            os.close(side)

    def set_permissions(self, policy: str) -> None:
        """Save ``agents.permissions``: it applies to the next turn, without a restart."""
        done = self.cli("system", "config", "set", "agents.permissions", policy)
        assert done.returncode == 0, done.stderr

    def enable_memory(self, isolation: bool = False) -> None:
        """Save memory.enabled (and isolation), restart the Hub in place, wait for it."""
        assert self.cli("system", "config", "set", "memory.enabled", "true").returncode == 0
        value = "on" if isolation else "off"
        assert self.cli("system", "config", "set", "memory.isolation", value).returncode == 0
        self.restart()

    def restart(self) -> None:
        status, body = self.rpc("system.restart")
        assert status == 200, body
        self.wait_restarted()

    def wait_restarted(self) -> None:
        """Wait until a requested restart is over: every saved setting is running."""

        def restarted() -> bool:
            status, body = self.rpc("system.config.get")
            return status == 200 and not any(v["restart_pending"] for v in body.values())

        wait_until(lambda: self._quietly(restarted), 60)

    @staticmethod
    def _quietly(check: Any) -> bool:
        try:
            return bool(check())
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # A prefix such as strace ignores SIGTERM and exits once the Hub has.
            served = self._served()
            if served is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(served, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                if served is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(served, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()


# What ``HubProcess.enable_memory`` sets, for a Hub that needs memory from its start: saved with
# ``save_settings`` before the first start, they save the restart (two CLI calls and a restart).
MEMORY_ON: Mapping[str, Any] = {"memory.enabled": True, "memory.isolation": "off"}
MEMORY_ISOLATED: Mapping[str, Any] = {"memory.enabled": True, "memory.isolation": "on"}


def save_settings(home: Path, settings: Mapping[str, Any]) -> None:
    """Save Hub settings before its first start: they are then its running values, no restart."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state = State(HubSettings(home=home).state_path)
    try:
        for key, value in settings.items():
            state.save_setting(key, value)
    finally:
        state.close()


@contextlib.contextmanager
def running_hub(
    home: Path, settings: Mapping[str, Any] | None = None, **process: Any
) -> Iterator[HubProcess]:
    """``amux serve`` over ``home`` with ``settings`` saved first, stopped on the way out."""
    if settings:
        save_settings(home, settings)
    hub = HubProcess(home, free_port(), **process)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture(autouse=True)
def no_amux_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without the developer's AMUX_* variables; a test sets its own after."""
    for name in [name for name in os.environ if name.startswith("AMUX_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[HubProcess]:
    """A fresh Hub process with default settings (memory disabled)."""
    with running_hub(tmp_path / "amux-home") as hub:
        yield hub


@pytest.fixture
def hub_settings(tmp_path: Path) -> HubSettings:
    return HubSettings(home=tmp_path / "amux-home")


@pytest.fixture
async def hub_client(
    aiohttp_client: Any, hub_settings: HubSettings
) -> AsyncIterator[TestClient[Any, Any]]:
    """The whole service in-process, behind aiohttp's test client."""
    client = await aiohttp_client(create_app(hub_settings))
    yield client


@functools.cache
def _stand_ins() -> Path:
    made = Path(tempfile.mkdtemp(prefix="amux-stand-ins-", dir="/tmp"))
    atexit.register(shutil.rmtree, made, True)
    for source in (REPO / "tests" / "fakes").iterdir():
        if source.is_file():
            copy = made / source.name
            shutil.copyfile(source, copy)
            # Whatever the checkout's umask made them: every uid may read and run the copies.
            copy.chmod(0o755 if os.access(source, os.X_OK) else 0o644)
    made.chmod(0o755)
    return made


def stand_in(name: str) -> Path:
    """``tests/fakes/<name>``, copied once per test run where an Agent's uid can run it.

    A root worker runs each Principal's Agents as an unprivileged uid of their own, which cannot
    enter a checkout under a directory closed to others (a ``mktemp -d``, root's home): a stand-in
    named inside the checkout would fail there with "Permission denied". The copies live in a
    directory of their own under ``/tmp``, open to every uid, whatever the checkout's place.
    """
    return _stand_ins() / name


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory a stand-in Agent can reach and write to outside its workspace (an
    unsandboxed one): a root worker runs Agents as a uid of their own, which cannot enter
    ``tmp_path``."""
    with tempfile.TemporaryDirectory(prefix="amux-agent-") as made:
        os.chmod(made, 0o1777)
        yield Path(made)
