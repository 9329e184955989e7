"""RDMA microbenchmark, like perftest's ``ib_read_bw`` / ``ib_write_bw``.

``python -m danaus.rdma.bench`` (or ``danaus rdma-bench``) spawns two procs, an owner and a
reader, and for every backend available (or those named with ``--backend``) sweeps sizes
from 4 KiB to 256 MiB, ``read_into`` and ``write_from``, with warm-up and iterations. It
prints a table (size, backend, op, GB/s, median and p99 latency), and the floors measured
in the same run: memcpy of the same size, and a raw one-way TCP loopback transfer.
``--json`` prints machine-readable rows, ``--plot out.png`` draws bandwidth against size.
``--hosts tcp://h1:port tcp://h2:port`` puts owner and reader on two host agents.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from danaus.actors import Actor, endpoint
from danaus.config import config

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]


def _iters(size: int) -> int:
    return max(5, min(200, (256 * MiB) // size))


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


class Owner(Actor):
    def __init__(self, size: int) -> None:
        from danaus.rdma import RDMABuffer

        self.data = np.ones(size, np.uint8)  # touched: first-touch faults are not measured
        self.buf = RDMABuffer(self.data)

    @endpoint
    def buffer(self) -> Any:
        return self.buf


class Reader(Actor):
    def __init__(self, size: int) -> None:
        self.dst = np.ones(size, np.uint8)

    @endpoint
    async def sweep(
        self, buf: Any, backend: str, sizes: list[int], ops: list[str]
    ) -> list[dict[str, Any]]:
        from danaus.rdma import get_rdma_backend

        config.rdma_backend = backend
        assert get_rdma_backend(buf) == backend
        rows = []
        full = buf.size()
        for size in sizes:
            view = memoryview(self.dst)[:size]  # type: ignore[arg-type]
            offset = full - size
            for op in ops:
                fn = buf.read_into if op == "read" else buf.write_from
                for _ in range(3):
                    await fn(view, offset=offset)
                samples = []
                for _ in range(_iters(size)):
                    t = time.perf_counter()
                    await fn(view, offset=offset)
                    samples.append(time.perf_counter() - t)
                med = statistics.median(samples)
                rows.append(
                    {
                        "size": size,
                        "backend": backend,
                        "op": op,
                        "GB/s": size / med / 1e9,
                        "median_us": med * 1e6,
                        "p99_us": _pct(samples, 99) * 1e6,
                    }
                )
        return rows


def memcpy_floor(size: int) -> float:
    src, dst = np.ones(size, np.uint8), np.zeros(size, np.uint8)
    np.copyto(dst, src)
    times = []
    for _ in range(_iters(size)):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return size / statistics.median(times) / 1e9


_SENDER = """
import socket, sys
n, iters, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
buf = memoryview(bytearray(b"x" * n))
for _ in range(iters):
    s.sendall(buf)
    s.recv(1)
s.close()
"""


def tcp_floor(size: int, iters: int = 5) -> float:
    """One-way raw TCP loopback, another process to this one, into a reused buffer."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port = ls.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", _SENDER, str(size), str(iters + 1), str(port)])
    try:
        ls.settimeout(30)
        conn, _ = ls.accept()
        conn.settimeout(30)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        buf = memoryview(bytearray(size))
        times = []
        for i in range(iters + 1):
            t = time.perf_counter()
            got = 0
            while got < size:
                got += conn.recv_into(buf[got:])
            if i:
                times.append(time.perf_counter() - t)
            conn.sendall(b"k")
        conn.close()
    finally:
        ls.close()
        child.wait(timeout=30)
    return size / statistics.median(times) / 1e9


