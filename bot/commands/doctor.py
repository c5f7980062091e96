"""``amux doctor``: check an installation and say how to fix each failure.

Each check answers a ``Check`` with a status: ``ok``, ``warn`` (works, but worth knowing), ``fail``
(something users will notice; comes with a fix) or ``skip`` (not applicable, or blocked by an
earlier failure). The report is printed for people or as JSON for scripts; the exit code is 1 when
any check failed. Nothing here changes the installation: the memory root lock is inspected through
``/proc/locks``, never taken, so a Hub starting meanwhile is not disturbed.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import stat
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import ValidationError
from pydantic_settings import SettingsError

from bot.config import FeishuSettings
from bot.feishu import app_manifest, saved_app
from bot.service.logs import LogSettings
from hub.client import HubClient
from hub.config import OWNER_TOKEN_FILE, ClientSettings, HubSettings, unparsable_setting
from hub.errors import AmuxError, InvalidArgument, Unauthenticated, Unavailable
from hub.rootlock import LOCK_NAME
from runtime_bridge import agent_exec, cgroups
from runtime_bridge.agent_users import DYNAMIC_UIDS, configured_user
from runtime_bridge.bounds import KINDS, bounds_from_settings
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.launch import confinement
from runtime_bridge.providers.process import user_switch
from runtime_bridge.sandbox import SandboxLayout, bwrap_argv

Status = Literal["ok", "warn", "fail", "skip"]
VERSION_SECONDS = 15.0
HTTP_SECONDS = 10.0
SANDBOX_SECONDS = 10.0
PROBE_BY_HAND = (
    "run `bwrap --ro-bind / / --proc /proc --dev /dev --unshare-pid --unshare-ipc --unshare-uts "
    "true` by hand to see why"
)
LONG_CONNECTION_ENDPOINT = "/callback/ws/endpoint"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Settings:
    """Every settings model the checks read; loaded once so a bad value fails one check only."""

    hub: HubSettings
    client: ClientSettings
    runtime: RuntimeSettings
    feishu: FeishuSettings
    log: LogSettings


# -- the pure part: the report ---------------------------------------------------------------------


def passed(checks: list[Check]) -> bool:
    return all(check.status != "fail" for check in checks)


def to_json(checks: list[Check]) -> dict[str, Any]:
    return {"ok": passed(checks), "checks": [asdict(check) for check in checks]}


def render(checks: list[Check]) -> str:
    """One line per check, a fix line under each failure, and a summary line."""
    marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "skip"}
    width = max((len(c.name) for c in checks), default=0)
    lines: list[str] = []
    for check in checks:
        lines.append(f"[{marks[check.status]}] {check.name:<{width}}  {check.detail}")
        if check.fix and check.status in ("fail", "warn"):
            lines.append(f"       {'':<{width}}  fix: {check.fix}")
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    if failed:
        lines.append(f"{failed} check(s) failed, {warned} warning(s).")
    else:
        lines.append(f"All checks passed ({warned} warning(s)).")
    return "\n".join(lines)


# -- checks ---------------------------------------------------------------------------------------


def load_settings() -> tuple[Settings | None, Check]:
    try:
        hub = HubSettings()
        # The app `amux feishu setup` saved, unless AMUX_FEISHU_APP_ID names one (as serve reads).
        feishu, _, _ = saved_app.resolve(hub.home, FeishuSettings())
        settings = Settings(hub, ClientSettings(), RuntimeSettings(), feishu, LogSettings())
    except InvalidArgument as error:
        return None, Check(
            "settings",
            "fail",
            error.message,
            "run `amux feishu setup` again, or remove the file and set AMUX_FEISHU_APP_ID",
        )
    except SettingsError as error:
        # A JSON setting that is not JSON: pydantic-settings refuses it before validating.
        models = (HubSettings, ClientSettings, RuntimeSettings, FeishuSettings, LogSettings)
        problem, fix = unparsable_setting(error, models).split(": ", 1)
        return None, Check("settings", "fail", problem, fix)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "?"
        title = error.title
        return None, Check(
            "settings",
            "fail",
            f"{title}: {where}: {first['msg']}",
            "correct that AMUX_* variable in the environment or the service's EnvironmentFile "
            "(deploy/amux.env.example lists them all)",
        )
    return settings, Check("settings", "ok", "all AMUX_* settings load")


def check_home(home: Path) -> Check:
    try:
        info = home.stat()
    except FileNotFoundError:
        return Check(
            "amux_home",
            "warn",
            f"{home} does not exist yet",
            "`amux serve` creates it on first start; on a worker host set AMUX_HOME or ignore",
        )
    except OSError as error:
        return Check("amux_home", "fail", f"cannot read {home}: {error.strerror}", _home_fix(home))
    if not stat.S_ISDIR(info.st_mode):
        return Check("amux_home", "fail", f"{home} is not a directory", "point AMUX_HOME elsewhere")
    problems = []
    if info.st_uid != os.geteuid():
        problems.append(f"owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        problems.append(f"mode {mode:04o} lets other users in")
    if problems:
        return Check("amux_home", "fail", f"{home}: {'; '.join(problems)}", _home_fix(home))
    return Check("amux_home", "ok", f"{home} (mode {mode:04o}, owned by this user)")


def _home_fix(home: Path) -> str:
    return f"chown -R $(id -un) {home} && chmod 700 {home}"


def check_root_lock(memory_root: Path, proc_locks: Path = Path("/proc/locks")) -> Check:
    if not (memory_root / LOCK_NAME).exists():
        return Check(
            "memory_root_lock", "warn", f"no Hub has used {memory_root} yet", "start `amux serve`"
        )
    holder = hub_pid(memory_root, proc_locks)
    if holder is None:
        return Check(
            "memory_root_lock",
            "warn",
            f"free: no running Hub serves {memory_root}",
            "start the Hub (`amux serve`, or `systemctl start amux`)",
        )
    return Check("memory_root_lock", "ok", f"held by a running Hub (pid {holder})")


def hub_pid(memory_root: Path, proc_locks: Path = Path("/proc/locks")) -> int | None:
    """The running Hub that holds ``memory_root``'s lock, if one does."""
    path = memory_root / LOCK_NAME
    try:
        inode = path.stat().st_ino
    except OSError:
        return None
    holder = _flock_holder(inode, proc_locks)
    recorded = _recorded_pid(path)
    if holder is None and recorded is not None and _alive(recorded):
        # Without /proc/locks, a live process with the recorded pid is the best evidence.
        holder = recorded
    return holder


