"""The bubblewrap sandbox every Agent launch runs in.

An Agent is untrusted code with a shell: whatever its shell can do, a prompt injection in a chat
message can do. The Hub's RPC is meant to be its only door to memory, so on the machine the
Agent must not reach the Hub's files (owner token, state database, every Principal's memory), the
worker's other launches, or processes outside its turn. The sandbox gives it:

- its own PID, IPC and UTS namespaces and its own ``/proc``: it sees no process outside its turn,
  and when the turn ends (or the worker dies) the kernel ends everything it started;
- the system directories and the installations it needs (the agent CLI, its interpreter, amux)
  read-only, and nothing else of the host: homes, ``/tmp``, ``/var``, ``AMUX_HOME`` and the
  worker's work directory are absent or empty, even where an installation's directory holds them;
- read-write only its own workspace and its Session's home, read-only its run directory;
- the kernel's interfaces masked as container runtimes mask them: ``/proc/sys``, ``/proc/irq``,
  ``/proc/bus``, ``/proc/fs`` and ``/proc/sysrq-trigger`` read-only; ``/proc/kcore``,
  ``/proc/keys``, ``/proc/timer_list`` and the like hidden; no ``/sys``; no user namespace of its
  own (``--disable-userns`` where bwrap makes one, a seccomp filter where it runs as root);
- never uid 0: a root worker runs bwrap as root (so it can mount what the worker can read) and
  switches to the Agent's own unprivileged uid inside, keeping only the capabilities that switch
  needs until then; a worker that is not root builds the sandbox in a user namespace of its own;
- a network namespace of its own (``--unshare-net``, unless the operator chose the host's
  network): only its loopback, where the relay's doors lead to the model gateway, the Hub and the
  egress proxy (``runtime_bridge/network.py``).

``bwrap_argv`` is pure, so ``amux runtime plan`` shows the exact sandbox a launch gets;
``sandbox_layout`` finds what to mount (executables on PATH, interpreters named by ``#!`` lines).
"""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hub.errors import InvalidArgument
from runtime_bridge.providers.errors import ExecutableMissing

# The host's system, visible read-only. Top-level links (``/bin -> usr/bin``) are recreated as
# links; directories are bound.
SYSTEM_PATHS: tuple[str, ...] = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# Hidden whatever is bound around them: the host's homes and scratch space, and where operators
# keep amux's own environment files.
ALWAYS_HIDDEN: tuple[str, ...] = ("/root", "/home", "/tmp", "/var", "/run", "/etc/amux")
# Fresh, empty and writable in every sandbox.
SCRATCH: tuple[str, ...] = ("/tmp", "/var/tmp")
# Kernel interfaces an Agent reads but never writes (sysctls check only file permissions: a
# writable ``kernel.core_pattern`` makes the kernel run a program of the writer's choice as root).
KERNEL_READ_ONLY: tuple[str, ...] = (
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
)
# Kernel interfaces an Agent never sees: memory images, other users' keys, timers and scheduler
# state that leak what other processes do, the kernel's log and symbols, hardware.
KERNEL_HIDDEN: tuple[str, ...] = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/kallsyms",
    "/proc/kmsg",
    "/proc/config.gz",
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
)
# The amux packages an Agent's ``amux mcp`` and ``amux memory`` import.
AMUX_PACKAGES: tuple[str, ...] = ("hub", "bot", "runtime_bridge", "cards")


@dataclass(frozen=True)
class SandboxLayout:
    """What one launch's sandbox shows, decided before anything starts."""

    cwd: Path
    # Installations, bound read-only after the system.
    installations: tuple[Path, ...]
    # Paths covered by an empty tmpfs where an installation would show them.
    hidden: tuple[Path, ...]
    # The launch's own directories: read-write (workspace, session home) and read-only (run dir).
    writable: tuple[Path, ...]
    read_only: tuple[Path, ...] = ()
    # Unix sockets the launch connects to (the warm MCP host).
    sockets: tuple[Path, ...] = ()
    # A resolver configuration that lives outside /etc (``/etc/resolv.conf`` as a link into /run).
    resolver: Path | None = None
    # bwrap runs as root and ``setpriv`` inside switches to the Agent's uid: until then the
    # sandbox keeps what that switch needs and nothing else (the switch clears them). Otherwise
    # it keeps nothing.
    switch_user: bool = False
    # bwrap makes a user namespace (a worker that is not root) and forbids the Agent another.
    user_namespace: bool = True
    # The descriptor bwrap reads the seccomp filter from (``agent_exec`` opens it); None: none.
    seccomp_fd: int | None = None
    # A network namespace of its own (only loopback); False: the host's network.
    own_network: bool = False


