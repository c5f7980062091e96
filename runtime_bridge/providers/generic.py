"""Providers without a memory integration: run as configured, report the missing capability.

Memory is never bolted on with a per-turn prompt: a bound Session on such a provider simply has
no memory, and the plan says so.

Through the worker's model gateway such a program gets no provider credential either; the
conventional variables (``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY``,
``OPENAI_BASE_URL``/``OPENAI_API_KEY``) point it at the gateway with the launch's placeholders.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from hub.errors import InvalidArgument
from runtime_bridge.approvals import Approver
from runtime_bridge.launch_env import launch_env
from runtime_bridge.providers.plan import Event, Failure, LaunchPlan, LaunchRequest, Result
from runtime_bridge.providers.process import (
    LOCAL,
    Launcher,
    StderrTail,
    materialize,
    resolve_executable,
)


def build_plan(request: LaunchRequest) -> LaunchPlan:
    """Argv ``[executable, *extra_args]`` with the prompt on stdin (pure).

    Raises:
        InvalidArgument: the operator declared no executable for this provider: a name from a
            caller is never looked up on PATH by itself.
    """
    if not request.executable:
        raise InvalidArgument(f"provider {request.provider} is not declared by the operator")
    warnings: tuple[str, ...] = ()
    if request.memory is not None:
        warnings = (f"memory capability missing for provider {request.provider}",)
    gateway = request.gateway
    routed: dict[str, str] | None = None
    if gateway is not None:
        routed = {
            "ANTHROPIC_BASE_URL": gateway.url,
            "ANTHROPIC_API_KEY": gateway.key("anthropic"),
            "OPENAI_BASE_URL": f"{gateway.url}/v1",
            "OPENAI_API_KEY": gateway.key("openai"),
        }
    return LaunchPlan(
        provider=request.provider,
        argv=(request.executable, *request.extra_args),
        env=launch_env(
            request.base_env,
            request.pass_env,
            gateway=routed,
            hidden=gateway.hidden if gateway else (),
        ),
        cwd=request.cwd,
        prompt=request.prompt,
        stdin=request.prompt,
        warnings=warnings,
        resume_id=request.resume_id,
    )


async def run(
    plan: LaunchPlan, approver: Approver | None = None, launcher: Launcher = LOCAL
) -> AsyncIterator[Event]:
    """Run the command; its whole stdout is the result."""
    executable = resolve_executable(plan)
    materialize(plan)
    process = await launcher.start(plan, [executable, *plan.argv[1:]])
    stderr = StderrTail(process.stderr)
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write((plan.stdin or "").encode())
        await process.stdin.drain()
        process.stdin.close()
        output = (await process.stdout.read()).decode("utf-8", "replace").strip()
        if await process.wait() == 0:
            yield Result(output, None, {})
        else:
            tail = plan.mask(await stderr.text())
            detail = tail.splitlines()[-1] if tail else "no output"
            yield Failure(f"{plan.provider} exited with status {process.returncode}: {detail}")
    finally:
        await launcher.stop(process)
        stderr.cancel()
        await stderr.text()