# Below this a busy Hub can run out of files (as ``amux serve`` warns at start).
LOW_OPEN_FILES = 4096
OPEN_FILES_FIX = (
    "raise the service's hard limit: LimitNOFILE=65536 in its systemd unit (the shipped units "
    "set it), or `ulimit -Hn 65536` before `amux serve`"
)


def _limits_of(pid: int, proc: Path) -> int | None:
    """The soft open-file limit in ``proc/<pid>/limits`` (None: unreadable or unlimited)."""
    try:
        text = (proc / str(pid) / "limits").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return int(soft) if soft.isdigit() else None
    return None


def check_open_files(
    running: int | None, proc: Path = Path("/proc"), hard: int | None = None
) -> Check:
    """How many files the Hub may open: the running Hub's limit (pid ``running``), else the
    hard limit a Hub started from here would raise itself to."""
    name = "open_files"
    limit = _limits_of(running, proc) if running is not None else None
    if limit is not None:
        detail = f"the running Hub (pid {running}) may open {limit} files"
    else:
        if hard is None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard == resource.RLIM_INFINITY:
            return Check(name, "ok", "amux serve started from here may open files without limit")
        limit = hard
        detail = f"amux serve started from here may open {limit} files (its hard limit)"
    if limit < LOW_OPEN_FILES:
        return Check(name, "warn", detail + f", under {LOW_OPEN_FILES}", OPEN_FILES_FIX)
    return Check(name, "ok", detail)


