"""The first step of a launch: limits, a session keyring of its own, the seccomp filter."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_bridge import agent_exec
from runtime_bridge.launch import confinement, write_seccomp_file

STEP = [sys.executable, "-I", "-S", agent_exec.__file__]
# Prints the calling process's session keyring id (KEYCTL_GET_KEYRING_ID, the session keyring,
# created if missing).
SESSION_KEYRING = (
    "import ctypes, platform; n = {'x86_64': 250, 'aarch64': 219}[platform.machine()]; "
    "print(ctypes.CDLL(None).syscall(n, 0, -3, 1))"
)
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
known_machine = pytest.mark.skipif(
    agent_exec.seccomp_filter() is None, reason=f"no filter for {platform.machine()}"
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STEP, *args], capture_output=True, text=True, timeout=60, check=False)


def test_limits_apply_to_what_it_runs() -> None:
    done = run("--rlimit", "nofile=256:256", "--rlimit", "core=0:0", "--", "/bin/sh", "-c",
               "ulimit -n; ulimit -c")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["256", "0"]


@known_machine
def test_each_launch_gets_a_session_keyring_nobody_else_holds() -> None:
    ours = subprocess.run(
        [sys.executable, "-c", SESSION_KEYRING], capture_output=True, text=True, check=True
    ).stdout
    first, second = (
        run("--keyring", "--", sys.executable, "-c", SESSION_KEYRING) for _ in range(2)
    )
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    ids = {ours.strip(), first.stdout.strip(), second.stdout.strip()}
    assert len(ids) == 3 and all(int(i) > 0 for i in ids)


@needs_bwrap
@known_machine
def test_the_filter_refuses_new_user_namespaces_and_nothing_an_agent_needs() -> None:
    bwrap = shutil.which("bwrap") or "bwrap"
    sandbox = [bwrap, "--seccomp", str(agent_exec.SECCOMP_FD), "--ro-bind", "/", "/",
               "--proc", "/proc", "--dev", "/dev", "--"]  # fmt: skip
    refused = run("--seccomp", "--", *sandbox, "unshare", "--user", "true")
    assert refused.returncode != 0
    assert "Operation not permitted" in refused.stderr
    threads = (
        "import os, threading, subprocess; t = threading.Thread(target=print, args=('thread',)); "
        "t.start(); t.join(); print(subprocess.run(['echo', 'child'], capture_output=True, "
        "text=True).stdout.strip()); pid = os.fork(); os._exit(0) if pid == 0 else None; "
        "print('forked', os.waitpid(pid, 0)[1])"
    )
    allowed = run("--seccomp", "--", *sandbox, sys.executable, "-c", threads)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.split() == ["thread", "child", "forked", "0"]
    without = subprocess.run([*sandbox[:1], *sandbox[3:], "unshare", "--user", "true"],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert without.returncode == 0, "user namespaces are refused here even without the filter"


def test_a_step_that_fails_ends_the_launch_with_one_line(tmp_path: Path) -> None:
    done = run("--cgroup", str(tmp_path / "missing" / "cgroup.procs"), "--", "/bin/true")
    assert done.returncode == agent_exec.FAILED
    assert done.stderr.startswith("amux: cannot confine the Agent's launch: cannot join")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_filter_is_known_per_machine() -> None:
    for machine in ("x86_64", "aarch64"):
        program = agent_exec.seccomp_filter(machine)
        assert program is not None and len(program) % 8 == 0
    assert agent_exec.seccomp_filter("sparc64") is None


@needs_bwrap
@known_machine
def test_the_shell_first_step_joins_limits_and_filters_as_the_python_one_does(
    tmp_path: Path,
) -> None:
    filter_file = write_seccomp_file(tmp_path)
    assert filter_file is not None
    step = confinement(True, (), ("nofile=256:256",), filter_file)
    bwrap = shutil.which("bwrap") or "bwrap"
    sandbox = [bwrap, "--seccomp", str(agent_exec.SECCOMP_FD), "--ro-bind", "/", "/",
               "--proc", "/proc", "--dev", "/dev", "--"]  # fmt: skip
    limits = subprocess.run(
        [*step, *sandbox, "/bin/sh", "-c", "ulimit -n; ulimit -c"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert limits.returncode == 0, limits.stderr
    assert limits.stdout.split() == ["256", "0"]
    refused = subprocess.run(
        [*step, *sandbox, "unshare", "--user", "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "Operation not permitted" in refused.stderr
    joined = subprocess.run(
        [*confinement(True, (tmp_path / "missing" / "cgroup.procs",), (), filter_file), "true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert joined.returncode == agent_exec.FAILED
