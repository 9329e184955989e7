"""``parallelize`` and ``Trainer``: the controller's one handle on a model trained by a mesh."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..actors.seam import Future, current_runtime, run_task
from ..errors import SupervisionError
from ..mesh.seam import (
    add_section,
    group_of,
    host_blocks,
    host_of,
    hosts_left,
    hosts_of,
    preload_for,
    respawn_procs,
    respawnable,
)
from ..spmd import setup_torch_elastic_env_async
from ._errors import ROLLED_BACK, PlanError
from ._model import (
    Batch,
    LossFn,
    Shard,
    check_batch,
    counted_tokens,
    find_parts,
    shard_batch,
    split_batch,
)
from ._plan import Plan
from ._staging import LARGE, Packed, Staged

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..mesh import HostMesh, ProcMesh
    from ._copies import CopyPlan, Keepers, Places
    from ._layout import Layout

T = TypeVar("T")
#: the flat ranks a shard goes to, as runs of neighbours (one cast each)
Ranks = tuple[range, ...]
#: ``data(step, dp_rank, dp_size)``: a replica's rows of a step's global batch
DataFn = Callable[[int, int, int], Any]
#: a batch cut for a plan: the plan, its counted labels, each shard with its ranks
Prepared = tuple[Plan, int, list[tuple[Ranks, "Shard | Packed"]]]
#: what a lost proc does to a trainer (see parallelize)
ON_LOST_PROC = ("respawn", "replan", "fail")
#: how long a failed call waits for supervision to name a lost proc, before it counts
#: as a rank's own error (a proc's exit is seen within milliseconds here)
LOST_PROC_WAIT_S = 2.0
#: how many times a recovery starts again on new procs when one of its own is lost
RECOVERY_TRIES = 3
#: seconds a recovery waits for a survivor's keeper to say which copies it holds
KEEPER_WAIT_S = 10.0
#: seconds a recovery's new keepers may take to read the copies from the old procs
ADOPT_TIMEOUT_S = 300.0
#: ``respawn`` in place: seconds a survivor's worker may take to let go of its piece
#: (its step ends once its peers' connections close); one that does not is killed
RELEASE_WAIT_S = 10.0
#: ``respawn``: the latest steps kept on the controller to run again (each rank's copy
#: is of the step that ended last on the controller, or the one before)
RERUN_KEPT = 3
_names = itertools.count()
_END = object()  # (the end of fit's batches)
log = logging.getLogger("danaus.parallel")


async def _each(endpoint: Any, *args: Any) -> list[Any]:
    """Call every worker; their results in arrival order. The first rank to raise fails
    the call at once (the others may be waiting for it in a collective)."""
    return [v async for v in endpoint.stream(*args)]


async def _each_its_own(calls: list[Any]) -> list[Any]:
    """Await calls to groups of workers (each sent its own arguments); their results in
    arrival order. The first to raise fails the whole at once, as :func:`_each`; the
    others' outcomes are taken as they come (they fail when the trainer stops the procs)."""
    futures = [asyncio.ensure_future(c) for c in calls]
    try:
        return [await f for f in asyncio.as_completed(futures)]
    except BaseException:
        for f in futures:
            f.add_done_callback(_taken)
        raise


