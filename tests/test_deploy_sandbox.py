"""deploy/ lets the Agent sandbox work: the image installs bubblewrap, and neither the systemd
units nor the compose worker forbid the namespaces or the fresh /proc each launch gets.

What each launch unshares is read from the sandbox's own argv, so a new namespace there fails
here until the units allow it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runtime_bridge.sandbox import SandboxLayout, bwrap_argv
from tests.test_deploy import DEPLOY, HUB_UNIT, WORKER_UNIT, unit

# systemd's names for the namespaces bwrap's --unshare-* options create.
UNSHARED = {
    "--unshare-user": "user",
    "--unshare-user-try": "user",
    "--unshare-pid": "pid",
    "--unshare-ipc": "ipc",
    "--unshare-uts": "uts",
    "--unshare-net": "net",
    "--unshare-cgroup": "cgroup",
    "--unshare-cgroup-try": "cgroup",
}
# Each masks part of /proc, and the kernel refuses a fresh /proc in a user namespace while any
# part of the one it would shadow is masked.
PROC_MASKING = ("ProtectKernelTunables", "ProtectKernelLogs", "ProtectHostname", "ProtectProc")


def launch_namespaces() -> set[str]:
    layout = SandboxLayout(cwd=Path("/"), installations=(), hidden=(), writable=())
    argv = bwrap_argv("bwrap", layout)
    flags = [arg for arg in argv if arg.startswith("--unshare-")]
    # An unprivileged bwrap always makes a user namespace and a mount namespace.
    return {"user", "mnt"} | {UNSHARED[flag] for flag in flags}


@pytest.mark.parametrize("path", [HUB_UNIT, WORKER_UNIT], ids=lambda p: p.name)
def test_the_systemd_units_allow_every_namespace_and_the_proc_an_agent_launch_needs(
    path: Path,
) -> None:
    service = {k.removeprefix("Service."): v[-1] for k, v in unit(path).items()}
    allowed = set(service["RestrictNamespaces"].split())
    assert launch_namespaces() <= allowed
    # Agents share the host's network, so nothing needs a network namespace.
    assert "net" not in allowed
    for key in PROC_MASKING:
        assert service.get(key, "no") == "no", key


def test_the_image_installs_bubblewrap() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    install = re.search(r"apt-get install [^\n]*", text)
    assert install is not None
    assert "bubblewrap" in install.group(0).split()


def test_the_compose_worker_unmasks_proc_for_the_sandbox() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    worker = text.split("\n  worker:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    assert re.search(r"security_opt:\n\s+- unmask=/proc/\*\n", worker)
