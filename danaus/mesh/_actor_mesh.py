"""``ActorMesh``: one actor per proc of a mesh, and the adverbs of its endpoints."""

from __future__ import annotations

import collections
import itertools
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..actors._actor import Actor, describe_endpoints, endpoints_of
from ..actors._future import Future
from ..actors._runtime import Runtime, current_runtime, run_on
from ..actors._serialize import dumps, dumps_args
from ..actors._wire import ERROR, Spawn
from ..errors import EndpointNotFoundError
from ._shape import Selector, Shape
from ._value_mesh import ValueMesh

if TYPE_CHECKING:
    from ._proc_mesh import ProcMesh

__all__ = ["ActorEndpoint", "ActorMesh"]

A = TypeVar("A", bound=Actor)
_spawn_ids = itertools.count()


class ActorMesh(Generic[A]):
    """One actor of class ``A`` in each proc of a proc mesh.

    ``mesh.method`` is an :class:`ActorEndpoint` with the adverbs ``call``,
    ``call_one``, ``choose``, ``stream`` and ``broadcast``.
    """

    def __init__(self, procs: ProcMesh, name: str, cls: type[A], shape: Shape,
                 initialized: ThreadFuture[None], spawn_rt: Runtime) -> None:
        self._procs = procs
        self._name = name
        self._cls = cls
        self._shape = shape
        self._init = initialized
        self._spawn_rt = spawn_rt
        self._rr = 0
        procs_ = procs._procs
        self._targets_list = [(g, procs_[g].addr) for g in shape.global_ranks()]

    @classmethod
    def _spawn(cls, procs: ProcMesh, name: str, actor_cls: type[A], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> ActorMesh[A]:
        raw, pickled, parts = dumps((actor_cls, args, kwargs),
                                    lambda: f"actor class {actor_cls.__name__} and its arguments")
        rt = current_runtime()
        init: ThreadFuture[None] = ThreadFuture()
        handles = procs._handles()
        shape = procs.shape
        errors: list[BaseException] = []
        left = [len(handles)]

        def on_reply(rank: int, status: int, value: Any) -> bool:
            if status == ERROR:
                errors.append(value)
            left[0] -= 1
            if left[0] == 0:
                if errors:
                    init.set_exception(errors[0])
                else:
                    init.set_result(None)
                return True
            return False

        def send() -> None:
            port = rt.open_port(on_reply)
            sizes = procs._root.sizes
            mesh_name = f"{procs.name}"
            for h in handles:
                conn = rt.connection(h.addr)
                msg = Spawn(name, port, mesh_name, h.rank, sizes, raw, pickled)
                if conn.send(msg, parts):
                    conn.pending[port] = h.rank
                else:
                    rt.deliver(port, h.rank, ERROR, rt.peer_lost_error(h.addr, conn.close_reason))

        run_on(rt, send)
        return cls(procs, name, actor_cls, shape, init, rt)

    def __repr__(self) -> str:
        return f"ActorMesh({self._name}: {self._cls.__name__}, {self._shape.sizes})"

    def __getattr__(self, name: str) -> ActorEndpoint[A]:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in endpoints_of(self._cls):
            raise EndpointNotFoundError(
                f"{self._cls.__name__} has no endpoint {name!r}; its endpoints are: "
                f"{describe_endpoints(self._cls)}"
            )
        return ActorEndpoint(self, name)

    # shape vocabulary
    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.sizes

    def size(self, dim: str | None = None) -> int:
        return len(self._shape) if dim is None else self._shape.size(dim)

    def __len__(self) -> int:
        return len(self._shape)

    def slice(self, **dims: Selector) -> ActorMesh[A]:
        """The actors at the selected ranks (an int drops a dim, a ``slice`` keeps it)."""
        return ActorMesh(self._procs, self._name, self._cls, self._shape.slice(**dims),
                         self._init, self._spawn_rt)

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every actor's ``__init__`` ran; raises ``ActorError`` if one raised."""
        rt = current_runtime()
        fut: Future[None] = Future(loop=rt.loop)

        def done(f: ThreadFuture[None]) -> None:
            def settle() -> None:
                if fut.done():
                    return
                exc = f.exception()
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)

            run_on(rt, settle)

        self._init.add_done_callback(done)
        return fut

    def _targets(self) -> list[tuple[int, str]]:
        return self._targets_list


