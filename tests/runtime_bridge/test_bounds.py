"""Per-launch bounds: defaults for the machine, the settings that change them, how they read in
messages, and measuring a workspace an Agent may be changing (real files in a tmp dir)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from runtime_bridge.bounds import (
    Bounds,
    GiB,
    MiB,
    bounds_from_settings,
    default_bounds,
    format_size,
    parse_size,
)
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.workspace_usage import MAX_DEPTH, measure, workspace_size
from runtime_bridge.workspace_watch import WorkspaceGuard

BOUND_ENV = (
    "AMUX_RUNTIME_MEMORY_MAX",
    "AMUX_RUNTIME_TASKS_MAX",
    "AMUX_RUNTIME_CPU_MAX",
    "AMUX_RUNTIME_OPEN_FILES_MAX",
    "AMUX_RUNTIME_WORKSPACE_MAX",
)


@pytest.fixture(autouse=True)
def no_bound_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in BOUND_ENV:
        monkeypatch.delenv(name, raising=False)


def test_defaults_leave_a_small_host_room_for_the_hub() -> None:
    small = default_bounds(cpus=1, ram_bytes=1 * GiB)
    assert small == Bounds(
        memory_bytes=512 * MiB, tasks=512, cpu=0.5, open_files=4096, workspace_bytes=2 * GiB
    )
    assert default_bounds(cpus=2, ram_bytes=8 * GiB).memory_bytes == 2 * GiB
    assert default_bounds(cpus=2, ram_bytes=8 * GiB).cpu == 1.0
    big = default_bounds(cpus=64, ram_bytes=256 * GiB)
    assert (big.memory_bytes, big.cpu) == (4 * GiB, 63.0)


def test_unset_settings_take_the_machines_defaults() -> None:
    bounds = bounds_from_settings(RuntimeSettings(), cpus=4, ram_bytes=4 * GiB)
    assert bounds == default_bounds(cpus=4, ram_bytes=4 * GiB)
    # This machine's own CPUs and RAM when none are given.
    assert bounds_from_settings(RuntimeSettings()).cpu >= 0.5


def test_settings_from_the_environment_accept_sizes_and_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMUX_RUNTIME_MEMORY_MAX", "1.5G")
    monkeypatch.setenv("AMUX_RUNTIME_TASKS_MAX", "100")
    monkeypatch.setenv("AMUX_RUNTIME_CPU_MAX", "0.25")
    monkeypatch.setenv("AMUX_RUNTIME_OPEN_FILES_MAX", "1024")
    monkeypatch.setenv("AMUX_RUNTIME_WORKSPACE_MAX", str(300 * MiB))
    bounds = bounds_from_settings(RuntimeSettings(), cpus=8, ram_bytes=32 * GiB)
    assert bounds == Bounds(
        memory_bytes=3 * GiB // 2,
        tasks=100,
        cpu=0.25,
        open_files=1024,
        workspace_bytes=300 * MiB,
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [("512M", 512 * MiB), ("2g", 2 * GiB), ("2GiB", 2 * GiB), ("2Gi", 2 * GiB), ("4096", 4096)],
)
def test_sizes_are_binary_whatever_the_spelling(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("2X", "is not a size: use bytes or a number with K, M, G or T"),
        ("2GB", "is ambiguous: write 2G or 2GiB"),
        ("-1G", "is not a size"),
        ("1M", "below the smallest usable 64 MiB"),
    ],
)
def test_a_wrong_memory_setting_says_what_to_write(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("AMUX_RUNTIME_MEMORY_MAX", value)
    with pytest.raises(ValidationError) as raised:
        RuntimeSettings()
    assert "memory_max" in str(raised.value)
    assert message in str(raised.value)


def test_a_cpu_quota_below_the_kernels_smallest_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AMUX_RUNTIME_CPU_MAX", "0.001")
    with pytest.raises(ValidationError, match="cpu_max"):
        RuntimeSettings()


def test_describe_names_the_bound_and_the_setting_that_changes_it() -> None:
    bounds = Bounds(2 * GiB, 512, 1.5, 4096, 3 * GiB // 2)
    assert bounds.describe("memory") == "memory bound (2 GiB, AMUX_RUNTIME_MEMORY_MAX)"
    assert bounds.describe("tasks") == "tasks bound (512 tasks, AMUX_RUNTIME_TASKS_MAX)"
    assert bounds.describe("cpu") == "CPU bound (1.5 CPUs, AMUX_RUNTIME_CPU_MAX)"
    assert bounds.describe("open_files") == (
        "open files bound (4096 open files, AMUX_RUNTIME_OPEN_FILES_MAX)"
    )
    assert bounds.describe("workspace") == "workspace bound (1.5 GiB, AMUX_RUNTIME_WORKSPACE_MAX)"
    assert format_size(300 * MiB) == "300 MiB"
    assert format_size(100) == "100 B"


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Random bytes, so the file system allocates every block (no holes, no compression).
    path.write_bytes(os.urandom(size))


def test_a_workspace_under_its_bound_is_measured_whole(tmp_path: Path) -> None:
    write(tmp_path / "a" / "one", 1 * MiB)
    write(tmp_path / "a" / "b" / "two", 2 * MiB)
    size = workspace_size(tmp_path, 1 * GiB)
    # The data plus the blocks of three directories.
    assert 3 * MiB <= size <= 3 * MiB + 64 * 1024
    assert workspace_size(tmp_path / "missing", 1 * GiB) == 0


def test_measuring_stops_just_past_the_bound(tmp_path: Path) -> None:
    for index in range(200):
        write(tmp_path / f"d{index % 10}" / f"f{index}", 64 * 1024)
    size = workspace_size(tmp_path, 256 * 1024)
    assert size > 256 * 1024
    # It stopped at the file that passed the bound, long before the tree's 12.5 MiB.
    assert size <= 256 * 1024 + 64 * 1024 + 10 * 4096 + 4096


def test_links_out_of_the_workspace_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside / "big", 4 * MiB)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "to-dir").symlink_to(outside)
    (workspace / "to-file").symlink_to(outside / "big")
    (workspace / "to-root").symlink_to("/")
    assert workspace_size(workspace, 1 * GiB) < 64 * 1024


def test_disk_used_counts_not_apparent_size(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as file:
        file.truncate(100 * GiB)
    write(tmp_path / "data", 1 * MiB)
    os.link(tmp_path / "data", tmp_path / "same-data")
    size = workspace_size(tmp_path, 10 * GiB)
    # The hole uses no disk, and the second name of a file is not a second file.
    assert 1 * MiB <= size < 1 * MiB + 64 * 1024


def test_a_tree_too_deep_to_walk_counts_as_over(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(MAX_DEPTH + 2):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    assert workspace_size(tmp_path, 1 * GiB) > 1 * GiB


def test_other_file_systems_inside_are_not_counted(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a file system inside the workspace needs root")
    mount = tmp_path / "mounted"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        write(mount / "data", 8 * MiB)
        assert workspace_size(tmp_path, 1 * GiB) < 64 * 1024
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_entries_vanishing_while_measured_are_skipped(tmp_path: Path) -> None:
    """The Agent may delete, recreate and swap directories for links during a measurement."""
    write(tmp_path / "stable", 1 * MiB)
    stop = threading.Event()

    def churn() -> None:
        index = 0
        while not stop.is_set():
            index += 1
            directory = tmp_path / f"churn{index % 4}"
            try:
                directory.mkdir()
                (directory / "file").write_bytes(b"x" * 8192)
                (directory / "file").unlink()
                directory.rmdir()
                directory.symlink_to("/")
                directory.unlink()
            except OSError:
                continue

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        sizes = [workspace_size(tmp_path, 1 * GiB) for _ in range(300)]
    finally:
        stop.set()
        thread.join()
    assert all(1 * MiB <= size < 2 * MiB for size in sizes)


def test_a_tree_of_more_names_than_a_measurement_walks_counts_as_over(tmp_path: Path) -> None:
    """Empty files and links use no blocks: without a count, a million of them would make every
    measurement walk a million names and still find nothing over the bound."""
    for index in range(150):
        (tmp_path / f"empty{index}").touch()
        (tmp_path / f"link{index}").symlink_to("/")
    usage = measure(tmp_path, 1 * GiB, max_entries=200)
    assert usage.crowded and usage.over(1 * GiB)
    assert not measure(tmp_path, 1 * GiB, max_entries=400).crowded


async def test_a_turn_writing_past_its_workspace_bound_is_stopped_where_it_waits(
    tmp_path: Path,
) -> None:
    stopped = asyncio.Event()

    async def turn() -> AsyncIterator[str]:
        try:
            for index in range(1000):
                write(tmp_path / f"f{index}", 256 * 1024)
                yield f"wrote {index}"
                await asyncio.sleep(0.01)
            yield "finished"
        finally:
            stopped.set()

    guard = WorkspaceGuard(tmp_path, 2 * MiB, poll=0.05)
    assert await guard.start() is None
    seen = [event async for event in guard.events(turn())]
    assert stopped.is_set() and "finished" not in seen
    assert guard.reached is not None and guard.reached.used > 2 * MiB
    # Stopped within a few measurements of the bound, not at the end of the turn.
    assert len(seen) < 40


async def test_a_workspace_past_its_bound_at_the_start_may_shrink_but_not_grow(
    tmp_path: Path,
) -> None:
    write(tmp_path / "old", 3 * MiB)
    guard = WorkspaceGuard(tmp_path, 2 * MiB, poll=0.05)
    already = await guard.start()
    assert already is not None and already.used >= 3 * MiB

    async def shrink() -> AsyncIterator[str]:
        (tmp_path / "old").unlink()
        for index in range(5):
            await asyncio.sleep(0.05)
            yield f"step {index}"

    assert len([event async for event in guard.events(shrink())]) == 5
    assert guard.reached is None and await guard.check() is None
    write(tmp_path / "new", 4 * MiB)
    assert await guard.check() is not None
