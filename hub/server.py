"""Mounts the Hub onto an aiohttp application: its services, its middleware (request ids and the
drain), the RPC route, health and metrics.

``/healthz`` answers while the process is up, with what other parts register on ``app[HEALTH]``
(the Feishu long connection's state); ``/readyz`` runs every readiness check (the Hub's own
plus those other parts of the service register on ``app[READINESS]``) and answers 503 if one fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web

from hub.config import HubSettings
from hub.contract import EXECUTION_STATES
from hub.metrics import METRICS, Metrics, Snapshot, metrics_endpoint
from hub.middleware import install_middleware
from hub.rpc import (
    HUB,
    IDENTITY_METHODS,
    MEMORY_ADMIN_METHODS,
    MEMORY_METHODS,
    RPC_METHODS,
    RPC_PATH,
    SYSTEM_METHODS,
    USAGE_METHODS,
    Methods,
    combine,
    rpc_handler,
)
from hub.rpc_executions import EXECUTION_METHODS
from hub.rpc_feishu import FEISHU_METHODS
from hub.rpc_projects import PROJECT_METHODS
from hub.rpc_schedules import SCHEDULE_METHODS
from hub.services import Hub

logger = logging.getLogger("amux.hub")

# A readiness check answers (ready, detail); the detail is shown to operators, so no secrets.
ReadinessCheck = Callable[[], Awaitable[tuple[bool, str]]]
CHECK_SECONDS = 2.0


@dataclass
class Readiness:
    """Named readiness checks; others register theirs (e.g. the Feishu connection) with ``add``."""

    checks: dict[str, ReadinessCheck] = field(default_factory=dict)

    def add(self, name: str, check: ReadinessCheck) -> None:
        self.checks[name] = check

    async def run(self) -> tuple[bool, list[dict[str, object]]]:
        results: list[dict[str, object]] = []
        for name, check in self.checks.items():
            try:
                ok, detail = await asyncio.wait_for(check(), CHECK_SECONDS)
            except TimeoutError:
                ok, detail = False, f"no answer within {CHECK_SECONDS:.0f}s"
            except Exception as error:  # a failing check is reported, never fatal
                logger.exception("readiness check %s failed", name)
                ok, detail = False, f"check failed: {type(error).__name__}"
            results.append({"name": name, "ok": ok, "detail": detail})
        return all(bool(r["ok"]) for r in results), results


READINESS = web.AppKey("readiness", Readiness)

# A health detail is cheap, synchronous and free of secrets: /healthz is unauthenticated.
HealthDetail = Callable[[], dict[str, object]]


@dataclass
class Health:
    """Details ``/healthz`` shows beside its status; others register theirs with ``add``."""

    details: dict[str, HealthDetail] = field(default_factory=dict)

    def add(self, name: str, detail: HealthDetail) -> None:
        self.details[name] = detail


HEALTH = web.AppKey("health", Health)

# Every method the Hub serves over RPC.
HUB_METHODS = combine(
    MEMORY_METHODS,
    MEMORY_ADMIN_METHODS,
    SYSTEM_METHODS,
    USAGE_METHODS,
    IDENTITY_METHODS,
    EXECUTION_METHODS,
    PROJECT_METHODS,
    SCHEDULE_METHODS,
    FEISHU_METHODS,
)


def add_hub(
    app: web.Application,
    settings: HubSettings,
    providers: Iterable[str] = (),
    *,
    methods: Methods = HUB_METHODS,
) -> None:
    """Open the Hub with the application and close it after the last request has drained.

    ``providers`` are the Agents turns may name (the workers' adapters); others are refused.
    ``methods`` are the RPC methods served.
    """
    providers = tuple(providers)
    install_middleware(app)

    metrics = Metrics()
    readiness = Readiness()
    app[METRICS] = metrics
    app[READINESS] = readiness
    app[HEALTH] = Health()

    async def hub_lifetime(app: web.Application) -> AsyncIterator[None]:
        hub = Hub.open(settings, providers)
        app[HUB] = hub
        metrics.set_snapshot_source(lambda: snapshot(hub))
        hub.usage.listeners.append(
            lambda provider, counted: metrics.model_usage(
                provider, counted.input_tokens, counted.output_tokens, counted.requests
            )
        )
        readiness.add("state_db", lambda: state_db_ready(hub))
        readiness.add("memory_root_lock", lambda: root_lock_ready(hub))
        yield
        metrics.set_snapshot_source(None)
        hub.close()

    async def lease_sweeper(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(sweep_leases(app[HUB]))
        # History past its window goes at start and then daily.
        pruner = asyncio.create_task(app[HUB].history.prune_forever())
        yield
        for running in (task, pruner):
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    async def release_long_polls(app: web.Application) -> None:
        await app[HUB].executions.close()

    app.cleanup_ctx.append(hub_lifetime)
    app.cleanup_ctx.append(lease_sweeper)
    app.on_shutdown.append(release_long_polls)
    app[RPC_METHODS] = methods
    app.router.add_route("*", RPC_PATH, rpc_handler(methods))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)


async def healthz(request: web.Request) -> web.Response:
    body: dict[str, object] = {"status": "ok"}
    for name, detail in request.app[HEALTH].details.items():
        body[name] = detail()
    return web.json_response(body)


async def readyz(request: web.Request) -> web.Response:
    """200 with each check when all pass, else 503 naming the failing ones."""
    ready, checks = await request.app[READINESS].run()
    body = {"status": "ready" if ready else "not_ready", "checks": checks}
    return web.json_response(body, status=200 if ready else 503)


async def state_db_ready(hub: Hub) -> tuple[bool, str]:
    try:
        hub.state.db.execute("SELECT COUNT(*) FROM principals").fetchone()
    except sqlite3.Error as error:
        return False, f"state database query failed: {error}"
    return True, "state database answers queries"


async def root_lock_ready(hub: Hub) -> tuple[bool, str]:
    lock = hub.root_lock
    if not lock.held:
        return False, "this Hub does not hold the memory root lock"
    # A lock file someone deleted no longer excludes a second Hub on the same root.
    if not lock.path.exists():
        return False, f"the lock file {lock.path} was removed; restart the Hub"
    return True, f"holding {lock.path}"


def snapshot(hub: Hub) -> Snapshot:
    rows = hub.state.db.execute(
        "SELECT state, COUNT(*) AS n FROM executions GROUP BY state"
    ).fetchall()
    # Every state appears, at zero too, so dashboards see a series before its first turn.
    counts: dict[str, int] = dict.fromkeys(EXECUTION_STATES, 0)
    counts.update({row["state"]: int(row["n"]) for row in rows})
    return Snapshot(
        executions_by_state=counts,
        connected_workers=hub.executions.connected_workers(),
    )


async def sweep_leases(hub: Hub) -> None:
    interval = max(0.05, min(1.0, hub.executions.lease_seconds / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await hub.executions.expire_leases()
        except Exception:
            logger.exception("expiring worker leases failed")
