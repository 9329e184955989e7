"""The model replicas behind the inference server: one actor mesh per *generation*,
routing to the least busy healthy replica, replacing a generation when a replica dies,
and reloading weights from the trainer over RDMA. No HTTP here: ``server`` maps routes
onto :class:`InferenceServer`.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from danaus import (
    Channel,
    DanausError,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    set_unhandled_fault_hook,
    this_host,
)
from danaus.rdma import RDMABuffer

from .metrics import Metrics
from .model import Replica, Trainer

__all__ = ["InferenceServer", "State", "Unavailable"]

log = logging.getLogger("inference_server")
_mesh_ids = itertools.count()


class Unavailable(Exception):
    """No replica could answer this request (it died, or the server is draining): 503."""


class State(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


class Generation:
    """One actor mesh of ``size`` replicas, one per proc.

    Requests are spread with ``choose()`` over the healthy replicas. A generation is
    never repaired: when a replica dies, the survivors keep serving while a whole new
    generation starts; the new one is swapped in, and the old one drains and stops.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.name = f"replica{next(_mesh_ids)}"
        self.size = size
        self.procs: ProcMesh = this_host().spawn_procs(per_host={"replicas": size}, name=self.name)
        self.replicas: Replica = self.procs.spawn(self.name, Replica, seed)
        self.failed: dict[int, str] = {}
        #: what requests choose() over: all replicas, or the longest healthy run of them
        self.route: Replica | None = self.replicas
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return (
            f"<Generation {self.name} size={self.size} failed={sorted(self.failed)} "
            f"inflight={self.inflight}>"
        )

    def fail(self, ranks: Sequence[int], why: str) -> None:
        for r in ranks:
            self.failed.setdefault(r, why)
        # choose() balances by calls in flight, and calls to a dead rank fail at once,
        # so a dead rank would look idle and win every time: route around it. A slice
        # is a contiguous (or strided) run of ranks, so take the longest healthy run.
        best: tuple[int, int] = (0, 0)
        start = 0
        for r in range(self.size + 1):
            if r == self.size or r in self.failed:
                if r - start > best[1] - best[0]:
                    best = (start, r)
                start = r + 1
        lo, hi = best
        self.route = self.replicas.slice(replicas=slice(lo, hi)) if hi > lo else None

    def begin(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def end(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    async def drained(self) -> None:
        await self._idle.wait()


class InferenceServer:
    """The danaus side of the app: replica generations, the trainer, supervision.

    Args:
        replicas: how many model replicas (procs) serve requests.
        seed: the replicas' initial weights.
        trainer_seed: the trainer's weights (different, so a reload shows).
        drain_timeout: how long a replaced generation may finish its requests.
        spawn_timeout: how long a generation (or the trainer) may take to start.
    """

    def __init__(
        self,
        replicas: int = 2,
        *,
        seed: int = 0,
        trainer_seed: int = 1,
        drain_timeout: float = 10.0,
        spawn_timeout: float = 60.0,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.size = replicas
        self.seed = seed
        self.trainer_seed = trainer_seed
        self.drain_timeout = drain_timeout
        self.spawn_timeout = spawn_timeout
        self.state = State.NEW
        self.metrics = Metrics()
        self._gen: Generation | None = None
        self._gens: dict[str, Generation] = {}  # every generation not yet stopped
        self._trainer_procs: ProcMesh | None = None
        self._trainer: Trainer | None = None
        self._trainer_failed: str | None = None
        self._weights: tuple[int, RDMABuffer] | None = None  # what every replica should hold
        self._reload_lock = asyncio.Lock()
        self._wake = asyncio.Event()  # a replica of the serving generation failed
        self._changed = asyncio.Event()  # set (and replaced) on failure, swap, retire
        self._tasks: set[asyncio.Task[None]] = set()
        self._prev_hook: Any = None

    def __repr__(self) -> str:
        return f"<InferenceServer {self.state.value} {self._gen!r}>"

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the replicas and the trainer; returns once all are up."""
        if self.state is not State.NEW:
            raise RuntimeError(f"{self!r} was started already")
        self.state = State.STARTING
        self._prev_hook = set_unhandled_fault_hook(self._on_failure)
        try:
            self._gen = self._spawn_generation()
            self._trainer_procs = this_host().spawn_procs(name=f"trainer{next(_mesh_ids)}")
            self._trainer = self._trainer_procs.spawn(
                self._trainer_procs.name, Trainer, self.trainer_seed
            )
            async with asyncio.timeout(self.spawn_timeout):
                await asyncio.gather(self._gen.replicas.initialized, self._trainer.initialized)
        except BaseException:
            await self.aclose()
            raise
        self.state = State.SERVING
        self._spawn_task(self._supervise())
        log.info("serving with %d replicas (%s)", self.size, self._gen.name)

    def drain(self) -> None:
        """Refuse new requests (503); those in flight go on."""
        if self.state in (State.STARTING, State.SERVING):
            self.state = State.DRAINING

    async def aclose(self) -> None:
        """Stop every mesh (in-flight requests to them fail with 503)."""
        if self.state is State.STOPPED:
            return
        self.state = State.STOPPED
        # Every mesh, also those a cancelled task was replacing or retiring.
        meshes = [g.procs for g in self._gens.values()]
        if self._trainer_procs is not None:
            meshes.append(self._trainer_procs)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(m.stop() for m in meshes))
        self._gens.clear()
        set_unhandled_fault_hook(self._prev_hook)

    async def __aenter__(self) -> InferenceServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("server task %s failed", task.get_coro(), exc_info=exc)

    # -- supervision -------------------------------------------------------------

    def _spawn_generation(self) -> Generation:
        gen = Generation(self.size, self.seed)
        self._gens[gen.name] = gen
        return gen

    def _on_failure(self, failure: MeshFailure) -> None:
        """The controller's fault hook: runs on this loop, must not block."""
        gen = self._gens.get(failure.mesh)
        summary = failure.report.strip().splitlines()[0] if failure.report.strip() else failure.kind
        if gen is not None:
            log.warning("replica failed: %s", failure)
            gen.fail([p.rank for p in failure.ranks], summary)
            self.metrics.replica_failures += len(failure.ranks)
            self._wake.set()
            self._notify()
        elif self._trainer_procs is not None and failure.mesh == self._trainer_procs.name:
            log.error("the trainer failed: %s", failure)
            self._trainer_failed = summary
        elif self._prev_hook is not None:
            self._prev_hook(failure)

    async def _supervise(self) -> None:
        """Replace the serving generation whenever one of its replicas has died."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._gen is not None and self._gen.failed:
                try:
                    await self._replace()
                except (DanausError, TimeoutError) as e:
                    log.error("could not start replacement replicas (%s); retrying in 1 s", e)
                    await asyncio.sleep(1.0)

    async def _replace(self) -> None:
        old = self._gen
        assert old is not None
        new = self._spawn_generation()
        log.info("replacing %s (failed ranks %s) with %s", old.name, sorted(old.failed), new.name)
        try:
            async with asyncio.timeout(self.spawn_timeout):
                await new.replicas.initialized
                await self._load_weights(new)
        except BaseException:
            if self.state is not State.STOPPED:  # else aclose stops it
                self._spawn_task(self._retire(new, drain=False))
            raise
        self._gen = new
        self.metrics.respawns += 1
        self._notify()
        self._spawn_task(self._retire(old))

    async def _load_weights(self, gen: Generation) -> None:
        """Bring a new generation to the weights the serving one holds."""
        async with self._reload_lock:
            if self._weights is not None:
                version, buf = self._weights
                await gen.replicas.reload.call(buf, version)

    async def _retire(self, gen: Generation, drain: bool = True) -> None:
        """Let ``gen``'s requests finish (bounded by ``drain_timeout``), then stop it."""
        if drain:
            try:
                async with asyncio.timeout(self.drain_timeout):
                    await gen.drained()
            except TimeoutError:
                log.warning(
                    "%s still had %d requests after %s s; stopping it",
                    gen.name,
                    gen.inflight,
                    self.drain_timeout,
                )
        try:
            await gen.procs.stop()
        finally:
            self._gens.pop(gen.name, None)
            self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_recovered(self, failures: int = 0) -> None:
        """Wait until at least ``failures`` replica failures were seen, every replica of
        the serving generation is healthy, and nothing replaced is still running.

        Bound it with ``asyncio.timeout``.
        """
        while True:
            changed = self._changed
            gen = self._gen
            if (
                self.metrics.replica_failures >= failures
                and gen is not None
                and not gen.failed
                and len(self._gens) == 1
            ):
                return
            await changed.wait()

    # -- requests ----------------------------------------------------------------

    async def tokens(self, prompt: str, max_tokens: int) -> AsyncGenerator[list[str], None]:
        """The tokens of one request, as its replica produces them.

        Yields lists: each holds the tokens that arrived since the last one was taken
        (usually one; more when the HTTP side fell behind, so they go out in one write).

        Raises:
            Unavailable: no healthy replica, the server drains, or the replica died.
        """
        if self.state is not State.SERVING:
            raise Unavailable(f"the server is {self.state.value}")
        gen = self._gen
        assert gen is not None
        route = gen.route
        if route is None:
            raise Unavailable(f"no healthy replica ({len(gen.failed)} failed; respawning)")
        port, receiver = Channel[str].open()
        gen.begin()
        call = route.generate.choose(prompt, max_tokens, port)
        nxt = receiver.recv()
        sent = 0
        try:
            while True:
                if not nxt.done():
                    await asyncio.wait((nxt, call), return_when=asyncio.FIRST_COMPLETED)
                if nxt.done():
                    batch = [nxt.result()]
                    nxt = receiver.recv()
                    while nxt.done():
                        batch.append(nxt.result())
                        nxt = receiver.recv()
                    sent += len(batch)
                    yield batch
                    continue
                # The call ended before the next token came: its reply holds every
                # token, so finish from it (no end marker needed); or it failed.
                try:
                    rest = call.result()[sent:]
                except SupervisionError as e:
                    raise Unavailable(str(e).splitlines()[0]) from e
                if rest:
                    yield rest
                return
        finally:
            if not nxt.done():
                nxt.cancel()
            receiver.close()
            gen.end()
            if call.done():
                if not call.cancelled():
                    call.exception()  # retrieved: no "never retrieved" noise
            else:  # the client left: stop the replica's generation
                call.cancel()

    async def health(self) -> tuple[int, dict[str, Any]]:
        gen = self._gen
        if gen is None:
            return 503, {"status": self.state.value, "replicas": []}
        pids = gen.procs.pids
        replicas: list[dict[str, Any]] = []
        for rank in range(gen.size):
            entry: dict[str, Any] = {"rank": rank, "pid": pids[rank]}
            if rank in gen.failed:
                entry.update(state="failed", reason=gen.failed[rank])
            else:
                try:
                    async with asyncio.timeout(2.0):
                        entry.update(await gen.replicas.slice(replicas=rank).state.call_one())
                    entry["state"] = "healthy"
                except TimeoutError:
                    entry["state"] = "busy"  # alive, but its mailbox is long
                except SupervisionError as e:
                    entry.update(state="failed", reason=str(e).splitlines()[0])
            replicas.append(entry)
        healthy = sum(r["state"] != "failed" for r in replicas)
        status = (
            "ok"
            if healthy == gen.size and self.state is State.SERVING
            else self.state.value
            if self.state is not State.SERVING
            else "degraded"
        )
        body = {
            "status": status,
            "generation": gen.name,
            "replacing": len(self._gens) > 1 or bool(gen.failed),
            "weights_version": self._weights[0] if self._weights else 0,
            "trainer": "failed: " + self._trainer_failed if self._trainer_failed else "ok",
            "replicas": replicas,
        }
        return (200 if healthy and self.state is State.SERVING else 503), body

    async def reload(self, train_steps: int = 0) -> dict[str, Any]:
        """Have the trainer publish its weights and every serving replica read them.

        Each replica handles the reload after the requests already queued to it, so
        nothing in flight is dropped or sees mixed weights.

        Raises:
            Unavailable: the trainer is gone, or a replica died during the reload (its
                replacement loads the new weights when it starts).
        """
        if self.state is not State.SERVING or self._trainer is None:
            raise Unavailable(f"the server is {self.state.value}")
        t0 = time.perf_counter()
        async with self._reload_lock:
            try:
                if train_steps:
                    await self._trainer.train.call_one(train_steps)
                version, buf = await self._trainer.publish.call_one()
            except SupervisionError as e:
                raise Unavailable(f"the trainer is gone: {e}") from e
            self._weights = (version, buf)
            gen = self._gen
            assert gen is not None
            t1 = time.perf_counter()
            if gen.route is None:
                results = []  # nobody to load; the replacement generation will
            else:
                try:
                    results = (await gen.route.reload.call(buf, version)).values()
                except SupervisionError as e:
                    raise Unavailable(f"a replica died during the reload: {e}") from e
        moved = sum(r["bytes"] for r in results)
        self.metrics.reloads += 1
        self.metrics.reload_bytes += moved
        return {
            "version": version,
            "replicas": len(results),
            "bytes": moved,
            "bytes_per_replica": buf.size(),
            "transfer_seconds": [r["seconds"] for r in results],
            "reload_seconds": time.perf_counter() - t1,
            "seconds": time.perf_counter() - t0,
        }

    def healthy(self) -> int:
        gen = self._gen
        return 0 if gen is None else gen.size - len(gen.failed)


# -- HTTP -------------------------------------------------------------------------