def _flock_holder(inode: int, proc_locks: Path) -> int | None:
    try:
        text = proc_locks.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1626 fe:00:2351412 0 EOF"; blocked waiters are marked "->".
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def _recorded_pid(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_memory_disk(
    memory_root: Path, min_free_bytes: int = 256 * 1024 * 1024, min_free_share: float = 0.05
) -> Check:
    """Room on the memory root's file system: once it is full, memory writes answer
    ``storage_unavailable`` (documents stay whole, reads go on)."""
    name = "memory_disk"
    where = memory_root
    try:
        # Before the first start the root does not exist yet: the disk it will be made on counts.
        while not where.exists() and where != where.parent:
            where = where.parent
        info = os.statvfs(where)
    except OSError as error:
        return Check(name, "warn", f"cannot inspect the disk of {memory_root}: {error.strerror}")
    mib = 1024 * 1024
    free = info.f_bavail * info.f_frsize
    total = info.f_blocks * info.f_frsize
    share = free / total if total else 0.0
    detail = f"{free // mib} MiB free of {total // mib} MiB ({share:.0%}) under {where}"
    if info.f_flag & os.ST_RDONLY:
        return Check(
            name,
            "fail",
            f"{where} is on a read-only file system: every memory write fails",
            f"remount the file system holding {where} read-write",
        )
    if free < min_free_bytes or share < min_free_share:
        return Check(
            name,
            "warn",
            f"{detail}: nearly full; memory writes fail with storage_unavailable once it is",
            f"free space on the file system holding {where}, or move AMUX_HOME to a larger one "
            "(its memory history and state database are there too)",
        )
    return Check(name, "ok", detail)


def _existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists: before the first start that is where it
    will be made, on that file system."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_workspace_disk(home: Path, runtime: RuntimeSettings) -> Check:
    """Whether the Hub's state and memory share a file system with Agents' workspaces: each
    Agent may fill its workspace up to its bound, and with enough of them the disk is full, and
    then the Hub can neither record a turn nor hand one out."""
    name = "workspace_disk"
    agent_places = [("the worker's directory", runtime.work_dir_beside(home))]
    if runtime.default_cwd is not None:
        agent_places.append(("AMUX_RUNTIME_DEFAULT_CWD", runtime.default_cwd))
    try:
        devices = {where: os.stat(_existing(where)).st_dev for _, where in agent_places}
        hub_devices = {os.stat(_existing(where)).st_dev for where in (home, home / "memory")}
    except OSError as error:
        return Check(name, "warn", f"cannot inspect {error.filename}: {error.strerror}")
    shared = [(label, where) for label, where in agent_places if devices[where] in hub_devices]
    if not shared:
        return Check(name, "ok", "Agents' workspaces are on another file system than AMUX_HOME")
    named = ", ".join(f"{label} {where}" for label, where in shared)
    bound = bounds_from_settings(runtime).describe("workspace")
    return Check(
        name,
        "warn",
        f"AMUX_HOME {home} (the state database and memory) shares a file system with {named}: "
        f"each Agent may fill its workspace up to its {bound}, and once that disk is full the "
        "Hub can no longer record or hand out turns",
        "put AMUX_RUNTIME_WORK_DIR (and AMUX_RUNTIME_DEFAULT_CWD, if set) on another file "
        "system, e.g. a partition or a size-limited mount of its own, or move AMUX_HOME",
    )


async def check_sandbox(
    runtime: RuntimeSettings,
    feishu: FeishuSettings,
    proc_sys: Path = Path("/proc/sys"),
    seconds: float = SANDBOX_SECONDS,
) -> Check:
    """Whether Agents launched here are confined, and whether they must be.

    Open enrollment lets anyone who messages the bot run an Agent, so there an unconfined Agent
    (sandbox off, or a bwrap that cannot start) fails; with enrollment closed, off is a warning.
    """
    name = "sandbox"
    euid = os.geteuid()
    open_enrollment = feishu.enabled and feishu.enroll == "auto"
    if not runtime.in_process:
        return Check(
            name,
            "skip",
            "this process launches no Agents (AMUX_RUNTIME_IN_PROCESS=false): "
            "run `amux doctor` on each worker host",
        )
    install = "install bubblewrap (Debian package `bubblewrap`)"
    if runtime.sandbox == "off":
        who = f"local user {runtime.run_as}'s" if runtime.run_as else "this service's own"
        detail = f"off (AMUX_RUNTIME_SANDBOX=off): Agents run with {who} file access"
        if open_enrollment:
            return Check(
                name,
                "fail",
                detail + ", and AMUX_FEISHU_ENROLL=auto lets anyone who messages the bot run one",
                f"set AMUX_RUNTIME_SANDBOX=bwrap and {install}, or set AMUX_FEISHU_ENROLL=closed",
            )
        return Check(name, "warn", detail, f"set AMUX_RUNTIME_SANDBOX=bwrap and {install}")
    # Found the way a launch finds it: on this process's PATH.
    path = shutil.which("bwrap")
    if path is None:
        return Check(
            name,
            "fail",
            "AMUX_RUNTIME_SANDBOX=bwrap, but bwrap is not on PATH: every Agent launch fails",
            install if open_enrollment else f"{install}, or set AMUX_RUNTIME_SANDBOX=off",
        )
    try:
        answered = await _capture([path, "--version"], seconds)
        # The probe is a launch's own sandbox around `true`: the same first step, namespaces,
        # masked /proc and /dev, seccomp filter and uid switch, so a host that lets bwrap start
        # but not mount a fresh /proc (or not switch uid) fails here, not at a turn.
        probed = await _capture(_probe_argv(path, euid), seconds)
    except OSError as error:
        return Check(name, "fail", f"{path} cannot run: {error.strerror}", "reinstall bubblewrap")
    version = answered[1].splitlines()[0] if answered and answered[1] else "bwrap"
    if probed is None:
        return Check(
            name,
            "fail",
            f"{version} ({path}): a probe launch gave no answer within {seconds:.0f}s",
            PROBE_BY_HAND,
        )
    code, output = probed
    if code != 0:
        detail, fix = _sandbox_failure(code, output, proc_sys)
        return Check(name, "fail", f"{version} ({path}) cannot sandbox here: {detail}", fix)
    return Check(
        name,
        "ok",
        f"{version} ({path}): a probe launch got its own PID, IPC and UTS namespaces and /proc, "
        "kernel interfaces masked, no user namespace of its own"
        + (f", as uid {DYNAMIC_UIDS.start}" if euid == 0 else ""),
    )


def _probe_argv(bwrap: str, euid: int) -> list[str]:
    root = euid == 0
    seccomp = agent_exec.SECCOMP_FD if agent_exec.seccomp_filter() else None
    layout = SandboxLayout(
        cwd=Path("/"),
        installations=(),
        hidden=(),
        writable=(),
        switch_user=root,
        user_namespace=not root,
        seccomp_fd=seccomp,
    )
    switch: tuple[str, ...] = ()
    if root:
        setpriv = shutil.which("setpriv") or "setpriv"
        switch = user_switch(setpriv, DYNAMIC_UIDS.start, DYNAMIC_UIDS.start)
    return [*confinement(True), *bwrap_argv(bwrap, layout), *switch, "true"]


def check_agent_user(runtime: RuntimeSettings, euid: int | None = None) -> Check:
    """Who Agents run as: never root."""
    name = "agent_user"
    euid = os.geteuid() if euid is None else euid
    if runtime.run_as:
        try:
            uid, _ = configured_user(runtime.run_as)
        except AmuxError as error:
            return Check(
                name,
                "fail",
                error.message,
                "unset AMUX_RUNTIME_RUN_AS, or set it to an unprivileged local user",
            )
        if euid != 0:
            return Check(
                name,
                "fail",
                f"AMUX_RUNTIME_RUN_AS={runtime.run_as}, but this service is not root and "
                "cannot switch to another user: every Agent launch fails",
                "run the worker as root, or unset AMUX_RUNTIME_RUN_AS",
            )
        return Check(
            name,
            "ok",
            f"every Agent runs as local user {runtime.run_as} (uid {uid}); Principals share it",
            "",
        )
    if euid == 0:
        return Check(
            name,
            "ok",
            "each Principal's Agents run as a uid of its own "
            f"({DYNAMIC_UIDS.start}-{DYNAMIC_UIDS.stop - 1}), never root",
        )
    return Check(
        name,
        "ok",
        f"Agents run as this service's uid ({euid}) inside a user namespace; Principals share it",
    )


def check_bounds(runtime: RuntimeSettings, cgroup_root: Path = cgroups.CGROUP_ROOT) -> Check:
    """How one launch is bounded here, and with what."""
    name = "bounds"
    bounds = bounds_from_settings(runtime)
    listed = ", ".join(bounds.value(kind) for kind in KINDS if kind != "workspace")
    applied = cgroups.mechanism(cgroup_root)
    detail = f"{applied}: {listed} per launch; workspace {bounds.value('workspace')}"
    if applied.startswith("rlimits"):
        return Check(
            name,
            "warn",
            detail + "; without cgroups memory and CPU are not bounded",
            "run the worker as root, or give it a delegated cgroup v2 subtree "
            "(systemd Delegate=yes) with the memory and pids controllers",
        )
    return Check(name, "ok", detail)


def _sandbox_failure(code: int, output: str, proc_sys: Path) -> tuple[str, str]:
    """What bwrap's complaint means on this host, and how to fix it."""
    said = output.splitlines()[0] if output else f"exited {code} without a message"
    if "proc" in said and "mount" in said.lower():
        return (
            f"{said}. The kernel refuses a fresh /proc in a user namespace while parts of this "
            "host's /proc are masked",
            "unmask /proc for the service: under systemd drop ProtectKernelTunables=, "
            "ProtectKernelLogs= and ProtectHostname= (deploy/systemd does); in a container use "
            "podman's --security-opt unmask=/proc/* (deploy/compose.yaml does)",
        )
    if "namespace" in said or "uid map" in said:
        settings = _userns_settings(proc_sys)
        found = f" ({'; '.join(settings)})" if settings else ""
        return (
            f"{said}. This user cannot create user namespaces{found}",
            "allow unprivileged user namespaces: sysctl user.max_user_namespaces above 0, and "
            "kernel.unprivileged_userns_clone=1 and kernel.apparmor_restrict_unprivileged_userns=0 "
            "where the kernel has them; and do not forbid them to the service (systemd "
            "RestrictNamespaces=, a container's seccomp profile)",
        )
    return said, PROBE_BY_HAND


def _userns_settings(proc_sys: Path) -> list[str]:
    """The kernel settings here that forbid an unprivileged user namespace."""
    forbidding = (
        ("user/max_user_namespaces", "user.max_user_namespaces", "0"),
        ("kernel/unprivileged_userns_clone", "kernel.unprivileged_userns_clone", "0"),
        (
            "kernel/apparmor_restrict_unprivileged_userns",
            "kernel.apparmor_restrict_unprivileged_userns",
            "1",
        ),
    )
    found = []
    for relative, sysctl, bad in forbidding:
        try:
            value = (proc_sys / relative).read_text().strip()
        except OSError:
            continue
        if value == bad:
            found.append(f"{sysctl} is {value}")
    return found


async def _capture(argv: list[str], seconds: float) -> tuple[int, str] | None:
    """Run ``argv`` with no input; its exit code and combined output, or None after ``seconds``.

    Raises:
        OSError: the executable cannot be started.
    """
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), seconds)
    except TimeoutError:
        process.kill()
        await process.wait()
        return None
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace").strip()


