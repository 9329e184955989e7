"""The inference-server example under a bounded load, next to the same model in-process.

Starts ``python -m examples.inference_server.server`` (2 replicas) as a real server
process, drives it over loopback HTTP with aiohttp (Server-Sent Events, 32 tokens per
request), and prints, each beside a floor measured in the same run:

- requests/s with 32 concurrent connections (a fixed number of requests), p50 and p99,
  against the same model called in-process, sequentially, in this process;
- latency with one connection against one in-process call (the serving overhead);
- the weight reload: each replica's ``read_into`` of the model's bytes, and the whole
  ``POST /reload``, against a memcpy of the same bytes.

Run with ``python -c "from bench.bench_inference import main; main()"``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import numpy as np
import torch
import uvloop

from ._stats import format_table, percentile

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 32
LOAD_REQUESTS = 640
CONNECTIONS = 32
SEQUENTIAL = 100
RELOADS = 10


async def _start_server() -> tuple[asyncio.subprocess.Process, str, asyncio.Task[None]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.inference_server.server",
        "--port",
        "0",
        "--replicas",
        "2",
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    url: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def drain() -> None:  # keep the pipe empty; find the address
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if "Running on http://" in line and not url.done():
                url.set_result(line.split("Running on ")[1].split()[0])
        if not url.done():
            url.set_exception(RuntimeError("the server exited before it listened"))

    reader = asyncio.ensure_future(drain())
    try:
        async with asyncio.timeout(90):
            return proc, await url, reader
    except BaseException:
        proc.kill()
        await proc.wait()
        raise


async def _request(s: aiohttp.ClientSession, url: str, prompt: str) -> tuple[float, float]:
    """One streamed /generate: (seconds to the first token, seconds to the end)."""
    t0 = time.perf_counter()
    first = 0.0
    async with s.post(f"{url}/generate", json={"prompt": prompt, "max_tokens": TOKENS}) as r:
        if r.status != 200:
            raise RuntimeError(f"/generate answered {r.status}: {await r.text()}")
        async for line in r.content:
            if not first and line.startswith(b"data: "):
                first = time.perf_counter() - t0
            elif line.startswith(b"event: "):
                if line != b"event: done\n":
                    raise RuntimeError(f"the stream failed: {line!r}")
                break
    return first, time.perf_counter() - t0


async def _load(url: str, total: int, connections: int) -> tuple[float, list[float], list[float]]:
    """``total`` requests over ``connections`` connections: (req/s, latencies, first tokens)."""
    left = iter(range(total))
    lat: list[float] = []
    ttft: list[float] = []

    async def worker(s: aiohttp.ClientSession) -> None:
        for i in left:
            f, t = await _request(s, url, f"request {i % 50}")
            ttft.append(f)
            lat.append(t)

    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=60), connector=aiohttp.TCPConnector(limit=connections)
    ) as s:
        await _request(s, url, "warm up")
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(s) for _ in range(connections)))
        elapsed = time.perf_counter() - t0
    return total / elapsed, lat, ttft


def _in_process(n: int) -> list[float]:
    """The same model, same prompts and token count, called here: seconds per call."""
    from examples.inference_server.model import build

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the replicas
    try:
        model = build(0)
        list(model.generate("warm up", TOKENS))
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            list(model.generate(f"request {i % 50}", TOKENS))
            out.append(time.perf_counter() - t0)
        return out
    finally:
        torch.set_num_threads(threads)


def _memcpy(nbytes: int, repeat: int = 200) -> float:
    """Median seconds of one single-threaded memcpy of ``nbytes`` (numpy's copyto).

    Not torch's copy_: it splits the copy over its thread pool, and on 2 busy vCPUs
    waiting for the second thread can cost a whole scheduler slice (8 ms).
    """
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _reloads(url: str, n: int) -> list[dict[str, float]]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        for _ in range(n):
            async with s.post(f"{url}/reload") as r:
                if r.status != 200:
                    raise RuntimeError(f"/reload answered {r.status}: {await r.text()}")
                out.append(await r.json())
    return out


def _ms(samples: Sequence[float], q: float) -> float:
    return percentile(samples, q) * 1e3


async def _run() -> list[dict[str, object]]:
    proc, url, reader = await _start_server()
    try:
        cold = (await _reloads(url, 1))[0]  # the replicas' first contact with the trainer
        warm = await _reloads(url, RELOADS)
        local = _in_process(SEQUENTIAL * 2)
        one_rate, one_lat, one_ttft = await _load(url, SEQUENTIAL, 1)
        rate, lat, ttft = await _load(url, LOAD_REQUESTS, CONNECTIONS)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
        await reader
    nbytes = int(warm[0]["bytes_per_replica"])
    copy = _memcpy(nbytes)
    local_rate = len(local) / sum(local)
    transfer = statistics.median(t for r in warm for t in r["transfer_seconds"])  # type: ignore[attr-defined]
    whole = statistics.median(r["seconds"] for r in warm)
    return [
        {
            "figure": f"/generate, {CONNECTIONS} connections, 2 replicas, {TOKENS} tokens",
            "danaus": f"{rate:,.0f} req/s",
            "detail": f"p50 {_ms(lat, 50):.1f} ms, "
            f"p99 {_ms(lat, 99):.1f} ms, first token p50 {_ms(ttft, 50):.1f} ms, n={len(lat)}",
            "floor": f"{local_rate:,.0f} req/s in-process, sequential",
            "ratio": f"{rate / local_rate:.2f}x",
        },
        {
            "figure": "/generate, 1 connection",
            "danaus": f"{_ms(one_lat, 50):.2f} ms p50",
            "detail": f"p99 {_ms(one_lat, 99):.2f} ms, first token p50 {_ms(one_ttft, 50):.2f} ms, "
            f"{one_rate:,.0f} req/s",
            "floor": f"{_ms(local, 50):.2f} ms in-process (p99 {_ms(local, 99):.2f})",
            "ratio": f"{percentile(one_lat, 50) / percentile(local, 50):.2f}x",
        },
        {
            "figure": f"reload, one replica's read_into ({nbytes / 1024:.0f} KiB)",
            "danaus": f"{transfer * 1e6:.0f} us median",
            "detail": f"n={2 * len(warm)}",
            "floor": f"{copy * 1e6:.0f} us memcpy",
            "ratio": f"{transfer / copy:.2f}x",
        },
        {
            "figure": "POST /reload, 2 replicas (publish + both reads)",
            "danaus": f"{whole * 1e3:.2f} ms median",
            "detail": f"first one {cold['seconds'] * 1e3:.1f} ms (replicas dial the trainer)",
            "floor": f"{2 * copy * 1e6:.0f} us memcpy x2",
            "ratio": f"{whole / (2 * copy):.0f}x",
        },
    ]


def main() -> None:
    rows = uvloop.run(_run())
    print(format_table(rows, ["figure", "danaus", "detail", "floor", "ratio"]))


if __name__ == "__main__":
    main()
