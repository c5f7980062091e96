"""Where a worker's launches live and how one launch is requested, shared by the worker and
``amux runtime plan`` so the plan shows exactly the paths and sandbox a worker would use.

Each Principal's Agents work in a workspace of their own (``<work_dir>/workspaces/<key>``), so
files one user's Agent leaves (``CLAUDE.md``, ``.claude/settings.json`` hooks…) never reach
another user's Agent. An operator-set ``AMUX_RUNTIME_DEFAULT_CWD`` is an explicit choice of one
directory that every user's Agents share: on a root worker they then share one uid as well, the
directory's, since each must write there.

Every launch starts with ``agent_exec`` (cgroups, limits, a session keyring of its own, the
seccomp filter), then the sandbox, then the switch to the Agent's uid.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hub.contract import Session
from hub.errors import InvalidArgument
from runtime_bridge import agent_exec
from runtime_bridge.agent_users import AgentUsers, Identity, configured_user, worker_is_root
from runtime_bridge.approvals import AUTO, READ_ONLY
from runtime_bridge.checkouts import Projects
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.network import (
    HUB,
    MODEL,
    QUIET_ENV,
    door_env,
    door_url,
    launch_doors,
    relay_argv,
)
from runtime_bridge.providers import LaunchPlan, LaunchRequest, MemoryAttachment
from runtime_bridge.providers.errors import ExecutableMissing
from runtime_bridge.providers.plan import GatewayPass
from runtime_bridge.providers.process import resolve_executable, user_switch
from runtime_bridge.reach import amux_in_use, check_launch
from runtime_bridge.sandbox import (
    SYSTEM_PATHS,
    bwrap_argv,
    check_workspace,
    sandbox_layout,
    service_hidden,
)

SESSION_HOME = "home"
READ_ONLY_UNSANDBOXED = (
    "the sandbox is off, so the read-only policy cannot mount the workspace read-only: only the "
    "Agent's own edit tools are refused, and its commands can still change files"
)
SECCOMP_FILE = "seccomp.bpf"
AGENT_EXEC = Path(agent_exec.__file__)


# A shared conversation's workspace key: never a principal's (those are 64 hex digits).
WORKSPACE_KEY = re.compile(r"^[a-z][a-z0-9]{0,15}-[0-9a-f]{16,64}$")


def principal_key(principal_id: str) -> str:
    """The directory name of a Principal's workspace: stable, and no identity in clear."""
    return hashlib.sha256(principal_id.encode("utf-8")).hexdigest()


# The first step without Python, where no session keyring needs replacing: join the cgroups
# named before "--", open the seccomp filter (its path is the first word) on the descriptor
# bwrap reads, then execute the rest.
FIRST_STEP = (
    'filter=$1; shift; while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
    f'if [ -n "$filter" ]; then exec {agent_exec.SECCOMP_FD}<"$filter"; fi; exec "$@"'
)


def confinement(
    sandboxed: bool,
    cgroup_procs: tuple[Path, ...] = (),
    rlimits: tuple[str, ...] = (),
    seccomp_file: Path | None = None,
) -> tuple[str, ...]:
    """The first step of a launch: join ``cgroup_procs``, set ``rlimits`` (``NAME=SOFT:HARD``),
    a session keyring of its own where the worker holds one, and the seccomp filter for bwrap.

    Given ``seccomp_file`` (the filter, written beforehand), a launch whose worker holds no
    session keyring of its own starts with ``sh`` and ``prlimit``: a Python interpreter's
    start would cost every launch more than the rest of its sandbox.
    """
    limits = ("core=0:0", *rlimits)  # No core files: a crash leaves nothing of the Agent's.
    seccomp = sandboxed and agent_exec.seccomp_filter() is not None
    prlimit = shutil.which("prlimit")
    if seccomp_file is not None and prlimit is not None and not _holds_session_keyring():
        words = ["/bin/sh", "-c", FIRST_STEP, "amux-launch", str(seccomp_file) if seccomp else ""]
        words += [str(procs) for procs in cgroup_procs]
        words += ["--", prlimit]
        for limit in limits:
            name, _, values = limit.partition("=")
            words.append(f"--{name}={values}")
        return (*words, "--")
    words = [sys.executable, "-I", "-S", str(AGENT_EXEC)]
    for procs in cgroup_procs:
        words += ["--cgroup", str(procs)]
    for limit in limits:
        words += ["--rlimit", limit]
    words.append("--keyring")
    if seccomp:
        words.append("--seccomp")
    return (*words, "--")