async def check_hub(
    client: HubClient, has_token: bool, owner_file: Path | None = None
) -> tuple[Check, bool]:
    """Reachable (/healthz) and authenticated (system.whoami); the flag gates later Hub checks.

    ``owner_file`` is the local owner token file the credential was read from, if it was.
    """
    start = "start the Hub (`amux serve` or `systemctl start amux`), or set AMUX_HUB_URL to it"
    url = client.base_url + "/healthz"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_SECONDS)) as session,
            session.get(url) as response,
        ):
            healthy = response.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        reason = str(error) or type(error).__name__
        return Check(
            "hub", "fail", f"cannot reach the Hub at {client.base_url}: {reason}", start
        ), (False)
    if not healthy:
        return Check("hub", "fail", f"{url} answered HTTP {response.status}", start), False
    token_fix = "set AMUX_TOKEN to a valid token (on the Hub host: `amux token issue <principal>`)"
    if not has_token:
        return Check(
            "hub",
            "fail",
            f"{client.base_url} is up, but this host has no Hub credential",
            token_fix + ", or run on the Hub host with its AMUX_HOME",
        ), False
    try:
        whoami = await client.whoami()
    except Unauthenticated as error:
        if owner_file is not None:
            refused = f"the local owner token in {owner_file} is refused: {error.message}"
            fix = (
                "on the Hub's host, `amux token issue --owner-file` (with this AMUX_HOME) "
                "writes a fresh owner token there"
            )
            return Check("hub", "fail", f"up, but {refused}", fix), False
        return Check(
            "hub", "fail", f"up, but the credential is refused: {error.message}", token_fix
        ), (False)
    except Unavailable as error:
        return Check("hub", "fail", error.message, start), False
    except AmuxError as error:
        return Check("hub", "fail", f"{error.code}: {error.message}", "see the Hub's log"), False
    principal = whoami.get("principal", {})
    return Check(
        "hub",
        "ok",
        f"{client.base_url} as {principal.get('name')} ({principal.get('kind')})",
    ), True


