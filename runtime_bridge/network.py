"""What a sandboxed launch's network is: its own namespace, three doors, an allow-list. Pure.

An Agent is untrusted code, so its sandbox has a network namespace of its own (bwrap
``--unshare-net``): only its own loopback, no route anywhere. Inside, the relay
(``runtime_bridge/relay.py``) listens on three loopback ports, each carried to a Unix socket the
worker binds in the launch's own run directory (owned by the Agent's uid, mode 0600, so no other
launch's Agent reaches it):

- ``model``: the worker's model gateway (the CLIs' base URLs point here);
- ``hub``: the Hub's RPC (``AMUX_HUB_URL``; the worker makes the TLS connection of an https Hub);
- ``egress``: an HTTP proxy (``HTTPS_PROXY``/``HTTP_PROXY``) that lets through only hosts on
  ``AMUX_RUNTIME_EGRESS_ALLOW`` (``runtime_bridge/egress.py``).

The ports are fixed: the namespace is the launch's alone, so nothing else can hold them, and the
plan shows exactly what the Agent will see.
"""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from hub.errors import InvalidArgument

RELAY = Path(__file__).with_name("relay.py")
MODEL = "model"
HUB = "hub"
EGRESS = "egress"
DOOR_PORTS: dict[str, int] = {MODEL: 7801, HUB: 7802, EGRESS: 7803}
LOOPBACK = "127.0.0.1"
NO_PROXY = "127.0.0.1,localhost"
EGRESS_SETTING = "AMUX_RUNTIME_EGRESS_ALLOW"

HOST_NETWORK_WARNING = (
    "AMUX_RUNTIME_NETWORK=host: Agents share this host's network, so they reach every address "
    "it reaches (the Hub's port, local services, the cloud's metadata address) directly; set "
    "AMUX_RUNTIME_NETWORK=isolated to give each launch only its doors"
)
UNSANDBOXED_NETWORK_WARNING = (
    "the sandbox is off, so the Agent has no network namespace: it reaches every address this "
    "host reaches, and AMUX_RUNTIME_EGRESS_ALLOW is not applied"
)


@dataclass(frozen=True)
class Door:
    """One way out of a launch's namespace: a loopback port inside, a Unix socket outside."""

    name: str
    port: int
    socket: Path

    @property
    def url(self) -> str:
        return door_url(self.name)

    def to_json(self) -> dict[str, str | int]:
        return {"name": self.name, "listen": f"{LOOPBACK}:{self.port}", "socket": str(self.socket)}


def door_url(name: str) -> str:
    """The URL of door ``name`` inside a launch's namespace."""
    return f"http://{LOOPBACK}:{DOOR_PORTS[name]}"


def launch_doors(run_dir: Path) -> tuple[Door, ...]:
    """The doors of the launch whose run directory is ``run_dir``."""
    return tuple(Door(name, port, run_dir / f"{name}.sock") for name, port in DOOR_PORTS.items())


def door(doors: tuple[Door, ...], name: str) -> Door:
    (found,) = [d for d in doors if d.name == name]
    return found


def relay_argv(doors: tuple[Door, ...]) -> tuple[str, ...]:
    """The relay's words, the Agent's argv to follow (``-I -S``: its start costs little)."""
    return (
        sys.executable,
        "-I",
        "-S",
        str(RELAY),
        *(f"{d.port}={d.socket}" for d in doors),
        "--",
    )


# What each CLI would otherwise reach for on its own (telemetry, error reports, update and
# version checks): off in an isolated launch, where each attempt would be a refused host on the
# turn's card. Claude honours the proxy variables; Pi's start-up fetches do not go through them.
QUIET_ENV: dict[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "PI_OFFLINE": "1",
    "PI_TELEMETRY": "0",
}


def door_env(doors: tuple[Door, ...]) -> dict[str, str]:
    """The proxy variables that send the Agent's other requests to the egress door (both
    spellings: tools read one or the other), and loopback past it to its own doors."""
    proxy = door(doors, EGRESS).url
    env: dict[str, str] = {}
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    return env


@dataclass(frozen=True)
class AllowEntry:
    """``host``, ``host:port``, ``*.domain`` or ``*.domain:port``."""

    host: str
    port: int | None = None

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.wildcard:
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``, lower-cased.

    Raises:
        InvalidArgument: not one of those.
    """
    text = text.strip().lower()
    if any(c.isspace() or c in "/@" for c in text):
        raise InvalidArgument(f"{text!r} is not host or host:port")
    port_text: str | None = None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise InvalidArgument(f"{text!r} is not host or host:port")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host = text
    if not host:
        raise InvalidArgument(f"{text!r} is not host or host:port")
    if port_text is None:
        return host.rstrip("."), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"{text!r} has no valid port")
    return host.rstrip("."), int(port_text)


def parse_allow_list(text: str) -> tuple[AllowEntry, ...]:
    """``AMUX_RUNTIME_EGRESS_ALLOW``: comma-separated entries; empty allows nothing.

    Raises:
        InvalidArgument: an entry is not host, host:port or a ``*.domain`` wildcard.
    """
    entries: list[AllowEntry] = []
    for word in text.split(","):
        if not word.strip():
            continue
        host, port = split_host_port(word)
        if "*" in host and (not host.startswith("*.") or "*" in host[2:] or len(host) < 3):
            raise InvalidArgument(f"{word.strip()!r}: a wildcard is written *.example.com")
        entries.append(AllowEntry(host, port))
    return tuple(entries)


def local_address(address: str) -> bool:
    """Loopback, link-local (the cloud metadata address 169.254.169.254 among them),
    unspecified or multicast: a proxy must not be a way into the worker's own host."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast


@dataclass(frozen=True)
class AllowList:
    entries: tuple[AllowEntry, ...] = ()

    @classmethod
    def parse(cls, text: str) -> AllowList:
        return cls(parse_allow_list(text))

    def allows(self, host: str, port: int) -> bool:
        return any(entry.matches(host, port) for entry in self.entries)

    def names_explicitly(self, host: str, port: int) -> bool:
        """Allowed by an entry naming this very host (no wildcard): what a local address
        needs."""
        return any(not e.wildcard and e.matches(host, port) for e in self.entries)

    def __str__(self) -> str:
        return ",".join(str(entry) for entry in self.entries)
