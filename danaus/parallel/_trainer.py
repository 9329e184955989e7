"""``parallelize`` and ``Trainer``: the controller's one handle on a model trained by a mesh."""

from __future__ import annotations

import asyncio
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
from typing import TYPE_CHECKING, Any, TypeVar

from ..actors._api import Future, current_runtime, run_task
from ..mesh._api import add_section
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

    from ..mesh import ProcMesh

T = TypeVar("T")
#: the flat ranks a shard goes to, as runs of neighbours (one cast each)
Ranks = tuple[range, ...]
#: ``data(step, dp_rank, dp_size)``: a replica's rows of a step's global batch
DataFn = Callable[[int, int, int], Any]
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
    next step gives the numbers of a run that never saw the bad batch. Any other rank
    failure (the model's own forward raising, a proc lost) fails the call with its
    traceback; the trainer is then broken (later calls raise the same) and every rank
    has been stopped, so none waits in a collective: build a new trainer on a new mesh.
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
    ) -> None:
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
        _LIVE.add(self)
        add_section("trainers", _trainers_picture)

        async def setup() -> Any:
            from ._worker import ParallelWorker, tied_params

            await setup_torch_elastic_env_async(procs)
            workers = procs.spawn(f"_parallel{next(_names)}", ParallelWorker)
            layout = plan.layout
            tied = tied_params(model, parts)
            args = (parts, layout, loss_fn, optimizer, data, tied, self._resume)
            if layout.pp == 1:
                await workers.setup.call(model, *args)
                return workers
            # each stage's procs get that stage only: a proc never holds the whole model
            flat = workers.flatten("rank")
            calls = []
            for k, (first, last) in enumerate(layout.stages):
                piece = parts.cut(model, first, last)
                for run in _runs(layout.stage_ranks(k)):
                    group = flat.slice(rank=slice(run.start, run.stop))
                    calls.append(group.setup.call(piece, *args))
                del piece
            await asyncio.gather(*calls)
            return workers

        self._workers: Future[Any] = run_task(self._rt, setup)

    def __repr__(self) -> str:
        return f"<Trainer {self.plan.strategy} on {len(self._procs)} procs: {self._state()}>"

    def _state(self) -> str:
        return "failed" if self._failed else "stopped" if self._stopped else "ready"

    def picture(self) -> dict[str, Any]:
        """What the dashboard's training view shows of this trainer, as plain JSON-able
        data: its plan (dims, stages with their blocks and ranks, the estimate), its
        state (``ready``, ``stopped``, ``failed``), the steps run and the latest
        ``HISTORY`` of them as ``[step, loss, tokens/s or None, seconds]``, and the plan
        drawn (``picture_html``: :meth:`Plan.html`)."""
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
            # the plan drawn (Plan.html: the ranks, the estimated schedule, memory per
            # proc against its limit), made once: a plan does not change
            "picture_html": self._picture_html(),
        }

    def _picture_html(self) -> str:
        if self._plan_html is None:
            self._plan_html = self.plan.html()
        return self._plan_html

    def _run(self, what: Callable[[Any], Coroutine[Any, Any, T]]) -> Future[T]:
        async def go() -> T:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._stopped:
                    raise RuntimeError("this trainer was stopped")
                if self._failed is not None:
                    raise self._failed
                try:
                    return await what(await self._workers)
                except Exception as e:
                    if _rolled_back(e):  # the user's code raised; every rank undid it
                        raise
                    self._failed = e
                    # a rank failed: the others may wait in a collective for it forever
                    await self._procs.stop(reason="a rank of the trainer failed")
                    raise

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
            self._steps += 1
            return self._send("step", 0, [], data_step=self._steps - 1)
        if batch is None:
            raise ValueError("step() needs the global batch (or parallelize(..., data=fn))")
        return self._send("step", *self._prepare(batch), tokens=_tokens(batch))

    def evaluate(self, batch: Batch) -> Future[float]:
        """The loss on ``batch`` (as :meth:`step` gives it), without updating the weights."""
        return self._send("evaluate", *self._prepare(batch))

    def _prepare(self, batch: Batch) -> tuple[int, list[tuple[Ranks, Shard | Packed]]]:
        """``batch`` checked and cut into shards (in the caller's thread): its counted
        labels, and each shard with its ranks; a shard over ``LARGE`` bytes packed into
        one buffer for the data plane."""
        counted = self._check(batch)
        out: list[tuple[Ranks, Shard | Packed]] = []
        for ranks, shard in self._shards(batch):
            out.append((ranks, Packed(shard) if shard.nbytes > LARGE else shard))
        return counted, out

    def _send(
        self,
        name: str,
        counted: int,
        shards: list[tuple[Ranks, Shard | Packed]],
        data_step: int | None = None,
        tokens: int | None = None,
    ) -> Future[float]:
        """Endpoint ``name`` of the workers on a prepared batch (or, with ``data_step``,
        on the one each loads itself); the batch's loss. A step is kept in the
        trainer's history (its loss, ``tokens`` per second where known, its seconds)."""

        async def go(w: Any) -> float:
            start = time.perf_counter()
            loss = await run(w)
            if name == "step":
                took = time.perf_counter() - start
                rate = None if tokens is None else tokens / max(took, 1e-9)
                self._done += 1
                self._history.append((self._done, loss, rate, took))
            return loss

        async def run(w: Any) -> float:
            if data_step is not None:
                return self._loss(await _each(getattr(w, name), None, 0, data_step))
            staged = [(r, s.register() if isinstance(s, Packed) else s) for r, s in shards]
            self.bytes_staged += sum(s.nbytes for _, s in staged if isinstance(s, Staged))
            try:
                parts = await _each_its_own(self._per_shard(w, name, staged, counted))
            finally:  # read, or never to be: the workers are done with it either way
                for _, s in staged:
                    if isinstance(s, Staged):
                        await s.buffer.drop()
            return self._loss([v for part in parts for v in part])

        return self._run(go)

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

        def take() -> tuple[int, int, list[tuple[Ranks, Shard | Packed]]] | None:
            """The next batch, checked and cut (off the loop): its tokens, counted
            labels and shards; None at the end."""
            batch = next(it, _END)
            return None if batch is _END else (_tokens(batch), *self._prepare(batch))

        async def given() -> tuple[float, int | None, float] | None:
            taken = await asyncio.to_thread(take)
            if taken is None:
                return None
            tokens, counted, shards = taken
            start = time.perf_counter()  # (the step's own time, as estimated)
            loss = await self._send("step", counted, shards, tokens=tokens)
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

        Raises (through the Future): a write that failed on a rank (a full disk), with
        its traceback; every rank rolled the save back and the trainer goes on.
        """
        where = os.path.abspath(os.fspath(path))

        async def go(w: Any) -> str:
            from . import _checkpoint

            try:
                await asyncio.to_thread(os.makedirs, where, exist_ok=True)
            except OSError as e:  # nothing was sent: the trainer is as it was
                e.add_note(ROLLED_BACK)
                raise
            done = await _each(w.save, where)
            counts = {
                "format": 1,
                "steps": self._done,
                "data_step": self._steps,
                "loss_scale": max(d["loss_scale"] for d in done),
                "plan": str(self.plan.strategy),
                "procs": len(self._procs),
            }
            try:
                await asyncio.to_thread(_checkpoint.write_meta, where, counts)
            except OSError as e:  # the checkpoint lacks its counts: no trainer resumes it
                e.add_note(ROLLED_BACK)
                raise
            return where

        return self._run(go)

    def held_bytes(self) -> Future[list[dict[str, int]]]:
        """Per proc, in rank order: bytes of ``weights``, ``grads``, ``optimizer`` state
        held there, and their ``total``."""

        async def go(w: Any) -> list[dict[str, int]]:
            held = await _each(w.held_bytes)
            return [
                {k: v for k, v in h.items() if k != "rank"}
                for h in sorted(held, key=lambda h: h["rank"])
            ]

        return self._run(go)

    def stop(self) -> Future[None]:
        """Leave the process groups and stop the workers; the procs stay up for another
        trainer. Returns at once: ``await`` (or ``.get()``) the result to wait for it."""
        self._stopped = True

        async def go() -> None:
            if self._failed is not None:
                return
            try:
                w = await self._workers
            except Exception:
                return
            await w.close.call()
            await w.stop()

        return run_task(self._rt, go)


def _rolled_back(e: BaseException) -> bool:
    """Whether ``e`` is an error after which every rank rolled its call back (the
    user's loss or ``data`` raising in a step, a checkpoint that could not be written:
    the note :data:`ROLLED_BACK` says so), so that the trainer goes on."""
    from ..errors import ActorError

    if isinstance(e, ActorError):
        return ROLLED_BACK in e.remote_traceback
    return ROLLED_BACK in getattr(e, "__notes__", ())


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
    """
    if compile is not None:
        if not isinstance(compile, bool):
            raise TypeError(f"compile={compile!r}: give True or False")
        plan = dataclasses.replace(plan, compile=compile)
    loss = loss_fn if loss_fn is not None else plan.loss_fn
    return Trainer(model, procs, plan, optimizer, loss, data, resume)