def _taken(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()  # taken: no "exception was never retrieved"


#: the steps a trainer keeps for the dashboard
HISTORY = 2000
#: the trainers of this controller, for the dashboard's training view
_LIVE: weakref.WeakSet[Trainer] = weakref.WeakSet()


def _trainers_picture() -> list[dict[str, Any]]:
    """The ``trainers`` section of a snapshot: every live trainer, oldest first."""
    return sorted((t.picture() for t in list(_LIVE)), key=lambda p: float(p["started"]))


class Trainer:
    """A model trained by every proc of a mesh as a plan lays it out.

    Made by :func:`parallelize`; each method returns a danaus ``Future``: ``await`` it in
    async code, ``.get()`` in sync code. Calls run one after another, in the order made.

    Where the user's code raises on a rank (the ``loss_fn``, ``data``; a loss that is
    not one number), the step fails with that rank's traceback (an ``ActorError`` that
    is also the error's own type), every rank has rolled it back (no optimizer step,
    gradients dropped, dropout's random state as before) and the trainer goes on: the
    next step gives the numbers of a run that never saw the bad batch. A lost proc is
    recovered from as ``parallelize(..., on_lost_proc=)`` says (by default a new proc
    in its place in the same mesh, from the copies of each rank's state the procs keep
    after every step: the call returns as if nothing had happened; see
    :meth:`recoveries`). Any other rank failure (the model's own forward raising) fails
    the call with its traceback; the trainer is then broken (later calls raise the
    same) and every rank has been stopped, so none waits in a collective: build a new
    trainer on a new mesh.
    """

    def __init__(
        self,
        model: nn.Module,
        procs: ProcMesh,
        plan: Plan,
        optimizer: Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer],
        loss_fn: LossFn | None,
        data: DataFn | None = None,
        resume: str | os.PathLike[str] | None = None,
        on_lost_proc: str = "respawn",
        snapshot_every: int | None = None,
    ) -> None:
        check_on_lost_proc(on_lost_proc)
        if snapshot_every is not None:
            if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int):
                raise TypeError(
                    f"snapshot_every must be a positive int or None, not {snapshot_every!r}"
                )
            if snapshot_every < 1:
                raise ValueError(f"snapshot_every must be a positive int, not {snapshot_every}")
        if data is not None and not callable(data):
            raise TypeError(
                f"data must be a function (step, dp_rank, dp_size) -> batch, not {data!r}"
            )
        if len(procs) != plan.dp * plan.pp * plan.tp:
            raise PlanError(
                f"the plan is for {plan.dp * plan.pp * plan.tp} procs "
                f"(dp={plan.dp} x pp={plan.pp} x tp={plan.tp}); the mesh has {len(procs)}"
            )
        self.plan = plan
        self._procs = procs
        self._given = procs  # (the user's: never stopped by the trainer)
        self._rt = current_runtime()
        self._lock: asyncio.Lock | None = None
        self._failed: BaseException | None = None
        self._stopped = False
        #: bytes of batches sent to the workers so far (each rank gets only its shard)
        self.bytes_sent = 0
        #: of those, the bytes of shards over ``LARGE`` (a MiB), which went by the data
        #: plane (each worker reads its shard's bytes; the call carries a handle)
        self.bytes_staged = 0
        parts = find_parts(model, plan.layers)
        self._parts = parts
        #: the model's own loss: a step's loss is the global batch's token mean
        self._token_mean = loss_fn is None and parts.default_loss(model) is not None
        self._check_model = model  # (its forward's signature: what a batch may hold)
        #: each worker loads its replica's rows itself: fn(step, dp_rank, dp_size)
        self._data = data
        self._steps = 0  # steps sent, the next one's number for ``data``
        #: the latest steps, for the dashboard: (step, loss, tokens/s or None, seconds)
        self._history: deque[tuple[int, float, float | None, float]] = deque(maxlen=HISTORY)
        self._done = 0  # steps that ended
        self._last_batch: Batch | None = None  # (a sample to re-plan with)
        self._resume: str | None = None
        if resume is not None:
            from . import _checkpoint

            # at once, here: a path that is no checkpoint is the caller's to hear of
            self._resume = str(_checkpoint.check(resume))
            _checkpoint.check_model(resume, model)
            counts = _checkpoint.meta(resume)
            self._done, self._steps = int(counts["steps"]), int(counts["data_step"])
        self._started = time.time()
        self._plan_html: str | None = None
        self._model, self._optimizer, self._loss_fn = model, optimizer, loss_fn
        #: what a lost proc does (see parallelize), and the recoveries made so far
        self._on_lost = on_lost_proc
        self._recoveries: list[dict[str, Any]] = []
        #: where a recovery restores from: the copies of each rank's state the procs
        #: keep after every step (:mod:`._copies`; their keepers, an actor beside each
        #: worker: ``replan`` builds whole tensors from them); where they cover no step
        #: it can go on from, the latest snapshot (a checkpoint of whole tensors in
        #: memory, /dev/shm, every ``snapshot_every`` steps where given, or the one a
        #: re-plan built), the checkpoint resumed, or None (the model as it was given),
        #: with the counts (steps, data step) there. The steps sent since, to run
        #: again: (steps ended, data step, the batch) before each
        self._snapshot_every = snapshot_every
        self._snapshot: str | None = self._resume
        self._snapshot_at = (self._done, self._steps)
        self._since: list[tuple[int, int, Batch | int]] = []
        self._snapshot_bytes: dict[int, int] = {}  # (per rank, of the latest)
        self._snapshots = _Snapshots()
        self._keepers: Keepers | None = None
        #: a respawn in place: the workers replaced, let go of their pieces, whose
        #: copies their keepers serve until the new keepers hold them
        self._released: Any = None
        #: a repair in place is under way (the procs are the user's: never stopped)
        self._repairing = False
        #: where each rank's state lies in the model's whole tensors (its worker says)
        self._places: dict[int, Places] = {}
        #: after a loss no copy covered: the whole tensors the copies left did cover,
        #: and their counts (partial), for save()
        self._survived: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None
        if on_lost_proc != "fail":  # (new procs start with the model's code imported)
            preload_for(procs, type(model).__module__)
        _LIVE.add(self)
        add_section("trainers", _trainers_picture)
        self._workers: Future[Any] = run_task(
            self._rt, lambda: self._setup(procs, plan, self._resume)
        )

    async def _setup(
        self,
        procs: ProcMesh,
        plan: Plan,
        resume: str | None,
        restore: tuple[Keepers, dict[int, list[int]]] | None = None,
        take_over: Callable[[Keepers], Awaitable[None]] | None = None,
    ) -> Any:
        """Spawn the workers on ``procs`` (with a keeper beside each, but for ``fail``)
        and set each up with its piece of the model as ``plan`` lays it out, from the
        checkpoint ``resume``, or from each rank's copy of step ``self._done``
        (``restore``: the keepers that hold them, each rank's keepers): the new keepers
        first read them (each its own rank's, and its peer's), then ``take_over(new
        keepers)`` stops the procs they were read from, then the workers are built."""
        from ..mesh import this_proc
        from ._copies import CopyPlan, Keeper, Keepers
        from ._worker import ParallelWorker

        await setup_torch_elastic_env_async(procs)
        n = next(_names)
        keepers = None
        if self._on_lost != "fail":
            alone = this_proc().spawn(f"_keeper{n}", Keeper) if len(procs) == 1 else None
            keepers = Keepers(procs.spawn(f"_keeper{n}", Keeper), alone)
        taken, workers = False, None
        stride = _host_stride(procs)  # (a rank's peer: on the next host, where there is one)
        try:
            copies = None if keepers is None else CopyPlan(keepers, self._done, stride=stride)
            if keepers is not None and restore is not None:
                await self._adopt(keepers, plan.layout, *restore, stride)
                whole = {r: r for r in range(len(procs))}
                copies = CopyPlan(keepers, self._done, whole, keepers, stride)
                if take_over is not None:  # (the keepers are the trainer's from here on)
                    taken = True
                    await take_over(keepers)
            workers = procs.spawn(f"_parallel{n}", ParallelWorker)
            await self._set_up(workers, plan.layout, resume, copies)
            if keepers is not None and restore is not None:  # (each keeps its own now)
                await asyncio.gather(*(k.settle.call_one() for k in keepers.all().values()))
        except BaseException:
            if keepers is not None and not taken:
                with contextlib.suppress(Exception):  # (their procs may be gone)
                    await keepers.stop()
            if self._repairing and workers is not None and self._released is None:
                self._released = workers  # (the next try lets them go: the procs stay)
            raise
        if not taken:
            previous, self._keepers = self._keepers, keepers
            if previous is not None and previous.controller is not None:
                await previous.controller.stop()
        return workers

    async def _adopt(
        self,
        keepers: Keepers,
        layout: Layout,
        source: Keepers,
        where: dict[int, list[int]],
        stride: int,
    ) -> None:
        """The new ``keepers`` read the copies of step ``self._done`` from ``source``'s
        (``where``: each rank's keepers there): each its own rank's, for its worker to
        start from, and its peer's (the copy it would hold of it), so that the new procs
        hold every copy before the old ones are stopped (a GPU's memory is then free for
        the new workers, and a new proc lost while they are set up is recovered from)."""
        from ._copies import roles

        step, calls = self._done, []
        for r, keepers_of_r in where.items():
            same, _, peer = roles(layout, r, stride)  # (DDP replicas: the same state)
            calls.append(keepers.at(r).adopt.call_one(r, step, source, keepers_of_r, same, True))
            if peer is not None:
                calls.append(
                    keepers.at(peer).adopt.call_one(r, step, source, keepers_of_r, (r,), False)
                )
        async with asyncio.timeout(ADOPT_TIMEOUT_S):
            await asyncio.gather(*calls)

    async def _set_up(
        self, workers: Any, layout: Layout, resume: str | None, copies: CopyPlan | None
    ) -> None:
        """Each worker set up with its piece of the model (see :meth:`_setup`)."""
        from ._worker import tied_params

        model, parts = self._model, self._parts
        tied = tied_params(model, parts)
        args = (parts, layout, self._loss_fn, self._optimizer, self._data, tied, resume, copies)
        if layout.pp == 1:
            done = [await workers.setup.call(model, *args)]
        else:  # each stage's procs get that stage only: a proc never holds the whole model
            flat = workers.flatten("rank")
            calls = []
            for k, (first, last) in enumerate(layout.stages):
                piece = parts.cut(model, first, last)
                for run in _runs(layout.stage_ranks(k)):
                    group = flat.slice(rank=slice(run.start, run.stop))
                    calls.append(group.setup.call(piece, *args))
                del piece
            done = await asyncio.gather(*calls)
        self._places = {p.rank: p for values in done for p in values.values()}

    @property
    def procs(self) -> ProcMesh:
        """The procs training the model: those given to :func:`parallelize` (after a
        ``respawn``, repaired in place: a lost rank's proc is a new process there), or,
        after a recovery that could not start procs in their places (``replan``, a lost
        host), the new ones the trainer spawned."""
        return self._procs

    def __repr__(self) -> str:
        return f"<Trainer {self.plan.strategy} on {len(self._procs)} procs: {self._state()}>"

    def _state(self) -> str:
        return "failed" if self._failed else "stopped" if self._stopped else "ready"

    def picture(self) -> dict[str, Any]:
        """What the dashboard's training view shows of this trainer, as plain JSON-able
        data: its plan (dims, stages with their blocks and ranks, the estimate), its
        state (``ready``, ``stopped``, ``failed``), the steps run and the latest
        ``HISTORY`` of them as ``[step, loss, tokens/s or None, seconds]``, its
        recoveries from lost procs (:meth:`recoveries`), and the plan drawn
        (``picture_html``: :meth:`Plan.html`)."""
        p, layout = self.plan, self.plan.layout
        stages = []
        for k, s in enumerate(p.stages):
            stages.append(
                {
                    "stage": k,
                    "blocks": [s.first, s.last],
                    "ranks": list(layout.stage_ranks(k)),
                    "checkpointing": s.checkpointing,
                    "estimated_s": s.estimated_s,
                    "peak_bytes": s.peak_bytes,
                }
            )
        return {
            "name": f"trainer {id(self):x}",
            "procs": getattr(self._procs, "name", None),
            "state": self._state(),
            "error": None if self._failed is None else str(self._failed)[:2000],
            "started": self._started,
            "plan": {
                "strategy": p.strategy,
                "dp": p.dp,
                "pp": p.pp,
                "tp": p.tp,
                "microbatches": p.microbatches,
                "schedule": p.schedule,
                "sharded": p.sharded,
                "precision": p.precision,
                "compile": p.compile,
                "estimated_step_s": p.estimated_step_s,
                "peak_bytes_per_proc": p.peak_bytes_per_proc,
                "stages": stages,
            },
            "steps": self._done,
            "history": [list(h) for h in self._history],
            # each recovery from a lost proc (see recoveries())
            "recoveries": [dict(r) for r in self._recoveries],
            # the plan drawn (Plan.html: the ranks, the estimated schedule, memory per
            # proc against its limit), made once: a plan does not change
            "picture_html": self._picture_html(),
        }

    def _picture_html(self) -> str:
        if self._plan_html is None:
            self._plan_html = self.plan.html()
        return self._plan_html

    def _run(
        self,
        what: Callable[[Any], Coroutine[Any, Any, T]],
        failed: Callable[[], Coroutine[Any, Any, T]] | None = None,
    ) -> Future[T]:
        """``what(workers)`` after the calls before it, recovering from a lost proc as
        ``on_lost_proc`` says; on a trainer that has failed, ``failed()`` where given and
        something survived the loss (:meth:`save`), else the failure again."""

        async def go() -> T:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._stopped:
                    raise RuntimeError("this trainer was stopped")
                if self._failed is not None and failed is not None and self._survived:
                    return await failed()
                if self._failed is not None:
                    raise self._failed
                for tries in itertools.count(1):
                    try:
                        return await what(await self._workers)
                    except Exception as e:
                        if _rolled_back(e):  # the user's code raised; every rank undid it
                            raise
                        lost = await self._lost_ranks(e, self._procs)
                        # a rank failed: the others may wait in a collective for it
                        # forever (a recovery first takes the copies the survivors hold)
                        if not lost or self._on_lost == "fail" or tries > RECOVERY_TRIES:
                            await self._procs.stop(reason="a rank of the trainer failed")
                        if not lost:
                            self._failed = e
                            raise
                        if self._on_lost == "fail":
                            self._failed = _lost_error(e, lost)
                            raise self._failed from e
                        if tries > RECOVERY_TRIES:  # the call itself kills a proc?
                            self._failed = _lost_error(e, lost)
                            self._failed.add_note(
                                f"the same call lost a proc {tries} times in a row, each time "
                                "after a recovery: what it sends may be what kills the proc"
                            )
                            raise self._failed from e
                        try:
                            await self._recover(e, lost)
                        except Exception as again:
                            self._failed = again
                            raise again from e
                        # and the call that failed runs again, on the new workers
                raise AssertionError("unreachable")  # (for mypy: the loop returns or raises)

        return run_task(self._rt, go)

    async def _lost_ranks(self, e: BaseException, procs: ProcMesh) -> dict[int, str]:
        """Of ``procs``, those that are lost (killed, their host gone), with why; empty
        where none is (a rank's code raised). A survivor's error (gloo's "connection
        closed by peer") may come before supervision has seen its peer's exit: where
        none is known lost yet, it is given ``LOST_PROC_WAIT_S`` to say so."""
        from ..errors import ActorError, SupervisionError

        group = procs.proc_group
        if not isinstance(e, (ActorError, SupervisionError)):
            return group.failed_procs()
        try:
            async with asyncio.timeout(LOST_PROC_WAIT_S):
                return await group.wait_failed()
        except TimeoutError:
            return group.failed_procs()

    async def _recover(self, error: BaseException, lost: dict[int, str]) -> None:
        """Train on after losing the procs ``lost``. ``respawn``: new procs in their
        places in the same proc mesh (:meth:`_repair`), where it can be repaired in
        place; else new procs on the same host (or hosts), as many (:meth:`_replace`).
        ``replan``: as many as survived, with a new plan for them (on several hosts,
        as many on each: as the host with the fewest survivors has, or, where that is
        fewer in all, on the hosts with more); ``respawn`` too where a host is gone (its
        agent lost), onto the hosts left. The workers are set
        up from the copies the survivors hold (``respawn``: each rank from its own;
        ``replan``: from the whole tensors built from them) or, where those cover no
        step it can go on from, from the latest snapshot; the steps since run again.
        Old procs replaced are stopped once their copies are read (their ranks may wait
        in a collective for the lost one). Recorded in :meth:`recoveries`."""
        started = time.perf_counter()
        phases: dict[str, float] = {}
        step = self._done
        old = self._procs
        mode, instead = self._on_lost, ""
        host, per_host = host_of(old), {"procs": len(old)}
        n = len(old) if mode == "respawn" else len(old) - len(lost)
        if mode == "replan":
            per_host = {"procs": n}
        if host is None:  # on several hosts: on the same ones, or on those left
            spread = hosts_of(old) if mode == "respawn" else None
            left = None if spread is not None else hosts_left(old, lost if mode == "replan" else ())
            if spread is not None:
                host, per_host = spread
            elif left is not None:
                # a host gone (its agent, and its procs with it), or procs lost in a
                # re-plan: re-planned onto new procs on the hosts left, as many on each
                # (respawn: as there were; replan: as the fewest survivors of a host)
                host, per, gone = left
                lost = {**dict.fromkeys(gone, "its host gone"), **lost}
                if mode == "respawn":
                    instead = "respawn: a host is gone, no procs can start there"
                mode, n, per_host = "replan", len(host) * per, {"procs": per}
        if mode == "respawn" and respawnable(old):
            source, lost = await self._repair(error, lost, phases)
        else:
            source, lost = await self._replace(error, lost, phases, mode, n, host, per_host)
        record = {
            "step": step,
            "lost": sorted(lost),
            "why": "; ".join(sorted(set(lost.values()))),
            "action": mode,
            "instead_of": instead,
            "procs": n,
            "plan": self.plan.strategy,
            "restored_step": phases.pop("_restored_step"),
            "restored_from": source,
            "rerun_steps": phases.pop("_rerun_steps"),
            "seconds": phases,
            "total_s": time.perf_counter() - started,
        }
        self._recoveries.append(record)
        whence = {
            "copies": "the copies of",
            "snapshot": "the snapshot of",
            "start": "the state it started from,",
        }[source]
        log.warning(
            "rank(s) %s lost after step %d (%s): %s%s, %d procs, %s; from %s step %d, "
            "%d step(s) run again; %.1f s (%s)",
            record["lost"], step, record["why"], mode, f" ({instead})" if instead else "", n,
            self.plan.strategy, whence, record["restored_step"], record["rerun_steps"],
            record["total_s"], ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()),
        )  # fmt: skip

    async def _repair(
        self, error: BaseException, lost: dict[int, str], phases: dict[str, float]
    ) -> tuple[str, dict[int, str]]:
        """``respawn``, in place: new procs start in the lost ones' places in the proc
        mesh the user holds, which is whole again (:func:`respawn_procs`); new keepers on
        every rank read the copies from the old ones; then the survivors' old workers let
        go of their pieces (:meth:`_drop_released`: those still busy after
        ``RELEASE_WAIT_S``, stuck in a collective, are killed and started again in
        place too, from the new keepers' copies); new workers start on every rank, each
        from its copy. What it restored from, and the ranks lost (more where one was
        lost while it recovered)."""
        self._repairing = True
        try:
            return await self._repair_tries(error, lost, phases)
        finally:
            self._repairing = False

    async def _repair_tries(
        self, error: BaseException, lost: dict[int, str], phases: dict[str, float]
    ) -> tuple[str, dict[int, str]]:
        """:meth:`_repair`'s tries: again where a proc is lost while it recovers."""
        procs = self._procs
        group = group_of(procs)
        source, gone = "", dict(lost)  # (gone: of the procs the copies are read from)
        for attempt in range(1, RECOVERY_TRIES + 1):
            t = time.perf_counter()
            try:
                if self._released is None:  # (the workers to let go, once copies are read)
                    with contextlib.suppress(Exception):
                        self._released = await self._workers
                restore = await self._restore_point(gone, error, "respawn", phases)
                source = restore.source
                failed = group.failed_procs()  # (and any seen lost since)
                lost = {**failed, **lost}
                await respawn_procs(procs, sorted(failed))
            except BaseException:
                await procs.stop(reason="the trainer could not recover")
                raise
            try:
                await self._recover_on(procs, "respawn", len(procs), phases, t, restore)
                return source, lost
            except BaseException as e:
                again = await self._lost_ranks(e, procs) if isinstance(e, Exception) else {}
                if not again or attempt == RECOVERY_TRIES:
                    await procs.stop(reason="the trainer could not recover")
                    raise
                # a proc lost during the recovery: the same again (from the copies the
                # new keepers hold, where they took over; else from the old keepers')
                log.warning("rank(s) %s lost while recovering; recovering again", sorted(again))
                why = {r: f"{w} (while recovering)" for r, w in again.items()}
                if isinstance(e, _Stuck):
                    why |= dict.fromkeys(e.ranks, e.why)
                took_over = self._keepers is not restore.keepers
                lost, gone = {**lost, **why}, why if took_over else {**gone, **why}
        raise AssertionError("unreachable")  # (for mypy: the loop returns or raises)

    async def _replace(
        self,
        error: BaseException,
        lost: dict[int, str],
        phases: dict[str, float],
        mode: str,
        n: int,
        host: HostMesh | None,
        per_host: dict[str, int],
    ) -> tuple[str, dict[int, str]]:
        """:meth:`_recover` on new procs (``n`` of them, ``per_host`` on ``host``), the
        old ones stopped; what it restored from, and the ranks lost (more where one was
        lost while it recovered)."""
        old = self._procs
        if host is None:
            await old.stop(reason="a rank of the trainer failed")
            raise PlanError(
                f"rank(s) {sorted(lost)} were lost, and the trainer's procs are on several "
                "hosts, where they are not laid out host by host (each host's procs one "
                "block of ranks, as many on each): no procs can start in their place; "
                "resume from a checkpoint (Trainer.save) on the procs left"
            ) from error
        if n < 1:
            raise PlanError(f"every proc of the trainer was lost ({lost})") from error
        source, gone = "", dict(lost)  # (gone: of the procs the copies are read from)
        for attempt in range(1, RECOVERY_TRIES + 1):
            t = time.perf_counter()
            try:
                restore = await self._restore_point(gone, error, mode, phases)
                source = restore.source
            except BaseException:
                await self._procs.stop(reason="the trainer could not recover")
                raise
            try:
                procs = host.spawn_procs(per_host=per_host, name=f"{old.name}-r")
            except BaseException:
                await self._procs.stop(reason="the trainer could not recover")
                raise
            try:
                await self._recover_on(procs, mode, n, phases, t, restore)
                break
            except BaseException as e:
                if not isinstance(e, Exception):  # (cancelled: no procs left behind)
                    await procs.stop(reason="the trainer's recovery was cancelled")
                    if self._procs is not procs:
                        await self._procs.stop(reason="the trainer's recovery was cancelled")
                    raise
                # a new proc lost during the recovery: the same again, on new procs (from
                # the copies the new procs hold, where they took over; else from what
                # the first try read: the old procs' copies, or the whole tensors built)
                again = await self._lost_ranks(e, procs)
                took_over = self._procs is procs
                if not took_over or not again or mode != "respawn" or attempt == RECOVERY_TRIES:
                    await procs.stop(reason="a proc was lost while the trainer recovered")
                if not again or attempt == RECOVERY_TRIES:
                    if not took_over:
                        await self._procs.stop(reason="the trainer could not recover")
                    raise
                log.warning("rank(s) %s lost while recovering; recovering again", sorted(again))
                why = {r: f"{w} (while recovering)" for r, w in again.items()}
                if took_over:  # the copies are on the new procs now
                    lost, gone = {**lost, **why}, why
                else:
                    lost = {**lost, **why}
        return source, lost

    async def _drop_released(self, keepers: Keepers | None) -> None:
        """A repair in place, once the new keepers hold every copy: the old workers of
        the procs not lost let go of their pieces and process groups
        (:meth:`ParallelWorker.release`), each once its call running now has ended (a
        step ends once a lost peer's connections close), then free their copies'
        buffers, and stop, as do the keepers that served them (``keepers``); the procs
        stay, and the user's actors there live on. Those still busy after
        ``RELEASE_WAIT_S`` are killed: lost while recovering, they are started again
        in place, from the new keepers' copies.

        Raises:
            _Stuck: naming the procs killed.
        """
        released, self._released = self._released, None
        group, stuck = group_of(self._procs), []
        if released is not None:
            flat = released.flatten("rank")

            async def let_go(r: int) -> int | None:
                try:
                    async with asyncio.timeout(RELEASE_WAIT_S):  # (close: release, and more)
                        await flat.slice(rank=r).close.call_one()
                except TimeoutError:
                    return r
                except Exception:  # (its proc lost meanwhile: nothing to free)
                    pass
                return None

            # (a lost rank's fails at once: its proc was)
            ranks = range(len(self._procs))
            stuck = [r for r in await asyncio.gather(*map(let_go, ranks)) if r is not None]
            for r in stuck:
                group.kill(r)

        async def stop_keepers() -> None:
            if keepers is not None:
                with contextlib.suppress(Exception):
                    await keepers.stop()

        stopping = [stop_keepers()]
        if released is not None:
            stopping.append(released.stop(reason="the trainer's workers were replaced"))
        await asyncio.gather(*stopping)
        if stuck:
            async with asyncio.timeout(RELEASE_WAIT_S):
                await group.wait_failed(stuck)
            raise _Stuck(stuck)

    async def _restore_point(
        self, lost: dict[int, str], error: BaseException, mode: str, phases: dict[str, float]
    ) -> _Restore:
        """Where a recovery starts from: the latest step since the steps kept whose copies
        the survivors' keepers hold for every rank (``respawn``: each rank's keepers
        holding it; ``replan``: the whole tensors built from them, in memory), else the
        snapshot or the state the trainer started from, where the steps since are kept.
        Once nothing more is to be read from them, the old procs are stopped.

        Raises:
            SupervisionError: no step that the steps kept can run on from is held for
                every rank (a rank and its peer lost together: its copies are on its own
                proc and its peer's), naming the ranks whose state is gone.
        """
        from ..errors import SupervisionError
        from ._copies import restore_point, uncovered

        oldest = self._since[0][0] if self._since else self._done
        n = len(self._procs)
        held: dict[int, list[tuple[int, int]] | None] = {}
        answered: dict[int, list[tuple[int, int]]] = {}
        point, unread = None, None

        async def ask(k: int, keeper: Any) -> tuple[int, list[tuple[int, int]] | None]:
            try:
                async with asyncio.timeout(KEEPER_WAIT_S):
                    return k, await keeper.steps.call_one()
            except Exception:  # (lost too, or stuck: its copies count for nothing)
                return k, None

        if self._keepers is not None:
            keepers = self._keepers.all()
            asked = [ask(k, keeper) for k, keeper in keepers.items() if k not in lost]
            held = dict(await asyncio.gather(*asked))
            answered = {k: v for k, v in held.items() if v is not None}
            point = restore_point(n, answered, self._done, oldest)
        if point is not None and mode == "respawn":
            return _Restore(point[0], "copies", keepers=self._keepers, where=point[1])
        if point is not None:  # a new plan: the whole tensors, which any plan loads
            t = time.perf_counter()
            try:
                path = await self._whole_from_copies(*point)
            except LookupError as e:  # (a keeper lost as it was read: the snapshot?)
                unread = e
            else:
                phases["gather"] = time.perf_counter() - t
                await self._let_go()
                return _Restore(point[0], "copies", resume=path)
        if self._snapshot_at[0] >= oldest:  # the snapshot (or the start), every step since
            await self._let_go()
            taken = self._snapshot is not None and self._snapshot != self._resume
            return _Restore(
                self._snapshot_at[0], "snapshot" if taken else "start", resume=self._snapshot
            )
        gone = {s: uncovered(n, answered, s) for s in range(self._done, oldest - 1, -1)}
        silent = sorted(k for k, v in held.items() if v is None)
        left = await self._keep_what_survives(answered, oldest)
        survives = (
            ". trainer.save(path) still writes what survives, the state after step "
            f"{left['steps']} of all but {len(left['missing'])} tensors (a checkpoint "
            "marked partial, which load_state_dict reads)"
            if left is not None
            else ""
        )
        raise SupervisionError(
            f"rank(s) {sorted(lost)} of the trainer were lost "
            f"({'; '.join(sorted(set(lost.values())))}), and no proc left holds a copy "
            "of every rank's state after any step it can go on from: "
            + (
                f"the copies of step {point[0]} could not be read ({unread})"
                if point is not None
                else ", ".join(f"after step {s}, none of rank(s) {r}" for s, r in gone.items())
            )
            + (f" (the keepers of rank(s) {silent} did not answer)" if silent else "")
            + ". Each rank's copy is held by its own proc and its peer's (the next rank's, "
            "on several hosts the next host's; by two "
            "replicas under DDP): losing both takes it. The trainer cannot go on: train "
            "from a checkpoint (Trainer.save, parallelize(..., resume=))" + survives
        ) from error

    async def _let_go(self) -> None:
        """Stop the procs the trainer recovers from (and a one-proc trainer's keeper on
        the controller): their ranks may wait in a collective for a lost one, and a GPU
        is then free for the new workers. In a repair in place, only their workers and
        keepers go (:meth:`_drop_released`)."""
        keepers, self._keepers = self._keepers, None
        if self._repairing:  # the procs stay
            with contextlib.suppress(_Stuck):  # (killed: started again in place)
                await self._drop_released(keepers)
            return
        await self._procs.stop(reason="the trainer's procs were replaced")
        if keepers is not None and keepers.controller is not None:
            await keepers.controller.stop()

    async def _whole_from_copies(self, step: int, where: dict[int, list[int]]) -> str:
        """``replan``: the model's whole tensors after step ``step``, built from every
        rank's copy (``where``: the keepers holding each; of DDP replicas one is read),
        written as a snapshot into memory (/dev/shm) for any plan to load; its path.

        Raises:
            LookupError: a copy that could not be read (each keeper's reason said).
        """
        from . import _checkpoint

        state, counts = await self._whole_at(step, where, complete=True)
        path = self._snapshots.fresh()
        try:
            await asyncio.to_thread(_checkpoint.write_whole, path, state, counts)
        except BaseException:
            await asyncio.to_thread(self._snapshots.drop, path)
            raise
        await self._keep_snapshot(path, (step, counts["data_step"]), {})  # (no proc's part)
        return path

    async def _whole_at(
        self, step: int, where: dict[int, list[int]], complete: bool
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The model's whole tensors after step ``step`` from the copies of the ranks in
        ``where`` (the keepers holding each; of DDP replicas one is read), and the
        trainer's counts there. Not ``complete``: those the copies that could be read
        cover whole (the counts say what it lacks, ``partial``).

        Raises:
            LookupError: (``complete``) a copy that could not be read, or a tensor the
                copies do not cover whole.
        """
        from . import _tp
        from ._copies import contents, lacking, read_any, roles, whole_state

        assert self._keepers is not None
        keepers, layout, parts = self._keepers, self.plan.layout, self._parts
        # one rank of each group holding the same state (DDP's replicas)
        firsts: dict[tuple[int, ...], int] = {}
        for r in sorted(where):
            firsts.setdefault(roles(layout, r, 1)[0], r)

        async def read(r: int) -> tuple[int, dict[str, Any]] | None:
            try:
                copy, data = await read_any(keepers, r, step, where[r])
            except LookupError:
                if complete:
                    raise
                return None
            return r, contents(copy, data)

        read_ = await asyncio.gather(*(read(r) for r in firsts.values()))
        copies = dict(c for c in read_ if c is not None)
        if not copies:
            raise LookupError(f"no rank's copy of step {step} could be read")
        rest = next(iter(copies.values()))
        data_step = next((d for s, d, _ in self._since if s == step), self._steps)
        counts = self._counts(step, data_step, rest["loss_scale"], rest["good_steps"])

        def whole(name: str, t: Any, tp: int) -> Any:
            return _tp.whole(name, t, parts.tp_plan, parts.blocks_path, tp, parts.family == "gpt2")

        places = self._places
        state = await asyncio.to_thread(whole_state, copies, places, whole, complete)
        if not complete:
            counts |= {"partial": True, "missing": lacking(state, places)}
        return state, counts

    async def _keep_what_survives(
        self, held: dict[int, list[tuple[int, int]]], oldest: int
    ) -> dict[str, Any] | None:
        """Where no step the trainer can go on from has a copy of every rank's state: the
        whole tensors that the copies the survivors hold do cover, of the step whose
        copies cover the most ranks (the latest of those), kept on the controller for
        :meth:`save` (a checkpoint marked partial); their counts, or None where nothing
        could be read."""
        from ._copies import held_by_step

        by_step = {s: w for s, w in held_by_step(held).items() if oldest <= s <= self._done}
        if not by_step or not self._places:
            return None
        step = max(by_step, key=lambda s: (len(by_step[s]), s))
        try:
            self._survived = await self._whole_at(step, by_step[step], complete=False)
        except Exception as e:  # (what survives is a courtesy: the loss is the error)
            log.warning("what survived the loss could not be read: %s", e)
            return None
        return self._survived[1]

    async def _recover_on(
        self,
        procs: ProcMesh,
        mode: str,
        n: int,
        phases: dict[str, float],
        t: float,
        restore: _Restore,
    ) -> None:
        """:meth:`_recover` once the new procs are spawning: wait for them, plan for
        them (``replan``), set the workers up from ``restore``, stop the old procs
        (``respawn``, once the new keepers have read the copies), run the steps since."""
        from ._planning import plan as make_plan
        from ._planning import replan

        await procs.initialized
        phases["spawn"] = time.perf_counter() - t - phases.get("gather", 0.0)
        if mode == "replan":
            t = time.perf_counter()
            try:  # from what plan() measured: no measuring again
                self.plan = replan(self.plan, self._model, n)
            except PlanError:  # (a plan not made by plan(): measure these procs)
                self.plan = await make_plan(
                    self._model, procs, sample=self._sample(), loss_fn=self._loss_fn,
                    precision=self.plan.precision, compile=self.plan.compile,
                )  # fmt: skip
            self._plan_html = None
            phases["plan"] = time.perf_counter() - t
        t = time.perf_counter()
        at = restore.step
        todo = [item for item in self._since if item[0] >= at]
        self._done = at
        if todo:
            self._steps = todo[0][1]

        async def take_over(keepers: Keepers) -> None:
            """The copies are on the new procs: the old ones can go (their ranks may
            wait in a collective for the lost one)."""
            t = time.perf_counter()
            old, self._procs = self._procs, procs
            previous, self._keepers = self._keepers, keepers
            if old is procs:  # repaired in place: the old workers and keepers go
                await self._drop_released(previous)
            else:
                await old.stop(reason="the trainer's procs were replaced")
                if previous is not None and previous.controller is not None:
                    await previous.controller.stop()
            phases["stop"] = time.perf_counter() - t

        copies = None
        if restore.keepers is not None and restore.where is not None:
            copies = (restore.keepers, restore.where)
        self._workers = run_task(
            self._rt, lambda: self._setup(procs, self.plan, restore.resume, copies, take_over)
        )
        w = await self._workers
        self._procs = procs
        phases["restore"] = time.perf_counter() - t - phases.get("stop", 0.0)
        phases["_restored_step"] = at
        t = time.perf_counter()
        self._since = [item for item in self._since if item[0] < at]
        for k, (_, _, item) in enumerate(todo):  # the steps since, again
            before = self._done
            try:
                await self._one_step(w, item)
            except BaseException:  # (lost again: what is yet to run again is kept)
                self._since += todo[k + 1 :] if self._done > before else todo[k:]
                raise
        phases["rerun"] = time.perf_counter() - t
        phases["_rerun_steps"] = len(todo)

    def _sample(self) -> Batch:
        """A batch for re-planning: the latest the controller saw, or ``data``'s rows of
        the next step, whole."""
        for _, _, item in reversed(self._since):
            if not isinstance(item, int):
                return item
        if self._last_batch is not None:
            return self._last_batch
        assert self._data is not None
        return self._data(self._steps, 0, 1)

    def recoveries(self) -> Future[list[dict[str, Any]]]:
        """Each recovery from a lost proc, oldest first: ``step``, the steps that had
        ended when the loss was seen; the ranks ``lost`` and ``why``; the ``action``
        (``respawn``, ``replan``) and what it was done ``instead_of`` (``""``, or a
        respawn's reason to re-plan: a host gone); the ``procs`` and ``plan`` it went on
        with; what it restored from (``restored_from``: ``copies``, the copies in the
        procs' memory; ``snapshot``; ``start``, the state the trainer started from) and
        the steps that had ended there (``restored_step``); the steps since, run again
        (``rerun_steps``; the call that failed then runs again too, unless its step had
        ended); the ``seconds`` of each phase (``gather``: a re-plan's whole tensors
        built from the copies, ``spawn``, ``plan``, ``restore``: the workers set up,
        ``stop``, after a respawn: the survivors' old workers let go of their pieces
        (in place), or the old procs stopped, ``rerun``) and in all
        (``total_s``)."""

        async def go() -> list[dict[str, Any]]:
            return [dict(r) for r in self._recoveries]

        return run_task(self._rt, go)

    def _check(self, batch: Batch) -> int:
        """Check ``batch`` here, before any worker sees it; the labels its loss counts
        (0 where the loss is the user's).

        Raises:
            PlanError: the replicas and microbatches do not divide its rows.
            ValueError: a key, shape or type is wrong (naming it), or no label counts.
        """
        n = check_batch(batch, self._check_model, self._parts)
        per = self.plan.dp * self.plan.microbatches
        if n % per:
            raise PlanError(
                f"the batch has {n} samples; dp={self.plan.dp} x microbatches="
                f"{self.plan.microbatches} = {per} must divide it"
            )
        if not self._token_mean:
            return 0
        counted = counted_tokens(split_batch(batch)[1])
        if counted == 0:
            raise ValueError(
                "every label of the batch is -100 (after the shift by one): its loss "
                "counts no token"
            )
        return counted

    def _loss(self, values: list[float | None]) -> float:
        """The step's loss from the replicas' parts: their sum (each is its share of
        the global token mean), or the mean of their means (a user's loss_fn)."""
        losses = [v for v in values if v is not None]
        return math.fsum(losses) if self._token_mean else math.fsum(losses) / len(losses)

    def _shards(self, batch: Batch) -> list[tuple[Ranks, Shard]]:
        """The shards of ``batch``, each with the flat ranks it goes to: per replica, its
        rows of what a stage reads (:func:`shard_batch`): the first stage's, the middle
        stages' (the same for all of them), the last's; the tensor-parallel ranks of a
        stage, and the middle stages, are neighbours, so each shard goes to one range of
        ranks as one cast (to a few, where the planner reordered unlike procs). Cut
        here, in the caller's thread, not on danaus's loop."""
        layout = self.plan.layout
        pp, tp = layout.pp, layout.tp
        out = []
        for dp_i in range(layout.dp):
            # stage 0; stages 1 .. pp - 2 (none where pp < 3); stage pp - 1 (stage 0 too
            # where pp == 1)
            for first, last in ((0, 0), (1, pp - 2), (pp - 1, pp - 1))[: 3 if pp > 1 else 1]:
                if first > last:
                    continue
                ranks = _runs(
                    layout.rank(dp_i, k, t) for k in range(first, last + 1) for t in range(tp)
                )
                out.append((ranks, shard_batch(batch, layout.dp, dp_i, first == 0, last == pp - 1)))
        self.bytes_sent += sum(shard.nbytes for _, shard in out)
        return out

    def _per_shard(
        self, workers: Any, name: str, shards: list[tuple[Ranks, Shard | Staged]], counted: int
    ) -> list[Any]:
        """A cast of ``name`` to each shard's ranks with that shard; what each gathers."""
        flat = workers.flatten("rank")

        async def cast(ranks: range, shard: Shard | Staged) -> list[Any]:
            group = flat.slice(rank=slice(ranks.start, ranks.stop))
            return [v async for v in getattr(group, name).stream(shard, counted)]

        return [cast(run, shard) for ranks, shard in shards for run in ranks]

    def step(self, batch: Batch | None = None) -> Future[float]:
        """One training step on the global ``batch``; its loss. With the model's own
        loss (a Hugging Face model's), that is the global batch's token mean, as the
        model gives it in one process: labels of -100 (padding, prompts) count for
        nothing, however the rows fall into replicas and microbatches. A user's
        ``loss_fn`` is averaged over microbatches and replicas.

        With ``parallelize(..., data=fn)`` it takes no batch: each worker loads its
        replica's rows itself (``fn(step, dp_rank, dp_size)``), the workers add up the
        labels they count, and nothing of the batch goes through the controller.

        Raises:
            PlanError, ValueError: at once, here, for a batch the plan cannot take
                (naming the key or the numbers at fault); the trainer stays usable. A
                batch given where the workers load their own, or none where they do
                not, is a ValueError.
        """
        if self._data is not None:
            if batch is not None:
                raise ValueError(
                    "this trainer's workers load their own batches (data=): step() takes none"
                )
            return self._send("step", None)
        if batch is None:
            raise ValueError("step() needs the global batch (or parallelize(..., data=fn))")
        return self._send("step", batch, self._prepare(batch), _tokens(batch))

    def evaluate(self, batch: Batch) -> Future[float]:
        """The loss on ``batch`` (as :meth:`step` gives it), without updating the weights."""
        return self._send("evaluate", batch, self._prepare(batch))

    def _prepare(self, batch: Batch) -> Prepared:
        """``batch`` checked and cut into shards for the current plan (in the caller's
        thread): the plan, its counted labels, and each shard with its ranks; a shard
        over ``LARGE`` bytes packed into one buffer for the data plane."""
        counted = self._check(batch)
        out: list[tuple[Ranks, Shard | Packed]] = []
        for ranks, shard in self._shards(batch):
            out.append((ranks, Packed(shard) if shard.nbytes > LARGE else shard))
        return self.plan, counted, out

    def _send(
        self,
        name: str,
        batch: Batch | None,
        prepared: Prepared | None = None,
        tokens: int | None = None,
    ) -> Future[float]:
        """Endpoint ``name`` of the workers on a global ``batch`` (``prepared`` for the
        plan of the moment; None: each worker loads its own, ``data=``); the batch's
        loss. A step is kept in the trainer's history (its loss, ``tokens`` per second
        where known, its seconds)."""

        start = time.perf_counter()
        done: list[float] = []  # the step's loss, once it ran

        async def go(w: Any) -> float:
            if name != "step":
                return await self._call(w, name, batch, prepared)
            if not done:  # (else it ran, and what failed after it was its snapshot)
                item = self._steps if batch is None else batch  # (data=: its step's number)
                try:
                    await self._one_step(w, item, prepared, done)
                except Exception as e:
                    if isinstance(item, int) and _rolled_back(e):
                        self._steps = item + 1  # a step whose data raised is skipped
                    raise
            took = time.perf_counter() - start
            rate = None if tokens is None else tokens / max(took, 1e-9)
            self._history.append((self._done, done[0], rate, took))
            return done[0]

        return self._run(go)

    async def _call(
        self, w: Any, name: str, batch: Batch | int | None, prepared: Prepared | None
    ) -> float:
        """Endpoint ``name`` of the workers ``w`` on a global batch (cut again where the
        plan has changed since ``prepared``), or on step ``batch``'s rows, which each
        loads itself (``data=``); the batch's loss."""
        if batch is None or isinstance(batch, int):
            return self._loss(await _each(getattr(w, name), None, 0, batch))
        if prepared is None or prepared[0] is not self.plan:  # re-planned meanwhile
            prepared = await asyncio.to_thread(self._prepare, batch)
        _, counted, shards = prepared
        staged = [(r, s.register() if isinstance(s, Packed) else s) for r, s in shards]
        self.bytes_staged += sum(s.nbytes for _, s in staged if isinstance(s, Staged))
        try:
            parts = await _each_its_own(self._per_shard(w, name, staged, counted))
        finally:  # read, or never to be: the workers are done with it either way
            for _, s in staged:
                if isinstance(s, Staged):
                    await s.buffer.drop()
        return self._loss([v for part in parts for v in part])

    async def _one_step(
        self,
        w: Any,
        item: Batch | int,
        prepared: Prepared | None = None,
        done: list[float] | None = None,
    ) -> None:
        """A training step on the global batch ``item`` (or data step ``item``), its
        loss put in ``done``; kept for a recovery to run again (``respawn``: the latest
        ``RERUN_KEPT``; ``replan``: until the next snapshot, which it takes every
        ``snapshot_every`` steps: a lost proc may fail that snapshot after the step
        ran, and the recovery runs the step again, the caller having its loss)."""
        counts = (self._done, self._steps)
        loss = await self._call(w, "step", item, prepared)
        if done is not None:
            done.append(loss)
        self._done += 1
        if isinstance(item, int):
            self._steps = item + 1
        else:
            self._last_batch = item
        if self._on_lost == "fail":  # (nothing runs again)
            return
        self._since.append((*counts, item))
        if self._snapshot_every is None:  # (each rank's copy is of this step or the last)
            del self._since[:-RERUN_KEPT]
            if (
                self._snapshot not in (None, self._resume)
                and self._since[0][0] > self._snapshot_at[0]
            ):
                # a re-plan's whole tensors: no recovery can go on from them any more
                stale, self._snapshot = self._snapshot, None
                await asyncio.to_thread(self._snapshots.drop, stale)
        elif self._done % self._snapshot_every == 0:
            await self._take_snapshot(w)

    async def _take_snapshot(self, w: Any) -> None:
        """``snapshot_every``: the model's state as it is now, a checkpoint of whole
        tensors (which any plan loads; each stage gathers its tensors first) into memory
        (/dev/shm), where a recovery whose copies are lost restores from; the one before
        it removed. One that cannot be written is logged, and the one before it kept (the
        steps since it are kept too)."""
        from . import _checkpoint

        path = self._snapshots.fresh()
        try:
            await self._write_checkpoint(w, path)
            held = await asyncio.to_thread(_checkpoint.bytes_by_rank, path)
        except Exception as e:
            if not (_rolled_back(e) or isinstance(e, OSError)):
                raise
            log.warning("the snapshot of step %d could not be written: %s", self._done, e)
            await asyncio.to_thread(self._snapshots.drop, path)
            return
        self._since = []
        await self._keep_snapshot(path, (self._done, self._steps), held)

    async def _keep_snapshot(self, path: str, at: tuple[int, int], held: dict[int, int]) -> None:
        """The snapshot at ``path`` is the latest, of the counts ``at`` (steps, data
        step), ``held`` bytes of it by rank; the one before it removed."""
        self._snapshot, self._snapshot_at, self._snapshot_bytes = path, at, held
        await asyncio.to_thread(self._snapshots.keep_only, path)

    def fit(
        self,
        batches: Iterable[Batch] | None = None,
        steps: int | None = None,
        log_every: int = 10,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        every: int = 100,
        keep: int = 2,
    ) -> Future[list[float]]:
        """Train one step on each global batch of ``batches`` (a list, a generator, a
        ``DataLoader``: any iterable), until it ends or ``steps`` steps ran; the losses,
        one a step.

        On a terminal a progress bar (tqdm, where installed) shows the step, the loss,
        tokens/s and the measured step time beside the plan's estimate; elsewhere
        nothing is printed, and every ``log_every`` steps a line goes to the
        ``danaus.parallel`` logger at INFO. The next batch is taken from ``batches`` off
        the event loop (a loader may block), while nothing else of danaus waits for it.

        With ``checkpoint=dir``, every ``every`` steps (counted as :attr:`steps`, the
        run's whole count) and after the last, a checkpoint is saved (:meth:`save`) to
        ``dir/step-00000100`` and so on, and only the newest ``keep`` are kept.

        Raises (through the Future):
            As :meth:`step` does: a bad batch stops the loop there, with the losses of
            the steps before it lost to the caller but not to the model (they were
            applied; ``state_dict()`` has them).
        """
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 0
        ):
            raise ValueError(f"steps must be a non-negative int or None, not {steps!r}")
        for name, n in (("log_every", log_every), ("every", every), ("keep", keep)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive int, not {n!r}")
        saving = None if checkpoint is None else (os.path.abspath(checkpoint), every, keep)
        if (batches is None) != (self._data is not None):
            raise ValueError(
                "fit() takes batches, or none where the workers load their own (data=)"
            )
        if batches is None:
            if steps is None:
                raise ValueError("fit() over the workers' own data (data=) needs steps=")

            async def own() -> tuple[float, int | None, float] | None:
                start = time.perf_counter()
                loss = await self.step()
                return loss, None, time.perf_counter() - start

            return run_task(self._rt, lambda: self._fit_loop(own, steps, steps, log_every, saving))
        total = steps
        if total is None and isinstance(batches, Sized):
            total = len(batches)
        it = iter(batches)

        def take() -> tuple[int, Batch, Prepared] | None:
            """The next batch, checked and cut (off the loop): its tokens, itself and
            its shards; None at the end."""
            batch = next(it, _END)
            return None if batch is _END else (_tokens(batch), batch, self._prepare(batch))

        async def given() -> tuple[float, int | None, float] | None:
            taken = await asyncio.to_thread(take)
            if taken is None:
                return None
            tokens, batch, prepared = taken
            start = time.perf_counter()  # (the step's own time, as estimated)
            loss = await self._send("step", batch, prepared, tokens)
            return loss, tokens, time.perf_counter() - start

        return run_task(self._rt, lambda: self._fit_loop(given, steps, total, log_every, saving))

    async def _fit_loop(
        self,
        one: Callable[[], Awaitable[tuple[float, int | None, float] | None]],
        steps: int | None,
        total: int | None,
        log_every: int,
        saving: tuple[str, int, int] | None = None,
    ) -> list[float]:
        """:meth:`fit`'s loop: ``one()`` runs a step (its loss, tokens where known, and
        seconds), None at the end of the batches; the progress bar or the log lines;
        ``saving``: (directory, every, keep) of its checkpoints."""
        losses: list[float] = []
        bar = _progress_bar(total)
        saved = -1
        try:
            while steps is None or len(losses) < steps:
                done = await one()
                if done is None:
                    break
                if saving is not None and self._done % saving[1] == 0:
                    saved = await self._save_kept(*saving)
                loss, tokens, took = done
                losses.append(loss)
                rate = None if tokens is None else tokens / took
                shown = _shown(len(losses), loss, rate, took, self.plan)
                if bar is not None:
                    bar.set_postfix_str(shown, refresh=False)
                    bar.update(1)
                elif len(losses) % log_every == 0:
                    log.info("step %s", shown)
            if saving is not None and losses and saved != self._done:
                await self._save_kept(*saving)
        finally:
            if bar is not None:
                bar.close()
        return losses

    async def _save_kept(self, where: str, every: int, keep: int) -> int:
        """Save to ``where/step-N`` (N: :attr:`steps`); remove all but the newest
        ``keep`` of ``where``'s checkpoints. The step saved."""
        import shutil

        step = self._done
        await self.save(os.path.join(where, f"step-{step:08d}"))

        def prune() -> None:
            ours = sorted(d for d in os.listdir(where) if d.startswith("step-") and d[5:].isdigit())
            for old in ours[:-keep]:
                shutil.rmtree(os.path.join(where, old), ignore_errors=True)

        await asyncio.to_thread(prune)
        return step

    def state_dict(self) -> Future[dict[str, torch.Tensor]]:
        """The whole model's weights on the controller, under the model's own keys (loads
        into a plain copy of the model)."""

        async def go(w: Any) -> dict[str, torch.Tensor]:
            out: dict[str, torch.Tensor] = {}
            for piece in await _each(w.state_dict):
                if piece:
                    out.update(piece)
            return out

        return self._run(go)

    @property
    def steps(self) -> int:
        """The optimizer steps the model has taken: those of this trainer, and those of
        the run it resumed (``parallelize(..., resume=path)``)."""
        return self._done

    def save(self, path: str | os.PathLike[str]) -> Future[str]:
        """Write a checkpoint of the model and its optimizer to the directory ``path``
        (made where missing; a shared filesystem where procs are on several hosts): the
        weights and the optimizer's state, whole under the model's own names, written
        by ``torch.distributed.checkpoint`` (each stage's first rank writes its own
        file, at once), and the trainer's counts (the steps taken; with ``data=``, the
        next step's number). Any plan on any number of procs resumes it
        (``parallelize(..., resume=path)``), and :func:`load_state_dict` gives a plain
        model's weights from it. Runs after the calls before it; the path written.

        A trainer that lost procs whose state no copy held (its calls raise
        ``SupervisionError`` saying so) writes what survived instead: the whole tensors
        the copies left cover, after the step they cover the most ranks at, in a
        checkpoint marked partial (``danaus.json``: ``partial``, and what it lacks in
        ``missing``), which :func:`load_state_dict` reads and no trainer resumes.

        Raises (through the Future): a write that failed on a rank (a full disk), with
        its traceback; every rank rolled the save back and the trainer goes on.
        """
        from . import _checkpoint

        where = os.path.abspath(os.fspath(path))

        async def made() -> None:
            try:
                await asyncio.to_thread(os.makedirs, where, exist_ok=True)
            except OSError as e:  # nothing was sent: the trainer is as it was
                e.add_note(ROLLED_BACK)
                raise

        async def go(w: Any) -> str:
            await made()
            await self._write_checkpoint(w, where)
            return where

        async def survived() -> str:
            assert self._survived is not None
            await made()
            state, counts = self._survived
            await asyncio.to_thread(_checkpoint.write_whole, where, state, counts)
            log.warning(
                "%s: wrote what survived the loss of procs into %s, the state after step "
                "%d; partial, it lacks %s", self, where, counts["steps"],
                ", ".join(counts["missing"][:5]) + (" ..." if len(counts["missing"]) > 5 else ""),
            )  # fmt: skip
            return where

        return self._run(go, survived)

    async def _write_checkpoint(self, w: Any, where: str) -> None:
        """The workers ``w`` write a checkpoint into the directory ``where``, and then
        the trainer's counts beside it (:meth:`save`, and ``replan``'s snapshots)."""
        from . import _checkpoint

        done = await _each(w.save, where)
        scale, good = max(d["loss_scale"] for d in done), max(d["good_steps"] for d in done)
        counts = self._counts(self._done, self._steps, scale, good)
        try:
            await asyncio.to_thread(_checkpoint.write_meta, where, counts)
        except OSError as e:  # the checkpoint lacks its counts: no trainer resumes it
            e.add_note(ROLLED_BACK)
            raise

    def _counts(
        self, steps: int, data_step: int, loss_scale: float, good_steps: int
    ) -> dict[str, Any]:
        """The trainer's counts a checkpoint keeps beside its tensors (``danaus.json``:
        see :func:`._checkpoint.meta`), after ``steps`` steps."""
        return {
            "format": 1,
            "steps": steps,
            "data_step": data_step,
            "loss_scale": loss_scale,
            "good_steps": good_steps,
            "plan": str(self.plan.strategy),
            "procs": len(self._procs),
        }

    def held_bytes(self) -> Future[list[dict[str, int]]]:
        """Per proc, in rank order: bytes of ``weights``, ``grads``, ``optimizer`` state
        held there, and their ``total``; ``copies``, the bytes of the copies of state
        it holds for a lost proc's successor (``respawn``: its own two latest, and its
        peer's, where no replica holds the same); and ``snapshot``, the bytes of its
        part of the latest snapshot (``replan``), which the host holds in memory
        (/dev/shm)."""

        async def go(w: Any) -> list[dict[str, int]]:
            held = await _each(w.held_bytes)
            peers: dict[int, int] = {}
            if self._keepers is not None:  # (each proc's keeper: its peer's copies)
                asks = [self._keepers.at(r).nbytes.call_one() for r in range(len(self._procs))]
                async with asyncio.timeout(KEEPER_WAIT_S):
                    peers = dict(enumerate(await asyncio.gather(*asks)))
            return [
                {k: v for k, v in h.items() if k != "rank"}
                | {"copies": h["copies"] + peers.get(h["rank"], 0)}
                | {"snapshot": self._snapshot_bytes.get(h["rank"], 0)}
                for h in sorted(held, key=lambda h: h["rank"])
            ]

        return self._run(go)

    def stop(self) -> Future[None]:
        """Leave the process groups and stop the workers; the procs stay up for another
        trainer (those the trainer spawned itself, after a lost proc it could not start
        again in its place, are stopped).
        Returns at once: ``await`` (or ``.get()``) the result to wait for it."""
        self._stopped = True

        async def go() -> None:
            try:
                if self._failed is not None:
                    return
                try:
                    w = await self._workers
                except Exception:
                    return
                await w.close.call()
                await w.stop()
            finally:
                if self._keepers is not None:  # (a one-proc trainer's: on the controller)
                    keepers, self._keepers = self._keepers, None
                    with contextlib.suppress(Exception):  # (their procs may be gone)
                        async with asyncio.timeout(KEEPER_WAIT_S):
                            await keepers.stop()
                await asyncio.to_thread(self._snapshots.close)
                self._survived = None
                if self._procs is not self._given:  # procs the trainer spawned itself
                    await self._procs.stop(reason="the trainer that spawned them stopped")

        return run_task(self._rt, go)


class _Stuck(SupervisionError):
    """A repair in place killed the procs ``ranks``: their old workers were still busy
    ``RELEASE_WAIT_S`` after the loss (stuck in a collective, or a step of their own)."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = ranks
        self.why = (
            f"killed: its worker was still busy {RELEASE_WAIT_S:g} s after the loss (stuck "
            "in a collective?), so it could not let go of its piece"
        )
        super().__init__(f"rank(s) {ranks} of the trainer {self.why}")


class _Restore(NamedTuple):
    """Where a recovery restores from: the steps ended there, and what that is
    (``copies``, ``snapshot``, ``start``); the checkpoint the new workers load (a
    snapshot, the one resumed, or the whole tensors a re-plan built from the copies), or
    (``respawn``) the keepers holding each rank's copy of that step."""

    step: int
    source: str
    resume: str | None = None
    keepers: Keepers | None = None
    where: dict[int, list[int]] | None = None


class _Snapshots:
    """The directories of a trainer's snapshots, in memory where Linux has a tmpfs
    (/dev/shm), removed when the trainer stops or is collected."""

    def __init__(self) -> None:
        import tempfile

        shm = "/dev/shm"
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
        self.root = tempfile.mkdtemp(prefix="danaus-snapshots-", dir=base)
        self._n = itertools.count()
        self._finalizer = weakref.finalize(self, _remove_tree, self.root)

    def fresh(self) -> str:
        return os.path.join(self.root, f"{next(self._n):08d}")

    def drop(self, path: str) -> None:
        _remove_tree(path)

    def keep_only(self, path: str) -> None:
        for name in os.listdir(self.root):
            if os.path.join(self.root, name) != path:
                _remove_tree(os.path.join(self.root, name))

    def close(self) -> None:
        self._finalizer()


def _remove_tree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _lost_error(e: BaseException, lost: dict[int, str]) -> BaseException:
    """The error a call fails with where procs were lost (``on_lost_proc="fail"``): the
    lost proc's own ``SupervisionError`` where that came first, else one naming the
    ranks lost (a survivor's error, gloo's "connection closed", came first)."""
    from ..errors import SupervisionError

    if isinstance(e, SupervisionError):
        return e
    why = "; ".join(f"rank {r}: {w}" for r, w in sorted(lost.items()))
    return SupervisionError(f"the trainer lost a proc ({why}); on_lost_proc='fail'")


def _rolled_back(e: BaseException) -> bool:
    """Whether ``e`` is an error after which every rank rolled its call back (the
    user's loss or ``data`` raising in a step, a checkpoint that could not be written:
    the note :data:`ROLLED_BACK` says so), so that the trainer goes on."""
    from ..errors import ActorError

    if isinstance(e, ActorError):
        return ROLLED_BACK in e.remote_traceback
    return ROLLED_BACK in getattr(e, "__notes__", ())


def check_on_lost_proc(mode: object) -> None:
    """Raises ValueError where ``mode`` is not one of :data:`ON_LOST_PROC`, naming them."""
    if mode not in ON_LOST_PROC:
        raise ValueError(f"on_lost_proc={mode!r}: give one of {', '.join(map(repr, ON_LOST_PROC))}")


def _host_stride(procs: ProcMesh) -> int:
    """How far a rank's peer is: the procs per host where ``procs`` are on several hosts
    laid out host by host (the peer is then on the next host), else 1."""
    blocks = host_blocks(procs)
    return 1 if blocks is None else blocks[1]


def _runs(ranks: Iterable[int]) -> Ranks:
    """``ranks`` as the fewest runs of consecutive ranks."""
    out: list[range] = []
    for r in sorted(ranks):
        if out and out[-1].stop == r:
            out[-1] = range(out[-1].start, r + 1)
        else:
            out.append(range(r, r + 1))
    return tuple(out)


def _tokens(batch: Batch) -> int:
    """The tokens a batch trains on: its mask's ones where it has one, else its ids (or,
    for an (inputs, target) batch, its rows)."""
    if isinstance(batch, dict):
        mask = batch.get("attention_mask")
        return int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
    return int(split_batch(batch)[0].shape[0])


def _shown(step: int, loss: float, tokens_s: float | None, took: float, plan: Plan) -> str:
    """A step's line: the loss, tokens/s (where the controller saw the batch), the step
    time beside the estimate."""
    estimate = f" (est {plan.estimated_step_s:.3f} s)" if plan.estimated_step_s else ""
    rate = f"{tokens_s:,.0f} tokens/s, " if tokens_s is not None else ""
    return f"{step}: loss {loss:.4f}, {rate}{took:.3f} s/step{estimate}"


def _progress_bar(total: int | None) -> Any:
    """A tqdm bar on stderr when it is a terminal and tqdm is installed, else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return None
    return tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True)


def parallelize(
    model: nn.Module,
    procs: ProcMesh,
    plan: Plan,
    *,
    optimizer: Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer],
    loss_fn: LossFn | None = None,
    data: DataFn | None = None,
    compile: bool | None = None,
    resume: str | os.PathLike[str] | None = None,
    on_lost_proc: str = "respawn",
    snapshot_every: int | None = None,
) -> Trainer:
    """Lay ``model`` out on ``procs`` as ``plan`` says and return its :class:`Trainer` at
    once (the workers set up in the background; the first call waits for them).

    ``optimizer`` makes each proc's optimizer from the parameters it holds (a lambda or a
    function; it travels to the procs). ``loss_fn(output, target)`` defaults to the
    plan's (the model's own loss for Hugging Face models). ``data(step, dp_rank,
    dp_size)``, where given, returns replica ``dp_rank``'s rows of step ``step``'s
    global batch (a dict or an ``(inputs, target)`` pair, ``1/dp_size`` of the rows);
    every proc of that replica calls it, so that no batch goes through the controller,
    and ``step()`` and ``fit(steps=N)`` then take none.

    ``compile=True`` compiles each block with ``torch.compile`` (TorchDynamo and
    Inductor, on every proc; the first step of each new sequence length compiles, the
    rest run compiled); by default the plan's ``compile`` (``plan(..., compile=True)``
    measures the compiled blocks, so that its estimate is of them). On CPU it needs a
    C++ compiler, and the first call says so plainly where a proc has none.

    ``resume=path`` starts from a checkpoint ``Trainer.save(path)`` wrote, under any
    plan and on any number of procs (saved at dp=4, resumed at dp=2 x pp=2 or on one
    proc): the weights, the optimizer's state, the steps taken and, with ``data=``,
    the next step's number; training goes on as if it had never stopped. ``model`` is
    then only the architecture (its weights are replaced). A path that is no
    checkpoint raises FileNotFoundError here, and one of another model a KeyError or
    ValueError naming a weight it lacks or holds in another shape.

    ``on_lost_proc`` says what a lost proc (killed, out of memory, its host agent gone)
    does to training. ``"respawn"``: the trainer spawns as many new procs on the same
    host, sets them up from the copies of each rank's state that the procs keep in
    memory after every step (each rank's on its own proc and its peer's, the next
    rank's or on several hosts the next host's: see
    ``held_bytes()``), stops the old ones (the survivors' ranks may wait in a
    collective for the lost one), and runs the step since the copies (where there is
    one) and the step that failed again: the call returns that step's loss as if
    nothing had happened. Neighbours lost together take a rank's two copies with them:
    the call then raises ``SupervisionError`` naming the ranks whose state is gone.
    Where the procs are on several hosts and all but one host is gone, the trainer
    re-plans onto the procs left instead.
    ``"replan"``: the trainer builds the model's whole tensors from the same copies,
    stops its procs and goes on with as many new ones as survived, with a new plan for
    them, which loads those. ``"fail"``: the call raises ``SupervisionError`` and the
    trainer is broken. See :meth:`Trainer.recoveries`. The procs given are stopped on a
    recovery: actors of yours there are lost with them. ``snapshot_every=N`` also writes
    a snapshot every ``N`` steps (a checkpoint of whole tensors into memory, /dev/shm;
    the global batches since are kept on the controller): a recovery whose copies are
    lost (neighbours lost together) goes on from it.
    """
    if compile is not None:
        if not isinstance(compile, bool):
            raise TypeError(f"compile={compile!r}: give True or False")
        plan = dataclasses.replace(plan, compile=compile)
    loss = loss_fn if loss_fn is not None else plan.loss_fn
    return Trainer(model, procs, plan, optimizer, loss, data, resume, on_lost_proc, snapshot_every)
