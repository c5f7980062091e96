"""Launch groups on this machine's real cgroups: a process that joins one is held to its
memory, task and CPU bounds while the test process is not, the kernel's counters say which
bound was reached, and removing a group ends what was left in it.

These need root and cgroups with memory and pids (v1 or v2); elsewhere they are skipped. The
cgroup v2 code path is also run against a fake tree (see ``fake_v2``), since a host has one
cgroup layout at a time.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime_bridge.bounds import Bounds, GiB, MiB
from runtime_bridge.cgroups import (
    LaunchGroup,
    _v2_layout,
    check_name,
    mechanism,
    rlimits,
)

SMALL = Bounds(memory_bytes=128 * MiB, tasks=32, cpu=1.0, open_files=256, workspace_bytes=GiB)

MakeGroup = Callable[[Bounds], LaunchGroup]


def real_cgroups() -> None:
    if os.geteuid() != 0:
        pytest.skip("launch groups on this host need root")
    how = mechanism()
    if how.startswith("rlimits"):
        pytest.skip(f"this host bounds launches with {how}")


@pytest.fixture
def make_group() -> Iterator[MakeGroup]:
    real_cgroups()
    groups: list[LaunchGroup] = []

    def make(bounds: Bounds) -> LaunchGroup:
        group = LaunchGroup.create(f"test-{uuid.uuid4().hex}", bounds)
        assert group is not None, mechanism()
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.remove()


def joined(group: LaunchGroup, *argv: str) -> list[str]:
    """``argv`` run by a shell that first moves itself into ``group``, as a launch does."""
    files = " ".join(f"'{path}'" for path in group.procs_files)
    script = f'for f in {files}; do echo $$ > "$f" || exit 99; done; exec "$@"'
    return ["sh", "-c", script, "sh", *argv]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_mechanism_names_what_bounds_launches_here() -> None:
    how = mechanism()
    assert how.startswith(("cgroup v2 (", "cgroup v1 (", "rlimits ("))
    if how.startswith("cgroup"):
        assert "memory" in how and "pids" in how
    # A root with no cgroups at all is a reason, not an error.
    assert mechanism(Path("/nonexistent")).startswith("rlimits (")


def test_a_worker_that_is_not_root_is_told_why_it_gets_rlimits() -> None:
    real_cgroups()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    checkout = Path(__file__).resolve().parents[2]
    can_run = subprocess.run([*as_nobody, "-c", "import runtime_bridge"], cwd=checkout)
    if can_run.returncode != 0:
        pytest.skip("user nobody cannot read this interpreter or checkout")
    probe = "from runtime_bridge.cgroups import mechanism; print(mechanism())"
    shown = subprocess.run(
        [*as_nobody, "-c", probe], capture_output=True, text=True, check=True, cwd=checkout
    )
    assert shown.stdout.startswith("rlimits (")
    assert "root" in shown.stdout or "delegated" in shown.stdout


FORK_LOOP = """
import os, signal, sys
children = 0
try:
    while children < 1000:
        if os.fork() == 0:
            # Kept alive, but off the output the test reads to its end.
            os.close(1)
            os.close(2)
            signal.pause()
            os._exit(0)
        children += 1
except BlockingIOError:
    print(children)
    sys.exit(3)