async def check_memory(client: HubClient) -> Check:
    try:
        config = await client.config_get()
    except AmuxError as error:
        return Check("memory", "fail", f"{error.code}: {error.message}", "see the Hub's log")
    enabled = config.get("memory.enabled", {})
    isolation = config.get("memory.isolation", {})
    detail = (
        f"enabled: saved {_word(enabled.get('saved'))}, running {_word(enabled.get('running'))}; "
        f"isolation: saved {isolation.get('saved')}, running {isolation.get('running')}"
    )
    if enabled.get("restart_pending") or isolation.get("restart_pending"):
        return Check(
            "memory",
            "warn",
            detail + "; restart pending",
            "restart the Hub to apply the saved values (`amux system restart`, owner only)",
        )
    return Check("memory", "ok", detail)


def _word(value: object) -> str:
    return "on" if value is True else "off" if value is False else str(value)


async def check_workers(client: HubClient) -> Check:
    try:
        capabilities = await client.capabilities()
    except AmuxError as error:
        return Check("workers", "fail", f"{error.code}: {error.message}", "see the Hub's log")
    workers = int(capabilities.get("runtime", {}).get("workers", 0))
    if workers == 0:
        return Check(
            "workers",
            "fail",
            "no Runtime worker is connected: Agent turns will wait in the queue",
            "run `amux runtime worker` with a service token on a worker host, or keep "
            "AMUX_RUNTIME_IN_PROCESS=true on the Hub",
        )
    return Check("workers", "ok", f"{workers} connected")


PERMISSION_MEANINGS = {
    "ask": (
        "edits and changing commands wait for the turn's person (reads never ask); "
        "Claude asks through amux's permission prompt; Codex: amux answers its app-server "
        "approvals, its own sandbox off inside amux's; Pi: amux's extension asks before its "
        "edits and changing commands"
    ),
    "auto": (
        "every Agent action runs without asking, inside amux's sandbox (the workspace, the "
        "session home and /tmp are the only writable places); Codex's own sandbox is off "
        "inside amux's"
    ),
    "read-only": (
        "the workspace is mounted read-only; Claude and Pi are offered no edit tools, Codex's "
        "edits fail on the mount"
    ),
}


def permissions_check(agents: dict[str, Any], runtime: RuntimeSettings) -> Check:
    """The permission policy the Hub gives the next turn, and what it means per provider."""
    name = "permissions"
    policy = str(agents.get("permissions", "?"))
    meaning = PERMISSION_MEANINGS.get(policy)
    if meaning is None:
        return Check(name, "warn", f"the Hub names an unknown policy {policy!r}")
    detail = f"{policy}: {meaning}"
    if policy == "ask":
        detail += f"; unanswered requests are denied after {_span(agents.get('approval_timeout'))}"
    if policy != "read-only" and runtime.in_process and runtime.sandbox == "off":
        # Without the sandbox, "inside the sandbox" is this service's whole file access.
        return Check(
            name,
            "warn",
            detail + "; but AMUX_RUNTIME_SANDBOX=off: what is allowed runs with this service's "
            "own file access",
            "set AMUX_RUNTIME_SANDBOX=bwrap, or `amux system config set agents.permissions "
            "read-only`",
        )
    return Check(name, "ok", detail)


def _span(seconds: object) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "the approval timeout"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60:g} min"
    return f"{seconds:g} s"


async def check_permissions(client: HubClient, runtime: RuntimeSettings) -> Check:
    try:
        capabilities = await client.capabilities()
    except AmuxError as error:
        return Check("permissions", "fail", f"{error.code}: {error.message}", "see the Hub's log")
    agents = capabilities.get("agents")
    if not isinstance(agents, dict):
        return Check(
            "permissions",
            "warn",
            "this Hub names no permission policy: it predates agents.permissions",
            "upgrade the Hub",
        )
    return permissions_check(agents, runtime)


async def check_feishu_credentials(feishu: FeishuSettings) -> Check:
    if not feishu.enabled:
        return Check(
            "feishu_credentials",
            "skip",
            "Feishu bot not configured (AMUX_FEISHU_APP_ID is empty)",
        )
    if not feishu.app_secret.get_secret_value():
        return Check(
            "feishu_credentials",
            "fail",
            "AMUX_FEISHU_APP_SECRET is empty",
            "copy the App Secret from the app's Credentials page into AMUX_FEISHU_APP_SECRET",
        )
    # Imported only when needed: lark-oapi takes seconds to import.
    from bot.feishu.client import FeishuClient

    client = FeishuClient(feishu, attempts=1, timeout=HTTP_SECONDS, connections=1)
    try:
        info = await client.bot_info()
    except AmuxError as error:
        return Check(
            "feishu_credentials",
            "fail",
            f"bot/v3/info via {feishu.domain} failed: {error.message}",
            "check AMUX_FEISHU_APP_ID / AMUX_FEISHU_APP_SECRET (or the app `amux feishu setup` "
            "saved: run it again), that the app has the bot feature and is published, and "
            "AMUX_FEISHU_DOMAIN (Feishu or Lark)",
        )
    finally:
        await client.close()
    name = f"{info.name} " if info.name else ""
    return Check("feishu_credentials", "ok", f"bot {name}(open_id {info.open_id})")


