"""`amux doctor`'s checks called directly: the sandbox probe (with stand-in bwraps) and the report.

``test_doctor`` runs the command as an operator does, against a real `amux serve`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bot.commands.doctor import (
    Check,
    check_agent_user,
    check_bounds,
    check_feishu_topic_scope,
    check_memory_disk,
    check_open_files,
    check_sandbox,
    check_workspace_disk,
    passed,
    permissions_check,
    render,
)
from bot.config import FeishuSettings
from runtime_bridge.config import RuntimeSettings
from tests.fakes.feishu import FakeFeishu
from tests.tmpfs import tmpfs

# -- the sandbox ----------------------------------------------------------------------------------

OPEN = FeishuSettings(app_id="cli_doctor", app_secret="s3cret", enroll="auto")
CLOSED = FeishuSettings(app_id="cli_doctor", app_secret="s3cret", enroll="closed")
NAMESPACES_REFUSED = (
    "bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
    "non-privileged user namespaces."
)
PROC_REFUSED = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"


def fake_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe: str) -> Path:
    """A ``bwrap`` first on PATH that knows its version and runs ``probe`` for anything else."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "bwrap"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo "bubblewrap 0.0.1-fake"; exit 0; fi\n'
        f"{probe}\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return script


async def test_a_working_bwrap_is_reported_with_its_version() -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    check = await check_sandbox(RuntimeSettings(sandbox="bwrap"), OPEN)
    assert check.status == "ok", check
    assert check.detail.startswith("bubblewrap ")
    assert "own PID, IPC and UTS namespaces and /proc" in check.detail
    assert "kernel interfaces masked, no user namespace of its own" in check.detail


async def test_sandbox_off_with_open_enrollment_fails_with_a_fix_for_either_side() -> None:
    check = await check_sandbox(RuntimeSettings(sandbox="off"), OPEN)
    assert check.status == "fail"
    assert "Agents run with this service's own file access" in check.detail
    assert "AMUX_FEISHU_ENROLL=auto" in check.detail
    assert "AMUX_RUNTIME_SANDBOX=bwrap" in check.fix
    assert "AMUX_FEISHU_ENROLL=closed" in check.fix


@pytest.mark.parametrize(
    "feishu", [CLOSED, FeishuSettings(app_id="", enroll="auto")], ids=["closed", "no-bot"]
)
async def test_sandbox_off_without_open_enrollment_is_a_warning(feishu: FeishuSettings) -> None:
    check = await check_sandbox(RuntimeSettings(sandbox="off", run_as="agent"), feishu)
    assert check.status == "warn"
    assert "Agents run with local user agent's file access" in check.detail
    assert "AMUX_RUNTIME_SANDBOX=bwrap" in check.fix
    assert passed([check])


async def test_a_missing_bwrap_fails_and_only_closed_enrollment_may_turn_the_sandbox_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    opened = await check_sandbox(RuntimeSettings(sandbox="bwrap"), OPEN)
    assert opened.status == "fail"
    assert "bwrap is not on PATH: every Agent launch fails" in opened.detail
    assert "bubblewrap" in opened.fix
    assert "SANDBOX=off" not in opened.fix
    closed = await check_sandbox(RuntimeSettings(sandbox="bwrap"), CLOSED)
    assert closed.status == "fail"
    assert "AMUX_RUNTIME_SANDBOX=off" in closed.fix


async def test_a_bwrap_that_cannot_create_namespaces_names_the_kernel_setting_that_forbids_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_bwrap(tmp_path, monkeypatch, f"echo '{NAMESPACES_REFUSED}' >&2; exit 1")
    proc_sys = tmp_path / "proc-sys"
    (proc_sys / "user").mkdir(parents=True)
    (proc_sys / "user" / "max_user_namespaces").write_text("0\n")
    check = await check_sandbox(RuntimeSettings(sandbox="bwrap"), CLOSED, proc_sys=proc_sys)
    assert check.status == "fail"
    assert check.detail.startswith("bubblewrap 0.0.1-fake (")
    assert NAMESPACES_REFUSED in check.detail
    assert "(user.max_user_namespaces is 0)" in check.detail
    assert "user.max_user_namespaces" in check.fix
    assert "RestrictNamespaces=" in check.fix


