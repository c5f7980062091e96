"""The real Codex under each permission policy, against the fake Responses API.

The scripted model edits with Codex's own ``apply_patch`` (a freeform tool, offered to a model
Codex's catalog knows: the config names ``gpt-5.5``, served by the fake) and runs shell commands
with ``exec_command``. ``auto`` and ``read-only`` run inside amux's real sandbox, where Codex's
own sandbox could not start and no command ran before.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_bridge.approvals import (
    ASK,
    AUTO,
    COMMAND,
    EDIT,
    READ_ONLY,
    ApprovalAnswer,
    ApprovalRequest,
)
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.providers import (
    LaunchPlan,
    LaunchRequest,
    MemoryAttachment,
    Result,
    build_plan,
    run,
)
from tests.fakes.model_server import Answer, CallTool, FakeModelServer, Step
from tests.runtime_bridge.conftest import (
    TEST_PASS_ENV,
    StubMcp,
    collect,
    offline_env,
    offline_request,
    sandboxed_launch,
    stub_search_call,
)
from tests.runtime_bridge.test_providers_codex import codex_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

sandboxed = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="needs bwrap and root: the Agent runs sandboxed, as a uid of its own",
)

# Codex offers apply_patch only to models its catalog knows; the fake serves any name.
MODEL = "gpt-5.5"
REFUSAL = "not in this workspace"


def patch_adding(name: str, line: str) -> CallTool:
    return CallTool(
        "apply_patch",
        {},
        freeform=f"*** Begin Patch\n*** Add File: {name}\n+{line}\n*** End Patch\n",
    )


def command(cmd: str) -> CallTool:
    return CallTool("exec_command", {"cmd": cmd})


def config_for(tmp_path: Path, model: FakeModelServer) -> Path:
    path = codex_config(tmp_path, model)
    path.write_text(path.read_text().replace('model = "fake-model"', f'model = "{MODEL}"'))
    return path


class Person:
    """An approver that records each request and answers with ``decide``."""

    def __init__(self, decide: Callable[[ApprovalRequest], bool] = lambda _: True) -> None:
        self.asked: list[ApprovalRequest] = []
        self._decide = decide

    async def __call__(self, request: ApprovalRequest) -> ApprovalAnswer:
        self.asked.append(request)
        return ApprovalAnswer(self._decide(request), REFUSAL)


def results(model: FakeModelServer) -> list[str]:
    return [text for _, text in model.tool_results]


def sandboxed_plan(
    tmp_path: Path, model: FakeModelServer, codex_bin: str, permissions: str
) -> tuple[LaunchPlan, Path]:
    """A launch as a root worker builds it: the Principal's own uid, inside bwrap."""
    settings = RuntimeSettings(
        name="test",
        codex=codex_bin,
        codex_config=config_for(tmp_path, model),
        pass_env=list(TEST_PASS_ENV),
        work_dir=tmp_path / "runtime",
        sandbox="bwrap",
    )
    env = offline_env(tmp_path / "home", model.base_url)
    plan, request = sandboxed_launch(settings, "codex", env, permissions)
    return plan, request.cwd


def plain_request(
    tmp_path: Path,
    model: FakeModelServer,
    codex_bin: str,
    permissions: str,
    memory: MemoryAttachment | None = None,
) -> LaunchRequest:
    request = offline_request(
        tmp_path,
        model.base_url,
        "codex",
        codex_bin,
        memory,
        prompt="Do the work.",
        state_dir=tmp_path / "state",
        provider_home_source=config_for(tmp_path, model),
    )
    return dataclasses.replace(request, permissions=permissions)


@sandboxed
async def test_auto_edits_and_runs_commands_inside_amuxs_sandbox_without_asking(
    tmp_path: Path, codex_bin: str
) -> None:
    script: list[Step] = [
        patch_adding("a.txt", "patched"),
        command("echo hi > b.txt && cat b.txt"),
        Answer("Both done."),
    ]
    person = Person()
    async with FakeModelServer(script) as model:
        plan, cwd = sandboxed_plan(tmp_path, model, codex_bin, AUTO)
        events = await collect(run(plan, person))

    assert isinstance(events[-1], Result), (events, results(model))
    assert events[-1].text == "Both done."
    assert (cwd / "a.txt").read_text() == "patched\n"
    assert (cwd / "b.txt").read_text() == "hi\n"
    patched, ran = results(model)
    assert "Success" in patched and "a.txt" in patched
    assert "Process exited with code 0" in ran and ran.rstrip().endswith("hi")
    assert person.asked == []
    assert "apply_patch" in model.main_requests[0].tool_names


