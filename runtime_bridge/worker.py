"""The Runtime worker: claim turns from the Hub, launch the Agent, stream progress, post results.

A worker talks to the Hub only over HTTP with a service credential, so it runs in the Hub's
process or on any other host the same way. While a turn runs, heart-beats keep its lease; a lost
lease or a cancel request stops the Agent's whole process group. It runs up to
``AMUX_RUNTIME_SLOTS`` turns at once: each slot claims and runs turns on its own, so one long
turn holds one slot, not the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import resource
import shutil
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from hub.client import HubClient
from hub.contract import (
    EGRESS,
    PLAN,
    PROGRESS,
    STEP,
    WARNING,
    Claim,
    Session,
    TurnOutcome,
    TurnResult,
)
from hub.errors import AmuxError, Conflict, InvalidArgument, NotFound, Unavailable
from hub.requestid import REQUEST_ID
from runtime_bridge.agent_users import configured_user
from runtime_bridge.approvals import ASK
from runtime_bridge.bounds import bounds_from_settings, format_size
from runtime_bridge.cgroups import LaunchGroup, rlimits
from runtime_bridge.checkouts import Checkout, GitBounds, Projects, SummaryCut
from runtime_bridge.codex_seed import CodexSeed
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.doors import LaunchDoors
from runtime_bridge.egress import Egress
from runtime_bridge.gateway import Gateway, Grant, launch_routes, operator_upstreams
from runtime_bridge.hub_approver import HubApprover
from runtime_bridge.launch import SESSION_HOME, LaunchSite, write_seccomp_file
from runtime_bridge.launch_phases import Turn, after_clean_exit
from runtime_bridge.materializer import materialize_memory_cli
from runtime_bridge.mcp_launcher import WarmMcp, warm_socket
from runtime_bridge.providers import (
    LOCAL,
    MEMORY_PROVIDERS,
    Failure,
    Launcher,
    LaunchPlan,
    MemoryAttachment,
    PlanUpdate,
    Progress,
    Result,
    ToolStep,
    build_plan,
    run,
)
from runtime_bridge.providers.confined import open_dir, open_root
from runtime_bridge.workspace_usage import MAX_ENTRIES
from runtime_bridge.workspace_watch import WorkspaceGuard

logger = logging.getLogger("amux.worker")

CLAIM_WAIT_SECONDS = 20.0
RLIMIT_NAMES = {
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_NPROC: "nproc",
    resource.RLIMIT_FSIZE: "fsize",
}
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


def default_amux_executable() -> str:
    """The amux CLI this process was started as, else the one on PATH, else the venv's."""
    candidates = [
        shutil.which("amux", path=str(Path(sys.executable).parent)),
        shutil.which("amux"),
    ]
    for candidate in candidates:
        if candidate:
            return candidate
    return str(Path(sys.executable).parent / "amux")


# What the turn may use is the less of the day's budget left and the per-turn one; the bot
# tells which, with figures, on the result card.
BUDGET_WARNING = "80 % of the tokens this turn may use are spent"


def memory_warning(reason: str) -> str:
    return f"amux memory is unavailable for this conversation ({reason}); it runs without memory"


def bound_memory_warning(reason: str) -> str:
    return (
        f"amux memory is unavailable for this turn ({reason}); the conversation keeps its memory "
        "instructions, and its memory calls fail until the Hub answers"
    )


