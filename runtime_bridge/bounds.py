"""How much of the machine one Agent launch may use: memory, tasks, CPU, open files, workspace.

An Agent is untrusted code with a shell, and it shares its machine with the Hub, the worker and
other users' turns. One turn that allocates without end, forks without end or spins every core
must end that turn only, never the others. Each launch therefore gets bounds:

- memory: a quarter of the machine's RAM, at least 512 MiB (an Agent CLI on Node needs a few
  hundred) and at most 4 GiB (a coding turn needs no more; the rest stays for everyone else);
- tasks (processes and threads): 512, far above what a CLI with its shells and tools uses, far
  below what takes a machine's process table;
- CPU: every core but one (at least half a core), so the Hub and other turns always get one;
  a quota, not a pinning: 1.5 means one and a half cores' worth of time;
- open files: 4096;
- workspace: 2 GiB on disk.

Each can be set (``AMUX_RUNTIME_MEMORY_MAX``, ``_TASKS_MAX``, ``_CPU_MAX``, ``_OPEN_FILES_MAX``,
``_WORKSPACE_MAX``); sizes are bytes or a number with a binary unit (``512M``, ``2G``, ``1.5GiB``).
Unset means the default above, computed from the machine the worker runs on.

This module is pure: the machine's CPU count and RAM come in as parameters, read by
``host_cpus`` and ``host_memory`` only when the caller passes none. ``cgroups`` applies memory,
tasks and CPU; rlimits apply open files; ``workspace_usage`` measures the workspace.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator

if TYPE_CHECKING:
    from runtime_bridge.config import RuntimeSettings

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

BoundKind = Literal["memory", "tasks", "cpu", "open_files", "workspace"]
KINDS: tuple[BoundKind, ...] = ("memory", "tasks", "cpu", "open_files", "workspace")

MEMORY_FLOOR = 512 * MiB
MEMORY_CEILING = 4 * GiB
DEFAULT_TASKS = 512
DEFAULT_OPEN_FILES = 4096
DEFAULT_WORKSPACE = 2 * GiB
# Below these a launch cannot start at all (Node alone needs more memory), so a setting under
# them is a mistake to report at start rather than a failure on every turn.
MIN_MEMORY = 64 * MiB
MIN_WORKSPACE = 1 * MiB
# The kernel's smallest CFS quota is 1 ms per 100 ms period.
MIN_CPU = 0.01

_ENV = {
    "memory": "AMUX_RUNTIME_MEMORY_MAX",
    "tasks": "AMUX_RUNTIME_TASKS_MAX",
    "cpu": "AMUX_RUNTIME_CPU_MAX",
    "open_files": "AMUX_RUNTIME_OPEN_FILES_MAX",
    "workspace": "AMUX_RUNTIME_WORKSPACE_MAX",
}
_LABEL = {
    "memory": "memory",
    "tasks": "tasks",
    "cpu": "CPU",
    "open_files": "open files",
    "workspace": "workspace",
}

# Units are binary whatever their spelling, as in systemd, Docker and Kubernetes: "2G", "2Gi"
# and "2GiB" are all 2 * 1024**3. Decimal "GB" is refused rather than silently read as binary.
_UNITS = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(value: str | int) -> int:
    """Bytes from ``value``: an integer, or a number with K, M, G or T (binary; ``i`` or ``iB``
    may follow).

    Raises:
        ValueError: not a size, or not positive.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value)
        unit = match.group(2).lower() if match else ""
        suffix = match.group(3).lower() if match else ""
        if match is None or (suffix not in ("", "b") and not unit):
            raise ValueError(
                f"{value!r} is not a size: use bytes or a number with K, M, G or T "
                "(binary: 1G = 1024M), e.g. 512M or 2G"
            )
        if suffix == "b" and unit:
            raise ValueError(
                f"{value!r} is ambiguous: write {match.group(1)}{unit.upper()} or "
                f"{match.group(1)}{unit.upper()}iB (binary units)"
            )
        size = math.floor(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{value!r} is not a positive size")
    return size


def format_size(size: int) -> str:
    """``2 GiB``, ``1.5 GiB``, ``300 MiB``: the largest binary unit that reads as a short number."""
    for unit, name in ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if size >= unit:
            value = size / unit
            text = f"{value:.0f}" if value == int(value) else f"{value:.1f}".rstrip("0")
            return f"{text} {name}"
    return f"{size} B"


def _size_setting(minimum: int) -> Any:
    def check(value: object) -> int | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str | int):
            raise ValueError(f"{value!r} is not a size")
        size = parse_size(value)
        if size < minimum:
            raise ValueError(f"{value!r} is below the smallest usable {format_size(minimum)}")
        return size

    return BeforeValidator(check)


