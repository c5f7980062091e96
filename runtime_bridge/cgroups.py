"""One control group per Agent launch, bounding its memory, tasks and CPU; rlimits otherwise.

A launch's bounds (``runtime_bridge.bounds``) hold for everything the Agent starts only in a
control group: the kernel counts the group's memory and tasks together however the Agent forks,
and ends (memory) or refuses (tasks) what passes them, inside that group alone. The rules:

- Which mechanism applies is decided by what the host offers, cheaply and without raising
  (``mechanism`` tells ``amux doctor``): the unified hierarchy (cgroup v2) when
  ``<root>/cgroup.controllers`` exists, else the v1 hierarchies the mount table shows under
  ``<root>`` (a hybrid host's ``unified`` mount, which holds no controller amux uses, is
  ignored), else rlimits. Memory and pids are required; cpu is applied where the host has it.
  Open files are bounded by an rlimit in every case: no controller counts them.
- Where groups live. v1: ``<root>/<controller>/amux/<name>`` in each hierarchy, which needs root
  (or an ``amux`` directory the operator made writable). Such a group is outside the group a
  service manager put the worker in, so the launch's bounds, not the service's, hold for it.
  v2 as root: ``<root>/amux/<name>``,
  with the controllers enabled in the ``cgroup.subtree_control`` of ``<root>`` and
  ``<root>/amux``. v2 not as root: inside the subtree delegated to this process (the deepest
  writable ancestor of its own cgroup whose controllers it may distribute), since the kernel
  lets a process move its children only between groups it may write. v2 forbids enabling
  controllers in a group that holds processes, so the worker's own group cannot be the parent.
- ``amux`` itself is shared by concurrent launches and is never removed; each launch's own
  group is, by ``LaunchGroup.remove``, which first kills what is left in it.
- The launch process joins the group by writing its own pid into each of ``procs_files``
  before it execs the sandbox (and before it gives up root, where it does), so the Agent never
  runs outside it.
- Memory is bounded without swap (v1 ``memory.memsw``, v2 ``memory.swap.max = 0``): swapping a
  runaway turn out would slow the whole machine instead of ending the turn.
- Nothing here raises for a host without usable cgroups: ``LaunchGroup.create`` returns None,
  cleans up what it made, and the caller bounds the launch with ``rlimits`` instead.

Names are single path components of letters, digits, ``-`` and ``_`` (an execution id), so a
name can never reach another group or a control file.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime_bridge.bounds import Bounds

logger = logging.getLogger("amux.worker")

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "amux"
REQUIRED = ("memory", "pids")
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
# A group whose last task just died is freed by the kernel a little later; rmdir says EBUSY
# until then. Bounded: a group that stays busy is left (and logged), never waited on forever.
REMOVE_DEADLINE_S = 2.0
_RETRY_S = 0.01
MOUNTINFO = Path("/proc/self/mountinfo")


def check_name(name: str) -> str:
    """``name`` if it is a single safe path component.

    Raises:
        ValueError: it is not.
    """
    if not NAME.match(name):
        raise ValueError(f"{name!r} is not a launch group name (letters, digits, - and _)")
    return name


@dataclass(frozen=True)
class _Layout:
    """Where this host's launch groups go: ``parents`` are the directories that hold ``amux``
    (one per v1 hierarchy; one in v2), ``controllers`` those applied."""

    version: int
    controllers: tuple[str, ...]
    parents: tuple[Path, ...]
    # v2: the controllers this process must enable in the parent's cgroup.subtree_control.
    to_enable: tuple[str, ...] = ()


def _read(path: Path) -> str:
    with open(path, encoding="ascii") as file:
        return file.read()


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as file:
        file.write(value)


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


def _own_v2_cgroup() -> str | None:
    try:
        for line in _read(Path("/proc/self/cgroup")).splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
    except OSError:
        return None
    return None


def _v2_layout(root: Path, euid: int, own: str | None) -> _Layout | str:
    available = set(_read(root / "cgroup.controllers").split())
    missing = [name for name in REQUIRED if name not in available]
    if missing:
        return f"cgroup v2 without the {' and '.join(missing)} controller"
    if euid == 0:
        if not _writable(root / "cgroup.subtree_control"):
            return "cgroup v2 is mounted read-only"
        wanted = tuple(name for name in CONTROLLERS if name in available)
        enabled = _enabled(root)
        if not set(wanted) <= enabled and (root / "cgroup.type").exists():
            # A container's cgroup namespace root is an ordinary group: it can only distribute
            # controllers while it holds no process.
            if _read(root / "cgroup.procs").split():
                return "cgroup v2 namespace root holds processes, so it cannot delegate controllers"
        return _Layout(2, wanted, (root,), tuple(n for n in wanted if n not in enabled))
    if own is None:
        return "not root, and this process's cgroup is unknown"
    group = root / own.lstrip("/")
    # A delegated subtree is writable from its top down: the first group above that is not
    # writable ends the search.
    while root in group.parents and all(
        _writable(path)
        for path in (group, group / "cgroup.procs", group / "cgroup.subtree_control")
    ):
        enabled = _enabled(group)
        offered = set(_read(group / "cgroup.controllers").split())
        has_processes = bool(_read(group / "cgroup.procs").split())
        usable = enabled if has_processes else enabled | offered
        if set(REQUIRED) <= usable:
            wanted = tuple(name for name in CONTROLLERS if name in usable)
            return _Layout(2, wanted, (group,), tuple(n for n in wanted if n not in enabled))
        group = group.parent
    return "not root, and no cgroup v2 subtree with memory and pids is delegated to this process"


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def _v1_mounts(root: Path) -> dict[str, Path]:
    """Each controller's v1 hierarchy mounted under ``root``. Names such as ``cpu`` are often
    links to a shared mount (``cpu,cpuacct``); the mount table says which is which."""
    mounts: dict[str, Path] = {}
    for line in _read(MOUNTINFO).splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1 :]
        if len(tail) < 3 or tail[0] != "cgroup":
            continue
        point = Path(_unescape(fields[4]))
        if root not in point.parents:
            continue
        for option in tail[2].split(","):
            if option in CONTROLLERS:
                mounts.setdefault(option, point)
    return mounts


def _v1_layout(root: Path, euid: int) -> _Layout | str:
    mounts = _v1_mounts(root)
    missing = [name for name in REQUIRED if name not in mounts]
    if missing:
        return f"no cgroup {' or '.join(missing)} controller is mounted"
    present = tuple(name for name in CONTROLLERS if name in mounts)
    parents = tuple(dict.fromkeys(mounts[name] for name in present))
    for parent in parents:
        shared = parent / PARENT
        if not _writable(shared if shared.is_dir() else parent):
            why = "read-only" if euid == 0 else "writable only by root"
            return f"cgroup v1 {parent.name} hierarchy is {why}"
    return _Layout(1, present, parents)


def _layout(root: Path) -> _Layout | str:
    """This host's layout, or why there is none. Reads a few small files; never raises."""
    try:
        if (root / "cgroup.controllers").exists():
            return _v2_layout(root, os.geteuid(), _own_v2_cgroup())
        return _v1_layout(root, os.geteuid())
    except OSError as error:
        return f"cgroups cannot be read ({error.strerror or error})"


