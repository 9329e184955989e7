"""Where each proc of a mesh sits in a dp x pp x tp grid, and what it runs there."""

from __future__ import annotations

from dataclasses import dataclass


def runs_fsdp(dp: int, pp: int, tp: int, sharded: bool) -> bool:
    """Whether a layout's replicas run under FSDP2 (``fully_shard``): where they shard,
    and where DDP does not compose (pipelines, tensor parallel). The worker replicates
    so, and the planner estimates so."""
    return dp > 1 and (sharded or pp > 1 or tp > 1)


@dataclass(frozen=True)
class Layout:
    """The grid a plan runs on: ``dp`` replicas of a ``pp``-stage pipeline whose blocks are
    split ``tp`` ways. Place ``(dp_i * pp + pp_i) * tp + tp_i`` of the grid (:func:`position`)
    is held by mesh rank ``order[place]``, or by the rank of that number where ``order``
    is empty: the ``tp`` procs of one stage are neighbours (the fastest links), replicas
    are farthest. The planner reorders unlike procs so that each stage's are alike.

    Attributes:
        dp, pp, tp: the grid's sizes.
        microbatches: microbatches per replica per step.
        stages: per stage, its (first, last) block index, inclusive.
        schedule: ``"1f1b"`` or ``"gpipe"`` (pipelines only).
        sharded: replicas shard weights, grads and optimizer state (FSDP) instead of
            each holding all of them (DDP).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the forward computes under
            autocast in the low precision, replicas communicate in it (weights,
            gradients and optimizer state stay fp32); fp16 scales the loss.
        checkpointing: per stage, whether its blocks keep only their inputs for backward
            and compute their forward again there (activation checkpointing).
        compile: each block runs compiled by ``torch.compile`` (TorchDynamo, Inductor).
        order: the mesh rank at each position of the grid (empty: position = rank).
    """

    dp: int
    pp: int
    tp: int
    microbatches: int
    stages: tuple[tuple[int, int], ...]
    schedule: str = "1f1b"
    sharded: bool = False
    precision: str = "fp32"
    checkpointing: tuple[bool, ...] = ()
    compile: bool = False
    order: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.order:
            return
        if sorted(self.order) != list(range(self.size)):
            raise ValueError(
                f"order={list(self.order)}: give each of the mesh's {self.size} ranks once"
            )
        g = self.grid()
        steps = [
            (g[d][k][t], g[d2][k2][t2])
            for d in range(self.dp)
            for k in range(self.pp)
            for t in range(self.tp)
            for d2, k2, t2 in ((d + 1, k, t), (d, k + 1, t), (d, k, t + 1))
            if d2 < self.dp and k2 < self.pp and t2 < self.tp
        ]
        wrong = next(((a, b) for a, b in steps if a > b), None)
        if wrong is not None:
            raise ValueError(
                f"order={list(self.order)}: ranks must rise along each of dp, pp and tp "
                "(torch numbers a process group's members in rank order): rank "
                f"{wrong[0]} comes before rank {wrong[1]}"
            )

    @property
    def size(self) -> int:
        return self.dp * self.pp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp_i, pp_i, tp_i) of ``rank``."""
        pos = self.order.index(rank) if self.order else rank
        tp_i = pos % self.tp
        pp_i = (pos // self.tp) % self.pp
        return pos // (self.tp * self.pp), pp_i, tp_i

    def rank(self, dp_i: int, pp_i: int, tp_i: int) -> int:
        pos = position(self.pp, self.tp, dp_i, pp_i, tp_i)
        return self.order[pos] if self.order else pos

    def grid(self) -> list[list[list[int]]]:
        """The ranks as a ``dp x pp x tp`` nested list (a ``DeviceMesh``'s)."""
        return [
            [[self.rank(d, k, t) for t in range(self.tp)] for k in range(self.pp)]
            for d in range(self.dp)
        ]

    def stage_ranks(self, pp_i: int) -> tuple[int, ...]:
        """The ranks that hold stage ``pp_i``: one per replica and tensor-parallel shard."""
        return stage_ranks(self.dp, self.pp, self.tp, pp_i, self.order)


def position(pp: int, tp: int, dp_i: int, pp_i: int, tp_i: int) -> int:
    """The place of ``(dp_i, pp_i, tp_i)`` in a grid of ``pp`` stages split ``tp`` ways:
    the ``tp`` shards of a stage are neighbours, replicas farthest apart."""
    return (dp_i * pp + pp_i) * tp + tp_i


def stage_ranks(
    dp: int, pp: int, tp: int, pp_i: int, order: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """The ranks of a ``dp x pp x tp`` grid that hold stage ``pp_i``, in order (replica,
    then tensor-parallel shard); ``order``: the rank at each position, as
    :class:`Layout`'s."""
    pos = [position(pp, tp, d, pp_i, t) for d in range(dp) for t in range(tp)]
    return tuple(order[p] for p in pos) if order else tuple(pos)


def order_of(dp: int, pp: int, tp: int, stages: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The ``order`` (see :class:`Layout`) that puts each stage on its ``ranks``
    (:func:`stage_ranks`' order); empty where that is the plain one, or where a stage's
    ranks are not given."""
    if len(stages) != pp or any(len(r) != dp * tp for r in stages):
        return ()
    order = [0] * (dp * pp * tp)
    for k, ranks in enumerate(stages):
        for i, r in enumerate(ranks):
            d, t = divmod(i, tp)
            order[position(pp, tp, d, k, t)] = r
    return () if order == list(range(len(order))) else tuple(order)