UPDATE_FIX = (
    "run `amux feishu setup --update` and scan its QR code: it asks Feishu for every scope, event "
    "and callback amux uses (or add them by hand in the app's console and publish a version)"
)
# Without these the bot hears nothing or cannot answer; the other scopes cost one feature each.
ESSENTIAL_SCOPES = frozenset(app_manifest.SCOPES[:4])


def check_feishu_app_file(home: Path, feishu: FeishuSettings) -> Check:
    """The app `amux feishu setup` saved: which one, where, and that only its owner may read it."""
    path = saved_app.app_path(home)
    try:
        saved = saved_app.load(home)
    except AmuxError as error:
        return Check("feishu_app_file", "fail", error.message, "run `amux feishu setup` again")
    if saved is None:
        return Check("feishu_app_file", "skip", f"no app saved by `amux feishu setup` ({path})")
    where = f"app {saved.app_id} ({saved.brand}) saved in {path}"
    if feishu.enabled and feishu.app_id != saved.app_id:
        where += f"; unused: AMUX_FEISHU_APP_ID ({feishu.app_id}) wins"
    try:
        loose = saved_app.loose_mode(path)
    except OSError as error:
        return Check("feishu_app_file", "fail", f"cannot read {path}: {error.strerror}")
    if loose is not None:
        return Check(
            "feishu_app_file",
            "warn",
            f"{where}, mode {loose:04o}: others may read the app secret",
            f"chmod 600 {path}",
        )
    return Check("feishu_app_file", "ok", f"{where}, mode 0600")


async def check_feishu_app_config(feishu: FeishuSettings) -> Check:
    """Every scope, event and callback of the manifest, as the app's own configuration lists."""
    if not feishu.enabled or not feishu.app_secret.get_secret_value():
        return Check("feishu_app_config", "skip", "Feishu bot not configured")
    from bot.feishu.client import FeishuClient
    from bot.feishu.errors import FeishuApiError

    client = FeishuClient(feishu, attempts=1, timeout=HTTP_SECONDS, connections=1)
    try:
        config = await client.app_config()
    except FeishuApiError as error:
        if error.missing_scope:
            return Check(
                "feishu_app_config",
                "warn",
                f"the app may not read its own configuration ({error.message}), so what it "
                "lacks is not checked",
                UPDATE_FIX,
            )
        return Check("feishu_app_config", "skip", f"not checked: {error.message}")
    except AmuxError as error:
        return Check("feishu_app_config", "skip", f"not checked: {error.message}")
    finally:
        await client.close()
    scopes = app_manifest.missing(set(config.scopes), app_manifest.SCOPES)
    events = app_manifest.missing(set(config.events), app_manifest.EVENTS)
    callbacks = app_manifest.missing(set(config.callbacks), app_manifest.CALLBACKS)
    lacks = [
        f"{kind} {', '.join(items)}"
        for kind, items in (("scopes", scopes), ("events", events), ("callbacks", callbacks))
        if items
    ]
    if not lacks:
        return Check(
            "feishu_app_config", "ok", "the app has every scope, event and callback amux uses"
        )
    essential = events or callbacks or ESSENTIAL_SCOPES.intersection(scopes)
    return Check(
        "feishu_app_config",
        "fail" if essential else "warn",
        f"the app lacks {'; '.join(lacks)}",
        UPDATE_FIX,
    )


async def check_feishu_topic_scope(feishu: FeishuSettings) -> Check:
    """Reading a topic's messages (topic context) needs a scope the bot otherwise does without."""
    if not feishu.enabled or not feishu.app_secret.get_secret_value():
        return Check("feishu_topic_context", "skip", "Feishu bot not configured")
    from bot.feishu.client import FeishuClient
    from bot.feishu.errors import FeishuApiError

    client = FeishuClient(feishu, attempts=1, timeout=HTTP_SECONDS, connections=1)
    try:
        # A thread that does not exist: a missing scope is refused before the id is looked at.
        await client.thread_messages("omt_amux_doctor_probe", 1)
    except FeishuApiError as error:
        if error.missing_scope:
            return Check(
                "feishu_topic_context",
                "warn",
                f"the app may not read topic messages ({error.message}): turns in group topics "
                "run without the topic's earlier messages",
                "add the scopes im:message:readonly and im:message.group_msg (read group "
                "messages) in the app's Permissions & Scopes, then publish a new version",
            )
    except AmuxError as error:
        return Check("feishu_topic_context", "skip", f"not checked: {error.message}")
    finally:
        await client.close()
    return Check("feishu_topic_context", "ok", "the app may read topic messages")