class ActorEndpoint(Generic[A]):
    """An endpoint of every actor in a mesh, with Monarch's adverbs."""

    def __init__(self, mesh: ActorMesh[A], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __repr__(self) -> str:
        return f"<endpoint {self._mesh._cls.__name__}.{self._name} of {self._mesh!r}>"

    def _encode(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, bool, list[Any]]:
        return dumps_args(args, kwargs, self._describe_args)

    def _describe_args(self) -> str:
        return f"arguments of {self._mesh._cls.__name__}.{self._name}"

    def _send(self, rt: Runtime, targets: list[tuple[int, str]], port: int,
              enc: tuple[Any, bool, list[Any]]) -> None:
        mesh = self._mesh
        raw, pickled, parts = enc
        actor = mesh._name
        method = self._name
        ready = rt is mesh._spawn_rt or mesh._init.done()
        if ready and len(targets) == 1 and rt.on_loop():
            rank, addr = targets[0]
            rt.send_call(addr, actor, method, port, rank, raw, pickled, parts)
            return

        def go() -> None:
            for rank, addr in targets:
                rt.send_call(addr, actor, method, port, rank, raw, pickled, parts)

        if ready:
            run_on(rt, go)
        else:  # spawned from another loop: wait for the spawn before the first message
            mesh._init.add_done_callback(lambda _: run_on(rt, go))

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call the one actor of this mesh; ``ValueError`` if it holds more or fewer."""
        n = len(self._mesh._targets_list)
        if n != 1:
            raise ValueError(
                f"call_one needs a mesh of exactly one actor, {self._mesh!r} has {n}: "
                "use call(), or slice the mesh first"
            )
        return self._call_single(self._mesh._targets(), args, kwargs)

    def _call_single(self, targets: list[tuple[int, str]], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Future[Any]:
        enc = self._encode(args, kwargs)
        rt = current_runtime()
        fut: Future[Any] = Future(loop=rt.loop)
        self._send(rt, targets, rt.open_future_port(fut), enc)
        return fut

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call one actor of the mesh, chosen round robin, and return its result."""
        targets = self._mesh._targets()
        i = self._mesh._rr % len(targets)
        self._mesh._rr += 1
        return self._call_single([targets[i]], args, kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[Any]]:
        """Call every actor; the result is a :class:`ValueMesh` of their return values.

        Raises (when awaited) the first ``ActorError`` or ``SupervisionError`` that comes back.
        """
        enc = self._encode(args, kwargs)
        rt = current_runtime()
        fut: Future[ValueMesh[Any]] = Future(loop=rt.loop)
        shape = self._mesh._shape
        targets = self._mesh._targets()
        index = {g: i for i, (g, _) in enumerate(targets)}
        values: list[Any] = [None] * len(targets)
        left = [len(targets)]

        def on_reply(rank: int, status: int, value: Any) -> bool:
            left[0] -= 1
            if status == ERROR:
                if not fut.done():
                    fut.set_exception(value)
            else:
                values[index[rank]] = value
                if left[0] == 0 and not fut.done():
                    fut.set_result(ValueMesh(shape, values))
            return left[0] == 0

        self._send(rt, targets, rt.open_port(on_reply), enc)
        return fut

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and do not wait (fire and forget)."""
        enc = self._encode(args, kwargs)
        self._send(current_runtime(), self._mesh._targets(), 0, enc)

    def stream(self, *args: Any, **kwargs: Any) -> _Stream:
        """Call every actor; iterate the results in arrival order (async or sync ``for``)."""
        enc = self._encode(args, kwargs)
        rt = current_runtime()
        targets = self._mesh._targets()
        s = _Stream(rt, len(targets))
        self._send(rt, targets, rt.open_port(s._on_reply), enc)
        return s


class _Stream:
    """Results of a call in arrival order: ``async for v in s`` or ``for v in s``."""

    def __init__(self, rt: Runtime, n: int) -> None:
        self._rt = rt
        self._n = n
        self._got = 0
        self._values: collections.deque[tuple[int, Any]] = collections.deque()
        self._waiter: Future[None] | None = None

    def _on_reply(self, rank: int, status: int, value: Any) -> bool:
        self._values.append((status, value))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._got += 1
        return self._got == self._n

    def _next(self) -> Future[Any]:
        fut: Future[Any] = Future(loop=self._rt.loop)

        def arm() -> None:
            if self._values:
                status, value = self._values.popleft()
                if status == ERROR:
                    fut.set_exception(value)
                else:
                    fut.set_result(value)
                return
            w: Future[None] = Future(loop=self._rt.loop)
            self._waiter = w
            w.add_done_callback(lambda _: arm())

        run_on(self._rt, arm)
        return fut

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Any]:
        for _ in range(self._n):
            yield await self._next()

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self._n):
            yield self._next().get()

