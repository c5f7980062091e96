"""The sandbox's argv and what it finds to mount: pure rules and file-system lookups."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hub.errors import InvalidArgument
from runtime_bridge.providers.errors import ExecutableMissing
from runtime_bridge.sandbox import (
    KERNEL_HIDDEN,
    KERNEL_READ_ONLY,
    SandboxLayout,
    bwrap_argv,
    check_workspace,
    find_installations,
    installation_root,
)


def layout(tmp_path: Path, **overrides: object) -> SandboxLayout:
    home = tmp_path / "amux-home"
    workspace = home / "runtime" / "workspaces" / "k"
    session = home / "runtime" / "sessions" / "s"
    run = home / "runtime" / "runs" / "e"
    for path in (workspace, session, run):
        path.mkdir(parents=True)
    values: dict[str, object] = {
        "cwd": workspace,
        "installations": (),
        "hidden": (Path("/root"), Path("/tmp"), home, home / "runtime"),
        "writable": (workspace, session),
        "read_only": (run,),
    }
    values.update(overrides)
    return SandboxLayout(**values)  # type: ignore[arg-type]


def pairs(argv: tuple[str, ...], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def test_the_argv_isolates_processes_and_dies_with_the_worker(tmp_path: Path) -> None:
    argv = bwrap_argv("/usr/bin/bwrap", layout(tmp_path))
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"):
        assert flag in argv
    assert argv[argv.index("--proc") + 1] == "/proc"
    assert argv[-3:] == ("--chdir", str(tmp_path / "amux-home/runtime/workspaces/k"), "--")
    assert "--cap-drop" in argv


def test_hidden_parents_of_the_launch_are_empty_unlistable_and_read_only(tmp_path: Path) -> None:
    home = tmp_path / "amux-home"
    argv = bwrap_argv("bwrap", layout(tmp_path))
    tmpfs = [p for p in pairs(argv, "--tmpfs") if not p.startswith("/proc/")]
    assert str(home) in tmpfs and str(home / "runtime") in tmpfs
    # /root is neither bound nor above the launch: it simply does not exist inside.
    assert "/root" not in tmpfs
    remounted = {p for p in pairs(argv, "--remount-ro") if not p.startswith("/proc/")}
    assert remounted == {str(home), str(home / "runtime")}
    # The launch's own directories are mounted after (over) the tmpfs that hides their parents.
    last_tmpfs = max(i for i, w in enumerate(argv) if w == "--tmpfs")
    assert argv.index("--bind") > last_tmpfs
    assert pairs(argv, "--bind") == [
        str(home / "runtime/workspaces/k"),
        str(home / "runtime/sessions/s"),
    ]
    assert str(home / "runtime/runs/e") in pairs(argv, "--ro-bind")


def test_a_hidden_path_inside_an_installation_is_covered_after_it(tmp_path: Path) -> None:
    install = tmp_path / "checkout"
    secret = install / ".amux"
    secret.mkdir(parents=True)
    argv = bwrap_argv(
        "bwrap", layout(tmp_path, installations=(install,), hidden=(secret,), writable=())
    )
    assert argv.index(str(install)) < argv.index(str(secret))
    assert str(secret) in pairs(argv, "--tmpfs")


def test_scratch_space_is_writable_by_any_user(tmp_path: Path) -> None:
    argv = bwrap_argv("bwrap", layout(tmp_path))
    for scratch in ("/tmp", "/var/tmp"):
        at = argv.index(scratch)
        assert argv[at - 3 : at] == ("--perms", "1777", "--tmpfs")


def test_a_user_switch_keeps_only_what_setpriv_needs_and_nothing_else_keeps_any(
    tmp_path: Path,
) -> None:
    shape = layout(tmp_path)
    argv = bwrap_argv("bwrap", replace(shape, switch_user=True, user_namespace=False))
    assert pairs(argv, "--cap-drop") == ["ALL"]
    assert pairs(argv, "--cap-add") == ["CAP_SETUID", "CAP_SETGID", "CAP_DAC_READ_SEARCH"]
    assert "--unshare-user" not in argv
    plain = bwrap_argv("bwrap", shape)
    assert pairs(plain, "--cap-drop") == ["ALL"] and "--cap-add" not in plain


def test_a_user_namespace_sandbox_forbids_the_agent_a_namespace_of_its_own(tmp_path: Path) -> None:
    argv = bwrap_argv("bwrap", layout(tmp_path, user_namespace=True, seccomp_fd=9))
    assert "--unshare-user" in argv and "--disable-userns" in argv
    assert pairs(argv, "--seccomp") == ["9"]


def test_the_kernel_interfaces_are_masked_after_the_fresh_proc(tmp_path: Path) -> None:
    argv = bwrap_argv("bwrap", layout(tmp_path))
    proc = argv.index("--proc")
    read_only = [argv[i + 1] for i, w in enumerate(argv) if w == "--ro-bind" and i > proc]
    assert "/proc/sys" in read_only
    for path in KERNEL_READ_ONLY:
        assert (path in read_only) == os.path.exists(path), path
    for path in KERNEL_HIDDEN:
        if os.path.isdir(path):
            assert path in pairs(argv, "--tmpfs") and path in pairs(argv, "--remount-ro")
        elif os.path.exists(path):
            at = argv.index(path)
            assert argv[at - 2 : at] == ("--ro-bind", "/dev/null"), path
    assert "/sys" not in argv


def test_an_npm_cli_brings_its_whole_node_modules(tmp_path: Path) -> None:
    package = tmp_path / "prefix" / "node_modules" / "@scope" / "cli"
    package.mkdir(parents=True)
    script = package / "cli.js"
    script.write_text("#!/usr/bin/env node\n")
    script.chmod(0o755)
    bin_dir = tmp_path / "prefix" / "node_modules" / ".bin"
    bin_dir.mkdir()
    (bin_dir / "cli").symlink_to(script)
    assert installation_root(bin_dir / "cli", ()) == tmp_path / "prefix" / "node_modules"
    roots = find_installations(["cli"], str(bin_dir), (Path("/root"),))
    assert tmp_path / "prefix" / "node_modules" in roots
    # node comes from the system (or wherever PATH has it), named by the #! line.
    assert all(not str(root).startswith("/usr") for root in roots)


def test_a_bin_executable_under_a_home_is_bound_narrowly(tmp_path: Path) -> None:
    home = tmp_path / "home" / "ops"
    (home / "bin").mkdir(parents=True)
    tool = home / "bin" / "agent"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert installation_root(tool, (home,)) == home / "bin"


def test_an_executable_in_a_home_binds_its_directory_never_the_prefix_beside_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "root"
    tool = home / ".local" / "bin" / "agent"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    secret = home / ".local" / "share" / "app" / "secret.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text("private")
    assert find_installations([str(tool)], "", (home,)) == (tool.parent,)
    # A directory holding dot entries beside the executable gives only the executable.
    (tool.parent / ".env").write_text("TOKEN=1")
    assert find_installations([str(tool)], "", (home,)) == (tool,)


def test_a_missing_executable_is_named(tmp_path: Path) -> None:
    with pytest.raises(ExecutableMissing, match="nope"):
        find_installations(["nope"], str(tmp_path), ())


def test_a_workspace_that_would_show_amux_state_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "amux-home"
    workspaces = home / "runtime" / "workspaces"
    workspaces.mkdir(parents=True)
    hidden = (home, home / "runtime")
    check_workspace(workspaces / "k", hidden, hidden, workspaces)
    check_workspace(tmp_path / "elsewhere", hidden, hidden, workspaces)
    with pytest.raises(InvalidArgument, match="contains"):
        check_workspace(tmp_path, hidden, hidden, workspaces)
    with pytest.raises(InvalidArgument, match="inside amux's own state"):
        check_workspace(home / "memory", hidden, hidden, workspaces)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap (bubblewrap) is not installed")
def test_the_sandbox_shows_the_workspace_and_nothing_of_its_hidden_parent(tmp_path: Path) -> None:
    shape = layout(tmp_path)
    (tmp_path / "amux-home" / "owner.token").write_text("secret")
    argv = bwrap_argv(shutil.which("bwrap") or "bwrap", shape)
    script = (
        "touch ./made-inside && ls -A {home} ; echo rc=$? ; cat {home}/owner.token ; echo rc=$?"
    ).format(home=tmp_path / "amux-home")
    done = subprocess.run(
        [*argv, "/bin/sh", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["rc=2", "rc=1"], (lines, done.stderr)
    assert (shape.cwd / "made-inside").exists()
    # The tmpfs hid the directory's content without touching it.
    assert set(os.listdir(tmp_path / "amux-home")) == {"runtime", "owner.token"}