@sandboxed
async def test_read_only_fails_every_edit_and_leaves_the_workspace_as_it_was(
    tmp_path: Path, codex_bin: str
) -> None:
    script: list[Step] = [
        patch_adding("a.txt", "patched"),
        command("echo hi > b.txt"),
        command("ls"),
        Answer("Could only look."),
    ]
    person = Person()
    async with FakeModelServer(script) as model:
        plan, cwd = sandboxed_plan(tmp_path, model, codex_bin, READ_ONLY)
        (cwd / "kept.txt").write_text("as it was\n")
        before = sorted(p.name for p in cwd.iterdir())
        events = await collect(run(plan, person))

    assert isinstance(events[-1], Result), (events, results(model))
    assert sorted(p.name for p in cwd.iterdir()) == before
    assert (cwd / "kept.txt").read_text() == "as it was\n"
    patched, wrote, listing = results(model)
    assert "Success" not in patched, patched
    assert "Read-only file system" in wrote, wrote
    assert "kept.txt" in listing
    assert person.asked == []


async def test_ask_relays_edits_and_changing_commands_and_a_denial_reaches_the_model(
    tmp_path: Path, codex_bin: str
) -> None:
    script: list[Step] = [
        patch_adding("allowed.txt", "yes"),
        patch_adding("refused.txt", "no"),
        command("echo a > made.txt"),
        command("echo b > refused-cmd.txt"),
        command("ls"),
        Answer("Some of it."),
    ]
    person = Person(lambda request: "refused" not in request.subject)
    async with FakeModelServer(script) as model:
        request = plain_request(tmp_path, model, codex_bin, ASK)
        work = request.cwd
        events = await collect(run(build_plan(request), person))

    assert isinstance(events[-1], Result), (events, results(model))
    assert [(r.tool, r.action, r.subject) for r in person.asked] == [
        ("fileChange", EDIT, str(work / "allowed.txt")),
        ("fileChange", EDIT, str(work / "refused.txt")),
        ("commandExecution", COMMAND, "/bin/bash -lc 'echo a > made.txt'"),
        ("commandExecution", COMMAND, "/bin/bash -lc 'echo b > refused-cmd.txt'"),
    ]
    # What the person judges: the new file's content, and where the command runs.
    assert person.asked[0].detail == f"add {work / 'allowed.txt'}\nyes"
    assert person.asked[2].detail == f"cwd: {work}"
    assert (work / "allowed.txt").read_text() == "yes\n"
    assert (work / "made.txt").read_text() == "a\n"
    assert not (work / "refused.txt").exists()
    assert not (work / "refused-cmd.txt").exists()
    allowed, refused, made, refused_cmd, listing = results(model)
    assert "Success" in allowed and "Success" not in refused
    assert "rejected by user" in refused
    assert "rejected by user" in refused_cmd and "rejected" not in made
    # ls needed nobody, and its output reached the model.
    assert "allowed.txt" in listing and "made.txt" in listing


async def test_ask_asks_about_globs_that_planted_file_names_turn_into_writes(
    tmp_path: Path, codex_bin: str
) -> None:
    # Files named like options: bash expands ``[-]fprint`` to find's ``-fprint`` and
    # ``[-][-]pre=sh`` to rg's ``--pre=sh``, which runs ``sh payload``.
    globbed = [
        "find . -maxdepth 0 [-]fprint made-by-find",
        "rg -l touch [-][-]pre=sh payload",
    ]
    script: list[Step] = [*map(command, globbed), command("ls -a"), Answer("Refused.")]
    person = Person(lambda _: False)
    async with FakeModelServer(script) as model:
        request = plain_request(tmp_path, model, codex_bin, ASK)
        work = request.cwd
        work.mkdir(parents=True, exist_ok=True)
        for planted in ("-fprint", "--pre=sh"):
            (work / planted).write_text("")
        (work / "payload").write_text("touch made-by-rg\n")
        events = await collect(run(build_plan(request), person))

    assert isinstance(events[-1], Result), (events, results(model))
    assert [(r.tool, r.action, r.subject) for r in person.asked] == [
        ("commandExecution", COMMAND, f"/bin/bash -lc '{line}'") for line in globbed
    ]
    *refused, listing = results(model)
    assert all("rejected by user" in text for text in refused), refused
    assert "payload" in listing and "made-by" not in listing
    assert sorted(p.name for p in work.iterdir()) == ["--pre=sh", "-fprint", "payload"]


async def test_ask_never_asks_about_amuxs_memory_tools(
    tmp_path: Path,
    codex_bin: str,
    stub_mcp: StubMcp,
    attachment_for: Callable[..., MemoryAttachment],
) -> None:
    script: list[Step] = [
        CallTool("mcp__memory__amux_memory_search", {"query": "deploys"}),
        Answer("Found it."),
    ]
    person = Person()
    async with FakeModelServer(script) as model:
        request = plain_request(tmp_path, model, codex_bin, ASK, attachment_for(stub_mcp.argv))
        events = await collect(run(build_plan(request), person))

    assert isinstance(events[-1], Result), (events, results(model))
    assert stub_mcp.calls() == [stub_search_call("deploys")]
    assert any("STUB-MEMORY-HIT" in text for text in results(model))
    assert person.asked == []