def mechanism(root: Path = CGROUP_ROOT) -> str:
    """What bounds launches on this host, as ``amux doctor`` shows it:
    ``cgroup v2 (memory, pids, cpu)``, ``cgroup v1 (memory, pids)``, ``rlimits (<why>)``."""
    layout = _layout(root)
    if isinstance(layout, str):
        return f"rlimits ({layout})"
    return f"cgroup v{layout.version} ({', '.join(layout.controllers)})"


def _settings(bounds: Bounds, version: int, controllers: tuple[str, ...]) -> list[tuple[str, str]]:
    """(file, value) to write into a new group, in order, for the controllers it has."""
    quota = str(max(1, round(bounds.cpu * CPU_PERIOD_US)))
    if version == 2:
        files = [("memory.max", str(bounds.memory_bytes)), ("pids.max", str(bounds.tasks))]
        if "cpu" in controllers:
            files.append(("cpu.max", f"{quota} {CPU_PERIOD_US}"))
        return files
    files = [
        ("memory.limit_in_bytes", str(bounds.memory_bytes)),
        ("pids.max", str(bounds.tasks)),
    ]
    if "cpu" in controllers:
        files += [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)]
    return files


def _burst_settings(
    bounds: Bounds, version: int, controllers: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(file, value) the kernel may lack (a burst needs Linux 5.14): a launch may spend one
    period's quota again at once, out of what it left unused. An Agent's CLI starts on several
    threads (Node compiles in parallel), and at one CPU that start was throttled by a tenth or
    more; the average over time stays at the bound."""
    if "cpu" not in controllers:
        return []
    quota = str(max(1, round(bounds.cpu * CPU_PERIOD_US)))
    return [("cpu.max.burst" if version == 2 else "cpu.cfs_burst_us", quota)]


class LaunchGroup:
    """One launch's control group (one directory per v1 hierarchy, one in v2)."""

    def __init__(
        self,
        name: str,
        version: int,
        directories: tuple[Path, ...],
        controllers: tuple[str, ...] = CONTROLLERS,
    ) -> None:
        self.name = check_name(name)
        self.version = version
        self.directories = directories
        # The bounds this group applies: memory and pids always, cpu where the host has it.
        self.controllers = controllers

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """The files the launch process writes its own pid into, each, before it execs."""
        return tuple(directory / "cgroup.procs" for directory in self.directories)

    @classmethod
    def create(cls, name: str, bounds: Bounds, root: Path = CGROUP_ROOT) -> LaunchGroup | None:
        """A new group ``name`` with ``bounds`` applied, or None where cgroups cannot be used
        (logged; nothing is left behind). A stale group of the same name is removed first.

        Raises:
            ValueError: ``name`` is not a single safe path component.
        """
        check_name(name)
        layout = _layout(root)
        if isinstance(layout, str):
            logger.debug("launch %s not in a cgroup: %s", name, layout)
            return None
        made: list[Path] = []
        try:
            if layout.version == 2:
                directories, controllers = cls._make_v2(name, layout, made)
            else:
                directories, controllers = cls._make_v1(name, layout, made)
            for file, value in _settings(bounds, layout.version, controllers):
                # In v1 each hierarchy's directory has its own controllers' files only.
                targets = [
                    directory
                    for directory in directories
                    if layout.version == 2 or (directory / file).exists()
                ]
                if not targets:
                    raise OSError(errno.ENOENT, f"no group of {name} has {file}")
                for directory in targets:
                    _write(directory / file, value)
            for file, value in _burst_settings(bounds, layout.version, controllers):
                for directory in directories:
                    if (directory / file).exists():
                        try:
                            _write(directory / file, value)
                        except OSError as error:
                            logger.debug("launch %s without a cpu burst: %s", name, error)
            for directory in directories:
                cls._no_swap(directory, bounds, layout.version)
        except OSError as error:
            logger.warning("launch %s runs without a cgroup (rlimits only): %s", name, error)
            for directory in reversed(made):
                try:
                    directory.rmdir()
                except OSError:
                    pass
            return None
        return cls(name, layout.version, directories, controllers)

    @staticmethod
    def _make_dir(directory: Path, made: list[Path], *, shared: bool) -> None:
        try:
            directory.mkdir()
        except FileExistsError:
            if shared:
                return
            # Execution ids are unique, so this is a group left by a worker that died: its
            # counters would report that launch's hits as this one's.
            logger.warning("removing stale launch group %s", directory)
            _empty_and_remove(directory)
            directory.mkdir()
        if not shared:
            made.append(directory)

    @classmethod
    def _make_v1(
        cls, name: str, layout: _Layout, made: list[Path]
    ) -> tuple[tuple[Path, ...], tuple[str, ...]]:
        directories = tuple(parent / PARENT / name for parent in layout.parents)
        for parent in layout.parents:
            cls._make_dir(parent / PARENT, made, shared=True)
        for directory in directories:
            cls._make_dir(directory, made, shared=False)
        return directories, layout.controllers

    @classmethod
    def _make_v2(
        cls, name: str, layout: _Layout, made: list[Path]
    ) -> tuple[tuple[Path, ...], tuple[str, ...]]:
        (parent,) = layout.parents
        shared = parent / PARENT
        if layout.to_enable:
            _enable(parent, layout.to_enable)
        cls._make_dir(shared, made, shared=True)
        missing = tuple(n for n in layout.controllers if n not in _enabled(shared))
        if missing:
            _enable(shared, missing)
        # What the kernel actually enabled: cpu may have been refused.
        controllers = tuple(n for n in layout.controllers if n in _enabled(shared))
        if not set(REQUIRED) <= set(controllers):
            raise OSError(errno.EPERM, f"{shared}: memory and pids cannot be enabled")
        directory = shared / name
        cls._make_dir(directory, made, shared=False)
        return (directory,), controllers

    @staticmethod
    def _no_swap(directory: Path, bounds: Bounds, version: int) -> None:
        # Present only where the kernel accounts swap; without it there is nothing to forbid.
        if version == 2:
            if (directory / "memory.swap.max").exists():
                _write(directory / "memory.swap.max", "0")
        elif (directory / "memory.memsw.limit_in_bytes").exists():
            _write(directory / "memory.memsw.limit_in_bytes", str(bounds.memory_bytes))

    def hit(self) -> tuple[str, ...]:
        """The bounds the kernel reports reached so far: ``"memory"`` (something was killed for
        memory), ``"tasks"`` (a fork was refused). Unreadable counters report nothing."""
        reached: list[str] = []
        if any(self._memory_hit(directory) for directory in self.directories):
            reached.append("memory")
        if any(self._tasks_hit(directory) for directory in self.directories):
            reached.append("tasks")
        return tuple(reached)

    def _memory_hit(self, directory: Path) -> bool:
        if self.version == 2:
            events = _keyed(directory / "memory.events")
            return events.get("oom_kill", 0) > 0 or events.get("oom", 0) > 0
        control = _keyed(directory / "memory.oom_control")
        if "oom_kill" in control:
            return control["oom_kill"] > 0
        if not (directory / "memory.oom_control").exists():
            return False
        # Kernels before 4.13 count no kills. failcnt also counts every time reclaim brought
        # the group back under its limit (page cache), so it is only a sign, used as a last
        # resort: a kill is then reported where memory was merely tight.
        return _number(directory / "memory.failcnt") > 0

    @staticmethod
    def _tasks_hit(directory: Path) -> bool:
        return _keyed(directory / "pids.events").get("max", 0) > 0

    def remove(self) -> None:
        """Kill whatever is left in the group and remove it. Never raises: a group the kernel
        keeps busy past a short deadline is logged and left."""
        for directory in self.directories:
            try:
                _empty_and_remove(directory)
            except OSError as error:
                logger.warning("launch group %s is left: %s", directory, error)


def _is_launch_group(directory: Path) -> bool:
    return directory.parent.name == PARENT and bool(NAME.match(directory.name))


def launch_group_of(pid: int, root: Path = CGROUP_ROOT) -> tuple[Path, ...] | None:
    """The ``cgroup.procs`` files of the launch group process ``pid`` is in (one per v1
    hierarchy, one in v2), for a process that serves that launch to join; None when ``pid`` is
    in no launch group or its groups cannot be read. Never raises."""
    try:
        lines = _read(Path(f"/proc/{pid}/cgroup")).splitlines()
        if (root / "cgroup.controllers").exists():
            paths = [line[3:].strip() for line in lines if line.startswith("0::")]
            directories = [root / path.lstrip("/") for path in paths]
        else:
            mounts = _v1_mounts(root)
            directories = []
            for line in lines:
                _, controllers, path = line.split(":", 2)
                for controller in controllers.split(","):
                    if controller in CONTROLLERS and controller in mounts:
                        directories.append(mounts[controller] / path.strip().lstrip("/"))
    except (OSError, ValueError):
        return None
    unique = tuple(dict.fromkeys(directories))
    if not unique or not all(_is_launch_group(d) for d in unique):
        return None
    if len({d.name for d in unique}) != 1:
        return None
    return tuple(d / "cgroup.procs" for d in unique)


def _enabled(group: Path) -> set[str]:
    # The kernel lists names bare; a plain file standing in for it holds what was written.
    return {token.lstrip("+") for token in _read(group / "cgroup.subtree_control").split()}


def _enable(group: Path, controllers: tuple[str, ...]) -> None:
    """Enable ``controllers`` for ``group``'s children; cpu is dropped rather than failing the
    whole group (the kernel refuses it while a real-time task runs in a child group)."""
    try:
        _write(group / "cgroup.subtree_control", " ".join(f"+{name}" for name in controllers))
    except OSError:
        if "cpu" not in controllers:
            raise
        rest = tuple(name for name in controllers if name != "cpu")
        if rest:
            _write(group / "cgroup.subtree_control", " ".join(f"+{name}" for name in rest))


def _number(path: Path) -> int:
    """A one-number counter file; 0 if unreadable."""
    try:
        return int(_read(path).strip())
    except (OSError, ValueError):
        return 0


def _keyed(path: Path) -> dict[str, int]:
    """A file of ``key value`` counter lines; {} if unreadable."""
    try:
        text = _read(path)
    except OSError:
        return {}
    counters: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            counters[key] = int(value.strip())
        except ValueError:
            continue
    return counters


def _pids(directory: Path) -> set[int]:
    try:
        # 0 stands for a process outside this pid namespace: never a pid to signal (kill(0)
        # would signal this process's own group).
        return {pid for pid in map(int, _read(directory / "cgroup.procs").split()) if pid > 0}
    except FileNotFoundError:
        return set()


def _kill_members(directory: Path) -> None:
    """SIGKILL every process in ``directory``, one by one (v1, or v2 without cgroup.kill).

    A pid read from cgroup.procs may be freed and reused by an unrelated process before the
    signal: each is opened as a pidfd first, and signalled only if it is still a member after
    that, so the signal reaches the process that was checked or none.
    """
    before = _pids(directory)
    handles: dict[int, int] = {}
    try:
        for pid in before:
            try:
                handles[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except OSError:
                # No pidfds (kernels before 5.3, or a seccomp filter): the plain kill is left.
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        still = _pids(directory)
        for pid, handle in handles.items():
            if pid in still:
                try:
                    signal.pidfd_send_signal(handle, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    finally:
        for handle in handles.values():
            os.close(handle)


def _empty_and_remove(directory: Path) -> None:
    """Kill every task in ``directory`` and remove it, retrying until a short deadline.

    Raises:
        OSError: it still exists (or holds tasks) at the deadline, or cannot be removed.
    """
    deadline = time.monotonic() + REMOVE_DEADLINE_S
    kill_file = directory / "cgroup.kill"
    while True:
        try:
            if kill_file.exists():
                # One write kills every task, including those forked meanwhile.
                _write(kill_file, "1")
            else:
                # Tasks forked meanwhile are caught by the next round.
                _kill_members(directory)
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise
        time.sleep(_RETRY_S)


def rlimits(
    bounds: Bounds, own_uid: bool, ceilings: Mapping[int, int] | None = None
) -> dict[int, tuple[int, int]]:
    """The rlimits (resource -> (soft, hard)) a launch sets on itself.

    Open files are always bounded this way: no cgroup counts them. So is the size of any one file
    the launch writes (``RLIMIT_FSIZE``, the workspace bound): a write or ``fallocate`` past it
    fails (``SIGXFSZ``, else ``EFBIG``), so a single fast writer cannot fill the disk between two
    measurements of the workspace, and no sparse file larger than the bound can be made there.
    Without a cgroup this is
    the whole fallback, and a weaker one:

    - ``RLIMIT_NPROC`` is ``bounds.tasks`` only when the launch runs as a uid of its own
      (``own_uid``): the kernel counts every process of the real uid on the machine, so under
      a uid shared with the worker or the operator's session the launch would fail to fork as
      soon as *they* have that many, and it bounds nothing for uid 0, which the kernel exempts.
      Concurrent launches under one run-as uid share it.
    - Memory gets no rlimit. ``RLIMIT_AS`` bounds address space reserved, not memory used, and
      Node reserves far more than it uses: ``node -e 1`` aborts under 512 MiB of address space,
      and every ``WebAssembly.Memory`` reserves about 10 GiB of guard space: under a 4 GiB
      ``RLIMIT_AS`` (the largest default memory bound) creating one fails, and four fail even
      under 32 GiB. Any value that lets Node CLIs work bounds nothing a cgroup would.
    - CPU gets no rlimit: ``RLIMIT_CPU`` kills after a total of CPU seconds, which ends long
      legitimate turns rather than sharing the machine.

    ``ceilings`` caps each value at a hard limit the caller cannot raise (a process that is not
    root cannot lift its own hard limit).
    """
    wanted = {
        resource.RLIMIT_NOFILE: bounds.open_files,
        resource.RLIMIT_FSIZE: bounds.workspace_bytes,
    }
    if own_uid:
        wanted[resource.RLIMIT_NPROC] = bounds.tasks
    limits: dict[int, tuple[int, int]] = {}
    for which, value in wanted.items():
        ceiling = (ceilings or {}).get(which)
        if ceiling is not None and ceiling != resource.RLIM_INFINITY:
            value = min(value, ceiling)
        limits[which] = (value, value)
    return limits