async def check_feishu_names(feishu: FeishuSettings) -> Check:
    """People's display names (on cards, in prompts and logs) need the contact scope."""
    if not feishu.enabled or not feishu.app_secret.get_secret_value():
        return Check("feishu_names", "skip", "Feishu bot not configured")
    from bot.feishu.client import FeishuClient
    from bot.feishu.errors import FeishuApiError
    from bot.names import CONTACT_SCOPE

    client = FeishuClient(feishu, attempts=1, timeout=HTTP_SECONDS, connections=1)
    try:
        # Nobody has this open_id: a missing scope is refused before the id is looked at.
        await client.user_names(["ou_amux_doctor_probe"])
    except FeishuApiError as error:
        if error.missing_scope:
            return Check(
                "feishu_names",
                "warn",
                f"the app may not read people's names ({error.message}): cards, prompts and "
                "logs name people by their amux handle (feishu-…)",
                f"add the scope {CONTACT_SCOPE} in the app's Permissions & Scopes, then "
                "publish a new version",
            )
        return Check("feishu_names", "skip", f"not checked: {error.message}")
    except AmuxError as error:
        return Check("feishu_names", "skip", f"not checked: {error.message}")
    finally:
        await client.close()
    return Check("feishu_names", "ok", "the app may read people's names")


async def check_feishu_ingress(feishu: FeishuSettings, hub_url: str) -> Check:
    if not feishu.enabled:
        return Check("feishu_ingress", "skip", "Feishu bot not configured")
    if feishu.mode == "webhook":
        unencrypted = not feishu.encrypt_key.get_secret_value()
        missing = feishu.webhook_secrets_missing()
        if missing:
            return Check(
                "feishu_ingress",
                "fail",
                f"webhook mode without {' and '.join(missing)}: events cannot be verified",
                "copy the Encrypt Key and Verification Token from the app's Events & Callbacks "
                "page, or set AMUX_FEISHU_MODE=long_connection",
            )
        probed = await _probe_webhook(hub_url)
        if probed.status == "ok" and unencrypted:
            # Feishu signs events only with an encrypt key; without one, a request is vouched
            # for by the verification token in its own body alone.
            return Check(
                "feishu_ingress",
                "warn",
                f"{probed.detail}; without AMUX_FEISHU_ENCRYPT_KEY (allowed by "
                "AMUX_FEISHU_ALLOW_UNENCRYPTED) events arrive unsigned and unencrypted",
                "copy the Encrypt Key from the app's Events & Callbacks page into "
                "AMUX_FEISHU_ENCRYPT_KEY, then unset AMUX_FEISHU_ALLOW_UNENCRYPTED",
            )
        return probed
    return await _probe_long_connection(feishu)


async def check_feishu_connection(feishu: FeishuSettings, hub_url: str) -> Check:
    """The running Hub's long connection, as its /healthz shows it: state and last frame's age."""
    from bot.feishu.liveness import LINK_HEALTH

    name = "feishu_connection"
    if not feishu.enabled or feishu.mode != "long_connection":
        return Check(name, "skip", "no long connection configured")
    url = hub_url.rstrip("/") + "/healthz"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_SECONDS)) as session,
            session.get(url) as response,
        ):
            body = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
        return Check(
            name, "skip", f"not checked: cannot read {url}: {error or type(error).__name__}"
        )
    link = body.get(LINK_HEALTH) if isinstance(body, dict) else None
    if not isinstance(link, dict):
        return Check(
            name,
            "warn",
            f"the Hub at {hub_url} runs no Feishu long connection",
            "restart `amux serve` with AMUX_FEISHU_MODE=long_connection and the app's credentials",
        )
    state = link.get("state")
    frame_age = link.get("last_frame_age_seconds")
    event_age = link.get("last_event_age_seconds")
    heard = "nothing heard yet" if frame_age is None else f"last frame {_age(frame_age)} ago"
    detail = f"{state}; {heard}, last event " + (
        "none yet" if event_age is None else f"{_age(event_age)} ago"
    )
    forced = link.get("silent_reconnects") or 0
    if forced:
        detail += f"; {forced} reconnect(s) after silence"
    network = (
        'see the Hub\'s log ("Feishu long connection"); allow outbound HTTPS and WebSocket '
        "to AMUX_FEISHU_DOMAIN from the Hub host"
    )
    if state == "connected":
        return Check(name, "ok", detail)
    if state == "reconnecting":
        return Check(name, "warn", detail, network)
    return Check(name, "fail", detail, network)


def _age(seconds: object) -> str:
    return f"{float(seconds):.0f}s" if isinstance(seconds, int | float) else "?"


async def _probe_webhook(hub_url: str) -> Check:
    from bot.feishu.ingress import EVENTS_PATH

    url = hub_url.rstrip("/") + EVENTS_PATH
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_SECONDS)) as session,
            session.post(url, data=b"{}") as response,
        ):
            status = response.status
    except (TimeoutError, aiohttp.ClientError, OSError) as error:
        return Check(
            "feishu_ingress",
            "fail",
            f"cannot reach {url}: {error or type(error).__name__}",
            "start the Hub with these Feishu settings",
        )
    if status == 404:
        return Check(
            "feishu_ingress",
            "fail",
            f"the Hub at {hub_url} does not serve {EVENTS_PATH}",
            "restart the Hub with AMUX_FEISHU_APP_ID set and AMUX_FEISHU_MODE=webhook",
        )
    return Check(
        "feishu_ingress",
        "ok",
        f"webhook {EVENTS_PATH} answers (HTTP {status} to an unsigned probe); Feishu must reach "
        f"it at your public callback URL",
    )


