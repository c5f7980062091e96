"""``amux doctor``'s network checks: a launch's namespace, its relay, the gateway's upstreams and
the egress allow-list.

The namespace and the relay are probed the way a launch gets them: bwrap ``--unshare-net`` around
the relay, with one door carried to a Unix socket this process serves, and inside, as the
Agent's uid on a root worker, a probe that finds no route out and its door answering. A model
provider the host cannot reach is reported, never a failure: a machine with no route out still
runs every amux path except the model's own answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from bot.commands.doctor import SANDBOX_SECONDS, Check, _capture
from runtime_bridge import agent_exec
from runtime_bridge.agent_users import DYNAMIC_UIDS
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.gateway import operator_upstreams
from runtime_bridge.launch import confinement
from runtime_bridge.network import EGRESS_SETTING, Door, relay_argv
from runtime_bridge.providers.process import user_switch
from runtime_bridge.sandbox import SandboxLayout, amux_installation, bwrap_argv

UPSTREAM_SECONDS = 5.0
PROBE_PORT = 7809
PING = b"amux-relay-probe"
# Inside the probe's namespace: an address outside must be unreachable, and the door must carry
# a round trip to the socket outside.
INSIDE = f"""
import socket
try:
    socket.create_connection(("192.0.2.1", 80), timeout=3).close()
    print("route-out")
except OSError as error:
    print("no-route" if error.errno == 101 else "route-error " + str(error))
try:
    door = socket.create_connection(("127.0.0.1", {PROBE_PORT}), timeout=5)
    door.sendall({PING!r})
    door.shutdown(socket.SHUT_WR)
    print("relayed" if door.recv(64) == {PING!r} else "relay-silent")
except OSError as error:
    print("relay-error " + str(error))
"""


def _network_skipped(runtime: RuntimeSettings) -> list[Check] | None:
    if not runtime.in_process:
        said = "this process launches no Agents: run `amux doctor` on each worker host"
        return [Check("network_namespace", "skip", said), Check("relay", "skip", said)]
    if runtime.sandbox == "off":
        said = "the sandbox is off, so launches have no network namespace and no doors"
        fix = "set AMUX_RUNTIME_SANDBOX=bwrap"
        return [Check("network_namespace", "warn", said, fix), Check("relay", "skip", said)]
    if runtime.network == "host":
        said = "AMUX_RUNTIME_NETWORK=host: Agents share this host's network"
        fix = "set AMUX_RUNTIME_NETWORK=isolated"
        return [Check("network_namespace", "warn", said, fix), Check("relay", "skip", said)]
    if shutil.which("bwrap") is None:
        said = "bwrap is not on PATH (see the sandbox check)"
        return [Check("network_namespace", "skip", said), Check("relay", "skip", said)]
    return None


def _probe_argv(bwrap: str, directory: Path, socket_path: Path) -> list[str]:
    root = os.geteuid() == 0
    layout = SandboxLayout(
        cwd=Path("/"),
        installations=amux_installation(()),
        hidden=(),
        writable=(),
        sockets=(socket_path,),
        switch_user=root,
        user_namespace=not root,
        seccomp_fd=agent_exec.SECCOMP_FD if agent_exec.seccomp_filter() else None,
        own_network=True,
    )
    switch: tuple[str, ...] = ()
    if root:
        setpriv = shutil.which("setpriv") or "setpriv"
        switch = user_switch(setpriv, DYNAMIC_UIDS.start, DYNAMIC_UIDS.start)
    relay = relay_argv((Door("probe", PROBE_PORT, socket_path),))
    inside = [sys.executable, "-I", "-S", "-c", INSIDE]
    return [*confinement(True), *bwrap_argv(bwrap, layout), *switch, *relay, *inside]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(await reader.read(64))
        await writer.drain()
    writer.close()


async def check_network(runtime: RuntimeSettings, seconds: float = SANDBOX_SECONDS) -> list[Check]:
    """The namespace and relay checks, from one probe launch."""
    skipped = _network_skipped(runtime)
    if skipped is not None:
        return skipped
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    directory = Path(tempfile.mkdtemp(prefix="amux-doctor-"))
    socket_path = directory / "probe.sock"
    try:
        os.chmod(directory, 0o711)
        server = await asyncio.start_unix_server(_echo, path=str(socket_path))
        # The probe runs as an Agent's uid on a root worker; this socket is the probe's alone.
        os.chmod(socket_path, 0o666)
        try:
            probed = await _capture(_probe_argv(bwrap, directory, socket_path), seconds)
        finally:
            server.close()
            await server.wait_closed()
    except OSError as error:
        said = f"the probe could not start: {error.strerror}"
        return [Check("network_namespace", "fail", said), Check("relay", "skip", said)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if probed is None:
        said = f"a probe launch gave no answer within {seconds:.0f}s"
        return [Check("network_namespace", "fail", said), Check("relay", "skip", said)]
    code, output = probed
    lines = output.splitlines()
    if "no-route" in lines:
        namespace = Check(
            "network_namespace",
            "ok",
            "a probe launch (bwrap --unshare-net) had only its own loopback: no route out",
        )
    else:
        detail = output.strip().splitlines()[-1] if output.strip() else f"exit status {code}"
        namespace = Check(
            "network_namespace",
            "fail",
            f"a probe launch did not get a network of its own: {detail}",
            "check that bwrap may create network namespaces here, or set AMUX_RUNTIME_NETWORK=host",
        )
    if "relayed" in lines:
        relay = Check("relay", "ok", "a probe connection through a relay door reached its socket")
    else:
        problem = next((line for line in lines if line.startswith("relay")), output or "none")
        relay = Check(
            "relay",
            "fail",
            f"a probe connection through a relay door failed: {problem}",
            "see runtime_bridge/relay.py's message above; every isolated launch needs it",
        )
    return [namespace, relay]


async def check_upstreams(runtime: RuntimeSettings, seconds: float = UPSTREAM_SECONDS) -> Check:
    """Whether the gateway's model providers answer a TCP connection from here (reported only:
    a host with no route out is a warning, never a failure)."""
    upstreams = operator_upstreams(os.environ, runtime.anthropic_base_url, runtime.openai_base_url)
    reached: list[str] = []
    unreached: list[str] = []
    for upstream in upstreams.values():
        parts = urlsplit(upstream.base)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
        except (OSError, TimeoutError) as error:
            reason = "timed out" if isinstance(error, TimeoutError) else "no route"
            unreached.append(f"{upstream.api} {upstream.shown} ({reason})")
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        reached.append(f"{upstream.api} {upstream.shown}")
    if not unreached:
        return Check("gateway_upstream", "ok", "reached " + ", ".join(reached))
    detail = "no route to " + ", ".join(unreached)
    if reached:
        detail += "; reached " + ", ".join(reached)
    return Check(
        "gateway_upstream",
        "warn",
        detail + ": Agents' model requests fail until this host can reach its provider",
        "open the route to the provider, or point AMUX_RUNTIME_ANTHROPIC_BASE_URL / "
        "AMUX_RUNTIME_OPENAI_BASE_URL at one this host reaches",
    )


def check_egress(runtime: RuntimeSettings) -> Check:
    """The egress allow-list, as launches apply it."""
    if not runtime.isolated():
        return Check("egress", "skip", "launches share the host's network: no egress proxy")
    allowed = str(runtime.allow_list())
    if not allowed:
        return Check(
            "egress",
            "ok",
            f"{EGRESS_SETTING} is empty: Agents reach no host beyond the model gateway and the Hub",
        )
    return Check("egress", "ok", f"Agents may reach {allowed} through the egress proxy")
