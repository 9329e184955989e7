"""The inference-server example, for real: aiohttp on loopback, a real HTTP client,
replica procs, RDMA weight reloads, SIGKILLed replicas and SIGTERM shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import Future as ThreadFuture
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from examples.inference_server.model import build
from examples.inference_server.replicas import InferenceServer
from examples.inference_server.server import SERVER, make_app

from ..faults import danaus_procs

ROOT = Path(__file__).resolve().parents[2]
REPLICA_SEED, TRAINER_SEED = 0, 1
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)

_expected: dict[tuple[int, str, int], str] = {}


def expected(seed: int, prompt: str, n: int) -> str:
    """What the model with ``seed``'s weights answers, computed in this process."""
    key = (seed, prompt, n)
    if key not in _expected:
        _expected[key] = "".join(build(seed).generate(prompt, n))
    return _expected[key]


class Server:
    def __init__(self, url: str, server: InferenceServer) -> None:
        self.url = url
        self.server = server


@pytest.fixture
async def srv() -> AsyncIterator[Server]:
    """The example app with 2 replicas on 127.0.0.1, an ephemeral port, this test's loop."""
    app = make_app(2, seed=REPLICA_SEED, trainer_seed=TRAINER_SEED, drain_timeout=5.0)
    runner = web.AppRunner(app, shutdown_timeout=5.0, access_log=None)
    async with asyncio.timeout(60):
        await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield Server(f"http://127.0.0.1:{site.port}", app[SERVER])
    finally:
        async with asyncio.timeout(30):
            await runner.cleanup()


async def generate(
    session: aiohttp.ClientSession, url: str, prompt: str, n: int, on_token: Any = None
) -> tuple[int, str]:
    """POST /generate and read the SSE stream: ``(status, text)``.

    A stream that ends with an ``error`` event counts as that event's status (503): the
    HTTP status was already sent as 200 when the replica died.
    """
    async with session.post(f"{url}/generate", json={"prompt": prompt, "max_tokens": n}) as r:
        if r.status != 200:
            return r.status, (await r.json())["error"]
        assert r.headers["Content-Type"] == "text/event-stream"
        tokens: list[str] = []
        event = "message"
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if event == "message":
                    tokens.append(data)
                    if on_token is not None:
                        on_token(data)
                    continue
                if event == "done":
                    assert data["text"] == "".join(tokens) and data["tokens"] == n
                    return 200, data["text"]
                assert event == "error", event
                return data["status"], data["error"]
        raise AssertionError(f"the stream ended without a done or error event after {tokens}")


async def test_generate_streams_tokens_health_and_metrics(srv: Server) -> None:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
        assert await generate(s, srv.url, "hello", 32) == (200, expected(REPLICA_SEED, "hello", 32))

        # Tokens come as they are produced: the first one long before the last of 512.
        t0 = time.perf_counter()
        first: list[float] = []
        status, text = await generate(
            s,
            srv.url,
            "stream me",
            512,
            lambda _: first.append(time.perf_counter() - t0) if not first else None,
        )
        total = time.perf_counter() - t0
        assert (status, text) == (200, expected(REPLICA_SEED, "stream me", 512))
        assert first[0] < total / 2, (first[0], total)

        async with s.post(
            f"{srv.url}/generate", json={"prompt": "hello", "max_tokens": 32, "stream": False}
        ) as r:
            assert r.status == 200
            assert (await r.json())["text"] == expected(REPLICA_SEED, "hello", 32)
        async with s.post(f"{srv.url}/generate", json={"max_tokens": 0}) as r:
            assert r.status == 400

        async with s.get(f"{srv.url}/health") as r:
            assert r.status == 200
            health = await r.json()
        assert health["status"] == "ok" and health["trainer"] == "ok"
        assert [rep["state"] for rep in health["replicas"]] == ["healthy", "healthy"]
        assert sorted(rep["pid"] for rep in health["replicas"]) == sorted(
            srv.server._gen.procs.pids
        )  # type: ignore[union-attr]
        assert sum(rep["served"] for rep in health["replicas"]) == 3

        async with s.get(f"{srv.url}/metrics") as r:
            assert r.status == 200 and r.content_type == "text/plain"
            metrics = await r.text()
    assert 'inference_requests_total{status="200"} 3' in metrics
    assert 'inference_requests_total{status="400"}' not in metrics  # rejected before routing
    assert "inference_request_latency_seconds_count 3" in metrics
    assert 'inference_request_latency_seconds{quantile="0.99"}' in metrics
    assert "inference_replicas_healthy 2" in metrics

    # Inside the app's loop a blocking .get() raises, telling us to await instead.
    gen = srv.server._gen
    assert gen is not None
    fut = gen.replicas.state.call()
    with pytest.raises(RuntimeError, match="await"):
        fut.get(timeout=1)
    assert len((await fut).values()) == 2


