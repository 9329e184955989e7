"""A mesh that simulates instead of computing: Monarch's ``Simulator``, with costs measured.

``Simulator(hosts, gpus).mesh`` is a tensor-engine mesh with no procs behind it. Under
its ``activate()`` torch calls make DTensors as on a real mesh (the controller records
the same commands); the commands go to a simulated worker instead, which runs each
operation on meta tensors (shapes and dtypes, no values) and times it from a cost
table: an operation, its arguments' shapes and dtypes, measured on this machine the
first time they are seen (running it on real tensors of those shapes), kept on disk by
device kind, or given (``costs=``). A collective takes the link's latency and its bytes
over the link's bandwidth (a ring: ``2 (n - 1) / n`` of the bytes for an all-reduce);
by default the link is this host's shared memory, measured (memcpy bandwidth, a local
socket's round trip).

Every worker runs the same commands (the controller sends each its own copy), so their
timelines are alike; per worker and stream, an operation starts when its stream is free
and its inputs are ready (a borrow makes one stream wait for another), and a collective
when every participant has reached it. ``display()`` prints each worker's streams (busy,
idle, end) and peak memory, and writes the timeline as a Chrome trace (Perfetto,
``chrome://tracing``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any

import torch

from .._os import trim_malloc
from ..actors.seam import Future, current_runtime
from ._client import _Client, _scope, no_mesh
from ._worker import BORROW, CALL, FREE, PULL, REDUCE, Ref, _flatten, _op
from .opaque_ref import GroupWire, OpaqueWire

__all__ = ["SimulatedMesh", "Simulator"]

TRACE_MODES = ("stream_only", "stream_and_memory")
MAIN = "main"  # the name of the default stream in reports


class SimulationWarning(UserWarning):
    """A simulated tensor's values were asked for: they are not computed."""


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(root) / "danaus"


class CostTable:
    """Seconds per operation, keyed by the operation and its arguments' shapes and
    dtypes: given, read from disk, or measured here on first sight (and saved)."""

    def __init__(self, given: dict[str, float] | str | os.PathLike[str] | None, cache: Path | None):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        name = f"simulator-costs-{COSTS_VERSION}-{self.device}.json"
        self.path = cache / name if cache is not None else None
        self.costs: dict[str, float] = {}
        if self.path is not None and self.path.exists():
            with contextlib.suppress(OSError, ValueError):
                self.costs.update(json.loads(self.path.read_text()))
        if isinstance(given, (str, os.PathLike)):
            given = dict(json.loads(Path(given).read_text()))
        self.given = dict(given or {})
        self.measured = 0  # (new this run)
        #: how much slower than measured a worker computes (cores shared), see Simulator
        self.sharing = 1.0
        self.unmeasurable: dict[str, str] = {}

    def cost(self, name: str, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> float:
        if "::" in name and "." not in name.partition("::")[2]:
            name += ".default"  # (as torch names an op's overload)
        key = f"{name}|{_signature(args)}|{_signature(kwargs)}"
        if key in self.given:
            return self.given[key]
        if name in self.given:  # a cost for every call of the op
            return self.given[name]
        if key not in self.costs:
            self.costs[key] = self._measure(key, fn, args, kwargs)
            self.measured += 1
        return self.costs[key] * self.sharing  # (measured alone, on one core)

    def engine(self, name: str, measure: Callable[[], float]) -> float:
        """Seconds of the engine's own work ``name`` (:data:`COLLECTIVE`):
        given (``costs=``, by that name), kept on disk, or measured here once."""
        if name in self.given:
            return self.given[name]
        if name not in self.costs:
            self.costs[name] = measure()
            self.measured += 1
        return self.costs[name] * self.sharing

    def _measure(
        self, key: str, fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]
    ) -> float:
        """The fastest of three runs after a warm-up, each on new arguments (in-place
        operations change theirs); on CPU, each with the memory glibc's malloc holds
        freed given back to the OS first, so that the operation's outputs land on fresh
        pages, as a step's do: a worker frees a step's tensors as the controller drops
        them, and glibc returns that memory (past its trim threshold) to the OS, so a
        large output is paged in again each time. Measured on one proc of the bench's
        DDP step (768-wide layers, 512 rows): each ReLU took 0.65 ms there and 0.2 ms
        timed on warm memory, 0.45 ms timed this way (its backward 0.7, 0.2 and 0.5); the
        matmuls 22 ms a step there, 18 and 22."""
        try:
            real_args, real_kwargs = _real(args), _real(kwargs)
            fn(*real_args, **real_kwargs)  # warm
            best = float("inf")
            for _ in range(3):
                real_args, real_kwargs = _real(args), _real(kwargs)  # (in-place ops)
                if self.device == "cpu":
                    trim_malloc()
                start = time.perf_counter()
                fn(*real_args, **real_kwargs)
                best = min(best, time.perf_counter() - start)
            return best
        except Exception as e:
            self.unmeasurable[key] = f"{type(e).__name__}: {e}"
            return 0.0

    def save(self) -> None:
        if self.path is None or not self.measured:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.costs, sort_keys=True))
            tmp.replace(self.path)