@functools.cache
def _holds_session_keyring() -> bool:
    return agent_exec.holds_session_keyring()


def write_seccomp_file(directory: Path) -> Path | None:
    """The seccomp filter as a file in ``directory`` (the worker's own, where no Agent writes),
    for the first step to open; written when a worker starts."""
    program = agent_exec.seccomp_filter()
    if program is None:
        return None
    path = directory / SECCOMP_FILE
    try:
        if path.read_bytes() == program:
            return path
    except OSError:
        pass
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".seccomp.{os.getpid()}")
    partial.write_bytes(program)
    partial.chmod(0o644)
    os.replace(partial, path)
    return path


def operator_server_paths(servers: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[Path, ...]]:
    """What the operator's MCP servers need to be visible in the sandbox: their commands, and
    the directories of files their arguments name by absolute path (a server's script)."""
    commands: list[str] = []
    directories: list[Path] = []
    for server in servers.values():
        command = server.get("command")
        if isinstance(command, str) and command:
            commands.append(command)
        for arg in server.get("args") or []:
            if isinstance(arg, str) and arg.startswith("/") and os.path.isfile(arg):
                directories.append(Path(arg).parent)
    return tuple(commands), tuple(dict.fromkeys(directories))


@dataclass(frozen=True)
class Workplace:
    """Where a conversation works, before it has a Session: the fields of one that decide its
    workspace and whom its Agents run as (see ``LaunchSite.workspace`` and ``identity_of``)."""

    principal_id: str
    # A shared conversation's own workspace, by key; None: its Principal's.
    workspace: str | None = None
    cwd: str | None = None
    # The project whose checkout it will work in, and the origin its Session will keep: its
    # files wait for that checkout where the worker finds them (``Projects.incoming_path``).
    project: str | None = None
    origin: str | None = None