async def test_a_client_that_leaves_mid_stream_stops_its_generation(
    srv: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    import examples.inference_server.server as server_module

    monkeypatch.setattr(server_module, "MAX_TOKENS", 10**7)  # minutes of generation
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
        r = await s.post(f"{srv.url}/generate", json={"prompt": "long", "max_tokens": 10**7})
        assert r.status == 200
        await r.content.readline()  # the stream has started
        r.close()  # the client leaves
        # /health asks each replica for its state: queued behind the generation on its
        # replica, so this answers only once that generation stopped.
        async with s.get(f"{srv.url}/health") as h:
            health = await h.json()
    assert sum(rep["cancelled"] for rep in health["replicas"]) == 1
    assert sum(rep["served"] for rep in health["replicas"]) == 0


async def test_32_concurrent_clients_all_answered(srv: Server) -> None:
    prompts = [f"client {i}" for i in range(32)]

    async def client(session: aiohttp.ClientSession, prompt: str) -> None:
        for n in (16, 24):
            assert await generate(session, srv.url, prompt, n) == (
                200,
                expected(REPLICA_SEED, prompt, n),
            )

    async with aiohttp.ClientSession(
        timeout=CLIENT_TIMEOUT, connector=aiohttp.TCPConnector(limit=32)
    ) as s:
        async with asyncio.timeout(60):
            await asyncio.gather(*(client(s, p) for p in prompts))
        async with s.get(f"{srv.url}/health") as r:
            served = [rep["served"] for rep in (await r.json())["replicas"]]
    assert sum(served) == 64 and min(served) > 0, served  # choose() used both replicas


async def test_reload_switches_to_the_trainers_weights_without_dropping_requests(
    srv: Server,
) -> None:
    old, new = expected(REPLICA_SEED, "reload", 48), expected(TRAINER_SEED, "reload", 48)
    assert old != new
    nbytes = build(0).nbytes()
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
        assert await generate(s, srv.url, "reload", 48) == (200, old)
        # Requests in flight while the reload happens all finish, each wholly on the
        # old weights or wholly on the new ones.
        async with asyncio.timeout(60):
            during = [asyncio.ensure_future(generate(s, srv.url, "reload", 48)) for _ in range(16)]
            async with s.post(f"{srv.url}/reload") as r:
                assert r.status == 200
                report = await r.json()
            results = await asyncio.gather(*during)
        assert all(status == 200 and text in (old, new) for status, text in results), results
        assert report["replicas"] == 2 and report["version"] == 1
        assert report["bytes_per_replica"] == nbytes and report["bytes"] == 2 * nbytes
        assert len(report["transfer_seconds"]) == 2 and report["seconds"] > 0
        for _ in range(4):  # both replicas now answer with the trainer's weights
            assert await generate(s, srv.url, "reload", 48) == (200, new)
        async with s.get(f"{srv.url}/health") as r:
            health = await r.json()
        assert health["weights_version"] == 1
        assert [rep["version"] for rep in health["replicas"]] == [1, 1]


@pytest.mark.timeout(150)
async def test_killed_replica_gives_503s_not_hangs_and_the_server_recovers(srv: Server) -> None:
    statuses: Counter[int] = Counter()
    done = asyncio.Event()
    target = [0]
    stop = asyncio.Event()

    async def client(session: aiohttp.ClientSession, i: int) -> None:
        while not stop.is_set():
            status, text = await generate(session, srv.url, f"load {i % 4}", 16)
            statuses[status] += 1
            if status == 200:
                assert text == expected(REPLICA_SEED, f"load {i % 4}", 16)
            if sum(statuses.values()) >= target[0] and (not busy_first[0] or replica_0_busy()):
                done.set()

    gen = srv.server._gen
    assert gen is not None
    # The kill comes while requests are chosen for replica 0 (a slow controller, under
    # coverage, could otherwise find it with none in flight for a moment: no 503 to see).
    busy_first = [True]

    def replica_0_busy() -> bool:
        return gen.route is not None and gen.route._inflight.get(0, 0) >= 2

    async with aiohttp.ClientSession(
        timeout=CLIENT_TIMEOUT, connector=aiohttp.TCPConnector(limit=32)
    ) as s:
        clients = [asyncio.ensure_future(client(s, i)) for i in range(32)]
        try:
            async with asyncio.timeout(120):
                target[0] = 64
                await done.wait()  # under load: every replica has requests queued
                killed = gen.procs.pids[0]
                os.kill(killed, signal.SIGKILL)
                busy_first[0] = False
                await srv.server.wait_recovered(failures=1)
                done.clear()
                target[0] = sum(statuses.values()) + 64
                await done.wait()  # and the recovered server keeps answering
                stop.set()
                await asyncio.gather(*clients)  # each request bounded by CLIENT_TIMEOUT
        finally:
            stop.set()
            for c in clients:
                c.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
        assert set(statuses) <= {200, 503}, statuses
        assert statuses[503] >= 1 and statuses[200] >= 128, statuses

        # The replacement: fresh procs, all healthy, serving the right weights.
        assert srv.server._gen is not gen
        async with s.get(f"{srv.url}/health") as r:
            assert r.status == 200
            health = await r.json()
        assert health["status"] == "ok" and not health["replacing"]
        assert killed not in [rep["pid"] for rep in health["replicas"]]
        for i in range(4):
            assert await generate(s, srv.url, f"after {i}", 16) == (
                200,
                expected(REPLICA_SEED, f"after {i}", 16),
            )
        async with s.get(f"{srv.url}/metrics") as r:
            metrics = await r.text()
    assert "inference_replica_failures_total 1" in metrics
    assert "inference_replica_respawns_total 1" in metrics
    assert f'inference_requests_total{{status="503"}} {statuses[503]}' in metrics


@pytest.mark.timeout(120)
async def test_replicas_killed_mid_stream_end_it_with_a_503_event(srv: Server) -> None:
    gen = srv.server._gen
    assert gen is not None
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
        first = asyncio.Event()
        in_flight = asyncio.ensure_future(generate(s, srv.url, "long", 512, lambda _: first.set()))
        async with asyncio.timeout(90):
            await first.wait()  # headers (200) are out: the failure must come in-band
            for pid in gen.procs.pids:
                os.kill(pid, signal.SIGKILL)
            status, error = await in_flight
            assert status == 503 and "SIGKILL" in error, error
            # With no replica left, requests fail at once instead of waiting.
            assert (await generate(s, srv.url, "nobody", 8))[0] == 503
            await srv.server.wait_recovered(failures=2)
        assert await generate(s, srv.url, "again", 8) == (200, expected(REPLICA_SEED, "again", 8))


async def test_the_app_runs_in_another_thread_on_its_own_loop() -> None:
    """Nothing needs the main thread: the app, its meshes and its loop live in a thread."""
    from danaus.actors._loops import close_loop_runtime  # no public close for a loop's runtime

    started: ThreadFuture[tuple[str, asyncio.AbstractEventLoop, asyncio.Event]] = ThreadFuture()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        runner = web.AppRunner(make_app(1, drain_timeout=5.0), access_log=None)
        try:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            stop = asyncio.Event()
            started.set_result((f"http://127.0.0.1:{site.port}", loop, stop))
            await stop.wait()
        except BaseException as e:
            if not started.done():
                started.set_exception(e)
            raise
        finally:
            await runner.cleanup()
            await close_loop_runtime(loop)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name="app")
    thread.start()
    try:
        async with asyncio.timeout(60):
            url, loop, stop = await asyncio.wrap_future(started)
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            assert await generate(s, url, "thread", 16) == (
                200,
                expected(REPLICA_SEED, "thread", 16),
            )
            async with s.get(f"{url}/health") as r:
                assert (await r.json())["status"] == "ok"
        loop.call_soon_threadsafe(stop.set)
    finally:
        await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive()