#: measured costs kept on disk are of this way of measuring (an older file is not read)
COSTS_VERSION = 2
#: the name of the engine's own cost of a collective in a cost table: its seconds beyond
#: its bytes and its hops. (A worker's own per command, beyond the operation, measured
#: 0.7 us on its real loop: not counted.)
COLLECTIVE = "danaus::collective"


def _measure_collective() -> float:
    """A collective's own seconds beyond its bytes and hops: on CPU, gloo's all-reduce of
    one number in a group of one (the hand-off to its threads and back), the median of
    50; on a GPU, nothing measured here (the link's latency stands for it)."""
    if torch.cuda.is_available():
        return 0.0
    try:
        import datetime

        import torch.distributed as dist

        group: Any = dist.ProcessGroupGloo(
            dist.HashStore(),  # type: ignore[attr-defined]
            0,
            1,
            datetime.timedelta(seconds=30),
        )
    except (ImportError, AttributeError, RuntimeError):
        return 0.0
    t = torch.zeros(1)
    for _ in range(5):
        group.allreduce([t]).wait()
    times = []
    for _ in range(50):
        start = time.perf_counter()
        group.allreduce([t]).wait()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _signature(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"T{tuple(obj.shape)}{str(obj.dtype).removeprefix('torch.')}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_signature(x) for x in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{k}={_signature(v)}" for k, v in sorted(obj.items())) + "}"
    return repr(obj)


def _real(obj: Any) -> Any:
    """Real CPU (or CUDA) tensors in place of meta ones, with their shapes and strides:
    random floats, zero integers (valid indices)."""
    if isinstance(obj, torch.Tensor) and obj.device.type == "meta":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # its strides too: a transposed operand (backward's matmuls) runs at its own pace
        t = torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device=device)
        return t.normal_() if obj.dtype.is_floating_point or obj.dtype.is_complex else t.zero_()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_real(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _real(v) for k, v in obj.items()}
    if isinstance(obj, torch.device) and obj.type == "meta":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return obj


def _measure_link(device: str) -> tuple[float, float]:
    """(bytes/s, seconds) of a link between two workers of one host, measured here: on
    CPU, TCP over loopback (what gloo uses: 16 MiB sent, and half a one-byte round
    trip); on GPU, a 64 MiB device copy and a local socket's half round trip."""
    if device == "cuda":
        src = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        bandwidth = src.numel() / (time.perf_counter() - start)
        return bandwidth, _tcp(0)[1]
    return _tcp(16 << 20)


