"""Runtime worker settings (env prefix ``AMUX_RUNTIME_``). Only composition roots build these."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hub.config import AbsolutePath
from hub.contract import provider_name_problem
from hub.errors import InvalidArgument
from runtime_bridge.bounds import MIN_CPU, MemorySetting, WorkspaceSetting, host_cpus
from runtime_bridge.launch_env import DEFAULT_PASS_ENV
from runtime_bridge.network import (
    HOST_NETWORK_WARNING,
    UNSANDBOXED_NETWORK_WARNING,
    AllowList,
    parse_allow_list,
)
from runtime_bridge.providers import ADAPTERS
from runtime_bridge.providers.plan import MEMORY_SERVER

MAX_SLOTS = 64
# The model gateway's port when Agents run in pods and none is set: the chart's NetworkPolicy
# names it.
POD_GATEWAY_PORT = 8790


def default_slots(cpus: int) -> int:
    """Turns a worker runs at once when AMUX_RUNTIME_SLOTS is unset: one per CPU, 2 to 8.

    A turn mostly waits on its model's API, but the builds and tests its Agent runs compete for
    the CPUs, so one per CPU keeps a busy turn from slowing the others much. At least two, so
    one long turn never holds up everyone on a small host; at most eight, since each launch may
    use up to its memory bound (a quarter of RAM by default).
    """
    return min(8, max(2, cpus))


def absolute_executable(executable: str) -> str:
    """A bare name stays one, looked up on the launch's PATH; a relative path becomes absolute.

    Agents start in their workspace and reach ``amux`` from inside the sandbox, where a path
    relative to the worker's own directory would name nothing.
    """
    if os.sep not in executable or os.path.isabs(executable):
        return executable
    return os.path.abspath(executable)


class RuntimeSettings(BaseSettings):
    """How a worker launches agents. List values are JSON in the environment."""

    model_config = SettingsConfigDict(env_prefix="AMUX_RUNTIME_", extra="ignore")

    name: str = Field(default_factory=socket.gethostname)
    # `amux serve` runs one worker beside the Hub unless this is false.
    in_process: bool = True
    # Each agent CLI's executable: a name looked up on PATH, or an absolute path.
    claude: str = "claude"
    codex: str = "codex"
    pi: str = "pi"
    # Further Agents the operator allows, name -> executable, run without memory. Nothing else is
    # ever launched: a provider name from a caller is never looked up on PATH by itself.
    providers: dict[str, str] = {}
    # bwrap: every launch runs in a bubblewrap sandbox; off: with the worker's own file access.
    sandbox: Literal["bwrap", "off"] = "bwrap"
    launcher: Literal["local", "agent-sandbox"] = Field(
        default="local",
        description="Where `amux runtime worker` runs each Agent: local: on the worker's host "
        "(AMUX_RUNTIME_SANDBOX says how); agent-sandbox: in a Kubernetes pod of its own, claimed "
        "from the agent-sandbox controller (needs the kubernetes extra, a cluster, "
        "AMUX_RUNTIME_SANDBOX=off; each turn's own files are streamed into its pod and back).",
    )
    sandbox_warm_pool: str = Field(
        default="amux-agent",
        description="The SandboxWarmPool an agent-sandbox launch claims its pod from (its "
        "SandboxTemplate sets the pod's RuntimeClass, resources and security context).",
    )
    sandbox_namespace: str | None = Field(
        default=None,
        description="Namespace of the SandboxClaims. Unset: the worker's own (in a cluster), "
        "else the kubeconfig context's, else default.",
    )
    sandbox_ready_seconds: float = Field(
        default=120.0,
        ge=1,
        description="Seconds an agent-sandbox launch waits for its pod to be Ready before the "
        "turn fails.",
    )
    pod_name: str | None = Field(
        default=None,
        description="The worker's own pod (the downward API's metadata.name): its SandboxClaims "
        "name it as their owner, so Kubernetes deletes them with a lost worker's pod.",
    )
    pod_uid: str | None = Field(
        default=None, description="The worker's own pod's metadata.uid, with AMUX_RUNTIME_POD_NAME."
    )
    pod_ip: str | None = Field(
        default=None,
        description="The worker's own pod's IP (the downward API's status.podIP): where Agents "
        "in sandbox pods reach its model gateway. Needed by AMUX_RUNTIME_LAUNCHER=agent-sandbox.",
    )
    gateway_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Port of the worker's model gateway. 0: any free port on loopback; with "
        "AMUX_RUNTIME_LAUNCHER=agent-sandbox it listens on every address, at a port the sandbox "
        "pods' NetworkPolicy names (8790 if 0).",
    )
    claude_args: list[str] = []
    codex_args: list[str] = []
    pi_args: list[str] = []
    # The operator's own MCP servers for Claude ({"mcpServers": {...}}, Claude's format): every
    # Claude launch gets exactly these, plus amux memory when its conversation is bound.
    claude_mcp_config: AbsolutePath | None = None
    # Provisioned explicitly into each launch's own CODEX_HOME / PI_CODING_AGENT_DIR.
    codex_config: AbsolutePath | None = None
    pi_agent_dir: AbsolutePath | None = None
    # Extra instructions merged with the memory protocol (never replaced by it).
    append_instructions: str | None = None
    developer_instructions: str | None = None
    # Provider credentials in pass_env never reach an Agent: the worker's model gateway holds them.
    pass_env: list[str] = list(DEFAULT_PASS_ENV)
    anthropic_base_url: str | None = Field(
        default=None,
        description="Where the worker's model gateway sends Anthropic requests. Unset: the "
        "worker's ANTHROPIC_BASE_URL, else https://api.anthropic.com.",
    )
    openai_base_url: str | None = Field(
        default=None,
        description="Where the worker's model gateway sends OpenAI requests (with /v1). Unset: "
        "the worker's OPENAI_BASE_URL, else https://api.openai.com/v1.",
    )
    network: Literal["isolated", "host"] = Field(
        default="isolated",
        description="isolated: each sandboxed launch has a network namespace of its own and "
        "reaches only the model gateway, the Hub and the egress proxy, through its doors; "
        "host: Agents share this host's network (warned in every plan).",
    )
    egress_allow: str = Field(
        default="",
        description="Hosts an isolated launch may reach through its egress proxy, "
        "comma-separated: host, host:port or *.example.com. Unset: none.",
    )
    # Per-run files and per-session agent homes; default: <AMUX_HOME>/runtime.
    work_dir: AbsolutePath | None = None
    # Where Agents work when a conversation names no directory; default: a workspace of each
    # Principal's own under <work_dir>/workspaces/. Setting it makes one directory all users share.
    default_cwd: AbsolutePath | None = None
    # Run Agents as this local user (a name or uid) instead of the worker's own; the worker must
    # run as root. Each run's files and the Agent's home then belong to that user alone.
    run_as: str | None = None
    # The amux executable launches use for `amux mcp` and the CLI; default: the running one.
    amux: str | None = None
    # Each launch's bounds (runtime_bridge.bounds); unset: the default for this machine.
    memory_max: MemorySetting = Field(
        default=None,
        description="Memory one Agent launch may use, everything it starts together: bytes or "
        "a size with a binary unit (512M, 2G). Unset: a quarter of RAM, within 512M..4G.",
    )
    tasks_max: int | None = Field(
        default=None,
        ge=1,
        description="Processes and threads one Agent launch may have at once. Unset: 512.",
    )
    cpu_max: float | None = Field(
        default=None,
        ge=MIN_CPU,
        description="CPU time one Agent launch may use, in CPUs (1.5 = one and a half cores). "
        "Unset: every CPU but one, at least 0.5.",
    )
    open_files_max: int | None = Field(
        default=None,
        ge=16,
        description="Files each process of an Agent launch may have open. Unset: 4096.",
    )
    workspace_max: WorkspaceSetting = Field(
        default=None,
        description="Disk an Agent's workspace may use: bytes or a size with a binary unit "
        "(512M, 2G). Unset: 2G.",
    )
    slots: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SLOTS,
        description="Agent turns this worker runs at once, each claimed and run on its own. "
        "Unset: one per CPU, at least 2 and at most 8.",
    )

    @field_validator("claude", "codex", "pi", "amux")
    @classmethod
    def _executable_path(cls, value: str | None) -> str | None:
        return None if value is None else absolute_executable(value)

    @field_validator("anthropic_base_url", "openai_base_url")
    @classmethod
    def _upstream_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value

    @field_validator("egress_allow")
    @classmethod
    def _egress_allow(cls, value: str) -> str:
        try:
            parse_allow_list(value)
        except InvalidArgument as error:
            raise ValueError(error.message) from None
        return value

    @field_validator("providers")
    @classmethod
    def _declared_providers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, executable in value.items():
            problem = provider_name_problem(name)
            if problem is not None:
                raise ValueError(problem)
            if name in ADAPTERS:
                raise ValueError(f"{name} is built in; set AMUX_RUNTIME_{name.upper()} instead")
            if not executable.strip():
                raise ValueError(f"provider {name} names no executable")
        return {name: absolute_executable(executable) for name, executable in value.items()}

    @model_validator(mode="after")
    def _pod_per_agent(self) -> RuntimeSettings:
        if self.launcher == "agent-sandbox" and self.sandbox == "bwrap":
            raise ValueError(
                "AMUX_RUNTIME_LAUNCHER=agent-sandbox runs each Agent in a pod that is its "
                "sandbox: set AMUX_RUNTIME_SANDBOX=off (bwrap does not run inside it)"
            )
        if self.launcher == "agent-sandbox" and not self.pod_ip:
            raise ValueError(
                "AMUX_RUNTIME_LAUNCHER=agent-sandbox needs AMUX_RUNTIME_POD_IP (the downward "
                "API's status.podIP): Agents in sandbox pods reach the model gateway there"
            )
        return self

    def gateway_address(self) -> tuple[str, int, str | None]:
        """Where the model gateway listens (host, port) and the host Agents are told."""
        if self.in_pods():
            return "0.0.0.0", self.gateway_port or POD_GATEWAY_PORT, self.pod_ip
        return "127.0.0.1", self.gateway_port, None

    def in_pods(self) -> bool:
        """Whether each Agent runs in a Kubernetes pod of its own (its sandbox, bounds, user
        and network are the pod's, not this host's)."""
        return self.launcher == "agent-sandbox"

    def unsandboxed_warning(self) -> str | None:
        """What a process launching Agents logs at start when the sandbox is off, else None."""
        if self.sandbox != "off" or self.in_pods():
            return None
        who = f"local user {self.run_as}'s" if self.run_as else "this service's own"
        return (
            f"AMUX_RUNTIME_SANDBOX=off: Agents run with {who} file access and see its processes; "
            "set AMUX_RUNTIME_SANDBOX=bwrap to confine each one to its own workspace"
        )

    def isolated(self) -> bool:
        """Whether each launch gets a network namespace of its own (only inside the sandbox)."""
        return self.sandbox == "bwrap" and self.network == "isolated"

    def network_warning(self) -> str | None:
        """What a plan and a worker's start say when launches share the host's network."""
        if self.in_pods():
            return None  # The sandbox pods' NetworkPolicy is their boundary.
        if self.sandbox == "off":
            return UNSANDBOXED_NETWORK_WARNING
        if self.network == "host":
            return HOST_NETWORK_WARNING
        return None

    def allow_list(self) -> AllowList:
        return AllowList.parse(self.egress_allow)

    def work_dir_beside(self, home: Path) -> Path:
        """Where a worker sharing the Hub's AMUX_HOME keeps runs, sessions and workspaces."""
        return self.work_dir or home / "runtime"

    def standalone_work_dir(self) -> Path:
        """Where ``amux runtime worker`` keeps them by default: a per-user temporary directory.

        A standalone worker usually runs on a host of its own, where AMUX_HOME (if set at all)
        only tells the CLI where to find a token: no Hub home there to keep Agents' files under.
        """
        return self.work_dir or Path(tempfile.gettempdir()) / f"amux-runtime-{os.getuid()}"

    def slot_count(self) -> int:
        return self.slots if self.slots is not None else default_slots(host_cpus())

    def accepted_providers(self) -> tuple[str, ...]:
        """The Agents this worker launches: the built-in adapters, then the declared ones."""
        return (*ADAPTERS, *sorted(self.providers))

    def executable(self, provider: str) -> str | None:
        built_in = {"claude": self.claude, "codex": self.codex, "pi": self.pi}
        return built_in.get(provider) or self.providers.get(provider)

    def extra_args(self, provider: str) -> tuple[str, ...]:
        args = {"claude": self.claude_args, "codex": self.codex_args, "pi": self.pi_args}
        return tuple(args.get(provider, []))

    def mcp_servers(self, provider: str) -> dict[str, Any]:
        """The operator's MCP servers for ``provider`` (only Claude takes them this way).

        Raises:
            InvalidArgument: the configured file is unreadable, not Claude's format, or names a
                server ``memory`` (amux's own).
        """
        path = self.claude_mcp_config
        if provider != "claude" or path is None:
            return {}
        where = f"AMUX_RUNTIME_CLAUDE_MCP_CONFIG ({path})"
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidArgument(f"{where} cannot be read: {error}") from None
        servers = loaded.get("mcpServers") if isinstance(loaded, dict) else None
        if not isinstance(servers, dict) or not all(
            isinstance(server, dict) for server in servers.values()
        ):
            raise InvalidArgument(f"{where} must be a JSON object with an mcpServers object")
        if MEMORY_SERVER in servers:
            raise InvalidArgument(f"{where} names a server {MEMORY_SERVER!r}, which is amux's")
        return servers

    def home_source(self, provider: str) -> Path | None:
        return {"codex": self.codex_config, "pi": self.pi_agent_dir}.get(provider)
