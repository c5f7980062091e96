"""What an outsider can do to the open ingress of `amux serve`: stall it, crash it, hold a restart.

`amux serve` runs as a process in webhook mode against the fake Feishu. The attackers are raw
loopback sockets in the test: gzip bombs, clients dribbling their bodies a byte at a time, and
bodies nested too deep to parse. Every attack is bounded and ends by itself.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import statistics
import struct
import time
import zlib
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.feishu.ingress import EVENTS_PATH
from tests.conftest import HubProcess, free_port, until
from tests.fakes.feishu import FakeFeishu
from tests.fakes.feishu_events import FeishuSigner, encrypt, signature

pytestmark = pytest.mark.timeout(180)

APP_ID = "cli_attacks"
signer = FeishuSigner(encrypt_key="ek_attacks", verification_token="vt_attacks", app_id=APP_ID)
USER = {"sender_open_id": "ou_user", "sender_union_id": "on_user", "sender_user_id": "u_user"}
JSON = {"Content-Type": "application/json; charset=utf-8"}
INFLATED = 1 << 30
CHUNK = 1 << 16


@functools.cache
def gzip_bomb() -> bytes:
    """A gzip stream of 1 GiB of zeros in about 1 MB, made one MiB at a time: 1 GiB never exists.

    After a full flush a deflate block refers to nothing before it, so every MiB of zeros
    compresses to the same bytes, and the stream is that block 1024 times.
    """
    zeros = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(INFLATED // len(zeros)):
        crc = zlib.crc32(zeros, crc)
    final = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, INFLATED & 0xFFFFFFFF)
    return header + block * (INFLATED // len(zeros)) + final + trailer


def request_head(path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def refused_unread(
    port: int, path: str, headers: dict[str, str]
) -> tuple[int, str | None, dict[str, Any]]:
    """A gzip body's refusal: its status, "close" once the Hub has closed the connection, and
    its JSON answer.

    Only the head is sent, announcing a 1 MB gzip body: the Hub answers before reading any of
    it. (Had body bytes been sent, the Hub's close of a connection with unread bytes resets it,
    and a reset may discard the answer before the client reads it.)
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        compressed = {**headers, "Content-Encoding": "gzip"}
        writer.write(request_head(path, compressed, len(gzip_bomb())))
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    # The whole answer arrived and then the end of the stream: the Hub closed the connection.
    return int(head.split()[1]), "close", json.loads(body)


async def status_of(reader: asyncio.StreamReader) -> int | None:
    """The status of the response arriving on ``reader``; None if the connection ends first."""
    try:
        line = await reader.readline()
    except ConnectionError:
        return None
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/") else None


async def closed_after_answer(reader: asyncio.StreamReader) -> bool:
    """The server ends the connection once it has answered (it does not wait for more)."""
    try:
        async with asyncio.timeout(5):
            while await reader.read(CHUNK):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


@dataclass
class Dribble:
    """One client sending its body a byte at a time, and what became of it."""

    sent: int = 0
    status: int | None = None
    closed: bool = False
    done: bool = False


async def dribble(
    port: int, path: str, headers: dict[str, str], out: Dribble, *, every: float = 0.5
) -> None:
    """Post to ``path`` a byte every ``every`` seconds until the server answers or cuts it off;
    the body it announces is never finished, and the client gives up after two minutes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_head(path, headers, length=4096))
        for _ in range(int(120 / every)):
            writer.write(b" ")
            await writer.drain()
            out.sent += 1
            try:
                # An answer ends the wait; without one, the next byte goes after ``every``.
                out.status = await asyncio.wait_for(status_of(reader), every)
            except TimeoutError:
                continue
            break
    except ConnectionError:
        out.status = await status_of(reader)
    finally:
        out.closed = await closed_after_answer(reader)
        out.done = True
        writer.close()


@dataclass
class Bombing:
    started: int = 0
    outcomes: list[int | None] | None = None

    def __post_init__(self) -> None:
        self.outcomes = []


async def bomb(port: int, body: bytes, stop: asyncio.Event, out: Bombing, rounds: int) -> None:
    """Post the gzip bomb to the webhook again and again, at most ``rounds`` times."""
    assert out.outcomes is not None
    headers = {**JSON, "Content-Encoding": "gzip"}
    for _ in range(rounds):
        if stop.is_set():
            return
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request_head(EVENTS_PATH, headers, len(body)))
            out.started += 1
            for at in range(0, len(body), CHUNK):
                writer.write(body[at : at + CHUNK])
                await writer.drain()
        except ConnectionError:
            pass  # The server closed the connection without reading the rest: as it should.
        try:
            out.outcomes.append(await asyncio.wait_for(status_of(reader), 60))
        finally:
            writer.close()


def signed_headers(body: bytes) -> dict[str, str]:
    """Headers signing ``body`` with the app's encrypt key, as Feishu signs a request."""
    timestamp, nonce = str(int(time.time())), "nonce-raw"
    return {
        **JSON,
        "X-Lark-Request-Timestamp": timestamp,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": signature(timestamp, nonce, signer.encrypt_key, body),
    }