async def test_a_bwrap_that_cannot_mount_proc_is_told_which_settings_mask_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_bwrap(tmp_path, monkeypatch, f'echo "{PROC_REFUSED}" >&2; exit 1')
    check = await check_sandbox(RuntimeSettings(sandbox="bwrap"), OPEN)
    assert check.status == "fail"
    assert PROC_REFUSED in check.detail
    assert "ProtectKernelTunables=" in check.fix
    assert "unmask=/proc/*" in check.fix


async def test_a_bwrap_probe_that_never_ends_fails_within_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_bwrap(tmp_path, monkeypatch, "exec sleep 60")
    check = await check_sandbox(RuntimeSettings(sandbox="bwrap"), CLOSED, seconds=0.5)
    assert check.status == "fail"
    assert "gave no answer within" in check.detail
    assert "by hand" in check.fix


async def test_a_hub_without_an_in_process_worker_leaves_the_sandbox_to_the_workers() -> None:
    check = await check_sandbox(RuntimeSettings(sandbox="off", in_process=False), OPEN)
    assert check.status == "skip"
    assert "on each worker host" in check.detail


# -- the report itself ----------------------------------------------------------------------------


def test_warnings_and_skips_do_not_fail_the_report() -> None:
    checks = [Check("a", "ok", "fine"), Check("b", "warn", "hm", "do x"), Check("c", "skip", "-")]
    assert passed(checks)
    text = render(checks)
    assert "fix: do x" in text
    assert text.endswith("All checks passed (1 warning(s)).")
    assert not passed([*checks, Check("d", "fail", "broken", "fix it")])


# -- the topic-context scope ----------------------------------------------------------------------


async def test_doctor_warns_with_the_scopes_to_add_when_the_app_may_not_read_topics() -> None:
    async with FakeFeishu(app_id="cli_doctor", app_secret="s3cret") as fake:
        settings = FeishuSettings(app_id="cli_doctor", app_secret="s3cret", domain=fake.url)
        granted = await check_feishu_topic_scope(settings)
        assert granted.status == "ok"
        assert fake.calls("GET", "/open-apis/im/v1/messages")[0].query["container_id_type"] == (
            "thread"
        )
        fake.message_list_refused = True
        refused = await check_feishu_topic_scope(settings)
        assert refused.status == "warn"
        assert "im:message.group_msg" in refused.fix
        assert "s3cret" not in refused.detail + refused.fix


# -- the memory disk ------------------------------------------------------------------------------


def test_a_nearly_full_memory_disk_warns_with_a_fix(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "home", "64m") as home:
        (home / "memory").mkdir()
        small = check_memory_disk(home / "memory")
        # Not created yet: the disk it will be made on is the one that counts.
        fresh = check_memory_disk(home / "not-yet" / "memory")
    for check in (small, fresh):
        assert check.status == "warn", check
        assert check.name == "memory_disk"
        assert "64 MiB free of 64 MiB" in check.detail and "nearly full" in check.detail
        assert "storage_unavailable" in check.detail
        assert check.fix.startswith("free space on the file system holding")
    assert f"under {tmp_path / 'home'}" in fresh.detail
    assert "fix: free space on the file system holding" in render([small])


def test_a_memory_disk_with_room_passes(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "home", "1g") as home:
        check = check_memory_disk(home)
    assert check.status == "ok", check
    assert check.detail.startswith("1024 MiB free of 1024 MiB (100%)")


def test_a_read_only_memory_disk_fails(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "home", "1g", "ro") as home:
        check = check_memory_disk(home)
    assert check.status == "fail", check
    assert "read-only" in check.detail
    assert check.fix == f"remount the file system holding {home} read-write"