def _within(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it, by their words as spelled (no link followed).

    Compares the cached part tuples: ``root in path.parents`` built and compared every parent as a
    path of its own, and laying out one launch asks this thousands of times.
    """
    prefix = root.parts
    return path.parts[: len(prefix)] == prefix


def _system_dirs() -> list[Path]:
    return [Path(p) for p in SYSTEM_PATHS if os.path.isdir(p) and not os.path.islink(p)]


class _Parents:
    """The directories bwrap must create above each mount, with permissions of our choosing.

    bwrap makes missing parents 0700 and root's, which another user (run-as) cannot pass
    through. Parents inside a hidden tmpfs are 0111 (passable, unlistable); other made parents
    0755. Directories inside a bound tree exist already, with the host's own permissions.
    """

    def __init__(self, system: list[Path], covered: list[Path]) -> None:
        self._made: set[Path] = {Path("/"), *system, *(Path(p) for p in SYSTEM_PATHS)}
        self._made |= {Path("/proc"), Path("/dev")}
        self._real: list[Path] = list(system)
        self._covered = covered
        self._tmpfs: list[Path] = []

    def create(self, destination: Path) -> list[str]:
        words: list[str] = []
        for parent in reversed(destination.parents):
            if parent in self._made:
                continue
            inner_tmpfs = max(
                (t for t in self._tmpfs if _within(parent, t)),
                key=lambda t: len(t.parts),
                default=None,
            )
            inner_real = max(
                (r for r in self._real if _within(parent, r)),
                key=lambda r: len(r.parts),
                default=None,
            )
            if inner_real is not None and (
                inner_tmpfs is None or len(inner_real.parts) > len(inner_tmpfs.parts)
            ):
                continue  # A real directory of a bound tree.
            hidden = inner_tmpfs is not None and inner_tmpfs in self._covered
            words += ["--perms", "0111" if hidden else "0755", "--dir", str(parent)]
            self._made.add(parent)
        return words

    def mounted(self, path: Path, bound: bool) -> None:
        self._made.add(path)
        (self._real if bound else self._tmpfs).append(path)


def bwrap_argv(bwrap: str, layout: SandboxLayout) -> tuple[str, ...]:
    """The ``bwrap … --`` prefix of a sandboxed launch (pure); the Agent's argv follows it.

    Later mounts cover earlier ones, so installations and empty tmpfs are mounted shallowest
    first (a hidden path inside an installation is covered; an installation inside ``/tmp``
    shows), and the launch's own directories last. A hidden path above a launch directory is
    an empty, read-only, unlistable tmpfs: the Agent passes through it and sees nothing else.
    """
    argv: list[str] = [
        bwrap,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        *(("--unshare-net",) if layout.own_network else ()),
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "amux-agent",
    ]
    if layout.user_namespace:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--cap-drop", "ALL"]
    if layout.switch_user:
        # What setpriv needs, and the search right to enter the Agent's own (0700) workspace.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        argv += ["--cap-add", "CAP_DAC_READ_SEARCH"]
    if layout.seccomp_fd is not None:
        argv += ["--seccomp", str(layout.seccomp_fd)]
    for system in SYSTEM_PATHS:
        target = os.readlink(system) if os.path.islink(system) else None
        if target is not None:
            argv += ["--symlink", target, system]
        elif os.path.isdir(system):
            argv += ["--ro-bind", system, system]
    argv += ["--proc", "/proc", "--dev", "/dev", *kernel_masks()]
    bound = [*_system_dirs(), *layout.installations]
    own = [*layout.writable, *layout.read_only, *layout.sockets]
    covered = [
        path
        for path in layout.hidden
        if str(path) not in SCRATCH
        and (
            any(_within(p, path) for p in own)
            or (any(_within(path, r) and path != r for r in bound) and os.path.isdir(path))
        )
    ]
    mounts: list[tuple[Path, list[str]]] = [
        (Path(path), ["--perms", "1777", "--tmpfs", path]) for path in SCRATCH
    ]
    binds = [*layout.installations, *([layout.resolver] if layout.resolver else [])]
    mounts += [(path, ["--ro-bind", str(path), str(path)]) for path in binds]
    mounts += [(path, ["--perms", "0111", "--tmpfs", str(path)]) for path in covered]
    mounts.sort(key=lambda mount: len(mount[0].parts))
    mounts += [(path, ["--bind", str(path), str(path)]) for path in layout.writable]
    mounts += [(path, ["--ro-bind", str(path), str(path)]) for path in layout.read_only]
    mounts += [(path, ["--bind", str(path), str(path)]) for path in layout.sockets]
    parents = _Parents(_system_dirs(), covered)
    for path, words in mounts:
        argv += parents.create(path)
        argv += words
        parents.mounted(path, bound=words[0] in ("--bind", "--ro-bind"))
    for path in sorted(covered, key=lambda p: len(p.parts), reverse=True):
        argv += ["--remount-ro", str(path)]
    argv += ["--chdir", str(layout.cwd), "--"]
    return tuple(argv)


def kernel_masks() -> list[str]:
    """bwrap words masking the fresh ``/proc`` (entries this kernel lacks are left out: bwrap
    cannot mount over what does not exist, and there is nothing to reach there)."""
    words: list[str] = []
    for path in KERNEL_READ_ONLY:
        if os.path.exists(path):
            words += ["--ro-bind", path, path]
    for path in KERNEL_HIDDEN:
        if os.path.isdir(path):
            words += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
        elif os.path.exists(path):
            words += ["--ro-bind", "/dev/null", path]
    return words


def _shebang_interpreter(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names (``env NAME`` gives NAME), if any."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return names[0] if names else None
    return words[0]


def installation_root(executable: Path, hidden: Iterable[Path]) -> Path:
    """The directory an executable's installation lives in, as narrow as still works.

    A package under ``node_modules`` needs the whole ``node_modules`` (its dependencies sit
    beside it); a ``bin/`` executable needs its prefix (``lib/`` beside ``bin/``). Inside a
    hidden path (a home: ``~/.local/bin/tool``) the prefix is where the user's own data lives
    (``~/.local/share``), so only the executable's own directory is taken; so too for a root
    that would expose a hidden path.
    """
    hidden = tuple(hidden)
    real = Path(os.path.realpath(executable))
    parts = real.parts
    candidate = real.parent
    if "node_modules" in parts:
        candidate = Path(*parts[: parts.index("node_modules") + 1])
    elif real.parent.name == "bin" and not any(_within(real, h) for h in hidden):
        candidate = real.parent.parent
    if any(_within(h, candidate) for h in hidden) or candidate == Path("/"):
        candidate = real.parent
    return candidate


def _holds_hidden(directory: Path, hidden: Iterable[Path]) -> bool:
    """Whether binding ``directory`` would show a hidden path or a dot entry (``.env``,
    ``.config``) kept beside an executable."""
    if any(_within(h, directory) and h != directory for h in hidden):
        return True
    try:
        return any(name.startswith(".") for name in os.listdir(directory))
    except OSError:
        return True


def _covered(path: Path, roots: Iterable[Path]) -> bool:
    return any(_within(path, root) for root in roots)


def find_installations(
    executables: Iterable[str], search_path: str, hidden: Iterable[Path]
) -> tuple[Path, ...]:
    """The installation roots of ``executables`` and of the interpreters their scripts name.

    Roots inside the system directories are left out: those are bound anyway.

    Raises:
        ExecutableMissing: an executable is not found on ``search_path``.
    """
    hidden = tuple(hidden)
    system = _system_dirs()
    roots: list[Path] = []
    # (name, required): interpreters named by #! lines are best effort; a missing one fails
    # the launch itself, with the interpreter's own message.
    pending = [(name, True) for name in executables]
    seen: set[str] = set()
    while pending:
        name, required = pending.pop(0)
        found = name if os.sep in name else shutil.which(name, path=search_path)
        if found is None or not os.path.exists(found):
            if not required:
                continue
            raise ExecutableMissing(
                f"{name!r} was not found for the sandbox", executable=name, provider="sandbox"
            )
        found = os.path.abspath(found)
        if found in seen:
            continue
        seen.add(found)
        real = Path(os.path.realpath(found))
        root = installation_root(Path(found), hidden)
        candidates: tuple[Path, ...] = (real.parent, root)
        if root == real.parent and any(_within(real, h) for h in hidden):
            # Inside a home, a directory holding dot entries binds the executable alone.
            candidates = (real,) if _holds_hidden(real.parent, hidden) else (real.parent,)
        for path in candidates:
            # A root holding a hidden path is bound all the same: the hidden path is covered
            # again afterwards. One that is hidden itself would hide its own executable.
            if not _covered(path, [*system, *roots]) and path not in hidden:
                roots = [r for r in roots if not _within(r, path)] + [path]
        interpreter = _shebang_interpreter(found)
        if interpreter is not None:
            pending.append((interpreter, False))
    return tuple(roots)


def amux_installation(hidden: Iterable[Path]) -> tuple[Path, ...]:
    """What ``amux mcp`` and the ``amux`` CLI need: this Python's prefixes and amux's packages."""
    hidden = tuple(hidden)
    roots: list[Path] = []
    for prefix in {sys.prefix, sys.base_prefix}:
        roots.append(Path(prefix))
    import runtime_bridge

    packages_dir = Path(runtime_bridge.__file__).resolve().parent.parent
    for package in AMUX_PACKAGES:
        candidate = packages_dir / package
        if candidate.is_dir():
            roots.append(candidate)
    system = _system_dirs()
    kept: list[Path] = []
    for root in roots:
        root = Path(os.path.realpath(root))
        if _covered(root, [*system, *kept]) or root in hidden:
            continue
        kept = [k for k in kept if not _within(k, root)] + [root]
    return tuple(kept)


def service_hidden(*, amux_home: Path | None, work_dir: Path) -> tuple[Path, ...]:
    """Paths no Agent may see: the host's homes and scratch space, amux's state and work dir."""
    paths = [Path(p) for p in ALWAYS_HIDDEN]
    try:
        paths.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    for path in (amux_home, work_dir):
        if path is not None:
            paths.append(Path(os.path.realpath(path)))
    return tuple(dict.fromkeys(paths))


def check_workspace(
    cwd: Path, hidden: Iterable[Path], state_roots: Iterable[Path], workspaces: Path
) -> None:
    """Refuse a working directory that would show the Agent what the sandbox hides.

    Raises:
        InvalidArgument: ``cwd`` contains a hidden path (``AMUX_HOME``, a home directory…) or
            lies inside amux's state (``AMUX_HOME``, the work dir) outside the workspaces.
    """
    real = Path(os.path.realpath(cwd))
    for path in hidden:
        if _within(path, real):
            raise InvalidArgument(
                f"the working directory {cwd} contains {path}, which Agents must not see; "
                "choose a directory of its own"
            )
    inside_workspaces = _within(real, Path(os.path.realpath(workspaces)))
    for root in state_roots:
        if _within(real, Path(os.path.realpath(root))) and not inside_workspaces:
            raise InvalidArgument(
                f"the working directory {cwd} lies inside amux's own state; "
                "choose a directory outside it"
            )


def resolver_outside_etc() -> Path | None:
    """``/etc/resolv.conf``'s target when it is a link out of ``/etc`` (systemd-resolved)."""
    link = Path("/etc/resolv.conf")
    if not link.is_symlink():
        return None
    target = Path(os.path.realpath(link))
    if _within(target, Path("/etc")) or not target.is_file():
        return None
    return target


def sandbox_layout(
    *,
    cwd: Path,
    writable: Iterable[Path],
    read_only: Iterable[Path],
    sockets: Iterable[Path],
    executables: Iterable[str],
    env: Mapping[str, str],
    hidden: tuple[Path, ...],
    switch_user: bool,
    seccomp_fd: int | None,
    own_network: bool = False,
) -> SandboxLayout:
    """The sandbox of one launch (reads the file system to find installations).

    Raises:
        ExecutableMissing: an executable the launch needs is not on its PATH.
    """
    installations = find_installations(executables, env.get("PATH", ""), hidden)
    installations += tuple(
        root for root in amux_installation(hidden) if not _covered(root, installations)
    )
    return SandboxLayout(
        cwd=cwd,
        installations=installations,
        hidden=hidden,
        writable=tuple(writable),
        read_only=tuple(read_only),
        sockets=tuple(sockets),
        resolver=resolver_outside_etc(),
        switch_user=switch_user,
        user_namespace=os.geteuid() != 0,
        seccomp_fd=seccomp_fd,
        own_network=own_network,
    )
