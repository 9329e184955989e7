"""``HostMesh`` and ``ProcMesh``: where actors live."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from ..actors._actor import Actor
from ..actors._future import Future
from ..actors._runtime import JOB_ID, current_runtime, run_on
from ..config import config
from ..errors import ClosedError
from ._procs import ProcHandle, start_proc, wait_exited
from ._shape import Selector, Shape

__all__ = ["HostMesh", "ProcMesh", "this_host", "this_proc"]

log = logging.getLogger("danaus.mesh")
A = TypeVar("A", bound=Actor)
_names = itertools.count()


class HostMesh:
    """A set of hosts that can start procs. ``this_host()`` is the local one."""

    def __init__(self, shape: Shape, name: str = "local") -> None:
        self._shape = shape
        self.name = name

    def __repr__(self) -> str:
        return f"HostMesh({self.name}, {self._shape.sizes})"

    @property
    def sizes(self) -> dict[str, int]:
        return self._shape.sizes

    def spawn_procs(self, per_host: Mapping[str, int] | None = None, *, name: str = "procs",
                    env: Mapping[str, str] | None = None) -> ProcMesh:
        """Start procs on every host: ``per_host={"gpus": 4}`` gives a ``{..., "gpus": 4}`` mesh.

        Returns at once; the procs come up in parallel, and messages sent to them
        meanwhile wait (in order) until they do.

        Args:
            per_host: named dims of procs on each host; ``{"procs": 1}`` when omitted.
            name: the mesh name, used in actor ids and log prefixes.
            env: extra environment variables for the procs.
        """
        per_host = dict(per_host or {"procs": 1})
        for dim, size in per_host.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"per_host[{dim!r}] must be a positive int, got {size!r}")
            if dim in self._shape.sizes:
                raise ValueError(f"dim {dim!r} is already a dim of the host mesh")
        sizes = {**self._shape.sizes, **per_host}
        shape = Shape.from_sizes(sizes)
        rt = current_runtime()
        uid = f"{name}{next(_names)}"
        handles = [start_proc(rt, f"unix:@danaus-{JOB_ID}-{uid}-{r}", r, dict(env or {}))
                   for r in range(len(shape))]
        return ProcMesh(shape, handles, name)


def this_host() -> HostMesh:
    """The host the controller runs on, as a mesh with no dims."""
    return HostMesh(Shape.from_sizes({}))


class ProcMesh:
    """Processes laid out as a named mesh; ``spawn`` puts one actor in each.

    Use ``async with`` (or ``with`` in sync code), or call :meth:`stop`, so the procs end
    with your program; they are killed when the controller exits in any case.
    """

    def __init__(self, shape: Shape, procs: list[ProcHandle], name: str,
                 root: ProcMesh | None = None) -> None:
        self._shape = shape
        self._procs = procs  # indexed by global rank
        self.name = name
        self._root = root or self
        self._stopped = False

    def __repr__(self) -> str:
        state = "stopped" if self._root._stopped else "running"
        return f"ProcMesh({self.name}, {self._shape.sizes}, {state})"

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

    def slice(self, **dims: Selector) -> ProcMesh:
        """The procs at the selected ranks (an int drops a dim, a ``slice`` keeps it)."""
        return ProcMesh(self._shape.slice(**dims), self._procs, self.name, self._root)

    def split(self, dim: str, into: Mapping[str, int]) -> ProcMesh:
        """Split ``dim`` into several dims whose sizes multiply to its size."""
        return ProcMesh(self._shape.split(dim, into), self._procs, self.name, self._root)

    def flatten(self, name: str) -> ProcMesh:
        """All dims as one named dim."""
        return ProcMesh(self._shape.flatten(name), self._procs, self.name, self._root)

    def rename(self, **renames: str) -> ProcMesh:
        """Rename dims: ``procs.rename(procs="gpus")``."""
        return ProcMesh(self._shape.rename(**renames), self._procs, self.name, self._root)

    def _handles(self) -> list[ProcHandle]:
        return [self._procs[g] for g in self._shape.global_ranks()]

    @property
    def pids(self) -> list[int]:
        """OS process ids of the procs, in rank order."""
        return [h.popen.pid for h in self._handles()]

    # actors
    def spawn(self, name: str, cls: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Create one ``cls(*args, **kwargs)`` actor in every proc of this mesh.

        Returns at once. Messages sent to the mesh are handled after ``__init__`` ran.
        ``await mesh.initialized`` (or ``mesh.initialized.get()``) raises ``ActorError``
        naming the rank if an ``__init__`` raised.
        """
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"spawn needs a subclass of danaus.Actor, got {cls!r}")
        if self._root._stopped:
            raise ClosedError(f"{self!r} was stopped")
        from ._actor_mesh import ActorMesh

        return ActorMesh._spawn(self, name, cls, args, kwargs)

    # lifecycle
    def stop(self) -> Future[None]:
        """Stop every actor and proc of this mesh (the whole mesh, also from a slice).

        Procs get ``config.stop_timeout`` seconds to exit cleanly, then are killed.
        """
        root = self._root
        rt = current_runtime()
        fut: Future[None] = Future(loop=rt.loop)

        def start() -> None:
            task = rt.spawn_task(root._stop_all())
            task.add_done_callback(lambda t: fut.set_result(None) if not t.exception() else fut.set_exception(t.exception()))  # type: ignore[arg-type]

        run_on(rt, start)
        return fut

    async def _stop_all(self) -> None:
        from ..actors._wire import StopProc

        self._stopped = True
        rt = current_runtime()
        waits = []
        for h in self._procs:
            if h.popen.poll() is not None:
                pass
            elif h.ready.done() and h.ready.exception() is None:
                rt.connection(h.addr).send(StopProc(0))
            else:
                h.kill()  # never came up: nothing to stop cleanly
            waits.append(wait_exited(h, config.stop_timeout))
        exited = await asyncio.gather(*waits)
        for h, ok in zip(self._procs, exited, strict=True):
            if not ok:
                log.warning("proc %s did not stop within %s s; killing it", h.addr, config.stop_timeout)
                h.kill()
        await asyncio.gather(*(wait_exited(h, config.stop_timeout) for h in self._procs))

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop().get()


def this_proc() -> ProcMesh:
    """Not supported yet: actors live in procs started with ``spawn_procs``."""
    raise NotImplementedError("this_proc() is not available yet; use this_host().spawn_procs()")


from ._actor_mesh import ActorMesh  # noqa: E402