def _tcp(nbytes: int) -> tuple[float, float]:
    """(bytes/s of sending ``nbytes``, half a one-byte round trip) over loopback TCP."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    a = socket.create_connection(server.getsockname())
    b, _ = server.accept()
    server.close()
    for s in (a, b):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        trips = []
        for _ in range(20):
            start = time.perf_counter()
            a.sendall(b"x")
            b.recv(1)
            b.sendall(b"x")
            a.recv(1)
            trips.append(time.perf_counter() - start)
        bandwidth = float("inf")
        if nbytes:
            payload = bytes(nbytes)

            def drain() -> None:
                left = nbytes
                while left:
                    left -= len(b.recv(min(left, 1 << 20)))
                b.sendall(b"x")

            reader = threading.Thread(target=drain)
            reader.start()
            start = time.perf_counter()
            a.sendall(payload)
            a.recv(1)
            bandwidth = nbytes / (time.perf_counter() - start)
            reader.join(timeout=30)
    finally:
        a.close()
        b.close()
    return bandwidth, min(trips) / 2


@dataclass
class Event:
    """One simulated operation on one stream (every worker's timeline is the same)."""

    name: str
    stream: str
    start: float
    end: float
    collective: int | None = None  # its number, linking it across workers
    live_bytes: int = 0


@dataclass
class _Timeline:
    streams: dict[str, float] = field(default_factory=dict)  # when each is free
    ready: dict[int, float] = field(default_factory=dict)  # when each tensor is
    table: dict[int, Any] = field(default_factory=dict)  # meta tensors (and values)
    sizes: dict[int, int] = field(default_factory=dict)  # bytes each id holds
    live: int = 0
    peak: int = 0
    events: list[Event] = field(default_factory=list)
    floor: float = 0.0  # no command of the batch being run starts before (it was sent)


class _SimClient(_Client):
    """A mesh's tensor engine with a simulator where the workers would be."""

    def __init__(self, sim: Simulator, mesh: SimulatedMesh) -> None:  # (no procs)
        self.procs = mesh  # type: ignore[assignment]
        self.sim = sim
        self.sizes = dict(mesh.sizes)
        n = 1
        for s in self.sizes.values():
            n *= s
        self.global_ranks = list(range(n))
        self.rendezvous = ("simulator", id(mesh))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._init_commands()
        self.timeline = _Timeline()
        self._streams_of: list[str | None] = []  # the stream each command was issued on
        #: the controller's clock: seconds since this mesh's first command, less the time
        #: the simulation itself took (a batch reaches the workers when it is sent)
        self._started: float | None = None
        self.simulating = 0.0

    def __repr__(self) -> str:
        return f"<simulated tensor engine of {self.procs!r}>"

    def issue(self, cmd: tuple[Any, ...]) -> None:
        with self.lock:
            if self._started is None:
                self._started = time.perf_counter()
            self._streams_of.append(self.stream)
        super().issue(cmd)

    def clock(self) -> float:
        if self._started is None:
            return 0.0
        return time.perf_counter() - self._started - self.simulating

    def _send(self, batch: list[tuple[Any, ...]], seq: int) -> None:
        """To the simulator, not to workers: the batch, sent now by the controller's
        clock (the frees, added at its end by ``flush``, on no stream)."""
        streams, self._streams_of = self._streams_of, []
        streams += [None] * (len(batch) - len(streams))
        sent_at = self.clock()
        started = time.perf_counter()
        self.sim.run_batch(self, batch, streams, sent_at)
        self.simulating += time.perf_counter() - started

    def barrier(self) -> int:
        self.flush()
        self.synced = self.sent
        return self.sent

    def fetch(self, t: Any, coords: dict[str, int]) -> Future[Any]:
        self.flush()
        unknown = sorted(set(coords) - set(self.sizes))
        if unknown:
            raise ValueError(f"fetch_shard: {unknown} are not dims of this mesh {self.sizes}")
        warnings.warn(
            "a simulated tensor's values are not computed: fetch_shard gives zeros of its "
            "shape and dtype",
            SimulationWarning,
            stacklevel=3,
        )
        f: Future[Any] = Future(loop=current_runtime().loop)
        f.set_result(torch.zeros(tuple(t.shape), dtype=t.dtype))
        return f


class SimulatedMesh:
    """A simulator's mesh: ``activate()`` it as a proc mesh; ``rename`` its dims."""

    def __init__(self, sim: Simulator, sizes: dict[str, int]) -> None:
        self._sim = sim
        self.sizes = dict(sizes)
        self._client: _SimClient | None = None

    def __repr__(self) -> str:
        return f"SimulatedMesh({self.sizes})"

    def __len__(self) -> int:
        n = 1
        for s in self.sizes.values():
            n *= s
        return n

    def size(self, dim: str | None = None) -> int:
        return len(self) if dim is None else self.sizes[dim]

    def rename(self, **names: str) -> SimulatedMesh:
        """The same simulated devices with dims renamed: ``rename(gpu="dp")``."""
        unknown = sorted(set(names) - set(self.sizes))
        if unknown:
            raise ValueError(f"rename: {unknown} are not dims of {self.sizes}")
        return SimulatedMesh(self._sim, {names.get(d, d): s for d, s in self.sizes.items()})

    def client(self) -> _SimClient:
        if self._client is None:
            self._client = _SimClient(self._sim, self)
            self._sim.clients.append(self._client)
        return self._client

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        """Inside, torch calls make simulated DTensors on this mesh."""
        return _scope(self.client())

    def slice(self, **coords: Any) -> Any:
        raise NotImplementedError(
            "a simulated mesh is not sliced: simulate the slice's own mesh instead"
        )


class Simulator:
    """Monarch's ``Simulator(hosts, gpus, trace_mode=...)``: ``simulator.mesh`` (dims
    ``host``, ``gpu``) simulates instead of computing; ``display()`` tells what it would
    have taken.

    Args:
        hosts: hosts of the simulated mesh.
        gpus: devices per host.
        trace_mode: ``"stream_only"`` (each worker's streams) or ``"stream_and_memory"``
            (with each worker's memory, as a counter track).
        trace_path: where ``display()`` writes the Chrome trace (``None``: nowhere).
        costs: seconds per operation (a dict, or a JSON file of one) as this simulator
            keys them (``aten::addmm.default|[T(4,)float32,...]|{}``, as a measured
            table on disk has them, e.g. recorded on a GPU machine), or by operation
            name alone (``aten::mm.default``); what is not given is measured here.
        link_bandwidth: bytes/s of a link between devices (default: measured, this
            host's shared memory).
        link_latency: seconds of a message over it (default: measured, a local socket).
        cost_cache: where measured costs are kept (default ``~/.cache/danaus``; ``None``
            keeps nothing).
        cores: CPU cores of a simulated host (default: this machine's); a CPU mesh's
            workers share them, each a core while there are enough.
    """

    def __init__(
        self,
        hosts: int = 1,
        gpus: int = 1,
        *,
        trace_mode: str = "stream_only",
        trace_path: str | os.PathLike[str] | None = "trace.json",
        costs: dict[str, float] | str | os.PathLike[str] | None = None,
        link_bandwidth: float | None = None,
        link_latency: float | None = None,
        cost_cache: str | os.PathLike[str] | EllipsisType | None = ...,
        cores: int | None = None,
        **unused: Any,
    ) -> None:
        if trace_mode not in TRACE_MODES:
            raise ValueError(f"trace_mode must be one of {TRACE_MODES}, not {trace_mode!r}")
        for name, v in (("hosts", hosts), ("gpus", gpus)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, not {v!r}")
        self.trace_mode = trace_mode
        self.trace_path = None if trace_path is None else Path(trace_path)
        if isinstance(cost_cache, EllipsisType):
            cache: Path | None = _cache_dir()
        else:
            cache = None if cost_cache is None else Path(cost_cache)
        self.costs = CostTable(costs, cache)
        if link_bandwidth is None or link_latency is None:
            measured_bw, measured_lat = _measure_link(self.costs.device)
            link_bandwidth = measured_bw if link_bandwidth is None else link_bandwidth
            link_latency = measured_lat if link_latency is None else link_latency
        self.link_bandwidth, self.link_latency = float(link_bandwidth), float(link_latency)
        #: on CPU, a host's workers and the controller share its cores: a measured cost
        #: (alone, on one core) is this much longer there; a GPU is a worker's own
        self.cores = cores if cores is not None else len(os.sched_getaffinity(0))
        if self.costs.device == "cpu":
            self.costs.sharing = max(1.0, (gpus + 1) / self.cores)
        self.mesh = SimulatedMesh(self, {"host": hosts, "gpu": gpus})
        self.clients: list[_SimClient] = []
        self._collectives = 0

    def __repr__(self) -> str:
        return f"Simulator({self.mesh.sizes}, trace_mode={self.trace_mode!r})"

    # ------------------------------------------------------------ running the commands

    def run_batch(
        self,
        client: _SimClient,
        batch: list[tuple[Any, ...]],
        streams: list[str | None],
        sent_at: float = 0.0,
    ) -> None:
        """Simulate one batch of commands, which the controller sent at ``sent_at``
        (its clock): no worker starts one before."""
        tl = client.timeline
        tl.floor = max(tl.floor, sent_at)
        with no_mesh():  # (the simulation's own torch calls are local ones)
            self._run_here(client, batch, streams)
        self.costs.save()

    def _run_here(
        self, client: _SimClient, batch: list[tuple[Any, ...]], streams: list[str | None]
    ) -> None:
        tl = client.timeline
        for cmd, stream in zip(batch, streams, strict=True):
            kind = cmd[0]
            if kind == FREE:
                for i in cmd[1]:
                    tl.table.pop(i, None)
                    tl.ready.pop(i, None)
                    tl.live -= tl.sizes.pop(i, 0)
            elif kind == CALL:
                self._call(client, tl, cmd)
            elif kind == REDUCE:
                self._reduce(client, tl, cmd, stream)
            elif kind == BORROW:
                _, src, from_stream, to_stream, out_ids, _ = cmd
                src_stream, dst_stream = from_stream or MAIN, to_stream or MAIN
                at = max(tl.streams.get(src_stream, tl.floor), tl.ready.get(src.i, 0.0))
                tl.streams[dst_stream] = max(tl.streams.get(dst_stream, 0.0), at)
                for i in out_ids:
                    tl.table[i] = tl.table.get(src.i)
                    tl.ready[i] = at
            elif kind == PULL:
                raise NotImplementedError("moving tensors between simulated meshes")

    def _resolve(self, tl: _Timeline, obj: Any, deps: list[float]) -> Any:
        t = type(obj)
        if isinstance(obj, Ref):
            deps.append(tl.ready.get(obj.i, 0.0))
            return tl.table.get(obj.i)
        if t is tuple or t is list:
            return t([self._resolve(tl, x, deps) for x in obj])
        if t is GroupWire or t is OpaqueWire:
            raise NotImplementedError("process groups and opaque references are not simulated")
        if isinstance(obj, torch.Tensor):
            return obj.to("meta")
        return obj

    def _call(self, client: _SimClient, tl: _Timeline, cmd: tuple[Any, ...]) -> None:
        _, fn, args, kwargs, out_ids, written, _where, _, stream = cmd
        deps: list[float] = []
        margs = self._resolve(tl, args, deps)
        mkwargs = {k: self._resolve(tl, v, deps) for k, v in (kwargs or {}).items()}
        if "device" in mkwargs:
            mkwargs["device"] = torch.device("meta")
        name = fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))
        op = _op(fn) if isinstance(fn, str) else fn
        result = op(*margs, **mkwargs)
        cost = self.costs.cost(name, op, margs, mkwargs)
        s = stream or MAIN
        start = max([tl.streams.get(s, 0.0), tl.floor, *deps])
        end = start + cost
        tl.streams[s] = end
        outs: list[Any] = []
        if out_ids:
            if isinstance(result, torch.Tensor):
                outs = [result]
            else:
                _flatten(result, outs)
        fresh = _fresh_outputs(fn, len(outs))
        for i, r, new in zip(out_ids, outs, fresh, strict=False):
            tl.table[i] = r
            tl.ready[i] = end
            nbytes = r.numel() * r.element_size() if new and isinstance(r, torch.Tensor) else 0
            tl.sizes[i] = nbytes
            tl.live += nbytes
        for i in written:
            tl.ready[i] = end
        tl.peak = max(tl.peak, tl.live)
        tl.events.append(Event(_short(name), s, start, end, live_bytes=tl.live))

    def _reduce(
        self, client: _SimClient, tl: _Timeline, cmd: tuple[Any, ...], stream: str | None
    ) -> None:
        _, src, dims, op, scatter, shape, dtype, out_ids, _ = cmd
        n = 1
        for d in dims:
            n *= client.sizes[d]
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * itemsize
        out_shape = list(shape)
        if op == "stack":
            moved = (n - 1) * nbytes  # an all-gather: every other rank's part comes in
            if not scatter:
                out_shape = [n, *out_shape]
        elif scatter:
            moved = (n - 1) * nbytes // n  # a reduce-scatter
            out_shape[0] //= n
        else:
            moved = 2 * (n - 1) * nbytes // n  # a ring all-reduce
        # the engine's collective is two (a flag saying whether any rank's input failed,
        # then the tensor), and the work a worker does around it, measured as any
        # operation is: a copy of the tensor to reduce into (and the average's division),
        # or the stack of the gathered parts
        cost = self._around_reduce(shape, dtype, op, scatter, n)
        cost += 2 * self.costs.engine(COLLECTIVE, _measure_collective)
        if n > 1:
            cost += 4 * (n - 1) * self.link_latency + moved / self.link_bandwidth
        s = stream or MAIN
        # every participant runs the same commands: they reach it at the same time
        start = max(tl.streams.get(s, 0.0), tl.floor, tl.ready.get(src.i, 0.0))
        end = start + cost
        tl.streams[s] = end
        self._collectives += 1
        out = torch.empty(out_shape, dtype=dtype, device="meta")
        for i in out_ids:
            tl.table[i] = out
            tl.ready[i] = end
            size = out.numel() * out.element_size()
            tl.sizes[i] = size
            tl.live += size
        tl.peak = max(tl.peak, tl.live)
        what = f"reduce {op} over {'x'.join(dims)}" + (" (scatter)" if scatter else "")
        tl.events.append(Event(what, s, start, end, self._collectives, tl.live))

    def _around_reduce(
        self, shape: Any, dtype: torch.dtype, op: str, scatter: bool, n: int
    ) -> float:
        """Seconds of a worker's own work around a collective of ``n`` ranks (as
        ``TensorWorker._collective`` does it), each operation costed from the table."""
        t = torch.empty(tuple(shape), dtype=dtype, device="meta")
        aten, cost = torch.ops.aten, self.costs.cost
        if op == "stack":
            return cost("aten::stack", aten.stack.default, ([t] * n,), {})
        seconds = cost("aten::clone", aten.clone.default, (t,), {})
        if op == "avg":
            seconds += cost("aten::div_.Scalar", aten.div_.Scalar, (t, n), {})
        if scatter and t.dim() > 0 and t.shape[0] >= n:
            part = torch.empty((t.shape[0] // n, *t.shape[1:]), dtype=dtype, device="meta")
            seconds += cost("aten::clone", aten.clone.default, (part,), {})
        return seconds

    # ------------------------------------------------------------ what it would have taken

    def _flush_all(self) -> None:
        for c in self.clients:
            c.flush()

    def summary(self) -> dict[str, Any]:
        """Per simulated mesh: its dims, per stream busy, idle and end (seconds), the end
        of the work (the controller's clock: a batch starts when it was sent) and its span
        from the first operation, and each worker's peak bytes (every worker alike)."""
        self._flush_all()
        out = []
        for c in self.clients:
            tl = c.timeline
            end = max(tl.streams.values(), default=0.0)
            streams = {}
            for s in sorted(tl.streams, key=lambda s: (s != MAIN, s)):
                busy = sum(e.end - e.start for e in tl.events if e.stream == s)
                streams[s] = {"busy_s": busy, "idle_s": end - busy, "end_s": tl.streams[s]}
            out.append(
                {
                    "mesh": dict(c.sizes),
                    "workers": len(c.global_ranks),
                    "end_s": end,
                    # from the first operation's start: the work without the controller's
                    # time before it sent it
                    "span_s": end - min((e.start for e in tl.events), default=0.0),
                    "streams": streams,
                    "peak_bytes": tl.peak,
                    "operations": sum(1 for e in tl.events if e.collective is None),
                    "collectives": sum(1 for e in tl.events if e.collective is not None),
                }
            )
        return {"meshes": out, "costs_measured_here": self.costs.measured}

    def display(self) -> None:
        """Print what each worker's streams did (busy, idle, the end of the work) and
        each worker's peak memory, and write the trace (``trace_path``)."""
        summary = self.summary()
        for m in summary["meshes"]:
            print(
                f"simulated mesh {m['mesh']}: {m['operations']} operations, "
                f"{m['collectives']} collectives, the work ends at {_ms(m['end_s'])} "
                f"(costs: {self.costs.device}, measured here; links "
                f"{self.link_bandwidth / 1e9:.1f} GB/s, {self.link_latency * 1e6:.0f} us)"
            )
            print(f"  {'worker':<8}{'stream':<12}{'busy':>12}{'idle':>12}{'end':>12}")
            for w in range(m["workers"]):
                for s, v in m["streams"].items():
                    print(
                        f"  {w:<8}{s:<12}{_ms(v['busy_s']):>12}{_ms(v['idle_s']):>12}"
                        f"{_ms(v['end_s']):>12}"
                    )
            print(f"  peak memory per worker: {_bytes(m['peak_bytes'])}")
        if self.costs.unmeasurable:
            print(f"  {len(self.costs.unmeasurable)} operation(s) could not be measured "
                  "(counted as 0 s)")  # fmt: skip
        if self.trace_path is not None:
            self.write_trace(self.trace_path)
            print(
                f"trace: {self.trace_path} (open it in https://ui.perfetto.dev or chrome://tracing)"
            )

    def trace(self) -> dict[str, Any]:
        """The timeline in Chrome's trace event format: a process per worker, a thread
        per stream, each operation a complete event, each collective linked across the
        workers by a flow; with ``stream_and_memory``, a memory counter per worker."""
        self._flush_all()
        events: list[dict[str, Any]] = []
        pid = 0
        for c in self.clients:
            names = list(c.sizes)
            for rank in range(len(c.global_ranks)):
                coords, r = {}, rank
                for d in reversed(names):
                    coords[d] = r % c.sizes[d]
                    r //= c.sizes[d]
                label = ", ".join(f"{d}={coords[d]}" for d in names)
                events.append({"ph": "M", "name": "process_name", "pid": pid,
                               "args": {"name": f"worker {rank} ({label})"}})  # fmt: skip
                tids = {
                    s: t
                    for t, s in enumerate(sorted(c.timeline.streams, key=lambda s: (s != MAIN, s)))
                }
                for s, tid in tids.items():
                    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                   "args": {"name": s}})  # fmt: skip
                for e in c.timeline.events:
                    ev = {"ph": "X", "name": e.name, "pid": pid, "tid": tids[e.stream],
                          "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6,
                          "cat": "collective" if e.collective is not None else "compute"}  # fmt: skip
                    events.append(ev)
                    if e.collective is not None:  # an arrow from worker 0 to each other
                        n = len(c.global_ranks)
                        for other in range(1, n) if rank == 0 else [rank]:
                            events.append({"ph": "s" if rank == 0 else "f", "bp": "e",
                                           "id": e.collective * n + other, "name": "collective",
                                           "cat": "collective", "pid": pid,
                                           "tid": tids[e.stream], "ts": e.start * 1e6})  # fmt: skip
                    if self.trace_mode == "stream_and_memory":
                        events.append({"ph": "C", "name": "memory", "pid": pid,
                                       "ts": e.end * 1e6, "args": {"bytes": e.live_bytes}})  # fmt: skip
                pid += 1
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.trace()))


def _fresh_outputs(fn: Any, n: int) -> list[bool]:
    """Which outputs of ``fn`` are new memory (not views of, or the very, inputs)."""
    if not isinstance(fn, str):
        return [True] * n
    try:
        returns = _op(fn)._schema.returns  # noqa: SLF001 (torch's op schema)
    except Exception:
        return [True] * n
    fresh = [r.alias_info is None for r in returns]
    return (fresh + [True] * n)[:n] if len(fresh) >= 1 else [True] * n


def _short(name: str) -> str:
    return name.removeprefix("aten::").removesuffix(".default")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