# Settings fields: bytes or a size string; unset (None) means the default for the machine.
MemorySetting = Annotated[int | None, _size_setting(MIN_MEMORY)]
WorkspaceSetting = Annotated[int | None, _size_setting(MIN_WORKSPACE)]


@dataclass(frozen=True)
class Bounds:
    """One launch's bounds. ``cpu`` is a quota in CPUs (1.0 = one core's time)."""

    memory_bytes: int
    tasks: int
    cpu: float
    open_files: int
    workspace_bytes: int

    def value(self, kind: BoundKind) -> str:
        """The bound as a person reads it: ``2 GiB``, ``512 tasks``, ``1.5 CPUs``."""
        if kind == "memory":
            return format_size(self.memory_bytes)
        if kind == "workspace":
            return format_size(self.workspace_bytes)
        if kind == "tasks":
            return f"{self.tasks} tasks"
        if kind == "open_files":
            return f"{self.open_files} open files"
        cpus = f"{self.cpu:g}"
        return f"{cpus} CPU" if self.cpu == 1 else f"{cpus} CPUs"

    def describe(self, kind: BoundKind) -> str:
        """``memory bound (2 GiB, AMUX_RUNTIME_MEMORY_MAX)``: what was reached and what sets it."""
        return f"{_LABEL[kind]} bound ({self.value(kind)}, {_ENV[kind]})"


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_memory() -> int:
    """The machine's physical RAM in bytes."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def default_memory(ram_bytes: int) -> int:
    return min(max(ram_bytes // 4, MEMORY_FLOOR), MEMORY_CEILING)


def default_cpu(cpus: int) -> float:
    return max(0.5, float(cpus - 1))


def default_bounds(*, cpus: int, ram_bytes: int) -> Bounds:
    return Bounds(
        memory_bytes=default_memory(ram_bytes),
        tasks=DEFAULT_TASKS,
        cpu=default_cpu(cpus),
        open_files=DEFAULT_OPEN_FILES,
        workspace_bytes=DEFAULT_WORKSPACE,
    )


def bounds_from_settings(
    settings: RuntimeSettings, *, cpus: int | None = None, ram_bytes: int | None = None
) -> Bounds:
    """The settings' bounds, each unset one the default for a machine of ``cpus`` and
    ``ram_bytes`` (this machine's when not given)."""
    defaults = default_bounds(
        cpus=host_cpus() if cpus is None else cpus,
        ram_bytes=host_memory() if ram_bytes is None else ram_bytes,
    )
    return Bounds(
        memory_bytes=(
            defaults.memory_bytes if settings.memory_max is None else settings.memory_max
        ),
        tasks=defaults.tasks if settings.tasks_max is None else settings.tasks_max,
        cpu=defaults.cpu if settings.cpu_max is None else settings.cpu_max,
        open_files=(
            defaults.open_files if settings.open_files_max is None else settings.open_files_max
        ),
        workspace_bytes=(
            defaults.workspace_bytes if settings.workspace_max is None else settings.workspace_max
        ),
    )