async def _probe_long_connection(feishu: FeishuSettings) -> Check:
    """Ask Feishu for a long-connection endpoint, as the SDK does before it connects."""
    url = feishu.domain + LONG_CONNECTION_ENDPOINT
    body = {"AppID": feishu.app_id, "AppSecret": feishu.app_secret.get_secret_value()}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_SECONDS)) as session,
            session.post(url, json=body) as response,
        ):
            answer = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
        return Check(
            "feishu_ingress",
            "fail",
            f"cannot reach the long-connection endpoint at {feishu.domain}: "
            f"{error or type(error).__name__}",
            "allow outbound HTTPS (and WebSocket) to AMUX_FEISHU_DOMAIN from the Hub host",
        )
    if not isinstance(answer, dict) or answer.get("code") != 0:
        code = answer.get("code") if isinstance(answer, dict) else "?"
        return Check(
            "feishu_ingress",
            "fail",
            f"Feishu refused a long connection (code {code})",
            "enable 'Receive events through persistent connection' on the app's Events page "
            "and check the app credentials",
        )
    return Check("feishu_ingress", "ok", "long connection: Feishu offers an endpoint")


async def check_agent(
    provider: str, executable: str, required: bool, declared: bool = False
) -> Check:
    """An agent CLI is installed and answers ``--version``; a declared provider need only exist
    (an arbitrary program may have no ``--version``)."""
    name = f"agent_{provider}"
    path = shutil.which(executable)
    if path is None:
        status: Status = "fail" if required or declared else "warn"
        variable = "AMUX_RUNTIME_PROVIDERS" if declared else f"AMUX_RUNTIME_{provider.upper()}"
        return Check(
            name,
            status,
            f"{executable!r} not found",
            f"install the {provider} CLI on this host or set {variable} to its path",
        )
    if declared:
        return Check(name, "ok", f"declared provider ({path})")
    try:
        answered = await _capture([path, "--version"], VERSION_SECONDS)
    except OSError as error:
        return Check(name, "fail", f"{path} cannot run: {error.strerror}", f"check {path}")
    if answered is None:
        return Check(
            name,
            "fail",
            f"{path} --version gave no answer within {VERSION_SECONDS:.0f}s",
            f"run `{path} --version` by hand to see what it waits for",
        )
    code, output = answered
    version = output.splitlines()[0] if output else ""
    if code != 0:
        return Check(
            name,
            "fail",
            f"{path} --version exited {code}: {version}",
            f"reinstall the {provider} CLI",
        )
    return Check(name, "ok", f"{version} ({path})")


# -- the run --------------------------------------------------------------------------------------

Step = Callable[[], Awaitable[Check]]


async def diagnose(
    settings_loader: Callable[[], tuple[Settings | None, Check]] = load_settings,
) -> list[Check]:
    """Run every check in order; later checks are skipped when what they need has failed."""
    settings, loaded = settings_loader()
    checks = [loaded]
    if settings is None:
        return checks
    checks.append(check_home(settings.hub.home))
    checks.append(check_root_lock(settings.hub.memory_root))
    checks.append(check_open_files(hub_pid(settings.hub.memory_root)))
    checks.append(check_memory_disk(settings.hub.memory_root))
    client = settings.client
    token = client.resolved_token()
    async with HubClient(client.hub_url, token, timeout=min(client.timeout, HTTP_SECONDS)) as hub:
        from_env = client.token is not None and client.token.get_secret_value()
        from_file = token is not None and not from_env and client.owner_token_fallback
        owner_file = client.home / OWNER_TOKEN_FILE if from_file else None
        reached, hub_ok = await check_hub(hub, token is not None, owner_file)
        checks.append(reached)
        if hub_ok:
            checks.append(await check_memory(hub))
            checks.append(await check_permissions(hub, settings.runtime))
        else:
            checks.append(Check("memory", "skip", "needs the Hub"))
            checks.append(Check("permissions", "skip", "needs the Hub"))
        checks.append(check_feishu_app_file(settings.hub.home, settings.feishu))
        checks.append(await check_feishu_credentials(settings.feishu))
        checks.append(await check_feishu_app_config(settings.feishu))
        checks.append(await check_feishu_topic_scope(settings.feishu))
        checks.append(await check_feishu_names(settings.feishu))
        checks.append(await check_feishu_ingress(settings.feishu, client.hub_url))
        checks.append(await check_feishu_connection(settings.feishu, client.hub_url))
        for provider in settings.runtime.accepted_providers():
            executable = settings.runtime.executable(provider) or provider
            required = settings.runtime.in_process and provider == settings.feishu.provider
            declared = provider in settings.runtime.providers
            checks.append(await check_agent(provider, executable, required, declared))
        checks.append(await check_sandbox(settings.runtime, settings.feishu))
        if settings.runtime.in_process:
            from bot.commands.doctor_reach import check_agent_reach

            checks.append(check_agent_user(settings.runtime))
            checks.append(check_agent_reach(settings.runtime, settings.hub.home))
            checks.append(check_bounds(settings.runtime))
            checks.append(check_workspace_disk(settings.hub.home, settings.runtime))
        # Beside the sandbox checks it builds on (it imports their helpers from here).
        from bot.commands.doctor_network import check_egress, check_network, check_upstreams

        checks += await check_network(settings.runtime)
        if settings.runtime.in_process:
            checks.append(await check_upstreams(settings.runtime))
        checks.append(check_egress(settings.runtime))
        if hub_ok:
            checks.append(await check_workers(hub))
        else:
            checks.append(Check("workers", "skip", "needs the Hub"))
    return checks