async def run(
    sizes: list[int], backends: list[str] | None, ops: list[str], hosts: list[str] | None
) -> list[dict[str, Any]]:
    from danaus.mesh import attach_to_hosts, this_host
    from danaus.rdma._manager import PREFERENCE, manager

    biggest = max(sizes)
    if hosts:
        mesh = attach_to_hosts(hosts).spawn_procs(per_host={"procs": 1})
        owner_procs, reader_procs = mesh.slice(hosts=0), mesh.slice(hosts=1)
    else:
        mesh = this_host().spawn_procs(per_host={"procs": 2})
        owner_procs, reader_procs = mesh.slice(procs=0), mesh.slice(procs=1)
    async with mesh:
        owner = await owner_procs.spawn("owner", Owner, biggest)
        reader = await reader_procs.spawn("reader", Reader, biggest)
        buf = await owner.buffer.call_one()
        available = [
            b
            for b in PREFERENCE
            if b in manager().backends and manager().backends[b].reaches(buf.handle)
        ]
        rows: list[dict[str, Any]] = []
        for backend in backends or available:
            rows += await reader.sweep.call_one(buf, backend, sizes, ops)
    return rows


def _fmt_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="danaus rdma-bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="", help="comma-separated byte counts (default 4KiB..256MiB)")
    p.add_argument("--backend", action="append", help="only these backends (repeatable)")
    p.add_argument("--op", choices=["read", "write", "both"], default="both")
    p.add_argument("--hosts", nargs=2, metavar="AGENT", help="owner and reader host agents")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.add_argument("--plot", metavar="PNG", help="draw bandwidth vs size into this file")
    ns = p.parse_args(argv)
    sizes = [int(s) for s in ns.sizes.split(",")] if ns.sizes else DEFAULT_SIZES
    ops = ["read", "write"] if ns.op == "both" else [ns.op]
    import uvloop

    rows = uvloop.run(run(sizes, ns.backend, ops, ns.hosts))
    floors = {
        s: {"memcpy": memcpy_floor(s), "tcp": tcp_floor(s, 3 if s >= 64 * MiB else 5)}
        for s in sizes
    }
    for r in rows:
        f = floors[r["size"]]
        r["memcpy_GB/s"], r["raw_tcp_GB/s"] = f["memcpy"], f["tcp"]
        r["vs_floor"] = r["GB/s"] / (f["tcp"] if r["backend"] == "tcp" else f["memcpy"])
    if ns.json:
        print(json.dumps(rows, indent=1))
    else:
        print(
            f"{'size':>8} {'backend':>8} {'op':>5} {'GB/s':>7} {'median us':>10} {'p99 us':>9}"
            f" {'floor GB/s':>11} {'ratio':>6}"
        )
        for r in rows:
            floor = r["raw_tcp_GB/s"] if r["backend"] == "tcp" else r["memcpy_GB/s"]
            print(
                f"{_fmt_size(r['size']):>8} {r['backend']:>8} {r['op']:>5} {r['GB/s']:7.2f} "
                f"{r['median_us']:10.1f} {r['p99_us']:9.1f} {floor:11.2f} {r['vs_floor']:6.2f}"
            )
        print(
            "floors, same run: memcpy of the same size (shm, ibverbs rows), raw one-way TCP "
            "loopback into a reused buffer (tcp rows)"
        )
    if ns.plot:
        _plot(rows, floors, ns.plot)


def _plot(rows: list[dict[str, Any]], floors: dict[int, dict[str, float]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("--plot needs matplotlib (pip install matplotlib)")
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in sorted({(r["backend"], r["op"]) for r in rows}):
        pts = [(r["size"], r["GB/s"]) for r in rows if (r["backend"], r["op"]) == key]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{key[0]} {key[1]}")
    sizes = sorted(floors)
    ax.plot(sizes, [floors[s]["memcpy"] for s in sizes], "k--", label="memcpy (floor)")
    ax.plot(sizes, [floors[s]["tcp"] for s in sizes], "k:", label="raw TCP (floor)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("transfer size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title("danaus RDMA data plane: bandwidth vs size")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"plot written to {path}")


if __name__ == "__main__":
    # Run as danaus.rdma.bench, not __main__: its actor classes then pickle by reference,
    # and the Reader's `config` is its proc's own (a copy would take rdma_backend).
    from danaus.rdma.bench import main as _main

    _main()
