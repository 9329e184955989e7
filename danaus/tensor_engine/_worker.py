"""The tensor-engine worker: one actor per proc, running the controller's commands on its
shard, in order, off the proc's event loop (one executor thread)."""

from __future__ import annotations

import threading
import traceback
from typing import Any

import torch

from ..actors import Actor, current_rank, endpoint
from ..config import config
from ..errors import RemoteException
from .opaque_ref import GroupWire, OpaqueRef, OpaqueWire, on_worker


class Ref:
    """Stands for the worker-side tensor with id ``i`` in a command's arguments."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.i,))

    def __repr__(self) -> str:
        return f"Ref({self.i})"


class Failed:
    """What a result id holds when its operation failed (or depended on one that did)."""

    def __init__(self, exc_type: str, message: str, tb: str, issued_at: str) -> None:
        self.exc_type = exc_type
        self.message = message
        self.tb = tb
        self.issued_at = issued_at


#: this proc's workers, by their controller's rendezvous address (one per activated mesh)
_workers: dict[tuple[Any, ...], TensorWorker] = {}


def local_shard(rendezvous: tuple[Any, ...], i: int, seq: int) -> Any:
    """This proc's shard of a DTensor passed to an actor (what it unpickles to)."""
    worker = _workers.get(tuple(rendezvous))
    if worker is None:
        raise RuntimeError(
            "a DTensor reached a proc that holds none of its shards: pass it to actors "
            "on the procs of its own mesh"
        )
    worker.wait_for(seq, SHARD_TIMEOUT)
    return worker.shard(i)


#: how long (s) an actor's argument waits for the commands that make its shard (the
#: controller waited for them before sending it: this is a safety net)
SHARD_TIMEOUT = 30

#: command kinds
CALL, FREE, REDUCE, PULL, BORROW = range(5)

_ops: dict[str, Any] = {}


def _op(name: str) -> Any:
    """The ATen operation called ``name`` (``aten::add_.Tensor``)."""
    op = _ops.get(name)
    if op is None:
        ns, _, rest = name.partition("::")
        base, _, overload = rest.partition(".")
        op = _ops[name] = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    return op


def _resolve(
    obj: Any, table: dict[int, Any], device: torch.device, worker: TensorWorker | None = None
) -> Any:
    t = type(obj)
    if t is Ref:
        v = table[obj.i]
        if type(v) is Failed:
            raise _Propagate(v)
        return v
    if t is tuple or t is list:
        return t([_resolve(x, table, device, worker) for x in obj])
    if t is OpaqueWire:
        return OpaqueRef._create(_resolve(obj.key, table, device))  # noqa: SLF001
    if t is GroupWire:
        if worker is None:
            raise TypeError("a process group can only be an argument of a @remote function")
        return worker._group(obj.dims)[0]  # noqa: SLF001 - the worker's own groups
    if t is torch.Tensor and obj.device != device:
        return obj.to(device)  # a local tensor of the controller, replicated
    return obj


class _Propagate(Exception):
    def __init__(self, failed: Failed) -> None:
        self.failed = failed


_REDUCE_OPS = {"sum": "SUM", "avg": "SUM", "min": "MIN", "max": "MAX"}