class Worker:
    """One worker loop; ``run_forever`` until ``stop`` is set."""

    def __init__(
        self,
        hub: HubClient,
        hub_url: str,
        settings: RuntimeSettings,
        work_dir: Path,
        base_env: Mapping[str, str] | None = None,
        amux_home: Path | None = None,
        launcher: Launcher = LOCAL,
    ) -> None:
        self.hub = hub
        self.hub_url = hub_url
        self.settings = settings
        self.work_dir = work_dir
        self.site = LaunchSite(settings, work_dir, amux_home)
        # Where each turn's Agent process runs: on this host, sandboxed, unless told otherwise.
        self.launcher = launcher
        self.base_env = dict(os.environ if base_env is None else base_env)
        # A remote project's credential is read from the worker's own environment, never a launch's.
        self.projects = Projects(work_dir, self.base_env, self.site.git_sandbox)
        self.amux = settings.amux or default_amux_executable()
        self.worker_id: str | None = None
        self.bounds = bounds_from_settings(settings)
        if self.site.sandboxed:
            write_seccomp_file(work_dir)
            # Said once at start (and in every plan), not on every turn's card.
            shared_network = settings.network_warning()
            if shared_network is not None:
                logger.warning(shared_network)
        if settings.run_as:
            # Refused at start, with the reason, rather than at every turn.
            configured_user(settings.run_as)
        # Its servers reach the Hub at the worker's own URL, never one a launch's Agent names.
        self.warm_mcp = WarmMcp(self.amux, hub_url)
        # Made at the first Codex launch, for the ones after it.
        self.codex_seed = CodexSeed(
            settings.executable("codex"), work_dir, self.base_env.get("PATH"), self.site.hidden()
        )
        self._seeding: asyncio.Task[None] | None = None
        # Provider credentials are read here, once, and live only in the gateway from now on.
        host, port, advertised = settings.gateway_address()
        self.gateway = Gateway(
            operator_upstreams(
                self.base_env, settings.anthropic_base_url, settings.openai_base_url
            ),
            host,
            port,
            advertised,
        )
        self._registering = asyncio.Lock()
        # Failures in a row across every slot, so an outage is logged once, not once per slot.
        self._failures = 0
        # Each running turn's gateway grant, by execution: its heartbeats report the count.
        self._grants: dict[str, Grant] = {}
        # The turns this worker's slots run now, by execution id.
        self.running: set[str] = set()

    async def register(self) -> str:
        self.worker_id = (await self.hub.register_worker(self.settings.name)).worker_id
        logger.info("worker %s registered as %s", self.settings.name, self.worker_id)
        return self.worker_id

    async def run_forever(self, stop: asyncio.Event) -> None:
        # Before any turn: what an earlier run of this worker left running is ended first.
        await self.launcher.reclaim()
        await self.gateway.start()
        warming = asyncio.create_task(self.warm_mcp.start()) if self.warm_mcp else None
        try:
            await self._serve(stop)
        finally:
            await asyncio.shield(self.gateway.stop())
            if warming is not None:
                warming.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await warming
            if self.warm_mcp is not None:
                await asyncio.shield(self.warm_mcp.stop())
            if self._seeding is not None:
                self._seeding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._seeding
            self.codex_seed.remove()

    async def _serve(self, stop: asyncio.Event) -> None:
        slots = [
            asyncio.create_task(self._slot(stop), name=f"worker-slot-{n}")
            for n in range(self.settings.slot_count())
        ]
        try:
            await asyncio.gather(*slots)
        finally:
            for slot in slots:
                slot.cancel()
            await asyncio.gather(*slots, return_exceptions=True)

    async def _slot(self, stop: asyncio.Event) -> None:
        """Claim one turn, run it to its result, claim the next, until ``stop`` is set."""
        failures = 0
        while not stop.is_set():
            known = self.worker_id
            try:
                if known is None:
                    known = await self._registered()
                claimed = await self._claim_unless(stop)
                failures = 0
                self._failures = 0
                if claimed is not None:
                    await self.execute(claimed)
            except AmuxError as error:
                if error.code == "not_found" and self.worker_id == known:
                    self.worker_id = None  # The Hub forgot us (e.g. a new state): register anew.
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                self._failures += 1
                if self._failures in (1, 10) or self._failures % 100 == 0:
                    logger.warning("worker cannot reach the Hub (%s); retrying", error.message)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _registered(self) -> str:
        """This worker's id, registering once however many slots find it unknown at once."""
        async with self._registering:
            if self.worker_id is None:
                await self.register()
        assert self.worker_id is not None
        return self.worker_id

    async def _claim_unless(self, stop: asyncio.Event) -> Claim | None:
        """Claim, but give up the long poll as soon as ``stop`` is set.

        A claim that completes anyway is still run. One the Hub grants just as the request is
        abandoned is left to its lease: it expires and the Hub retries the turn elsewhere.
        """
        claiming = asyncio.create_task(self.claim())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({claiming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (claiming, stopping):
                task.cancel()
            await asyncio.gather(claiming, stopping, return_exceptions=True)
        return None if claiming.cancelled() else claiming.result()

    async def claim(self) -> Claim | None:
        return await self.hub.claim(self.worker_id, CLAIM_WAIT_SECONDS)

    async def _event(self, claimed: Claim, kind: str, text: str) -> None:
        await self.hub.add_event(claimed.execution_id, self.worker_id, kind, text)

    async def execute(self, claimed: Claim) -> None:
        """Run one claimed turn to a posted result, whatever happens to the Agent."""
        # The turn's request id rides on every Hub call and log line made for it (tasks created
        # below copy this context).
        context = REQUEST_ID.set(claimed.request_id)
        self.running.add(claimed.execution_id)
        try:
            await self._execute(claimed)
        finally:
            self.running.discard(claimed.execution_id)
            REQUEST_ID.reset(context)

    def stopping_notice(self) -> str:
        """What a stopping worker says once: it drains, how much, and what a cut drain costs."""
        count = len(self.running)
        stopping = f"worker {self.settings.name} stopping: it claims no new turn and"
        if count == 0:
            return f"{stopping} runs none"
        turns = "turn" if count == 1 else "turns"
        return (
            f"{stopping} finishes the {count} {turns} it runs first; a turn cut short is run "
            "again elsewhere once its lease runs out"
        )

    async def _execute(self, claimed: Claim) -> None:
        runner = asyncio.create_task(self._launch(claimed))
        keeper = asyncio.create_task(self._keep_lease(claimed, runner))
        done, _ = await asyncio.wait({runner, keeper}, return_when=asyncio.FIRST_COMPLETED)
        outcome: TurnOutcome | None
        if keeper not in done:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            outcome = runner.result()
        else:
            # The keeper stopped the Agent (lease lost or cancel requested); let it wind down.
            # A launch still being prepared may already be gone by now, cancelled: the keeper's
            # verdict stands, and the slot lives on to claim its next turn.
            outcome = keeper.result()
            with contextlib.suppress(asyncio.CancelledError):
                finished = await runner
                outcome = finished if outcome is not None else None
        if outcome is None:
            return  # The lease was lost: the Hub already gave the turn to someone else.
        try:
            await self.hub.complete(claimed.execution_id, self.worker_id, outcome)
        except Conflict:
            logger.warning("execution %s finished after its lease was lost", claimed.execution_id)

    async def _keep_lease(
        self, claimed: Claim, runner: asyncio.Task[TurnOutcome]
    ) -> TurnOutcome | None:
        interval = max(0.05, claimed.lease_seconds / 3)
        # Each beat is a long poll the Hub answers at once on a cancel: a Stop ends the Agent
        # within a round trip, not at the next beat. Within the client's request timeout.
        wait = min(interval, CLAIM_WAIT_SECONDS)
        loop = asyncio.get_running_loop()
        while True:
            sent = loop.time()
            try:
                grant = self._grants.get(claimed.execution_id)
                beat = await self.hub.heartbeat(
                    claimed.execution_id,
                    self.worker_id,
                    grant.used if grant is not None else None,
                    wait,
                )
                if grant is not None and beat.budget_given:
                    # The Principal's other running turns spent part of the same day since the
                    # claim (or the owner extended it): this turn's allowance follows.
                    grant.budget = beat.budget
            except (Conflict, NotFound):
                # Gone elsewhere, or gone with a state the Hub no longer has: stop the Agent
                # either way rather than leave it running beside this slot's next turn.
                runner.cancel()
                return None
            except Unavailable:
                # Keep working; the lease covers short Hub outages.
                await asyncio.sleep(interval)
                continue
            if beat.cancel_requested:
                runner.cancel()
                return TurnOutcome(succeeded=False, result=None, error="cancelled")
            # A Hub that answers at once (draining, or one that does not wait) is not asked
            # again at once: beats stay ``wait`` apart.
            rest = wait - (loop.time() - sent)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _launch(self, claimed: Claim) -> TurnOutcome:
        """A turn's life, as its phases. Each opens what it needs and registers its cleanup on
        ``stack``: a phase that fails, or a cancelled turn, unwinds the phases before it, last
        opened first; the run's verdicts are read once the run's phases are released."""
        turn = Turn(claimed, self.site.run_dir(claimed.execution_id))
        try:
            async with contextlib.AsyncExitStack() as stack:
                self._leave_nothing(turn, stack)
                grant = await self._open_grant(turn, stack)
                await self._make_directories(turn)
                checkout = await self._checkout(claimed, turn.run_as, turn.warnings)
                memory = await self._delegate_memory(turn)
                plan = await self._lay_out(turn, grant, memory, checkout)
                guard = await self._guard_workspace(claimed, plan.cwd, turn.warnings)
                # Before the run's phases below, so it concludes once they are released.
                after_clean_exit(stack, partial(self._conclude, turn, plan, grant, guard, checkout))
                plan = await self._bound(turn, plan, stack)
                self._watch_budget(turn, grant, stack)
                approver = self._approver(turn)
                await self._open_doors(turn, plan, approver, stack)
                await self._run(turn, plan, approver, grant, guard)
            assert turn.outcome is not None
            return turn.outcome
        except AmuxError as error:
            said = TurnResult(provider=claimed.session.provider, warnings=tuple(turn.warnings))
            return TurnOutcome(False, said, error.message)
        except Exception:
            logger.exception("launching execution %s failed", claimed.execution_id)
            said = TurnResult(provider=claimed.session.provider, warnings=tuple(turn.warnings))
            return TurnOutcome(False, said, "the worker failed to launch the Agent; see its log")

    def _leave_nothing(self, turn: Turn, stack: contextlib.AsyncExitStack[bool | None]) -> None:
        """The turn's run directory, removed, then the memory credential the Hub delegated for
        it, revoked: after every other phase's cleanup, so a slow Hub holds nothing local."""

        async def revoke() -> None:
            if turn.credential_id is not None:
                with contextlib.suppress(AmuxError):
                    await self.hub.revoke_credential(turn.credential_id)

        stack.push_async_callback(revoke)
        stack.callback(shutil.rmtree, turn.run_dir, ignore_errors=True)

    async def _open_grant(self, turn: Turn, stack: contextlib.AsyncExitStack[bool | None]) -> Grant:
        """The launch's model-gateway grant, closed (and no longer reported) at the turn's end."""
        provider = turn.claimed.session.provider
        # Re-checked here: the Hub this worker serves may accept providers it does not.
        self.site.check_provider(provider)
        await self.gateway.start()
        grant = self.gateway.open(
            launch_routes(
                provider,
                self.gateway.defaults,
                self.base_env,
                self.settings.home_source(provider),
            ),
            turn.claimed.budget,
        )
        self._grants[turn.execution_id] = grant

        def close() -> None:
            grant.close()
            self._grants.pop(turn.execution_id, None)

        stack.callback(close)
        return grant

    async def _make_directories(self, turn: Turn) -> None:
        """Who the Agent runs as, and the directories it runs in (the run dir goes with the
        turn)."""
        session = turn.claimed.session
        turn.run_as = self.site.identity_of(session)
        self._prepare(self.site, session, turn.execution_id, turn.run_as)

    async def _delegate_memory(self, turn: Turn) -> MemoryAttachment | None:
        """The conversation's memory, through a credential delegated for this turn (revoked with
        the turn's run directory)."""
        claimed = turn.claimed
        memory, turn.credential_id = await self._memory(
            claimed, claimed.session.provider, turn.run_dir, turn.warnings, turn.run_as
        )
        return memory

    async def _lay_out(
        self, turn: Turn, grant: Grant, memory: MemoryAttachment | None, checkout: Checkout | None
    ) -> LaunchPlan:
        """The launch's plan, laid out in its sandbox; the sandbox's warnings said once each."""
        claimed, site = turn.claimed, self.site
        request = site.request(
            provider=claimed.session.provider,
            prompt=claimed.prompt,
            session=claimed.session,
            execution_id=claimed.execution_id,
            memory=memory,
            base_env=self.base_env,
            # A pod's HOME is gone with it: the conversation's own is taken back after the turn.
            own_home=site.sandboxed or turn.run_as is not None or self.settings.in_pods(),
            permissions=claimed.permissions,
            # The permission prompt a Claude launch asks through is a command of amux's own.
            amux_argv=(self.amux,),
            gateway=grant.access,
        )
        request = dataclasses.replace(request, home_seed=self._home_seed(request.provider))
        plan = dataclasses.replace(
            build_plan(request), run_as=turn.run_as, execution_id=claimed.execution_id
        )
        mcp_argv = memory.mcp_argv if memory is not None else ()
        # Off the event loop: laying out a sandbox reads the file system for every
        # installation the launch needs, and in `amux serve` the loop also answers Feishu.
        plan = await asyncio.to_thread(
            site.sandbox,
            plan,
            request,
            warm_socket(mcp_argv),
            (*mcp_argv[:1], *request.amux_argv),
            borrowed_objects=(checkout.objects,) if checkout is not None else (),
        )
        for warning in plan.warnings:
            if warning not in turn.warnings:
                turn.warnings.append(warning)
                await self._event(claimed, WARNING, warning)
        return plan

    async def _bound(
        self, turn: Turn, plan: LaunchPlan, stack: contextlib.AsyncExitStack[bool | None]
    ) -> LaunchPlan:
        """``plan`` confined to the launch's bounds: its cgroup, removed once the Agent is done
        (what it reached read first), and its rlimits."""
        group = await asyncio.to_thread(LaunchGroup.create, turn.execution_id, self.bounds)
        if group is not None:

            async def remove() -> None:
                turn.reached = group.hit()
                await asyncio.shield(asyncio.to_thread(group.remove))

            stack.push_async_callback(remove)
        return dataclasses.replace(
            plan,
            confine=self.site.confinement(
                group.procs_files if group is not None else (),
                self._rlimits(turn.run_as, group),
            ),
        )

    def _home_seed(self, provider: str) -> tuple[Path, ...]:
        """What a new home of ``provider`` starts with: Codex's empty databases once made."""
        if provider != "codex":
            return ()
        if self._seeding is None:
            self._seeding = asyncio.create_task(self.codex_seed.make())
        return self.codex_seed.files()

    def _watch_budget(
        self, turn: Turn, grant: Grant, stack: contextlib.AsyncExitStack[bool | None]
    ) -> None:
        """The budget warning, if the count passed it after the Agent's last event."""

        async def last_word() -> None:
            if grant.warn_due():
                turn.warnings.append(BUDGET_WARNING)
                with contextlib.suppress(AmuxError):
                    await self._event(turn.claimed, WARNING, BUDGET_WARNING)

        stack.push_async_callback(last_word)

    def _approver(self, turn: Turn) -> HubApprover:
        """Who answers the Agent's permission requests: its user, through the Hub."""
        assert self.worker_id is not None
        return HubApprover(self.hub, turn.execution_id, self.worker_id)

    async def _open_doors(
        self,
        turn: Turn,
        plan: LaunchPlan,
        approver: HubApprover,
        stack: contextlib.AsyncExitStack[bool | None],
    ) -> None:
        """The launch's doors, open while the Agent runs (a launch with a network of its own)."""
        doors = await self._doors(turn.claimed, plan, approver)
        if doors is not None:
            await stack.enter_async_context(doors)

    async def _run(
        self,
        turn: Turn,
        plan: LaunchPlan,
        approver: HubApprover,
        grant: Grant,
        guard: WorkspaceGuard,
    ) -> None:
        """The Agent's run, its progress streamed to the Hub as it comes."""
        claimed = turn.claimed
        async for event in guard.events(run(plan, approver, self.launcher)):
            if grant.warn_due():
                turn.warnings.append(BUDGET_WARNING)
                await self._event(claimed, WARNING, BUDGET_WARNING)
            if isinstance(event, Progress):
                await self._event(claimed, PROGRESS, plan.mask(event.text))
            elif isinstance(event, PlanUpdate):
                # Each step masked on its own, so a mask never breaks the JSON around it.
                masked = [(plan.mask(step), status) for step, status in event.steps]
                await self._event(claimed, PLAN, PlanUpdate(tuple(masked)).to_json())
            elif isinstance(event, ToolStep):
                step = ToolStep(event.action, plan.mask(event.subject))
                await self._event(claimed, STEP, step.to_json())
            elif isinstance(event, Result):
                turn.text = plan.mask(event.text)
                turn.native_id = event.native_session_id
                turn.usage = dict(event.usage)
            elif isinstance(event, Failure):
                turn.failure = plan.mask(event.message)

    async def _conclude(
        self,
        turn: Turn,
        plan: LaunchPlan,
        grant: Grant,
        guard: WorkspaceGuard,
        checkout: Checkout | None,
    ) -> None:
        """The turn's outcome once the Agent is gone: its budget, bounds and workspace verdicts,
        then what it left on its conversation's branch."""
        claimed = turn.claimed
        grant.close()
        usage = turn.usage
        if grant.usage.requests:
            # Counted as the answers passed: preferred to the Agent's own report.
            usage = {**usage, "gateway": grant.usage.to_dict()}
        failure = turn.failure
        if grant.budget_reached:
            # The Agent may word the refusal as an answer; the turn ended for want of budget.
            failure = f"budget reached: {grant.used}/{grant.budget} tokens"
        failure = await self._bounds_reached(claimed, turn.reached, failure, turn.warnings)
        failure = await self._workspace_reached(guard, failure)
        result = TurnResult(
            text=turn.text,
            provider=claimed.session.provider,
            binding=plan.binding,
            warnings=tuple(turn.warnings),
            usage=usage,
            budget=grant.budget,
            budget_reached=grant.budget_reached,
        )
        if checkout is not None:
            result = await self._keep_branch(claimed, checkout, turn.run_as, result)
        if failure is not None or turn.text is None:
            error = failure or "the Agent ended without an answer"
            turn.outcome = TurnOutcome(False, result, error, turn.native_id)
        else:
            turn.outcome = TurnOutcome(True, result, None, turn.native_id)

    async def _doors(
        self, claimed: Claim, plan: LaunchPlan, approver: HubApprover
    ) -> LaunchDoors | None:
        """The worker's side of the launch's doors, for a launch with a network of its own."""
        if not plan.doors:
            return None

        async def report(host: str, port: int, reason: str) -> None:
            with contextlib.suppress(AmuxError):
                await self._event(claimed, EGRESS, plan.mask(reason))

        egress = Egress(
            self.settings.allow_list(),
            report,
            approver if claimed.permissions == ASK else None,
        )
        return LaunchDoors(
            plan.doors,
            gateway_url=self.gateway.url,
            hub_url=self.hub_url,
            egress=egress,
            owner=plan.run_as,
            label=claimed.execution_id,
        )

    async def _checkout(
        self, claimed: Claim, run_as: tuple[int, int] | None, warnings: list[str]
    ) -> Checkout | None:
        """A project Session's checkout, ready for this turn (made, or restored to the worker's
        own git config); None for any other Session.

        Raises:
            InvalidArgument, Unavailable: the project is unknown here, or its repository or the
                checkout cannot be had.
        """
        session = claimed.session
        if session.project is None:
            return None
        source = claimed.project
        if source is None or source.name != session.project:
            raise InvalidArgument(
                f"the Hub sent no source for this conversation's project {session.project}"
            )
        said: list[str] = []
        checkout = await asyncio.to_thread(
            self.projects.prepare,
            source,
            session.id,
            run_as,
            said,
            claimed.moved_from,
            session.origin,
        )
        for warning in said:
            warnings.append(warning)
            await self._event(claimed, WARNING, warning)
        return checkout

    async def _keep_branch(
        self,
        claimed: Claim,
        checkout: Checkout,
        run_as: tuple[int, int] | None,
        result: TurnResult,
    ) -> TurnResult:
        """``result`` with what the turn left on its conversation's branch, committed and
        published by the worker; a failure to keep it is a warning, not the turn's failure."""
        said: list[str] = []
        # The worker's git reads what the Agent left: it runs in a cgroup of the launch's
        # bounds of its own (the launch's is gone with the Agent), each step against a deadline.
        name = f"{claimed.execution_id}-git"
        group = await asyncio.to_thread(LaunchGroup.create, name, self.bounds)
        procs = group.procs_files if group is not None else ()
        bounds = GitBounds(self.site.git_confinement(procs, self._rlimits(run_as, group)))
        try:
            branch = await asyncio.to_thread(
                self.projects.finish, checkout, claimed.execution_id, run_as, said, bounds
            )
        except SummaryCut as error:
            branch = None
            said.append(error.message)
        except AmuxError as error:
            branch = None
            kept = f"this turn's changes could not be kept on {checkout.branch}"
            if group is not None and "memory" in group.hit():
                kept += f" (git reached the {self.bounds.describe('memory')})"
            said.append(f"{kept}: {error.message}")
        finally:
            if group is not None:
                await asyncio.shield(asyncio.to_thread(group.remove))
        for warning in said:
            with contextlib.suppress(AmuxError):
                await self._event(claimed, WARNING, warning)
        warnings = (*result.warnings, *said)
        return dataclasses.replace(result, warnings=warnings, branch=branch)

    def _rlimits(
        self, run_as: tuple[int, int] | None, group: LaunchGroup | None
    ) -> tuple[str, ...]:
        """A launch's rlimits as its first step sets them (``NAME=SOFT:HARD``)."""
        # Never above a hard limit the worker itself lives under (it could not raise it).
        ceilings = {r: resource.getrlimit(r)[1] for r in RLIMIT_NAMES}
        limits = rlimits(self.bounds, run_as is not None and group is None, ceilings)
        return tuple(f"{RLIMIT_NAMES[r]}={soft}:{hard}" for r, (soft, hard) in limits.items())

    async def _bounds_reached(
        self, claimed: Claim, reached: tuple[str, ...], failure: str | None, warnings: list[str]
    ) -> str | None:
        """The turn's failure as its user should read it once a bound was reached.

        Memory ends the Agent (the kernel kills it), so the bound is the failure; a refused fork
        may or may not end the turn, so it is the failure when the turn failed, else a warning.
        """
        bounds = self.bounds
        if "memory" in reached:
            return f"the Agent was stopped at its {bounds.describe('memory')}"
        if "tasks" in reached:
            said = f"the Agent reached its {bounds.describe('tasks')}: processes past it failed"
            if failure is not None:
                return f"{said} ({failure})"
            warnings.append(said)
            await self._event(claimed, WARNING, said)
        return failure

    async def _guard_workspace(
        self, claimed: Claim, cwd: Path, warnings: list[str]
    ) -> WorkspaceGuard:
        """The turn's workspace bound, measured once before the Agent starts."""
        guard = WorkspaceGuard(cwd, self.bounds.workspace_bytes)
        try:
            already = await guard.start()
        except OSError as error:
            logger.warning("cannot measure the workspace %s: %s", cwd, error.strerror)
            return guard
        if already is not None:
            said = (
                f"the workspace already holds more than its {self.bounds.describe('workspace')}: "
                "this turn may remove files, and is stopped if the workspace grows"
            )
            warnings.append(said)
            await self._event(claimed, WARNING, said)
        return guard

    async def _workspace_reached(self, guard: WorkspaceGuard, failure: str | None) -> str | None:
        """The turn's failure once its workspace passed the bound, while the Agent ran (it was
        stopped) or by the time it ended (measured once more: the last writes may have come
        after the last measurement). Nothing is deleted."""
        usage = guard.reached or await guard.check()
        if usage is None:
            return failure
        held = (
            f"more than {MAX_ENTRIES} files and directories, more than amux measures"
            if usage.crowded
            else f"at least {format_size(usage.used)}"
        )
        said = (
            f"the Agent reached its {self.bounds.describe('workspace')} and was stopped: the "
            f"workspace held {held}. Nothing was deleted; the next turn may remove files, and is "
            "stopped if the workspace grows"
        )
        return f"{said} ({failure})" if failure is not None else said

    def _prepare(
        self,
        site: LaunchSite,
        session: Session,
        execution_id: str,
        run_as: tuple[int, int] | None,
    ) -> None:
        """Create the launch's directories: run dir, Session home, workspace.

        The run dir and the parents stay the worker's; with ``run_as`` the Agent's user gets its
        Session directory, home and default workspace, made and handed over through directory
        descriptors so that nothing it planted there is followed.
        """
        session_id = session.id
        for parent in (site.work_dir / "runs", site.work_dir / "sessions", site.workspaces):
            parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if run_as is not None:
                # Others may pass through the worker's directories, never list or read them.
                parent.chmod(0o711)
        if run_as is not None:
            site.work_dir.chmod(0o711)
        with open_root(site.run_dir(execution_id)) as run_fd:
            if run_as is not None:
                os.fchmod(run_fd, 0o711)
        owner = run_as
        with open_root(site.work_dir / "sessions") as sessions:
            with open_dir(sessions, Path(session_id) / SESSION_HOME, owner):
                pass
        if session.project is not None:
            return  # Its checkout is made by ``Projects.prepare``, under the project's lock.
        cwd = site.workspace(session)
        if session.cwd:
            # The owner's own directory, as named: never made here, nor anything put in its place.
            if not cwd.is_dir():
                problem = "is not a directory" if cwd.exists() else "does not exist"
                raise InvalidArgument(
                    f"the working directory {cwd} {problem} on the worker's host; "
                    "name an existing directory"
                )
        elif self.settings.default_cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
            if run_as is not None:
                # The operator's shared directory: every Agent (one user) writes there.
                with open_root(cwd) as shared:
                    os.fchown(shared, *run_as)
        else:
            with (
                open_root(site.workspaces) as workspaces,
                open_dir(workspaces, Path(cwd.name), owner),
            ):
                pass

    def _mcp_argv(self) -> tuple[str, ...]:
        # An Agent that cannot reach the warm host's socket (run as another user without the
        # sandbox binding it) falls back to the cold command by itself.
        if self.warm_mcp is not None:
            return self.warm_mcp.argv()
        return (self.amux, "mcp")

    async def _memory(
        self,
        claimed: Claim,
        provider: str,
        run_dir: Path,
        warnings: list[str],
        run_as: tuple[int, int] | None = None,
    ) -> tuple[MemoryAttachment | None, str | None]:
        """Freeze or reuse the Session's binding and delegate its credential.

        When the Hub cannot be asked, a fresh Session runs without memory (never with another
        scope), warned. A Session bound earlier keeps its protocol and native-memory suppression
        all the same: its memory tools answer ``unavailable`` with the reason, so the Agent's
        own memory never comes back for a conversation promised one memory source.
        """
        session = claimed.session
        try:
            answer = await self.hub.session_memory(
                session.id,
                capable=provider in MEMORY_PROVIDERS,
                execution_id=claimed.execution_id,
            )
        except AmuxError as error:
            if session.memory == "bound" and session.binding:
                warning = bound_memory_warning(error.message)
                warnings.append(warning)
                await self._event(claimed, WARNING, warning)
                unavailable = f"the Hub could not be asked for this conversation ({error.message})"
                return self._attach(run_dir, session.binding, "", run_as, unavailable), None
            warning = memory_warning(error.message)
            warnings.append(warning)
            await self._event(claimed, WARNING, warning)
            with contextlib.suppress(AmuxError):
                await self.hub.unbind_session(session.id)
            return None, None
        if answer.warning:
            warnings.append(answer.warning)
            await self._event(claimed, WARNING, answer.warning)
        if not answer.bound or answer.token is None:
            return None, None
        attachment = self._attach(run_dir, str(answer.binding), answer.token, run_as)
        return attachment, answer.credential_id

    def _attach(
        self,
        run_dir: Path,
        binding: str,
        token: str,
        run_as: tuple[int, int] | None,
        unavailable: str | None = None,
    ) -> MemoryAttachment:
        attachment = MemoryAttachment(
            hub_url=self.site.agent_hub_url(self.hub_url),
            credential=token,
            binding=binding,
            mcp_argv=self._mcp_argv(),
            unavailable=unavailable,
        )
        cli_dir = materialize_memory_cli(
            run_dir, self.amux, attachment.connection_env(), owner=run_as
        )
        return dataclasses.replace(attachment, cli_dir=cli_dir)