@dataclass(frozen=True)
class LaunchSite:
    """The directories of one worker's launches, and what its sandbox hides."""

    settings: RuntimeSettings
    work_dir: Path
    # The AMUX_HOME of the Hub or CLI beside this worker: hidden from Agents.
    amux_home: Path | None = None

    def run_dir(self, execution_id: str) -> Path:
        return self.work_dir / "runs" / execution_id

    def state_dir(self, session_id: str) -> Path:
        return self.work_dir / "sessions" / session_id

    def session_home(self, session_id: str) -> Path:
        return self.state_dir(session_id) / SESSION_HOME

    @property
    def workspaces(self) -> Path:
        return self.work_dir / "workspaces"

    @property
    def projects(self) -> Projects:
        return Projects(self.work_dir, {})

    def workspace(self, session: Session | Workplace) -> Path:
        """A project Session's own checkout (where a project conversation not yet opened
        leaves its files for it), the Session's chosen directory, the operator's shared one, a
        shared conversation's own, or the Principal's own.

        Raises:
            InvalidArgument: the Session names a workspace key or project that is not one.
        """
        if isinstance(session, Session) and session.project is not None:
            return self.projects.checkout_path(session.project, session.id)
        if isinstance(session, Workplace) and session.project is not None:
            if session.origin is None:
                raise InvalidArgument("a project conversation not yet opened needs its origin")
            return self.projects.incoming_path(session.project, session.origin)
        if session.cwd:
            return Path(session.cwd)
        if self.settings.default_cwd is not None:
            return self.settings.default_cwd
        if session.workspace is not None:
            if not WORKSPACE_KEY.match(session.workspace):
                raise InvalidArgument(f"{session.workspace!r} is not a workspace key")
            return self.workspaces / session.workspace
        return self.workspaces / principal_key(session.principal_id)

    def identity_of(self, session: Session | Workplace, allocate: bool = True) -> Identity | None:
        """Who ``session``'s Agents run as: its workspace decides, so that every turn there
        can change what the others left (a shared conversation's uid is its workspace's own).

        Raises:
            InvalidArgument: ``AMUX_RUNTIME_RUN_AS`` names no user, or root.
        """
        owner = session.principal_id
        shared = session.workspace is not None and self.settings.default_cwd is None
        if shared and not session.cwd:
            owner = f"workspace:{session.workspace}"
        return self.agent_identity(owner, allocate)

    @property
    def sandboxed(self) -> bool:
        return self.settings.sandbox == "bwrap"

    @property
    def isolated(self) -> bool:
        """Whether launches have a network of their own, reaching out only through doors."""
        return self.settings.isolated()

    def agent_hub_url(self, hub_url: str) -> str:
        """The Hub's URL as a launch's Agent reaches it: its hub door when isolated."""
        return door_url(HUB) if self.isolated else hub_url

    def agent_gateway(self, gateway: GatewayPass) -> GatewayPass:
        """The gateway as a launch's Agent reaches it: its model door when isolated (each CLI's
        base URL names it)."""
        return dataclasses.replace(gateway, url=door_url(MODEL)) if self.isolated else gateway

    def agent_identity(self, principal_id: str, allocate: bool = True) -> Identity | None:
        """Who ``principal_id``'s Agents (or a shared workspace's) run as: the configured user,
        else on a root worker a uid of their own (of the shared directory's, when one is set),
        else the worker's own uid (None). Without ``allocate`` nothing is written: an owner
        without a uid yet is shown the one it would get.

        Raises:
            InvalidArgument: ``AMUX_RUNTIME_RUN_AS`` names no user, or root.
        """
        if self.settings.in_pods():
            return None  # Its pod's securityContext says who an Agent runs as.
        if self.settings.run_as:
            return configured_user(self.settings.run_as)
        if not worker_is_root():
            return None
        shared = self.settings.default_cwd
        owner = principal_id if shared is None else f"shared-directory:{shared}"
        users = AgentUsers(self.work_dir)
        return users.of(owner) if allocate else users.planned(owner)

    def confinement(
        self, cgroup_procs: tuple[Path, ...] = (), rlimits: tuple[str, ...] = ()
    ) -> tuple[str, ...]:
        known = self.sandboxed and agent_exec.seccomp_filter() is not None
        filter_file = self.work_dir / SECCOMP_FILE if known else None
        return confinement(self.sandboxed, cgroup_procs, rlimits, filter_file)

    def git_confinement(
        self, cgroup_procs: tuple[Path, ...], rlimits: tuple[str, ...]
    ) -> tuple[str, ...]:
        """The first step of the worker's own git processes after a turn: a launch's cgroups
        and rlimits, without the seccomp filter (git's jail is bwrap without one)."""
        return confinement(False, cgroup_procs, rlimits, self.work_dir / SECCOMP_FILE)

    def hidden(self) -> tuple[Path, ...]:
        return service_hidden(amux_home=self.amux_home, work_dir=self.work_dir)

    def check_provider(self, provider: str) -> None:
        """Raises: InvalidArgument: the provider is not one this worker may launch."""
        accepted = self.settings.accepted_providers()
        if provider not in accepted:
            raise InvalidArgument(f"unknown provider {provider!r}; accepted: {', '.join(accepted)}")

    def request(
        self,
        *,
        provider: str,
        prompt: str,
        session: Session,
        execution_id: str,
        memory: MemoryAttachment | None,
        base_env: Mapping[str, str],
        own_home: bool,
        permissions: str = AUTO,
        amux_argv: tuple[str, ...] = (),
        gateway: GatewayPass | None = None,
    ) -> LaunchRequest:
        """The launch request of one turn of ``session``.

        With ``own_home`` (sandboxed, or another user) HOME is the Session's own home, so the
        Agent's native state persists across its turns and is nobody else's. With ``gateway``
        (every worker launch) the Agent reaches its model only through the worker's gateway.

        Raises:
            InvalidArgument: the provider is not accepted here.
        """
        self.check_provider(provider)
        if gateway is not None:
            gateway = self.agent_gateway(gateway)
        env = dict(base_env)
        # A fork resumes its parent's native session where the parent keeps it.
        home_of = session.fork_of or session.id
        if own_home:
            env["HOME"] = str(self.session_home(home_of))
        settings = self.settings
        return LaunchRequest(
            provider=provider,
            prompt=prompt,
            cwd=self.workspace(session),
            run_dir=self.run_dir(execution_id),
            state_dir=self.state_dir(home_of),
            resume_id=session.native_id or None,
            append_instructions=settings.append_instructions,
            developer_instructions=settings.developer_instructions,
            memory=memory,
            executable=settings.executable(provider),
            extra_args=settings.extra_args(provider),
            base_env=env,
            pass_env=tuple(settings.pass_env),
            provider_home_source=settings.home_source(provider),
            mcp_servers=settings.mcp_servers(provider),
            permissions=permissions,
            amux_argv=amux_argv,
            gateway=gateway,
            model=session.model,
            fork=session.fork_of is not None,
        )

    def git_sandbox(
        self, checkout: Path, objects: Path, run_as: Identity | None
    ) -> tuple[str, ...]:
        """The prefix of the worker's own git commands in a project checkout: a sandbox showing
        only that checkout (read-write) and the objects it borrows (read-only), switching to the
        Agent's uid on a root worker; () with the sandbox off.

        Raises:
            ExecutableMissing: bwrap, git or setpriv is not installed.
        """
        if not self.sandboxed:
            return ()
        tools = {name: shutil.which(name) for name in ("bwrap", "git", "setpriv")}
        for name, found in tools.items():
            if found is None and (name != "setpriv" or run_as is not None):
                raise ExecutableMissing(
                    f"{name} is needed to work in a project's checkouts", executable=name
                )
        layout = sandbox_layout(
            cwd=checkout,
            writable=(checkout,),
            read_only=(objects,),
            sockets=(),
            executables=(str(tools["git"]),),
            env={"PATH": os.environ.get("PATH", os.defpath)},
            hidden=self.hidden(),
            switch_user=run_as is not None,
            seccomp_fd=None,
        )
        prefix = bwrap_argv(str(tools["bwrap"]), layout)
        if run_as is not None:
            prefix += user_switch(str(tools["setpriv"]), *run_as)
        return prefix

    def check_workspace(self, cwd: Path) -> None:
        """Raises: InvalidArgument: ``cwd`` would expose what the sandbox hides."""
        roots = [self.work_dir, *([self.amux_home] if self.amux_home else [])]
        checkouts = cwd.parent
        # A project conversation's checkout is a workspace of the work dir too, one a project's.
        is_checkout = checkouts.name == "checkouts" and checkouts.parent.parent == (
            self.work_dir / "projects"
        )
        check_workspace(cwd, self.hidden(), roots, checkouts if is_checkout else self.workspaces)

    @staticmethod
    def _amux_used(
        plan: LaunchPlan, request: LaunchRequest, executables: tuple[str, ...]
    ) -> tuple[str, ...]:
        memory_cli = request.memory.cli_dir if request.memory is not None else None
        return amux_in_use(plan, executables, memory_cli)

    def sandbox(
        self,
        plan: LaunchPlan,
        request: LaunchRequest,
        sockets: tuple[Path, ...] = (),
        extra_executables: tuple[str, ...] = (),
        borrowed_objects: tuple[Path, ...] = (),
        isolate: bool | None = None,
    ) -> LaunchPlan:
        """``plan`` run inside the sandbox, after ``agent_exec`` (only that when the sandbox is
        off; the worker adds the launch's cgroups to it). ``borrowed_objects``: a project
        checkout's project repository objects, which it reads and never writes.

        An isolated launch (``isolate``; by default a launch whose gateway pass names the model
        door, see ``agent_gateway``) gets a network namespace of its own and the relay to its doors,
        which whoever runs it serves (``runtime_bridge.doors``).

        Raises:
            ExecutableMissing: bwrap, or an executable the launch needs, is not installed.
            ExecutableUnreachable: the Agent's uid cannot run its CLI or amux's own
                installation (``extra_executables``) where they are.
            InvalidArgument: the working directory would expose what the sandbox hides, or a
                root worker's plan names no other user to run the Agent as.
        """
        if isolate is None:
            # Planned for the namespace: its CLI reaches the gateway through the model door.
            isolate = request.gateway is not None and request.gateway.url == door_url(MODEL)
        if worker_is_root() and plan.run_as is None and not self.settings.in_pods():
            raise InvalidArgument(
                "a root worker never runs an Agent as root; the plan names no uid"
            )
        if not self.sandboxed:
            check_launch(
                plan, resolve_executable(plan), self._amux_used(plan, request, extra_executables)
            )
            warnings = plan.warnings
            if plan.permissions == READ_ONLY:
                warnings += (READ_ONLY_UNSANDBOXED,)
            return dataclasses.replace(
                plan, confine=self.confinement(), warnings=warnings, borrowed=borrowed_objects
            )
        # The Agent's own executable first, for the same message an unsandboxed launch gives.
        executable = resolve_executable(plan)
        # By its directory's real path: the sandbox binds installations where they really are,
        # so a directory reached through a link (/opt/current -> /opt/v2) is not there twice.
        real_dir = os.path.realpath(os.path.dirname(executable))
        plan = dataclasses.replace(
            plan,
            argv=(os.path.join(real_dir, os.path.basename(executable)), *plan.argv[1:]),
        )
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise ExecutableMissing(
                "bwrap (Debian package bubblewrap) is needed to sandbox Agents; install it, "
                "or set AMUX_RUNTIME_SANDBOX=off to run them with the worker's own file access",
                executable="bwrap",
                provider=plan.provider,
            )
        self.check_workspace(plan.cwd)
        commands, files = operator_server_paths(request.mcp_servers)
        # Under read-only the workspace is mounted so: no tool, command or program the Agent
        # starts can change it, whatever its own permission system would have allowed.
        read_only_workspace = plan.permissions == READ_ONLY
        writable = (request.home_root,) if read_only_workspace else (plan.cwd, request.home_root)
        layout = sandbox_layout(
            cwd=plan.cwd,
            writable=tuple(dict.fromkeys(writable)),
            read_only=(
                *((plan.cwd,) if read_only_workspace else ()),
                request.run_dir,
                *files,
                *borrowed_objects,
            ),
            sockets=sockets,
            executables=(plan.argv[0], *extra_executables, *commands),
            env=plan.env,
            hidden=self.hidden(),
            switch_user=plan.run_as is not None,
            seccomp_fd=agent_exec.SECCOMP_FD if agent_exec.seccomp_filter() else None,
            own_network=isolate,
        )
        bound = (*layout.installations, *(Path(path) for path in SYSTEM_PATHS))
        amux = self._amux_used(plan, request, extra_executables)
        check_launch(plan, plan.argv[0], amux, bound)
        env = {**plan.env, "TMPDIR": "/tmp"}
        sandboxed = dataclasses.replace(
            plan,
            sandbox=bwrap_argv(bwrap, layout),
            env=env,
            confine=self.confinement(),
            borrowed=borrowed_objects,
        )
        if not isolate:
            return sandboxed
        doors = launch_doors(request.run_dir)
        return dataclasses.replace(
            sandboxed,
            env={**QUIET_ENV, **env, **door_env(doors)},
            relay=relay_argv(doors),
            doors=doors,
        )