async def timed(call: Awaitable[Any]) -> tuple[float, Any]:
    started = time.monotonic()
    result = await call
    return time.monotonic() - started, result


def cpu_seconds(pid: int) -> float:
    """CPU time ``pid`` has used so far, user and system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Hub:
    process: HubProcess
    feishu: FakeFeishu
    http: aiohttp.ClientSession

    async def healthz(self) -> int:
        async with self.http.get(f"{self.process.url}/healthz") as response:
            return response.status

    async def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        async with self.http.post(
            f"{self.process.url}{EVENTS_PATH}", data=io.BytesIO(body), headers=headers
        ) as response:
            return response.status, await response.read()

    async def say(self, text: str) -> tuple[int, str]:
        """A genuine message event, signed as Feishu signs it; its status and message id."""
        stored = self.feishu.add_message("oc_p2p_user", text)
        payload = signer.message(text, **USER, chat_id="oc_p2p_user", message_id=stored.message_id)
        status, _ = await self.post(*signer.sign(payload))
        return status, stored.message_id


@asynccontextmanager
async def webhook_hub(tmp_path: Path, **env: str) -> AsyncIterator[Hub]:
    async with FakeFeishu(app_id=APP_ID) as feishu:
        process = HubProcess(
            tmp_path / "amux-home",
            free_port(),
            extra_env={
                "AMUX_FEISHU_APP_ID": APP_ID,
                "AMUX_FEISHU_APP_SECRET": feishu.app_secret,
                "AMUX_FEISHU_ENCRYPT_KEY": signer.encrypt_key,
                "AMUX_FEISHU_VERIFICATION_TOKEN": signer.verification_token,
                "AMUX_FEISHU_DOMAIN": feishu.url,
                "AMUX_FEISHU_LANGUAGE": "en_us",
                "AMUX_RUNTIME_IN_PROCESS": "false",
                **env,
            },
        )
        await asyncio.to_thread(process.start)
        try:
            # A fresh connection per request, as each prober and Feishu delivery makes its own.
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession(connector=connector) as http:
                await until(lambda: feishu.calls("GET", "/bot/v3/info"))
                yield Hub(process, feishu, http)
        finally:
            await asyncio.to_thread(process.stop)


async def test_gzip_bombs_and_dribbled_bodies_stall_neither_healthz_nor_a_signed_event(
    tmp_path: Path,
) -> None:
    body = gzip_bomb()
    assert len(body) < 1_100_000
    async with webhook_hub(tmp_path, AMUX_REQUEST_BODY_SECONDS="5") as hub:
        cpu_before = cpu_seconds(hub.process.pid)
        slow = [Dribble() for _ in range(20)]
        dribblers = [
            asyncio.create_task(dribble(hub.process.port, EVENTS_PATH, JSON, d)) for d in slow
        ]
        await until(lambda: all(d.sent for d in slow), 10)
        stop = asyncio.Event()
        bombing = Bombing()
        bombers = [
            asyncio.create_task(bomb(hub.process.port, body, stop, bombing, rounds=100))
            for _ in range(4)
        ]
        await until(lambda: bombing.started >= 4, 10)

        health = [await timed(hub.healthz()) for _ in range(10)]
        acked, (status, message_id) = await timed(hub.say("/amux"))
        health.append(await timed(hub.healthz()))
        still_dribbling = sum(not d.done for d in slow)
        stop.set()
        await asyncio.gather(*bombers)
        await asyncio.gather(*dribblers)
        cpu = cpu_seconds(hub.process.pid) - cpu_before
        reply = await until(lambda: hub.feishu.calls("POST", f"/messages/{message_id}/reply"))
        log = hub.process.log()

    assert [code for _, code in health] == [200] * len(health)
    # Typically about 10 ms each; the attacking clients share these two cores with the Hub, so
    # one answer may wait a few hundred ms. The stall this guards against lasted seconds.
    assert statistics.median(seconds for seconds, _ in health) < 0.1, health
    assert max(seconds for seconds, _ in health) < 1.0, health
    assert status == 200 and acked < 3.0, acked
    assert reply, "the genuine event was handled"
    # The measurements ran while every slow client was still connected and dribbling.
    assert still_dribbling == len(slow)
    # Each bomb was refused unread (415), or its connection cut before the answer was read.
    assert bombing.outcomes and set(bombing.outcomes) <= {415, None}, bombing.outcomes
    assert 415 in bombing.outcomes
    # Inflating one bomb costs seconds of CPU; refusing all of them unread costs next to none.
    assert cpu < 3.0, f"the Hub spent {cpu:.1f}s of CPU on {len(bombing.outcomes)} bombs"
    # A slow body times out with 408 and its connection is dropped.
    assert [(d.status, d.closed) for d in slow] == [(408, True)] * len(slow)
    assert "Traceback" not in log


async def test_bodies_that_do_not_decode_get_a_one_line_400_and_never_a_traceback(
    tmp_path: Path,
) -> None:
    nested = b"[" * 200_000
    bodies = {
        "nested arrays": nested,
        "nested objects": b'{"a":' * 100_000,
        "not UTF-8": b'{"\xff\xfe": 1}',
        "a huge integer": b"9" * 5000,
        "not JSON": b"\x00not json",
        "a broken ciphertext": json.dumps({"encrypt": "@@@"}).encode(),
        "nesting inside the ciphertext": json.dumps(
            {"encrypt": encrypt("[" * 200_000, signer.encrypt_key)}
        ).encode(),
    }
    async with webhook_hub(tmp_path) as hub:
        answers = {name: await hub.post(body, JSON) for name, body in bodies.items()}
        # Signed with the right key, the signature passes first, then the body fails to parse.
        signed = await hub.post(nested, signed_headers(nested))
        # The Hub RPC reads bodies from outside too, with the same rules.
        token = {"Authorization": f"Bearer {hub.process.owner_token}", **JSON}
        rpc = f"{hub.process.url}/rpc/v1/system.config.get"
        async with hub.http.post(rpc, data=b"[" * 200_000, headers=token) as response:
            rpc_nested = response.status, await response.json()
        rpc_gzip = await refused_unread(hub.process.port, "/rpc/v1/system.config.get", token)
        # A client hanging up halfway through its body gets a log line, not a traceback.
        _, writer = await asyncio.open_connection("127.0.0.1", hub.process.port)
        writer.write(request_head(EVENTS_PATH, JSON, 4096) + b"[[[")
        await writer.drain()
        writer.close()
        await until(lambda: "was cut off" in hub.process.log())
        log = hub.process.log()

    for name, (status, answer) in [*answers.items(), ("signed nesting", signed)]:
        assert status == 400, (name, status, answer)
        assert answer.count(b"\n") == 0, name
        assert json.loads(answer)["error"]["code"] == "invalid_argument", name
    assert rpc_nested[0] == 400 and rpc_nested[1]["error"]["code"] == "invalid_argument"
    assert rpc_gzip[:2] == (415, "close")
    assert rpc_gzip[2]["error"]["code"] == "unsupported_encoding"
    assert "Traceback" not in log and "Error handling request" not in log


async def test_a_restart_is_not_held_by_clients_dribbling_their_bodies(tmp_path: Path) -> None:
    # Bodies may take far longer than the restart: only the drain can end these reads.
    async with webhook_hub(tmp_path, AMUX_REQUEST_BODY_SECONDS="300") as hub:
        port = hub.process.port
        token = {"Authorization": f"Bearer {hub.process.owner_token}", **JSON}
        slow = [Dribble() for _ in range(20)]
        dribblers = [
            asyncio.create_task(dribble(port, EVENTS_PATH, JSON, d)) for d in slow[:10]
        ] + [
            asyncio.create_task(dribble(port, "/rpc/v1/system.config.get", token, d))
            for d in slow[10:]
        ]
        await until(lambda: all(d.sent >= 2 for d in slow), 10)

        started = time.monotonic()
        status, _ = await asyncio.to_thread(hub.process.rpc, "system.restart")
        assert status == 200
        await until(lambda: hub.process.log().count("amux Hub listening") == 2, 60)
        assert await hub.healthz() == 200
        took = time.monotonic() - started
        await asyncio.gather(*dribblers)
        log = hub.process.log()

    # Without cutting them off the drain would wait 30 s for these requests; a restart's own
    # start-up on a loaded 2-core machine takes up to about 10 s, so only the drain's wait is told.
    assert took < 25.0, f"the restart took {took:.1f}s"
    assert "requests still running" not in log
    # Each was told the Hub is restarting, or its connection went with the old listener.
    assert all(d.done and d.status in (503, None) for d in slow), slow
    assert any(d.status == 503 for d in slow)