def test_workspaces_on_the_hubs_file_system_are_a_warning_naming_both_and_the_fix(
    tmp_path: Path,
) -> None:
    home = tmp_path / "amux-home"
    shared = check_workspace_disk(home, RuntimeSettings(workspace_max="20M"))
    assert shared.status == "warn", shared
    assert shared.name == "workspace_disk"
    assert f"AMUX_HOME {home}" in shared.detail
    assert f"the worker's directory {home / 'runtime'}" in shared.detail
    assert "workspace bound (20 MiB, AMUX_RUNTIME_WORKSPACE_MAX)" in shared.detail
    assert "AMUX_RUNTIME_WORK_DIR" in shared.fix and "another file system" in shared.fix
    with tmpfs(tmp_path / "workspaces", "16m") as apart:
        separate = check_workspace_disk(home, RuntimeSettings(work_dir=apart))
        # One shared directory on the Hub's disk is named by its own setting.
        default_cwd = RuntimeSettings(work_dir=apart, default_cwd=tmp_path)
        through_cwd = check_workspace_disk(home, default_cwd)
    assert separate.status == "ok", separate
    assert through_cwd.status == "warn" and "AMUX_RUNTIME_DEFAULT_CWD" in through_cwd.detail
    assert "the worker's directory" not in through_cwd.detail


def test_a_configuration_running_agents_as_root_fails_and_names_the_fix() -> None:
    check = check_agent_user(RuntimeSettings(run_as="root"), euid=0)
    assert check.status == "fail"
    assert "would run Agents as root" in check.detail
    assert "unset AMUX_RUNTIME_RUN_AS" in check.fix


@pytest.mark.parametrize(
    ("euid", "run_as", "status", "said"),
    [
        (0, None, "ok", "a uid of its own (61184-65519), never root"),
        (1000, None, "ok", "this service's uid (1000) inside a user namespace"),
        (0, "nobody", "ok", "local user nobody"),
        (1000, "nobody", "fail", "cannot switch to another user"),
    ],
)
def test_who_agents_run_as_is_reported(
    euid: int, run_as: str | None, status: str, said: str
) -> None:
    check = check_agent_user(RuntimeSettings(run_as=run_as), euid=euid)
    assert check.status == status and said in check.detail, check


def test_the_bounds_and_the_mechanism_that_applies_them_are_reported(tmp_path: Path) -> None:
    settings = RuntimeSettings(tasks_max=64, memory_max="1G")
    here = check_bounds(settings)
    assert "1 GiB" in here.detail and "64 tasks" in here.detail and "workspace 2 GiB" in here.detail
    if here.status == "ok":
        assert here.detail.startswith("cgroup v")
    # A host offering no cgroup: rlimits only, which leave memory and CPU unbounded.
    bare = check_bounds(settings, cgroup_root=tmp_path)
    assert bare.status == "warn"
    assert bare.detail.startswith("rlimits") and "memory and CPU are not bounded" in bare.detail
    assert "Delegate=yes" in bare.fix


def test_without_a_running_hub_the_open_file_limit_one_would_start_with_is_reported() -> None:
    low = check_open_files(None, hard=1024)
    assert low.status == "warn" and "may open 1024 files (its hard limit)" in low.detail
    assert "LimitNOFILE=65536" in low.fix
    high = check_open_files(None, hard=65536)
    assert high.status == "ok" and "65536" in high.detail


# -- the permission policy ------------------------------------------------------------------------


def test_each_policy_says_what_it_means_for_each_provider() -> None:
    runtime = RuntimeSettings(sandbox="bwrap")
    ask = permissions_check({"permissions": "ask", "approval_timeout": 90}, runtime)
    assert ask.status == "ok"
    for said in (
        "Claude asks through amux's permission prompt",
        "Codex: amux answers its app-server approvals, its own sandbox off inside amux's",
        "Pi: amux's extension asks",
        "denied after 90 s",
    ):
        assert said in ask.detail
    auto = permissions_check({"permissions": "auto", "approval_timeout": 600}, runtime)
    assert auto.status == "ok" and "inside amux's sandbox" in auto.detail
    assert "the workspace, the session home and /tmp are the only writable places" in auto.detail
    read_only = permissions_check({"permissions": "read-only"}, runtime)
    assert read_only.detail.startswith("read-only: the workspace is mounted read-only")


def test_a_policy_that_lets_agents_change_files_without_the_sandbox_is_a_warning() -> None:
    off = RuntimeSettings(sandbox="off")
    auto = permissions_check({"permissions": "auto", "approval_timeout": 3600}, off)
    assert auto.status == "warn" and "AMUX_RUNTIME_SANDBOX=off" in auto.detail
    assert "AMUX_RUNTIME_SANDBOX=bwrap" in auto.fix
    assert permissions_check({"permissions": "read-only"}, off).status == "ok"