def _procs_of(pid: int) -> list[int]:
    """Live danaus procs started by the controller ``pid`` (wherever they were reparented)."""
    return danaus_procs(pid)


@pytest.mark.timeout(120)
async def test_sigterm_drains_in_flight_requests_and_leaves_no_process() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.inference_server.server",
        "--port",
        "0",
        "--replicas",
        "2",
        "--drain-timeout",
        "10",
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    output: list[str] = []
    url: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def read() -> None:  # keep the pipe drained; find the address
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace")
            output.append(line)
            if "Running on http://" in line and not url.done():
                url.set_result(line.split("Running on ")[1].split()[0])

    reader = asyncio.ensure_future(read())
    try:
        async with asyncio.timeout(60):
            base = await url
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            assert await generate(s, base, "hi", 8) == (200, expected(REPLICA_SEED, "hi", 8))
            children = _procs_of(proc.pid)
            assert len(children) == 3, children  # 2 replicas and the trainer
            # A long request is streaming when SIGTERM comes: it is drained, not cut.
            first = asyncio.Event()
            in_flight = asyncio.ensure_future(
                generate(s, base, "drain", 512, lambda _: first.set())
            )
            async with asyncio.timeout(30):
                await first.wait()
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                assert await in_flight == (200, expected(REPLICA_SEED, "drain", 512))
                assert await proc.wait() == 0
            with pytest.raises(aiohttp.ClientConnectionError):
                await generate(s, base, "too late", 8)
        assert danaus_procs(proc.pid, servers=True) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.wait_for(reader, 10)
    assert any("serving with 2 replicas" in line for line in output), output
