"""``parallelize`` and ``Trainer``: the controller's one handle on a model trained by a mesh."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..actors._api import Future, current_runtime, run_task
from ..spmd import setup_torch_elastic_env_async
from ._errors import PlanError
from ._model import Batch, LossFn, batch_size, find_parts
from ._plan import Plan

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..mesh import ProcMesh

T = TypeVar("T")
_names = itertools.count()


async def _each(endpoint: Any, *args: Any) -> list[Any]:
    """Call every worker; their results in arrival order. The first rank to raise fails
    the call at once (the others may be waiting for it in a collective)."""
    return [v async for v in endpoint.stream(*args)]


class Trainer:
    """A model trained by every proc of a mesh as a plan lays it out.

    Made by :func:`parallelize`; each method returns a danaus ``Future``: ``await`` it in
    async code, ``.get()`` in sync code. Calls run one after another, in the order made.
    A rank that raises fails the call with its traceback (an ``ActorError``); the trainer
    is then broken (later calls raise the same) and every rank has been stopped, so none
    waits in a collective: build a new trainer on a new mesh.
    """

    def __init__(
        self,
        model: nn.Module,
        procs: ProcMesh,
        plan: Plan,
        optimizer: Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer],
        loss_fn: LossFn | None,
    ) -> None:
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
        parts = find_parts(model, plan.layers)

        async def setup() -> Any:
            from ._worker import ParallelWorker

            await setup_torch_elastic_env_async(procs)
            workers = procs.spawn(f"_parallel{next(_names)}", ParallelWorker)
            await workers.setup.call(model, parts, plan.layout, loss_fn, optimizer)
            return workers

        self._workers: Future[Any] = run_task(self._rt, setup)

    def __repr__(self) -> str:
        state = "failed" if self._failed else "stopped" if self._stopped else "ready"
        return f"<Trainer {self.plan.strategy} on {len(self._procs)} procs: {state}>"

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
                    self._failed = e
                    # a rank failed: the others may wait in a collective for it forever
                    await self._procs.stop(reason="a rank of the trainer failed")
                    raise

        return run_task(self._rt, go)

    def _check(self, batch: Batch) -> None:
        n = batch_size(batch)
        per = self.plan.dp * self.plan.microbatches
        if n % per:
            raise PlanError(
                f"the batch has {n} samples; dp={self.plan.dp} x microbatches="
                f"{self.plan.microbatches} = {per} must divide it"
            )

    @staticmethod
    def _loss(values: list[float | None]) -> float:
        losses = [v for v in values if v is not None]
        return math.fsum(losses) / len(losses)

    def step(self, batch: Batch) -> Future[float]:
        """One training step on the global ``batch``; its mean loss."""
        self._check(batch)

        async def go(w: Any) -> float:
            return self._loss(await _each(w.step, batch))

        return self._run(go)

    def evaluate(self, batch: Batch) -> Future[float]:
        """The mean loss on ``batch``, without updating the weights."""
        self._check(batch)

        async def go(w: Any) -> float:
            return self._loss(await _each(w.evaluate, batch))

        return self._run(go)

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


def parallelize(
    model: nn.Module,
    procs: ProcMesh,
    plan: Plan,
    *,
    optimizer: Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer],
    loss_fn: LossFn | None = None,
) -> Trainer:
    """Lay ``model`` out on ``procs`` as ``plan`` says and return its :class:`Trainer` at
    once (the workers set up in the background; the first call waits for them).

    ``optimizer`` makes each proc's optimizer from the parameters it holds (a lambda or a
    function; it travels to the procs). ``loss_fn(output, target)`` defaults to the
    plan's (the model's own loss for Hugging Face models).
    """
    return Trainer(model, procs, plan, optimizer, loss_fn if loss_fn is not None else plan.loss_fn)
