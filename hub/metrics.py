"""Prometheus metrics of one amux process, served at ``GET /metrics``.

Each application owns its own ``CollectorRegistry`` (never the global one) so several apps in one
process, as in tests, keep separate counts. Gauges that describe current state (executions by state,
connected workers) are computed when scraped, from a source the composition root provides.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from hub.storage import CAUSES, DISKS

# Hub RPC calls are mostly sub-millisecond reads, with long polls of up to 30 s at the far end.
RPC_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OK = "ok"
UNKNOWN_METHOD = "unknown"
OTHER = "other"


@dataclass(frozen=True)
class Snapshot:
    """State read at scrape time."""

    executions_by_state: Mapping[str, int] = field(default_factory=dict)
    connected_workers: int = 0


SnapshotSource = Callable[[], Snapshot]

LINK_STATES = ("connected", "reconnecting", "disconnected")


@dataclass(frozen=True)
class FeishuLink:
    """The Feishu long connection as last seen: state, ages of the last frame and event."""

    state: str
    frame_age_seconds: float | None
    event_age_seconds: float | None
    silent_reconnects: int
    silence_bound_seconds: float

    def to_json(self) -> dict[str, object]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "state": self.state,
            "last_frame_age_seconds": rounded(self.frame_age_seconds),
            "last_event_age_seconds": rounded(self.event_age_seconds),
            "silent_reconnects": self.silent_reconnects,
            "silence_bound_seconds": rounded(self.silence_bound_seconds),
        }


LinkSource = Callable[[], FeishuLink]


class _StateCollector(Collector):
    def __init__(self) -> None:
        self.source: SnapshotSource | None = None
        self.link: LinkSource | None = None

    def collect(self) -> Iterable[Metric]:
        snapshot = self.source() if self.source is not None else Snapshot()
        executions = GaugeMetricFamily(
            "amux_executions", "Agent turns on the Hub by state.", labels=["state"]
        )
        for state, count in sorted(snapshot.executions_by_state.items()):
            executions.add_metric([state], count)
        yield executions
        yield GaugeMetricFamily(
            "amux_connected_workers",
            "Runtime workers that polled or heart-beat recently.",
            value=snapshot.connected_workers,
        )
        if self.link is not None:
            yield from _link_metrics(self.link())


def _link_metrics(link: FeishuLink) -> Iterable[Metric]:
    state = GaugeMetricFamily(
        "amux_feishu_long_connection_state",
        "The Feishu long connection's state: 1 for the current one.",
        labels=["state"],
    )
    for name in LINK_STATES:
        state.add_metric([name], 1 if link.state == name else 0)
    yield state
    if link.frame_age_seconds is not None:
        yield GaugeMetricFamily(
            "amux_feishu_long_connection_last_frame_age_seconds",
            "Seconds since the long connection last received a frame (pong, event, anything).",
            value=link.frame_age_seconds,
        )
    if link.event_age_seconds is not None:
        yield GaugeMetricFamily(
            "amux_feishu_long_connection_last_event_age_seconds",
            "Seconds since the long connection last delivered an event or card click.",
            value=link.event_age_seconds,
        )
    yield CounterMetricFamily(
        "amux_feishu_long_connection_silent_reconnects",
        "Reconnects forced because the long connection heard nothing for 3 ping intervals.",
        value=link.silent_reconnects,
    )


class Metrics:
    """The metric objects of one application and a small API to record into them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rpc_seconds = Histogram(
            "amux_rpc_request_duration_seconds",
            "Hub RPC latency by method and HTTP status.",
            ["method", "status"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self.memory_operations = Counter(
            "amux_memory_operations",
            "Memory RPC calls by method and outcome (ok or the error code).",
            ["method", "outcome"],
            registry=r,
        )
        self.memory_conflicts = Counter(
            "amux_memory_conflicts",
            "Memory writes refused because the document changed since it was read.",
            ["method"],
            registry=r,
        )
        self.search_incomplete = Counter(
            "amux_memory_search_incomplete",
            "Searches that stopped at the scan budget and answered incomplete=true.",
            registry=r,
        )
        self.storage_errors = Counter(
            "amux_storage_errors",
            "Calls a disk refused, by disk (memory, memory_history, state) and cause "
            "(no_space, quota, read_only, io).",
            ["disk", "cause"],
            registry=r,
        )
        self.feishu_events = Counter(
            "amux_feishu_events",
            "Feishu events by outcome: received, deduplicated or failed; caught_up for received "
            "ones catch-up listed.",
            ["outcome"],
            registry=r,
        )
        self.feishu_calls = Counter(
            "amux_feishu_api_calls",
            "Outbound Feishu OpenAPI calls by API and outcome (ok or error).",
            ["api", "outcome"],
            registry=r,
        )
        self.feishu_retries = Counter(
            "amux_feishu_api_retries",
            "Outbound Feishu OpenAPI calls retried after a rate limit or transient error.",
            ["api"],
            registry=r,
        )
        self.feishu_undelivered = Counter(
            "amux_feishu_replies_undelivered",
            "Replies and final cards the bot owed but gave up: too_old (24 h) or refused.",
            ["reason"],
            registry=r,
        )
        # By provider only: a label per Principal would grow without bound, and names are personal.
        self.model_tokens = Counter(
            "amux_model_tokens",
            "Model tokens of completed turns as the Runtime's model gateway counted them, by "
            "direction (input, output) and provider.",
            ["direction", "provider"],
            registry=r,
        )
        self.model_requests = Counter(
            "amux_model_requests",
            "Model requests of completed turns that passed the Runtime's model gateway.",
            ["provider"],
            registry=r,
        )
        self._state = _StateCollector()
        r.register(self._state)
        # Method names are the served table's (or one label for unknown ones), statuses and
        # error codes the Hub's own: a bounded set of keys.
        self._rpc_series: dict[tuple[str, int, str | None], tuple[Histogram, Counter | None]] = {}

    def set_snapshot_source(self, source: SnapshotSource | None) -> None:
        """Where scrape-time gauges come from; None while the Hub is not open."""
        self._state.source = source

    def set_feishu_link_source(self, source: LinkSource | None) -> None:
        """Where the long connection's gauges come from; None in webhook mode."""
        self._state.link = source

    def observe_rpc(
        self, method: str, status: int, seconds: float, error_code: str | None, body: bytes
    ) -> None:
        """Record one finished RPC call (``body`` is the JSON answer, read for search results)."""
        # The labelled series are looked up once each: a lookup costs as much as the count.
        key = (method, status, error_code)
        series = self._rpc_series.get(key)
        if series is None:
            outcome = error_code or OK
            counted = (
                self.memory_operations.labels(method, outcome)
                if method.startswith("memory.")
                else None
            )
            series = self._rpc_series[key] = (
                self.rpc_seconds.labels(method, str(status)),
                counted,
            )
        series[0].observe(seconds)
        if series[1] is None:
            return
        outcome = error_code or OK
        series[1].inc()
        if outcome == "conflict":
            self.memory_conflicts.labels(method).inc()
        if method == "memory.search" and outcome == OK and _incomplete(body):
            self.search_incomplete.inc()

    def storage_refused(self, disk: str | None, cause: str | None) -> None:
        """Count one call answered ``storage_unavailable``."""
        # Both come from the Hub's own closed sets; anything else would be a bug, not a series.
        self.storage_errors.labels(
            disk if disk in DISKS else OTHER, cause if cause in CAUSES else OTHER
        ).inc()

    def feishu_event(self, outcome: str) -> None:
        """Count one Feishu event: ``received``, ``deduplicated`` or ``failed``."""
        self.feishu_events.labels(outcome).inc()

    def feishu_call(self, api: str, ok: bool) -> None:
        """Count one outbound Feishu call (after its retries) by API name."""
        self.feishu_calls.labels(api, OK if ok else "error").inc()

    def feishu_retry(self, api: str) -> None:
        self.feishu_retries.labels(api).inc()

    def feishu_gave_up(self, reason: str) -> None:
        """Count one owed reply the bot stopped trying to deliver."""
        self.feishu_undelivered.labels(reason).inc()

    def model_usage(
        self, provider: str, input_tokens: int, output_tokens: int, requests: int
    ) -> None:
        """Count one completed turn's model usage."""
        self.model_tokens.labels("input", provider).inc(input_tokens)
        self.model_tokens.labels("output", provider).inc(output_tokens)
        self.model_requests.labels(provider).inc(requests)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _incomplete(body: bytes) -> bool:
    try:
        decoded = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(decoded, dict) and decoded.get("incomplete") is True


async def metrics_endpoint(request: web.Request) -> web.Response:
    """``GET /metrics`` in the Prometheus text format."""
    body = request.app[METRICS].render()
    response = web.Response(body=body)
    # The exposition content type carries its own version parameter, so set the header whole.
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


METRICS = web.AppKey("metrics", Metrics)