"""


def test_a_fork_loop_stops_at_the_task_bound(make_group: MakeGroup) -> None:
    group = make_group(SMALL)
    done = subprocess.run(
        joined(group, sys.executable, "-c", FORK_LOOP), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert int(done.stdout) < SMALL.tasks
    assert group.hit() == ("tasks",)
    # The bound is the group's alone: this process forks as before, with 31 tasks still held.
    assert subprocess.run(["true"]).returncode == 0
    group.remove()
    assert not any(directory.exists() for directory in group.directories)


def test_an_allocation_past_the_memory_bound_is_killed(make_group: MakeGroup) -> None:
    group = make_group(SMALL)
    fits = subprocess.run(
        joined(group, sys.executable, "-c", "b = bytearray(32 * 2**20)"), timeout=60
    )
    assert fits.returncode == 0
    assert group.hit() == ()
    too_big = subprocess.run(
        joined(group, sys.executable, "-c", "b = bytearray(400 * 2**20)"), timeout=60
    )
    assert too_big.returncode == -9
    assert group.hit() == ("memory",)


BUSY_LOOP = """
import time
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
"""


def test_a_busy_loop_gets_only_its_cpu_quota(make_group: MakeGroup) -> None:
    if "cpu" not in mechanism():
        pytest.skip("this host's cgroups have no cpu controller")
    group = make_group(Bounds(128 * MiB, 32, 0.2, 256, GiB))
    process = subprocess.Popen(joined(group, sys.executable, "-c", BUSY_LOOP))
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0
    # A second of wall time at a fifth of a core: well under the second it would otherwise use.
    assert usage.ru_utime + usage.ru_stime < 0.6


def test_a_launch_may_spend_one_periods_quota_again_at_once(make_group: MakeGroup) -> None:
    # A CLI's start runs on several threads; at its steady bound it would be throttled.
    if "cpu" not in mechanism():
        pytest.skip("this host's cgroups have no cpu controller")
    group = make_group(Bounds(128 * MiB, 32, 0.5, 256, GiB))
    bursts = [
        directory / name
        for directory in group.directories
        for name in ("cpu.cfs_burst_us", "cpu.max.burst")
        if (directory / name).exists()
    ]
    if not bursts:
        pytest.skip("this kernel has no cpu burst (Linux 5.14+)")
    assert [path.read_text().strip() for path in bursts] == ["50000"]


def test_removing_a_group_ends_what_is_left_in_it(make_group: MakeGroup) -> None:
    group = make_group(SMALL)
    process = subprocess.Popen(joined(group, "sh", "-c", "sleep 600 & sleep 600 & wait"))
    procs = group.procs_files[0]
    wait_until(lambda: len(procs.read_text().split()) == 3)
    group.remove()
    assert not any(directory.exists() for directory in group.directories)
    assert process.wait(timeout=10) == -9


def test_a_bound_the_kernel_refuses_leaves_no_group(caplog: pytest.LogCaptureFixture) -> None:
    real_cgroups()
    name = f"test-{uuid.uuid4().hex}"
    # 0.001 CPUs is a 100 us quota, under the kernel's 1 ms minimum: refused after memory and
    # pids were already set.
    refused = Bounds(128 * MiB, 32, 0.001, 256, GiB)
    with caplog.at_level(logging.WARNING, logger="amux.worker"):
        group = LaunchGroup.create(name, refused)
    if "cpu" not in mechanism():
        assert group is not None
        group.remove()
        pytest.skip("this host's cgroups have no cpu controller")
    assert group is None
    assert "runs without a cgroup" in caplog.text
    leftovers = list(Path("/sys/fs/cgroup").glob(f"**/amux/{name}"))
    assert leftovers == []


def test_a_stale_group_of_the_same_name_is_replaced(make_group: MakeGroup) -> None:
    first = make_group(SMALL)
    subprocess.run(joined(first, sys.executable, "-c", FORK_LOOP), capture_output=True)
    assert first.hit() == ("tasks",)
    again = LaunchGroup.create(first.name, SMALL)
    assert again is not None
    try:
        assert again.hit() == ()
    finally:
        again.remove()


@pytest.mark.parametrize("name", ["", "..", "a/b", "../amux", "memory.max", "x" * 200])
def test_a_group_name_is_one_safe_path_component(name: str) -> None:
    with pytest.raises(ValueError, match="not a launch group name"):
        check_name(name)
    with pytest.raises(ValueError):
        LaunchGroup.create(name, SMALL)


def test_the_rlimit_fallback_bounds_open_files_and_tasks_only_for_an_own_uid() -> None:
    shared = rlimits(SMALL, own_uid=False)
    fsize = (SMALL.workspace_bytes, SMALL.workspace_bytes)
    assert shared == {resource.RLIMIT_NOFILE: (256, 256), resource.RLIMIT_FSIZE: fsize}
    own = rlimits(SMALL, own_uid=True)
    assert own == {
        resource.RLIMIT_NOFILE: (256, 256),
        resource.RLIMIT_NPROC: (32, 32),
        resource.RLIMIT_FSIZE: fsize,
    }
    capped = rlimits(SMALL, own_uid=True, ceilings={resource.RLIMIT_NOFILE: 128})
    assert capped[resource.RLIMIT_NOFILE] == (128, 128)
    # Memory and CPU are not rlimits at all (see rlimits' docstring).
    assert resource.RLIMIT_AS not in own and resource.RLIMIT_CPU not in own


def test_the_open_files_rlimit_holds_in_the_launched_process() -> None:
    limits = rlimits(SMALL, own_uid=False)

    def apply() -> None:
        for which, value in limits.items():
            resource.setrlimit(which, value)

    shown = subprocess.run(
        ["sh", "-c", "ulimit -n"], preexec_fn=apply, capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "256"


def test_an_address_space_rlimit_would_break_node() -> None:
    """Why the fallback has no memory rlimit: Node reserves address space it never uses."""
    node = subprocess.run(["sh", "-c", "command -v node"], capture_output=True, text=True)
    if node.returncode != 0:
        pytest.skip("node is not installed")
    wasm = "new WebAssembly.Memory({initial: 1})"

    def address_space(limit: int) -> Callable[[], None]:
        return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    unbounded = subprocess.run([node.stdout.strip(), "-e", wasm], capture_output=True)
    assert unbounded.returncode == 0
    # The largest default memory bound, as address space.
    bounded = subprocess.run(
        [node.stdout.strip(), "-e", wasm], preexec_fn=address_space(4 * GiB), capture_output=True
    )
    assert bounded.returncode != 0
    assert b"could not allocate memory" in bounded.stderr


def fake_v2(root: Path, controllers: str, *, namespace_root: bool = False) -> Path:
    """A fake of the kernel's cgroup2 interface: plain directories and files standing for
    ``cgroup.controllers``, ``cgroup.subtree_control`` and ``cgroup.procs``. This host mounts
    cgroup v1, so the v2 path can only run against files imitating the kernel's; what they
    cannot imitate (files the kernel adds to a new group) is not asserted."""
    root.mkdir()
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("1\n")
    if namespace_root:
        (root / "cgroup.type").write_text("domain\n")
    return root


def test_v2_group_enables_its_controllers_and_writes_the_bounds(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root v2 layout is chosen only when running as root")
    root = fake_v2(tmp_path / "cgroup", "cpuset cpu io memory hugetlb pids rdma misc")
    assert mechanism(root) == "cgroup v2 (memory, pids, cpu)"
    # As an earlier launch would have left it, with the files the kernel gives a new group.
    (root / "amux").mkdir()
    (root / "amux" / "cgroup.subtree_control").write_text("")
    bounds = Bounds(128 * MiB, 32, 0.5, 256, GiB)
    group = LaunchGroup.create("exec1", bounds, root)
    assert group is not None
    directory = root / "amux" / "exec1"
    assert group.procs_files == (directory / "cgroup.procs",)
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (root / "amux" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (directory / "memory.max").read_text() == str(128 * MiB)
    assert (directory / "pids.max").read_text() == "32"
    assert (directory / "cpu.max").read_text() == "50000 100000"

    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 0\noom_kill 0\n")
    (directory / "pids.events").write_text("max 0\n")
    assert group.hit() == ()
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\n")
    (directory / "pids.events").write_text("max 3\n")
    assert group.hit() == ("memory", "tasks")


def test_v2_without_pids_falls_back_to_rlimits(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cgroup", "cpu io memory")
    assert mechanism(root) == "rlimits (cgroup v2 without the pids controller)"
    assert LaunchGroup.create("exec1", SMALL, root) is None
    assert not (root / "amux" / "exec1").exists()


def test_v2_namespace_root_holding_processes_falls_back(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root v2 layout is chosen only when running as root")
    root = fake_v2(tmp_path / "cgroup", "cpu memory pids", namespace_root=True)
    assert mechanism(root) == (
        "rlimits (cgroup v2 namespace root holds processes, so it cannot delegate controllers)"
    )


def test_v2_not_as_root_uses_the_delegated_subtree_above_its_own_group(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cgroup", "cpu memory pids")
    delegated = root / "user.slice" / "amux.service"
    own = delegated / "worker"
    for group, enabled in ((root / "user.slice", "memory pids"), (delegated, "memory pids")):
        group.mkdir()
        (group / "cgroup.controllers").write_text("memory pids\n")
        (group / "cgroup.subtree_control").write_text(enabled + "\n")
        (group / "cgroup.procs").write_text("")
    own.mkdir()
    (own / "cgroup.controllers").write_text("memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    layout = _v2_layout(root, 1000, "/user.slice/amux.service/worker")
    assert not isinstance(layout, str), layout
    # The worker's own group holds processes, so it cannot distribute memory: its parent can.
    assert layout.parents == (delegated,)
    assert layout.controllers == ("memory", "pids")
    assert _v2_layout(root, 1000, None) == "not root, and this process's cgroup is unknown"
