"""The planner: from what was measured, the layout with the least estimated step time that
fits every proc's memory.

For each grid (dp x pp x tp = the mesh's size), microbatch count and kind of replica
(DDP, or FSDP sharding), the stage boundaries come from dynamic programming over the
blocks: the split into ``pp`` contiguous stages whose slowest stage is fastest, with each
stage under the memory cap. The step is then estimated as

- compute: the longer of the pipeline's critical path, ``(microbatches + pp - 1)`` x
  the slowest stage's microbatch time (the schedule's bubble), and the work of every
  proc over the cores there are (a host with fewer cores than procs runs them in turn:
  while some stages wait in the bubble, the others have their cores). Each stage's time
  is its blocks' measured forward + backward (divided by ``tp``), its part of embed /
  head, the sends to the next stage and the tensor-parallel all-reduces (four per
  block) at the measured bandwidth, as one proc alone runs them;
- replicas: an all-reduce of the stage's gradients (DDP), or FSDP's all-gathers of the
  weights (each microbatch's forward, and its backward too where the plan shards) and a
  reduce-scatter of the gradients;
- the optimizer step, measured per byte of weights, every proc at once.

Where every proc computes at once, the work over the cores is charged what sharing them
measured to cost past an even share (``MeshFacts.together``).

Memory per proc: weights + gradients + optimizer state (each divided by ``tp`` for the
blocks, by ``dp`` under FSDP) + the activations of the microbatches in flight on that
stage (1F1B keeps ``pp - stage`` of them, GPipe all) + what the backend holds while it
runs, as measured: FSDP's gathered weights, whole gradients and buffers (a stage is one
unit), or the copies of a DDP gradient bucket an all-reduce makes.

Given the costs of the blocks checkpointed too (``checkpointing=None``: measured so), a
stage that does not fit the cap keeping its activations recomputes them instead where
that fits (it is slower, so a stage that fits keeps them), and the split is chosen
knowing so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from ._errors import PlanError
from ._layout import order_of, runs_fsdp, stage_ranks
from ._plan import Plan, StagePlan, strategy_name
from ._profile import MeshFacts, ModelCost

#: estimates this close to the fastest (a fraction) count as a tie, which the simplest
#: layout wins: fewer dims in use, no sharding, fewer microbatches
TIE = 0.05

#: more microbatches than this per replica buy little and cost a profile size each
MAX_MICROBATCHES = 16

#: bytes of a DDP gradient bucket (torch's ``bucket_cap_mb`` default): what is all-reduced
#: at once
DDP_BUCKET = 25 << 20


@dataclass(frozen=True)
class Candidate:
    dp: int
    pp: int
    tp: int
    microbatches: int
    sharded: bool

    @property
    def schedule(self) -> str:
        return "1f1b" if self.microbatches >= self.pp else "gpipe"

    def describe(self) -> str:
        return strategy_name(self.dp, self.pp, self.tp, self.sharded)


@dataclass(frozen=True)
class Estimate:
    cand: Candidate
    step_s: float
    peak: int
    stages: tuple[StagePlan, ...]
    #: every stage fits the memory of the procs that hold it
    fits: bool = True
    #: the step's parts, as timed (``step_s`` is their sum times ``typical``): the
    #: pipeline's critical path (or its work over the cores, where procs outnumber
    #: them), the gradients' sync between replicas, the optimizer's step
    pipeline_s: float = 0.0
    sync_s: float = 0.0
    optimizer_s: float = 0.0
    #: how much slower a typical pass ran than the fastest one each part was timed at
    typical: float = 1.0
    #: the copies of each proc's state after the step (a trainer that recovers lost
    #: procs: ._copies), packed by the proc and read by its peer
    copies_s: float = 0.0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(
    n: int,
    batch: int,
    n_blocks: int,
    *,
    can_pipeline: bool,
    tp_ok: list[int],
    dp: int | None = None,
    pp: int | None = None,
    tp: int | None = None,
    microbatches: int | None = None,
) -> Iterator[Candidate]:
    """Every layout allowed by the model, the mesh, the batch and the forced dims."""
    for d in divisors(n):
        for p in divisors(n // d):
            t = n // (d * p)
            if (dp and d != dp) or (pp and p != pp) or (tp and t != tp):
                continue
            if p > n_blocks or (p > 1 and not can_pipeline) or t not in tp_ok:
                continue
            if batch % d:
                continue
            ms = [microbatches] if microbatches else divisors(batch // d)
            for m in ms:
                if m > MAX_MICROBATCHES and not microbatches:
                    continue
                if (batch // d) % m:
                    continue
                for sharded in (False, True) if d > 1 else (False,):
                    yield Candidate(d, p, t, m, sharded)


def check_forced(
    n: int,
    batch: int,
    n_blocks: int,
    *,
    can_pipeline: bool,
    tp_ok: list[int],
    dp: int | None,
    pp: int | None,
    tp: int | None,
    microbatches: int | None,
    why_no_tp: str,
) -> None:
    """A clear error for forced dims that cannot be met, naming the argument."""
    forced = {k: v for k, v in (("dp", dp), ("pp", pp), ("tp", tp)) if v is not None}
    for k, v in forced.items():
        if not isinstance(v, int) or v < 1:
            raise PlanError(f"{k}={v!r}: each forced dim is a positive int")
    prod = math.prod(forced.values())
    if n % prod or (len(forced) == 3 and prod != n):
        raise PlanError(
            f"{' x '.join(f'{k}={v}' for k, v in forced.items())} = {prod} does not "
            f"{'equal' if len(forced) == 3 else 'divide'} the mesh's {n} procs"
        )
    if pp and pp > 1 and not can_pipeline:
        raise PlanError(
            f"pp={pp}: this model cannot be cut into pipeline stages (danaus runs the "
            "forward around the blocks only for nn.Sequential, Hugging Face GPT-2 and "
            "Llama-style models); give pp=1"
        )
    if pp and pp > n_blocks:
        raise PlanError(f"pp={pp}: the model has only {n_blocks} blocks to split into stages")
    if tp and tp not in tp_ok:
        raise PlanError(f"tp={tp}: {why_no_tp}")
    if dp and batch % dp:
        raise PlanError(f"dp={dp} does not divide the batch of {batch} samples")
    if microbatches is not None:
        if not isinstance(microbatches, int) or microbatches < 1:
            raise PlanError(f"microbatches={microbatches!r}: give a positive int")
        per = (dp or 1) * microbatches
        if batch % per:
            raise PlanError(
                f"microbatches={microbatches}"
                + (f" x dp={dp}" if dp else "")
                + f" does not divide the batch of {batch} samples"
            )


def profile_sizes(cands: list[Candidate], batch: int) -> list[int]:
    """The microbatch sizes the candidates run (each is measured)."""
    return sorted({batch // (c.dp * c.microbatches) for c in cands}, reverse=True)


class _Costs:
    """Prefix sums of one microbatch size's block costs, for the stage DP. A block's time
    is as one proc alone runs it (:func:`estimate` adds the others' contention for the
    cores): split ``tp`` ways as measured (block 0 timed split on every proc at once,
    so over the procs per core; the others scaled alike), or its own time over ``tp``."""

    def __init__(
        self, cost: ModelCost, mesh: MeshFacts, s: int, tp: int, contention: float
    ) -> None:
        self.cost = cost
        self.s = s
        b = cost.blocks
        measured = cost.tp_block_s.get(tp, {}).get(s) if tp > 1 else None
        if measured is not None:
            scale = measured / contention / max(b[0].time_s[s], 1e-12)
            self.t = _prefix([x.time_s[s] * scale for x in b])
        else:
            ring = 2 * (tp - 1) / tp
            bw, lat = mesh.collective_bw, mesh.collective_latency_s
            # two all-reduces of a block's output forward, two backward
            comm = [4 * (x.out_bytes[s] * ring / bw + lat) if tp > 1 else 0.0 for x in b]
            self.t = _prefix([x.time_s[s] / tp + c for x, c in zip(b, comm, strict=True)])
        self.a = _prefix([x.act_bytes[s] for x in b])
        self.w = _prefix([x.param_bytes / tp for x in b])
        self.out = [x.out_bytes[s] for x in b]


def _prefix(xs: list[float] | list[int]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def estimate(
    cand: Candidate,
    cost: ModelCost,
    mesh: MeshFacts,
    batch: int,
    cap: int,
    recompute: ModelCost | None = None,
    cut: tuple[int, ...] | None = None,
) -> Estimate:
    """The best stage split of ``cand`` and its step time and peak memory per proc
    (``fits`` is False when nothing fits: then the split is the least memory one).
    ``cap``: bytes each proc may hold (the less of it and a proc's own, where the mesh
    measured each proc's). ``recompute``: the blocks' costs checkpointed, for stages
    that do not fit without. ``cut``: the blocks of each stage, forced
    (``plan(blocks_per_stage=...)``).

    Unlike procs (``mesh.speed``, ``mesh.memory``): the procs are first arranged so
    that those of one stage are alike (:func:`arrange`); a stage then computes at the
    pace of its slowest proc and fits in its smallest one's memory, so that the split
    gives a slow stage fewer blocks and a small one less to hold."""
    c = cand
    s = batch // (c.dp * c.microbatches)
    L = len(cost.blocks)
    order = arrange(c.dp, c.pp, c.tp, mesh)
    ranks_of = [stage_ranks(c.dp, c.pp, c.tp, k, order) for k in range(c.pp)]
    pace = [max((mesh.speed[r] for r in rs), default=1.0) if mesh.speed else 1.0 for rs in ranks_of]
    caps = [min([cap, *(mesh.memory[r] for r in rs)]) if mesh.memory else cap for rs in ranks_of]
    contention = max(1.0, mesh.procs_per_host / max(1, mesh.cores_per_host))
    threads = max(1, cost.threads)
    # what computing at once costs past sharing the cores evenly (measured: switches,
    # caches, memory bandwidth), in a step where every proc computes
    ideal = max(1.0, mesh.procs_per_host * threads / max(1, mesh.cores_per_host))
    overs = max(1.0, mesh.together / ideal)
    # the tensor-parallel block was timed on every proc at once: over both, as alone
    plain_costs = _Costs(cost, mesh, s, c.tp, contention * overs)
    ckpt_costs = _Costs(recompute, mesh, s, c.tp, contention * overs) if recompute else None
    hosts = max(1, mesh.procs // max(1, mesh.procs_per_host))
    bw, lat = mesh.collective_bw, mesh.collective_latency_s
    hop = mesh.hop_latency_s
    state = 2.0 + cost.opt_ratio  # weights, grads, optimizer state per byte of weights
    fsdp = runs_fsdp(c.dp, c.pp, c.tp, c.sharded)
    # a respawn's copies: weights and optimizer state, per byte of weights; twice (its
    # two latest) where no peer copies them (DDP replicas serve each other; one proc's
    # peer is the controller), four times (and its peer's two) where one does, the
    # peer's stage taken as large as its own
    copied = 1.0 + cost.opt_ratio
    replicas_serve = not fsdp and c.dp > 1  # (DDP's: see ._copies.roles)
    copies = 2 if replicas_serve or c.dp * c.pp * c.tp == 1 else 4
    # not measured: FSDP taken to gather one block at a time, the biggest of blocks
    # i..j-1 at biggest[i][j] (made once here: the stage split asks of every i, j)
    biggest: list[list[int]] = []
    if fsdp and not mesh.fsdp_bytes_per_byte:
        for i in range(L + 1):
            row, most = [0] * (L + 1), 0
            for j in range(i + 1, L + 1):
                most = max(most, cost.blocks[j - 1].param_bytes)
                row[j] = most
            biggest.append(row)

    def stage_as(k: int, i: int, j: int, k_costs: _Costs) -> tuple[float, int, float]:
        """Stage k over blocks i..j-1: (microbatch seconds, peak bytes, weight bytes)."""
        first, last = k == 0, k == c.pp - 1
        t = 0.0
        w = k_costs.w[j] - k_costs.w[i]
        act = k_costs.a[j] - k_costs.a[i]
        if first:
            t += cost.embed.time_s[s]
            w += cost.embed.param_bytes
            act += cost.embed.act_bytes[s]
        if last:
            t += cost.head.time_s[s]
            w += cost.head.param_bytes
            act += cost.head.act_bytes[s]
        t = (t + k_costs.t[j] - k_costs.t[i]) * pace[k]
        if not last:  # activations to the next stage, gradients back
            t += 2 * (k_costs.out[j - 1] / bw + hop)
        inflight = (
            1
            if c.pp == 1
            else (c.microbatches if c.schedule == "gpipe" else min(c.microbatches, c.pp - k))
        )
        if fsdp:  # FSDP2 shards the state; the stage is one unit, gathered whole to run
            held = w * state / c.dp
            working = mesh.fsdp_bytes_per_byte * w if mesh.fsdp_bytes_per_byte else biggest[i][j]
        else:  # DDP: the backend's copies of a gradient bucket while it is all-reduced
            held = w * state
            working = mesh.allreduce_bytes_per_byte * min(w, DDP_BUCKET) if c.dp > 1 else 0
        if mesh.copies:  # a respawn's copies (._copies): its own latest two, its peer's two
            held += copies * w * copied / (c.dp if fsdp else 1)
        return t, int(held + working + inflight * act), w

    def stage_full(k: int, i: int, j: int) -> tuple[float, int, float, bool]:
        """As ``stage_as``, checkpointed where it does not fit otherwise and that needs
        less memory; and whether it is."""
        t, mem, w = stage_as(k, i, j, plain_costs)
        if ckpt_costs is None or mem <= caps[k]:
            return t, mem, w, False
        t2, mem2, w2 = stage_as(k, i, j, ckpt_costs)
        return (t2, mem2, w2, True) if mem2 < mem else (t, mem, w, False)

    def stage(k: int, i: int, j: int) -> tuple[float, int, float]:
        t, mem, w, _ = stage_full(k, i, j)
        return t, mem, w

    if cut is not None:
        ends = [sum(cut[: k + 1]) for k in range(len(cut))]
        best = [(e - n, e) for e, n in zip(ends, cut, strict=True)]
    else:
        best = _split(c.pp, L, stage, caps)
    stages = []
    worst_t, peak, worst_w, busy, fits = 0.0, 0, 0.0, 0.0, True
    for k, (i, j) in enumerate(best):
        t, mem, w, ckpt = stage_full(k, i, j)
        weights = int(w * (c.tp if c.tp > 1 else 1))
        ranks = ranks_of[k]
        stages.append(
            StagePlan(
                i, j - 1, weights, t, mem, checkpointing=ckpt, ranks=ranks, limit_bytes=caps[k]
            )
        )
        worst_t, peak, worst_w = max(worst_t, t), max(peak, mem), max(worst_w, w)
        fits = fits and mem <= caps[k]
        # its procs' seconds of work (a slow proc's wait for its CPU quota is not work)
        busy += c.microbatches * t / pace[k] * len(ranks)
    # the critical path, or, where procs outnumber cores, the work over the cores
    cores = max(1, mesh.cores_per_host) * hosts
    pipeline = max((c.microbatches + c.pp - 1) * worst_t, busy * threads / cores * overs)
    sync = 0.0
    if fsdp:
        # FSDP2: gradients reduce-scattered once; measured over the whole mesh, scaled
        # to the dp group's ring
        gathers = fsdp_gathers(c)
        scale = ((c.dp - 1) / c.dp) / max((mesh.procs - 1) / mesh.procs, 1e-9)
        # as FSDP2 runs them (its copies in and out, its hooks), measured on one unit
        per_byte = (
            gathers * mesh.gather_s_per_byte * mesh.fsdp_gather_over
            + mesh.scatter_s_per_byte * mesh.fsdp_scatter_over
        )
        sync = worst_w * scale * per_byte + (gathers + 1) * lat
    elif c.dp > 1:  # DDP: one all-reduce of the gradients
        sync = 2 * (c.dp - 1) / c.dp * worst_w / bw + lat
    # FSDP2 shards the optimizer's state whether or not it reshards after the forward
    # (ZeRO-3, or ZeRO-2 under pipelines and tensor parallel): each rank steps its shard
    opt_bytes = worst_w / (c.dp if fsdp else 1)
    opt = cost.opt_s_per_byte * opt_bytes * contention * max(pace) * overs
    copying = 0.0
    if mesh.copying:  # packed by the proc; read by its peer over the data plane, where no
        # replica holds the same
        nbytes = worst_w * copied / (c.dp if fsdp else 1)
        read = 0.0 if replicas_serve else nbytes / mesh.bandwidth
        copying = (cost.copy_s_per_byte * nbytes + read) * contention * max(pace) * overs
    step = pipeline + sync + opt + copying
    # the parts were timed at their fastest; a step runs as a typical pass did
    return Estimate(
        c, step * cost.typical, peak, tuple(stages), fits, pipeline, sync, opt, cost.typical,
        copying,
    )  # fmt: skip


def fsdp_gathers(c: Candidate) -> int:
    """How many times a step of ``c`` gathers each FSDP2 unit's weights: for each
    microbatch's forward (and again for its backward where sharded between them), except
    under a pipeline: torch's pipeline stage keeps them gathered after each backward
    until the last, so once a step where the stage keeps them whole between forward and
    backward (ZeRO-2), and once more than the microbatches where it reshards after each
    forward (each forward, and the first backward)."""
    if c.pp > 1:
        return c.microbatches + 1 if c.sharded else 1
    return (2 if c.sharded else 1) * c.microbatches


#: procs whose speeds are this close (a fraction) count as alike: on a busy 2-core
#: machine, equal procs measured up to 1.5x apart (a sub-millisecond block, the faster
#: of two windows each); a CPU quota of 30% is 3.3x
ALIKE = 1.0


def classes(values: list[float], alike: float = ALIKE) -> list[int]:
    """Each value's class, 0 for the smallest: sorted, a value more than ``alike`` over
    the first of its class starts the next one (measured speeds of equal procs differ
    by the machine's noise; that should not reorder them)."""
    out = [0] * len(values)
    cls, start = -1, -math.inf
    for i in sorted(range(len(values)), key=lambda i: values[i]):
        if values[i] > start * (1 + alike):
            cls, start = cls + 1, values[i]
        out[i] = cls
    return out


def arrange(dp: int, pp: int, tp: int, mesh: MeshFacts) -> tuple[int, ...]:
    """Which proc takes each place of the grid (:class:`Layout`'s ``order``): where the
    procs of some stage are unlike (in speed, or in usable memory), the procs are put
    in order, fastest (then roomiest) first, and each stage takes the next ``dp * tp``
    of them, so that a stage's replicas and shards are alike and its blocks can be
    fitted to them; the stages keep the order of their lowest rank. Empty (each place
    to the rank of its number) where every stage's procs are already alike, or where
    the alike groups cannot be placed with ranks rising along every dim (torch numbers
    a process group's members in rank order, and a pipeline's stages, FSDP's shards
    and tensor-parallel shards go by that number: ranks 1 and 2 slow of 4 in
    ``dp=2 x pp=2`` is such a case, and runs as numbered)."""
    n = dp * pp * tp
    speed = classes(list(mesh.speed)) if len(mesh.speed) == n else [0] * n
    room = classes([-float(m) for m in mesh.memory], 0.1) if len(mesh.memory) == n else [0] * n

    def key(r: int) -> tuple[int, int]:
        return speed[r], room[r]

    if all(len({key(r) for r in stage_ranks(dp, pp, tp, k)}) == 1 for k in range(pp)):
        return ()
    ranked = sorted(range(n), key=lambda r: (key(r), r))
    groups = sorted(
        (tuple(sorted(ranked[k * dp * tp : (k + 1) * dp * tp])) for k in range(pp)), key=min
    )
    if any(a >= b for g, h in itertools.pairwise(groups) for a, b in zip(g, h, strict=True)):
        return ()
    return order_of(dp, pp, tp, groups)


def _split(
    pp: int, L: int, fn: Callable[[int, int, int], tuple[float, int, float]], caps: list[int]
) -> list[tuple[int, int]]:
    """Contiguous split of ``L`` blocks into ``pp`` stages minimising the slowest stage
    with every stage ``k`` under ``caps[k]`` (or, where none fits, minimising the largest
    peak over its cap); ``fn(k, i, j)`` is stage ``k`` over blocks ``i..j-1``: (seconds,
    peak, weights)."""
    inf = (math.inf, math.inf, math.inf)
    # best[k][j]: (slowest, largest peak over the cap, sum of squared times) of the first
    # j blocks in k+1 stages, and the cut
    best: list[list[tuple[Key, int]]] = [[(inf, -1)] * (L + 1) for _ in range(pp)]
    for j in range(1, L - pp + 2):
        t, mem, _ = fn(0, 0, j)
        best[0][j] = (_key(t, mem, caps[0]), 0)
    for k in range(1, pp):
        for j in range(k + 1, L - (pp - k - 1) + 1):
            for i in range(k, j):
                prev = best[k - 1][i][0]
                if prev == inf:
                    continue
                t, mem, _ = fn(k, i, j)
                here = _key(t, mem, caps[k])
                cand = _worse(prev, here)
                if cand < best[k][j][0]:
                    best[k][j] = (cand, i)
    cuts = []
    j = L
    for k in reversed(range(pp)):
        i = best[k][j][1] if k else 0
        cuts.append((i, j))
        j = i
    return list(reversed(cuts))


#: how the stage split compares stages: (seconds, bytes over the cap, seconds squared)
Key = tuple[float, float, float]


def _key(t: float, mem: int, cap: int) -> Key:
    """Stages that fit compare by time; one that does not is worse than any that fits,
    and compares by how far over its cap it is. Of splits whose slowest stage is as
    slow, the one whose other stages are more even (the least sum of squared times)
    wins: 1F1B's step is the slowest stage's times the microbatches plus the others'
    once, and of unlike procs, each stage's blocks should be as even as they can."""
    return (t, 0.0, t * t) if mem <= cap else (math.inf, float(mem - cap), 0.0)


def _worse(a: Key, b: Key) -> Key:
    return (max(a[0], b[0]), max(a[1], b[1]), a[2] + b[2])


def choose(
    cost: ModelCost,
    mesh: MeshFacts,
    *,
    batch: int,
    cands: list[Candidate],
    layers: str | None,
    recompute: ModelCost | None = None,
    cut: tuple[int, ...] | None = None,
) -> Plan:
    """The fastest candidate that fits ``mesh.memory_per_proc``; ``PlanError`` naming the
    memory the smallest one needs where none fits. ``recompute``: the blocks' costs
    checkpointed, for the stages that fit only so (see :func:`estimate`); ``cut``: each
    stage's blocks, forced. The plan's ``candidates`` are every one that fits."""
    # each proc's own memory where the mesh measured each (estimate takes the less of
    # the two): the least of them would hold every stage to the smallest proc
    cap = max(mesh.memory) if mesh.memory else mesh.memory_per_proc
    least = min(mesh.memory) if mesh.memory else cap
    ests = [estimate(c, cost, mesh, batch, cap, recompute, cut) for c in cands]
    if not ests:
        raise PlanError("no layout of this mesh suits the model and batch")
    fits = sorted((e for e in ests if e.fits), key=lambda e: e.step_s)
    if fits:
        # within TIE of the fastest, the simplest layout: estimates are not that exact
        near = [e for e in fits if e.step_s <= fits[0].step_s * (1 + TIE)]
        simplest = min(near, key=_rank)
        fits.remove(simplest)
        fits.insert(0, simplest)
    if not fits:
        smallest = min(ests, key=lambda e: e.peak)
        raise PlanError(
            f"no plan fits in {least / 2**20:.1f} MiB per proc"
            + (f" (the least; the most {cap / 2**20:.1f})" if cap > least else "")
            + ": the smallest, "
            f"{smallest.cand.describe()} with {smallest.cand.microbatches} microbatches, "
            f"needs {smallest.peak / 2**20:.1f} MiB per proc (give more procs or "
            "memory_per_proc)"
        )
    best = fits[0]
    runner = next((e for e in fits[1:] if _shape(e) != _shape(best)), None)
    why = (
        f"fastest (or simplest within {TIE:.0%} of it) of {len(ests)} layouts estimated ({len(fits)} fit in "
        f"{least / 2**20:.1f} MiB per proc{' or more' if cap > least else ''}); measured "
        f"on {mesh.procs} procs, "
        f"{mesh.procs_per_host} per host on {mesh.cores_per_host} cores; data plane "
        f"{mesh.bandwidth / 1e9:.2f} GB/s between procs, all-reduce "
        f"{mesh.collective_bw / 1e9:.2f} GB/s (bus), {mesh.collective_latency_s * 1e6:.0f} µs, "
        f"a send {mesh.hop_latency_s * 1e6:.0f} µs"
    )
    if mesh.fsdp_gather_over > 1.0 or mesh.fsdp_scatter_over > 1.0:
        why += (
            f"; FSDP2's gather {mesh.fsdp_gather_over:.2f}x and reduce-scatter "
            f"{mesh.fsdp_scatter_over:.2f}x the backend's own"
        )
    why += _unlike(mesh, best)
    if mesh.memory_why:
        why += f"; usable memory per proc from {mesh.memory_why}"
    if cost.passes:
        why += (
            f"; each part timed as the fastest of {cost.passes} passes (the median was up "
            f"to {cost.noise:.0%} slower{': a busy machine' if cost.noise > 0.1 else ''}; "
            f"a step estimated as a typical pass ran, {cost.typical - 1:.0%} over the fastest)"
        )
    if cost.sample_shape:
        why += (
            f"; estimated for the sample's {' x '.join(map(str, cost.sample_shape))} "
            "inputs (other sequence lengths run on the same plan)"
        )
    if recompute is not None:
        chosen = [i for i, st in enumerate(best.stages) if st.checkpointing]
        why += (
            f"; activation checkpointing on stage(s) {', '.join(map(str, chosen))}: they "
            "fit only recomputing their activations"
            if chosen
            else "; no activation checkpointing: every stage fits keeping its activations"
        )
    if len(fits) < len(ests):
        over = min((e for e in ests if not e.fits), key=_rank)
        why += (
            f"; {len(ests) - len(fits)} need more memory, e.g. {over.cand.describe()} "
            f"({over.peak / 2**20:.1f} MiB)"
        )
    runner_up = (
        f"{runner.cand.describe()}, {runner.cand.microbatches} microbatches: "
        f"{runner.step_s * 1e3:.2f} ms, {runner.peak / 2**20:.2f} MiB per proc"
        if runner
        else ""
    )
    picked = _as_plan(best, layers, cap, why, runner_up)

    def weighed(e: Estimate) -> Plan:
        if e is best:
            return picked
        ratio = e.step_s / max(best.step_s, 1e-12)
        return _as_plan(e, layers, cap, f"a candidate the planner weighed: its estimated "
                        f"step is {ratio:.2f}x the chosen layout's")  # fmt: skip

    ranked = sorted(fits, key=lambda e: e.step_s)
    return replace(picked, candidates=tuple(weighed(e) for e in ranked))


def _unlike(mesh: MeshFacts, best: Estimate) -> str:
    """What the ``why`` says of unlike procs: which are slower, which hold less, and how
    the chosen layout placed them."""
    out = ""
    slow = {r: x for r, x in enumerate(mesh.speed) if x > 1.0}
    if slow:
        out += "; procs unlike in speed, each measured: " + ", ".join(
            f"rank {r} {x:.1f}x slower" for r, x in slow.items()
        )
    if mesh.memory and max(mesh.memory) > min(mesh.memory) * 1.1:
        out += "; procs unlike in memory: " + ", ".join(
            f"rank {r} {m / 2**20:.0f} MiB" for r, m in enumerate(mesh.memory)
        )
    if out:
        c = best.cand
        if order_of(c.dp, c.pp, c.tp, [st.ranks for st in best.stages]):  # reordered
            out += (
                "; the stages placed on alike procs ("
                + ", ".join(
                    f"stage {k}: ranks {list(st.ranks)}" for k, st in enumerate(best.stages)
                )
                + ")"
            )
        if c.pp > 1:
            out += "; blocks per stage " + ", ".join(
                str(st.last - st.first + 1) for st in best.stages
            )
    return out


def _as_plan(e: Estimate, layers: str | None, cap: int, why: str, runner_up: str = "") -> Plan:
    c = e.cand
    return Plan(
        dp=c.dp,
        pp=c.pp,
        tp=c.tp,
        microbatches=c.microbatches,
        stages=e.stages,
        estimated_step_s=e.step_s,
        peak_bytes_per_proc=e.peak,
        schedule=c.schedule,
        sharded=c.sharded,
        layers=layers,
        # the least any of its procs may hold (each stage's own is its limit_bytes)
        memory_per_proc=min((st.limit_bytes for st in e.stages), default=cap),
        why=why,
        runner_up=runner_up,
    )


def _shape(e: Estimate) -> tuple[int, int, int, bool]:
    return (e.cand.dp, e.cand.pp, e.cand.tp, e.cand.sharded)


def _rank(e: Estimate) -> tuple[int, int, float]:
    # fewer dims in use (and no sharding), then fewer microbatches, then faster
    dims = (e.cand.dp > 1) + (e.cand.pp > 1) + (e.cand.tp > 1) + e.cand.sharded
    return (dims, e.cand.microbatches, e.step_s)
