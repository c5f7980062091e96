"""Connections and per-call latency of Feishu card updates: the pooled session against
lark-oapi's own transport.

Run: .venv/bin/python tests/benchmarks/bench_feishu_transport.py

The fake Feishu serves TLS on loopback, with a certificate made for this run and trusted for this
run only (the pooled session through its SSL context, lark-oapi's ``requests`` through
``REQUESTS_CA_BUNDLE`` in this process), on an event loop thread of its own. Each round sends
``CALLS`` card updates (``PATCH /im/v1/messages/:id``), one after another, both ways in turn:
  - baseline: lark-oapi's ``Client.request`` in a worker thread, as the bot sent every call
    before: its transport is a module-level ``requests.request``, a new connection (and TLS
    handshake) per call;
  - pooled: ``FeishuClient.update_card`` (pacing lifted) on a fresh pooled session per round, so
    its first call's handshake is counted too.
The tenant token is fetched before the rounds, once. Printed: connections per 100 calls and the
per-call latency (each round's median and 90th percentile; the median over rounds with min–max).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import SecretStr

from tests.benchmarks.bench_feishu import LoopThread
from tests.benchmarks.harness import header, ratio
from tests.fakes.feishu import FakeFeishu

CALLS = 100
ROUNDS = 5
APP_ID = "cli_bench_transport"


def self_signed(directory: Path) -> Path:
    """A certificate and key for 127.0.0.1 in one PEM file, valid for an hour."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "amux bench")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / "fake-feishu.pem"
    path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def percentile(samples: list[float], pct: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def spread(values: list[float], scale: float = 1.0, decimals: int = 1) -> str:
    shown = [v * scale for v in values]
    return (
        f"{statistics.median(shown):.{decimals}f} "
        f"({min(shown):.{decimals}f}–{max(shown):.{decimals}f})"
    )


class Baseline:
    """lark-oapi's own transport, driven as the bot drove it: a call per worker thread."""

    def __init__(self, url: str) -> None:
        import lark_oapi as lark

        self._lark = lark
        self._client = (
            lark.Client.builder()
            .app_id(APP_ID)
            .app_secret("secret")
            .domain(url)
            .timeout(10.0)
            .log_level(lark.LogLevel.WARNING)
            .build()
        )
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench-lark")

    def _patch(self, message_id: str, card: dict[str, Any]) -> None:
        from lark_oapi.core.enum import AccessTokenType, HttpMethod

        request = (
            self._lark.BaseRequest.builder()
            .http_method(HttpMethod.PATCH)
            .uri("/open-apis/im/v1/messages/:message_id")
            .paths({"message_id": message_id})
            .headers({"Content-Type": "application/json; charset=utf-8"})
            .token_types({AccessTokenType.TENANT})
            .body({"content": json.dumps(card)})
            .build()
        )
        raw = self._client.request(request).raw
        if raw.status_code != 200 or json.loads(raw.content).get("code") != 0:
            raise RuntimeError(f"the baseline's card update failed: {raw.content[:200]!r}")

    async def update_card(self, message_id: str, card: dict[str, Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._patch, message_id, card
        )

    def close(self) -> None:
        self._executor.shutdown()


def pooled_client(url: str, trust: ssl.SSLContext) -> Any:
    from bot.config import FeishuSettings
    from bot.feishu.client import FeishuClient
    from bot.feishu.ratelimit import Pacer, SlidingWindow
    from bot.feishu.transport import pooled_session

    settings = FeishuSettings(app_id=APP_ID, app_secret=SecretStr("secret"), domain=url)
    unpaced = Pacer(SlidingWindow(1_000_000, 1.0), SlidingWindow(1_000_000, 1.0))
    return FeishuClient(settings, pacer=unpaced, http=pooled_session(verify=trust))


async def one_round(fake: FakeFeishu, message_id: str, client: Any) -> tuple[float, list[float]]:
    """(connections per 100 calls, each call's seconds) for ``CALLS`` updates in a row."""
    before = fake.connections
    samples = []
    for n in range(CALLS):
        start = time.perf_counter()
        await client.update_card(message_id, {"n": n})
        samples.append(time.perf_counter() - start)
    return (fake.connections - before) * 100 / CALLS, samples


async def measure(fake: FakeFeishu, trust: ssl.SSLContext) -> None:
    baseline = Baseline(fake.url)
    warm = pooled_client(fake.url, trust)
    try:
        # The tenant token (cached process-wide) and the card to update.
        sent = await warm.send_card("oc_bench", {"n": -1})
        await baseline.update_card(sent.message_id, {"n": -1})
        connections: dict[str, list[float]] = {"baseline": [], "pooled": []}
        p50: dict[str, list[float]] = {"baseline": [], "pooled": []}
        p90: dict[str, list[float]] = {"baseline": [], "pooled": []}
        for _ in range(ROUNDS):
            for key in ("baseline", "pooled"):
                client = baseline if key == "baseline" else pooled_client(fake.url, trust)
                try:
                    count, samples = await one_round(fake, sent.message_id, client)
                finally:
                    if client is not baseline:
                        await client.close()
                        await client.http.aclose()
                connections[key].append(count)
                p50[key].append(statistics.median(samples))
                p90[key].append(percentile(samples, 90))
    finally:
        baseline.close()
        await warm.close()
        await warm.http.aclose()
    print(f"card updates over TLS on loopback, {CALLS} in a row per round, {ROUNDS} rounds:")
    labels = (("baseline", "lark-oapi transport (baseline)"), ("pooled", "pooled session"))
    for key, label in labels:
        print(
            f"  {label:<31} connections per 100 calls {spread(connections[key], decimals=0)}; "
            f"per call p50 {spread(p50[key], 1000, 2)} ms, p90 {spread(p90[key], 1000, 2)} ms"
        )
    ours, base = statistics.median(p50["pooled"]), statistics.median(p50["baseline"])
    print(f"  pooled per-call p50 against the baseline's: {ratio(ours, base)}")


async def main() -> None:
    header("Feishu transport, pooled session against lark-oapi's per-call connections")
    with tempfile.TemporaryDirectory(prefix="amux-bench-transport-") as tmp:
        pem = self_signed(Path(tmp))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(pem)
        trust = ssl.create_default_context(cafile=str(pem))
        # lark-oapi's module-level requests call takes no SSL setting; this trusts the fake's
        # certificate for this process only.
        os.environ["REQUESTS_CA_BUNDLE"] = str(pem)
        fake_thread = LoopThread("bench-fake-feishu")
        fake = FakeFeishu(app_id=APP_ID, ssl_context=serving)
        await fake_thread.run(fake.__aenter__())
        try:
            await measure(fake, trust)
        finally:
            await fake_thread.run(fake.__aexit__())
            fake_thread.close()


if __name__ == "__main__":
    asyncio.run(main())