class TensorWorker(Actor):
    """Holds this proc's shards in a table and runs the command stream on them."""

    def __init__(
        self,
        rendezvous: tuple[str, int],
        world: int,
        sizes: dict[str, int],
        global_ranks: list[int] | None = None,
    ) -> None:
        # Our index in the mesh the controller activated (a slice: not our root rank).
        root_rank = current_rank().rank
        self.rank = global_ranks.index(root_rank) if global_ranks else root_rank
        self.world = world
        self.mesh_sizes = sizes
        self.rendezvous = rendezvous
        self.table: dict[int, Any] = {}
        self.groups: dict[tuple[str, ...], Any] = {}
        self.streams: dict[str, Any] = {}
        self.store: Any = None
        self.seq = 0  # the last batch run
        self.done = threading.Condition()
        _workers[tuple(rendezvous)] = self
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        torch.manual_seed(self.rank)
        on_worker()  # this process holds the objects of OpaqueRefs

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.groups.clear()
        if _workers.get(tuple(self.rendezvous)) is self:
            del _workers[tuple(self.rendezvous)]

    # Every endpoint is sync: they run in order on the actor's own thread, so a fetch or
    # a publish sees the commands sent before it, and the proc's loop stays free (a
    # DTensor argument of another actor's call waits for its shard off that loop).

    @endpoint
    def run(self, cmds: list[tuple[Any, ...]], seq: int = 0) -> None:
        try:
            start = 0
            for i, cmd in enumerate(cmds):
                if cmd[0] == PULL:  # a transfer from another mesh: in order
                    self._execute(cmds[start:i])
                    self._pull(cmd)
                    start = i + 1
            self._execute(cmds[start:])
        finally:
            with self.done:
                self.seq = max(self.seq, seq)
                self.done.notify_all()

    def _pull(self, cmd: tuple[Any, ...]) -> None:
        _, bufs, shape, dtype, out_ids, where = cmd
        try:
            buf = bufs[self.rank]
            dst = torch.empty(shape, dtype=dtype)
            try:
                buf.read_into(dst.view(-1).view(torch.uint8) if dst.numel() else dst).get()
            finally:
                buf.drop().get()  # our snapshot has served its purpose: its owner frees it
            value: Any = dst.to(self.device)
        except Exception as e:
            value = Failed(
                type(e).__qualname__, str(e), "".join(traceback.format_exception(e)), where
            )
        for i in out_ids:
            self.table[i] = value

    @endpoint
    def publish(self, i: int, readers: list[int]) -> list[Any]:
        """Shard ``i`` for ``readers[rank]`` procs of another mesh to pull: a snapshot
        each (later commands may change the shard before they pull), which each reader
        drops once it has read it."""
        from ..rdma import RDMABuffer

        n = readers[self.rank]
        if not n:
            return []
        v = self.shard(i)
        t = v.detach().to("cpu", copy=True).contiguous().view(-1).view(torch.uint8)
        return [RDMABuffer(t) for _ in range(n)]

    @endpoint
    def fetch(self, i: int) -> Any:
        v = self.shard(i)
        # A copy: the shard itself may change (later commands) while the reply is sent.
        return v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v

    @endpoint
    def call_function(self, fn: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """``fn`` on this worker's shards (after the batches sent before), its result
        fetched: ``remote(fn).call(...)``."""
        args = _resolve(args, self.table, self.device)
        kwargs = {k: _resolve(v, self.table, self.device) for k, v in kwargs.items()}
        out = fn(*args, **kwargs)
        return out.detach().to("cpu", copy=True) if isinstance(out, torch.Tensor) else out

    @endpoint
    def table_stats(self) -> dict[str, int]:
        return {"live": len(self.table)}

    def shard(self, i: int) -> Any:
        """Tensor ``i`` as the commands so far left it; raises if its op failed."""
        if i not in self.table:
            raise KeyError(f"no tensor {i} on this worker (freed?)")
        v = self.table[i]
        if type(v) is Failed:
            raise RemoteException(
                f"tensor_worker[{self.rank}]",
                current_rank_text(self),
                v.exc_type,
                v.message,
                v.tb,
                v.issued_at,
            )
        return v

    def wait_for(self, seq: int, timeout: float) -> None:
        """Block until the batch numbered ``seq`` ran (another actor's thread calls it)."""
        with self.done:
            if not self.done.wait_for(lambda: self.seq >= seq, timeout):
                raise TimeoutError(
                    f"the tensor engine's worker did not run batch {seq} within {timeout} s"
                )

    # ------------------------------------------------------------ execution

    def _execute(self, cmds: list[tuple[Any, ...]]) -> None:
        table = self.table
        for cmd in cmds:
            kind = cmd[0]
            if kind == FREE:
                for i in cmd[1]:
                    table.pop(i, None)
                continue
            if kind == CALL:
                out_ids, written, where = cmd[4], cmd[5], cmd[6]
            else:
                out_ids, written, where = cmd[-2], (), cmd[-1]
            try:
                result = self._one(kind, cmd)
            except _Propagate as p:
                for i in (*out_ids, *written):
                    table[i] = p.failed
                continue
            except Exception as e:
                failed = Failed(
                    type(e).__qualname__, str(e), "".join(traceback.format_exception(e)), where
                )
                for i in (*out_ids, *written):
                    table[i] = failed
                continue
            if not out_ids:
                continue
            if isinstance(result, torch.Tensor):
                table[out_ids[0]] = result
            else:  # tuples, named tuples, lists: their tensors, in order
                tensors: list[Any] = []
                _flatten(result, tensors)
                for i, r in zip(out_ids, tensors, strict=True):
                    table[i] = r

    def _one(self, kind: int, cmd: tuple[Any, ...]) -> Any:
        table = self.table
        if kind == CALL:
            _, fn, args, kwargs, _, _, _, seed, stream = cmd
            device = self.device
            args = _resolve(args, table, device, self)
            if kwargs:
                kwargs = {k: _resolve(v, table, device, self) for k, v in kwargs.items()}
                if "device" in kwargs:
                    kwargs["device"] = device  # the mesh's device: this worker's
            if type(fn) is str:
                fn = _op(fn)
            if seed:
                self._generator().manual_seed(seed + self.rank)
            if stream is not None and device.type == "cuda":
                with torch.cuda.stream(self._stream(stream)):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)
        if kind == BORROW:
            _, src, from_stream, to_stream, _, _ = cmd
            t = _resolve(src, table, self.device)
            if self.device.type == "cuda":
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(self._stream(from_stream))
                self._stream(to_stream).wait_event(event)
            return t
        if kind == REDUCE:
            _, src, dims, op, scatter, shape, dtype, _, _ = cmd
            missing = src.i not in table
            value: Any = table.get(src.i)
            failed = value if type(value) is Failed else None
            bad = missing or failed is not None or not isinstance(value, torch.Tensor)
            if bad:
                # Join the collective anyway (the others wait in it), with zeros.
                value = torch.zeros(shape, dtype=dtype, device=self.device)
            out, anyone_failed = self._reduce(value, tuple(dims), op, scatter, bad)
            if failed is not None:
                raise _Propagate(failed)
            if bad:
                raise KeyError(
                    f"the input of this collective, tensor {src.i}, is not on this worker (freed?)"
                )
            if anyone_failed:
                raise RuntimeError(
                    "an input of this collective failed on another rank; "
                    "fetch that rank's input to see why"
                )
            return out
        raise ValueError(f"unknown command kind {kind}")

    def _generator(self) -> torch.Generator:
        if self.device.type == "cuda":
            return torch.cuda.default_generators[self.device.index or 0]
        return torch.default_generator

    def _stream(self, name: str | None) -> Any:
        """The CUDA stream for a name (None: the default stream)."""
        if name is None:
            return torch.cuda.default_stream(self.device)
        if name not in self.streams:
            self.streams[name] = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        return self.streams[name]

    def _group(self, dims: tuple[str, ...]) -> tuple[Any, int, int]:
        """The process group of the ranks that differ from ours only along ``dims``.

        Groups of this worker's own (not torch's default group): a proc may hold the
        workers of several meshes (a mesh and its slices), each with its own ranks.
        """
        import datetime

        import torch.distributed as dist

        names = list(self.mesh_sizes)
        key = tuple(sorted(dims, key=names.index))
        if key in self.groups:
            return self.groups[key]  # type: ignore[no-any-return]
        timeout = datetime.timedelta(seconds=config.collective_timeout)
        if self.store is None:
            host, port = self.rendezvous
            self.store = dist.TCPStore(host, port, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
        coords = []
        r = self.rank
        for d in reversed(names):
            coords.append(r % self.mesh_sizes[d])
            r //= self.mesh_sizes[d]
        mine = dict(zip(reversed(names), coords, strict=True))
        others = tuple((d, mine[d]) for d in names if d not in key)
        n, index = 1, 0
        for d in key:
            n *= self.mesh_sizes[d]
            index = index * self.mesh_sizes[d] + mine[d]
        store = dist.PrefixStore(f"group/{key}/{others}", self.store)  # type: ignore[attr-defined]
        if self.device.type == "cuda":
            group: Any = dist.ProcessGroupNCCL(store, index, n, dist.ProcessGroupNCCL.Options())
        else:
            group = dist.ProcessGroupGloo(store, index, n, timeout)
        self.groups[key] = (group, n, index)
        return self.groups[key]  # type: ignore[no-any-return]

    def _reduce(
        self, t: torch.Tensor, dims: tuple[str, ...], op: str, scatter: bool, failed: bool
    ) -> tuple[torch.Tensor, bool]:
        """The collective, and whether any rank's input had failed (then every result is)."""
        import torch.distributed as dist

        group, n, index = self._group(dims)
        flag = torch.tensor([1.0 if failed else 0.0], device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        group.allreduce([flag], opts).wait()
        return self._collective(t, group, n, index, op, scatter), bool(flag.item())

    def _collective(
        self, t: torch.Tensor, group: Any, n: int, index: int, op: str, scatter: bool
    ) -> torch.Tensor:
        import torch.distributed as dist

        if op == "stack":
            parts = [torch.empty_like(t) for _ in range(n)]
            group.allgather([parts], [t.contiguous()]).wait()
            out = torch.stack(parts)
            return out[index] if scatter else out
        out = t.detach().clone().contiguous()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(getattr(dist.ReduceOp, _REDUCE_OPS[op]))
        group.allreduce([out], opts).wait()
        if op == "avg":
            out /= n
        if scatter:
            out = out.chunk(n)[index].clone()
        return out


def _flatten(obj: Any, into: list[Any]) -> None:
    if isinstance(obj, torch.Tensor):
        into.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _flatten(x, into)
    elif type(obj) is OpaqueRef:
        into.append(obj._key)  # noqa: SLF001 - the table keeps its key, and so its object


def current_rank_text(worker: TensorWorker) -> str:
    from ..geometry import Point

    return str(Point.from_rank(worker.rank, worker.mesh_sizes))
