"""``plan()``: measure a model and a mesh on the mesh's own procs, then choose a layout."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..actors.seam import Future, current_runtime, run_task
from ..mesh.seam import preload_for
from ..spmd import setup_torch_elastic_env_async
from ._errors import PlanError
from ._model import ModelParts, check_batch, find_parts
from ._plan import Plan, SimulatedPlan
from ._planner import (
    Candidate,
    candidates,
    check_forced,
    choose,
    classes,
    estimate,
    profile_sizes,
)
from ._profile import MeshFacts, ModelCost, ProcFacts, TPProbe, _alike, _param_bytes

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..mesh import ProcMesh

_names = itertools.count()

#: bytes read between procs to measure the data plane's bandwidth
PROBE_BYTES = 8 << 20


def _default_optimizer(ps: Iterator[Any]) -> Any:
    import torch

    return torch.optim.AdamW(ps)


def tp_sizes(model: nn.Module, parts: ModelParts, n: int) -> tuple[list[int], str]:
    """The tensor-parallel degrees the model allows on ``n`` procs, and why not others."""
    if parts.not_cut:
        return [1], parts.why_not_cut(model)
    if not parts.can_tensor_parallel:
        return [1], parts.tp_why or (
            f"tensor parallel needs a plan for {type(model).__name__}'s blocks (a Hugging "
            "Face config's base_model_tp_plan, or GPT-2's)"
        )
    cfg: Any = getattr(model, "config")  # noqa: B009 (an nn.Module attribute)
    heads = int(cfg.num_attention_heads)
    width = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None)
    dims = [
        heads,
        int(getattr(cfg, "num_key_value_heads", None) or heads),
        int(width or 4 * int(cfg.hidden_size)),
    ]
    ok = [t for t in range(1, n + 1) if n % t == 0 and all(d % t == 0 for d in dims)]
    return ok, (
        f"attention heads ({dims[0]}), key/value heads ({dims[1]}) and the MLP width "
        f"({dims[2]}) must all divide by it"
    )


def _local_procs(procs: ProcMesh) -> int:
    sizes = list(dict(procs.sizes).values())
    return sizes[-1] if sizes else 1


async def _measure_mesh(
    procs: ProcMesh, profilers: Any, facts: list[ProcFacts], tp: TPProbe | None
) -> tuple[MeshFacts, dict[int, dict[int, float]]]:
    """The mesh as measured: memory, cores, the data plane between procs, collectives
    (and the tensor-parallel block ``tp`` asks for, timed on every proc at once)."""
    n = len(facts)
    per_host: dict[str, int] = {}
    for f in facts:
        per_host[f.host] = per_host.get(f.host, 0) + 1
    bw, lat = float("inf"), 0.0
    if n > 1:
        # rank 0 to its neighbour, and to the farthest rank (another host, if any)
        for reader in sorted({1, n - 1}):
            buf = await _one(procs, profilers, 0).offer.call_one(PROBE_BYTES)
            b, lt = await _one(procs, profilers, reader).read.call_one(buf, PROBE_BYTES)
            bw, lat = min(bw, b), max(lat, lt)
        await setup_torch_elastic_env_async(procs)
        probes = (await profilers.collective.call(PROBE_BYTES, tp)).values()
        cbw = min(p[0] for p in probes)
        clat, gather, scatter, hop, held, fsdp = (
            max(p[i] for p in probes) for i in (1, 2, 3, 5, 6, 7)
        )
        # (ratios of two differences of times, each proc's own: the median, not one
        # proc's outlier)
        gather_over, scatter_over = (statistics.median(p[i] for p in probes) for i in (8, 9))
        tp_s = {  # the slowest rank's time, at each degree and size
            d: {s: max(p[4][d][s] for p in probes) for s in sizes}
            for d, sizes in probes_sizes(tp).items()
        }
    else:
        bw, lat, cbw, clat, gather, scatter, hop, tp_s = 1e12, 0.0, 1e12, 0.0, 0.0, 0.0, 0.0, {}
        held, fsdp, gather_over, scatter_over = 0.0, 0.0, 1.0, 1.0
    facts_ = MeshFacts(
        procs=n,
        procs_per_host=max(per_host.values()),
        cores_per_host=min(f.cores for f in facts),
        memory_per_proc=min(f.memory for f in facts),
        bandwidth=bw,
        latency_s=lat,
        device=facts[0].device,
        collective_bw=cbw,
        collective_latency_s=clat,
        gather_s_per_byte=gather,
        scatter_s_per_byte=scatter,
        hop_latency_s=hop,
        allreduce_bytes_per_byte=held,
        fsdp_bytes_per_byte=fsdp,
        fsdp_gather_over=gather_over,
        fsdp_scatter_over=scatter_over,
    )
    return facts_, tp_s


def _check_room(model: nn.Module, parts: ModelParts, facts: list[ProcFacts]) -> list[int] | None:
    """How the model is measured, or a PlanError before anything is sent to a proc where
    the procs cannot hold it however it is laid out (its weights and gradients alone,
    spread evenly over every proc: the least any layout holds) or it cannot be measured.

    The proc that measures (the roomiest of the fastest) is alone at work then. The model
    is measured whole where its weights and gradients fit there (``None``); else block
    by block: one block of each make (:func:`._profile._alike`) with the parts before
    and after the blocks, each block measured as the one of its make that was (the
    index of that one, for each block)."""
    weights = _param_bytes([model])
    memory, _ = usable_memory(facts)
    mib = 2**20
    if 2 * weights / len(facts) > min(memory):
        raise PlanError(
            f"no plan fits in {min(memory) / mib:.1f} MiB per proc: the model's weights "
            f"and gradients alone ({2 * weights / mib:.1f} MiB) need "
            f"{2 * weights / len(facts) / mib:.1f} MiB per proc even spread over all "
            f"{len(facts)} procs (give more procs, or more memory)"
        )
    # its group's whole room is the measuring proc's own; on CPU, one under no cgroup
    # limit has the host's RAM; on a GPU, its device's free memory
    alone = max(min(_room(f), math.inf if f.device == "cpu" else f.memory) for f in facts)
    if 2 * weights <= alone:
        return None
    if not parts.can_pipeline:
        raise PlanError(
            f"measuring the model needs its weights and gradients ({2 * weights / mib:.1f} "
            f"MiB) on one proc, and the roomiest may hold {alone / mib:.1f} MiB: "
            f"{parts.why_not_cut(model)}, so it is measured whole (give procs more memory)"
        )
    blocks = parts.blocks(model)
    first: dict[Any, int] = {}
    stand_in = [first.setdefault(make, i) for i, make in enumerate(_alike(model, parts, blocks))]
    ends = [model.get_submodule(p) for p in (*parts.embed_paths, *parts.head_paths)]
    some = _param_bytes([*ends, *(blocks[i] for i in sorted(set(stand_in)))])
    if 2 * some > alone:
        raise PlanError(
            f"measuring the model block by block needs the weights and gradients of one "
            f"block of each make and of the parts around them ({2 * some / mib:.1f} MiB) "
            f"on one proc, and the roomiest may hold {alone / mib:.1f} MiB "
            "(give procs more memory)"
        )
    return stand_in


#: a cgroup's limit is a hard one (the OOM killer ends a proc past it), and a proc's
#: resident peak measured up to 1.85x the estimate of what it holds (FSDP replicas of a
#: pipeline's stages: their gather and reduce-scatter buffers; 1.2x for plain data
#: parallel, 1.66x for a pipeline): the room under it is planned over this
CGROUP_MARGIN = 2.0


def _room(f: ProcFacts) -> float:
    """The room under the cgroup limit over a proc (infinite where none limits it)."""
    return math.inf if f.group is None else f.group.free


def usable_memory(facts: list[ProcFacts]) -> tuple[tuple[int, ...], str]:
    """Each proc's usable bytes: the least of what it reported (CUDA's free memory,
    ``memory_per_proc``, the host's available RAM over its procs) and its share of the
    room left under the tightest cgroup memory limit over it (that room over the procs
    of this mesh under the same group, over ``CGROUP_MARGIN``); and, where a cgroup
    limit is the tightest for some proc, words saying so for the plan's ``why``."""
    under: dict[tuple[str, str], int] = {}
    for f in facts:
        if f.group is not None:
            key = (f.host, f.group.group)
            under[key] = under.get(key, 0) + 1
    out, said = [], {}
    for f in facts:
        mem = f.memory
        if f.group is not None:
            key = (f.host, f.group.group)
            share = int(f.group.free / under[key] / CGROUP_MARGIN)
            if share < mem:
                mem = share
                said[key] = (
                    f"cgroup {f.group.group}'s memory limit {f.group.limit / 2**20:.0f} MiB"
                    f" ({f.group.free / 2**20:.0f} MiB of it free) over its {under[key]} "
                    f"procs of this mesh, over {CGROUP_MARGIN:g} (the estimate's miss)"
                )
        out.append(mem)
    return tuple(out), "; ".join(said.values())


def _one(procs: ProcMesh, actors: Any, rank: int) -> Any:
    """The actor of ``actors`` (one per proc of ``procs``) on flat rank ``rank``."""
    from ..geometry import Point

    return actors.slice(**dict(Point.from_rank(rank, dict(procs.sizes))))


async def _speeds(
    procs: ProcMesh,
    profilers: Any,
    model: nn.Module,
    parts: ModelParts,
    sample: Any,
    loss: Any,
    size: int,
    threads: int,
) -> tuple[tuple[float, ...], float]:
    """Each proc's speed, measured on it: how many times slower than the fastest it runs
    the model's first block, procs within ``ALIKE`` of each other counted as alike (the
    mean of their class); empty where every proc is alike. One proc at a time, so that
    none is timed while the others take its cores, and each twice, the rounds
    interleaved: the faster of its two windows counts (another program's work only
    adds time, and a sub-millisecond block's mean over one window moved 1.5x on a busy
    2-core machine; a CPU quota holds a proc back in both).

    And how many times slower the procs run it all at once than alone (the median over
    procs: ``MeshFacts.together``), the windows overlapping: what the estimate charges
    a step in which every proc computes."""
    n = len(procs)
    if n < 2:
        return (), 1.0
    # a pipeline's first block (and what comes before it) is all a proc needs for this
    piece = parts.cut(model, 0, 0) if parts.can_pipeline else model
    paces = [math.inf] * n
    for _ in range(2):
        for r in range(n):
            one = _one(procs, profilers, r).pace
            paces[r] = min(paces[r], await one.call_one(piece, parts, sample, loss, size, threads))
    at_once = await profilers.pace.call(piece, parts, sample, loss, size, threads)
    together = max(1.0, statistics.median(
        t / max(alone, 1e-12) for t, alone in zip(at_once.values(), paces, strict=True)
    ))  # fmt: skip
    cls = classes(paces)
    if max(cls) == 0:
        return (), together
    means = [statistics.fmean(p for p, c in zip(paces, cls, strict=True) if c == k)
             for k in range(max(cls) + 1)]  # fmt: skip
    return tuple(means[c] / means[0] for c in cls), together


def probes_sizes(tp: TPProbe | None) -> dict[int, list[int]]:
    return {d: tp.sizes for d in tp.degrees} if tp is not None else {}


async def _plan(
    model: nn.Module,
    procs: ProcMesh,
    sample: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    layers: str | None,
    forced: dict[str, int | None],
    memory_per_proc: int | None,
    optimizer: Callable[[Iterator[Any]], Any],
    precision: str = "fp32",
    checkpointing: bool | None = False,
    compile: bool = False,
    blocks_per_stage: tuple[int, ...] | None = None,
    on_lost_proc: str = "respawn",
) -> Plan:
    from ._profile import Profiler

    parts = find_parts(model, layers)
    n = len(procs)
    batch = check_batch(sample, model, parts)
    if blocks_per_stage is not None:
        if sum(blocks_per_stage) != parts.n_blocks:
            raise PlanError(
                f"blocks_per_stage={list(blocks_per_stage)} adds up to "
                f"{sum(blocks_per_stage)} blocks; the model has {parts.n_blocks}"
            )
        forced = {**forced, "pp": len(blocks_per_stage)}
    tp_ok, why_no_tp = tp_sizes(model, parts, n)
    kw = {"can_pipeline": parts.can_pipeline, "tp_ok": tp_ok}
    pp = forced.get("pp")
    if isinstance(pp, int) and pp > 1 and not parts.can_pipeline:
        raise PlanError(f"pp={pp}: {parts.why_not_cut(model)}; give pp=1")
    check_forced(n, batch, parts.n_blocks, **kw, **forced, why_no_tp=why_no_tp)  # type: ignore[arg-type]
    cands = list(candidates(n, batch, parts.n_blocks, **kw, **forced))  # type: ignore[arg-type]
    if not cands:
        raise PlanError(
            f"no layout of {n} procs suits a batch of {batch} samples and "
            f"{parts.n_blocks} blocks with {forced}: give a batch that the replicas divide"
        )
    loss = loss_fn if loss_fn is not None else parts.default_loss(model)
    if loss is None:
        raise PlanError(f"{type(model).__name__} has no loss of its own: give loss_fn=")
    started = time.perf_counter()
    profilers = procs.spawn(f"_planner{next(_names)}", Profiler)
    local = _local_procs(procs)
    try:
        facts = list((await profilers.facts.call(memory_per_proc, local)).values())
        stand_in = _check_room(model, parts, facts)
        threads = max(1, min(f.cores for f in facts) // max(1, local))
        tp_cands = [c for c in cands if c.tp > 1]
        probe = None
        if tp_cands:
            degrees = sorted({c.tp for c in tp_cands})
            tp_sizes_ = profile_sizes(tp_cands, batch)
            # the first block split (and what comes before it) is all a proc needs
            first_block = parts.cut(model, 0, 0) if parts.can_pipeline else model
            probe = TPProbe(first_block, parts, sample, degrees, tp_sizes_, threads)
        mesh, tp_s = await _measure_mesh(procs, profilers, facts, probe)
        sizes = profile_sizes(cands, batch)
        speed, together = await _speeds(
            procs, profilers, model, parts, sample, loss, min(sizes), threads
        )
        mesh = replace(mesh, speed=speed, together=together)
        # the model is measured on a fastest proc (the others' times are its over their
        # speed), of those the one with the most room under its cgroup limit, if any
        fastest = max(
            (r for r in range(len(facts)) if not speed or speed[r] == 1.0),
            key=lambda r: (_room(facts[r]), -r),
        )
        first = _one(procs, profilers, fastest)
        sent = model
        if stand_in is not None:  # only what stands in for every block, and the ends
            sent = parts.keep(model, set(stand_in), embed=True, head=True)
        measure = (sent, parts, sample, loss, optimizer, sizes, threads, precision)
        cost = await first.model.call_one(*measure, bool(checkpointing), compile, stand_in)
        cost.tp_block_s = tp_s
        recompute = None
        if checkpointing is None:  # both, for the planner to choose per stage
            recompute = await first.model.call_one(*measure, True, compile, stand_in)
            recompute.tp_block_s = _scaled(tp_s, cost, recompute)
        # what measuring leaves behind (the libraries it loaded, their pages) is charged
        # to the procs' cgroup: the room under its limit is read again after it
        await profilers.release.call()
        rooms = list((await profilers.room.call()).values())
        facts = [replace(f, group=g) for f, g in zip(facts, rooms, strict=True)]
        memory, why_memory = usable_memory(facts)
        mesh = replace(mesh, memory=memory, memory_per_proc=min(memory), memory_why=why_memory)
        # the copies of each rank's state a trainer that recovers keeps are in the procs'
        # memory on CPU (on a GPU, in the host's)
        copying = on_lost_proc != "fail"
        mesh = replace(mesh, copies=copying and mesh.device == "cpu", copying=copying)
    finally:
        await profilers.stop()
    searched = time.perf_counter()
    chosen = choose(
        cost, mesh, batch=batch, cands=cands, layers=layers, recompute=recompute,
        cut=blocks_per_stage,
    )  # fmt: skip
    measured = Measured(cost, mesh, recompute, batch, layers, loss_fn, checkpointing)
    profiled, search = searched - started, time.perf_counter() - searched
    return _finished(chosen, measured, precision, compile, profiled, search)


@dataclass(frozen=True)
class Measured:
    """What :func:`plan` measured and was asked, kept on its :class:`Plan`: enough to
    plan again for fewer procs (:func:`replan`) without measuring again."""

    cost: ModelCost
    mesh: MeshFacts
    recompute: ModelCost | None
    batch: int
    layers: str | None
    loss_fn: Any
    checkpointing: bool | None


def _finished(
    chosen: Plan, m: Measured, precision: str, compile: bool, profiled: float, search: float
) -> Plan:
    """``chosen`` and its candidates as they are to run: how they compute, and (every
    stage, as measured) whether they recompute."""

    def finish(p: Plan) -> Plan:
        stages = p.stages
        if m.checkpointing:
            stages = tuple(replace(st, checkpointing=True) for st in stages)
        return replace(
            p,
            stages=stages,
            loss_fn=m.loss_fn,
            precision=precision,
            checkpointing=m.checkpointing,
            compile=compile,
            candidates=(),
            profile_s=profiled,
            search_s=search,
            measured=m,
        )

    return replace(finish(chosen), candidates=tuple(finish(c) for c in chosen.candidates))


def _measured(p: Plan, instead: str) -> Measured:
    """What ``plan()`` measured for ``p``; ``PlanError`` saying to ``instead`` if none."""
    if not isinstance(p.measured, Measured):
        raise PlanError(f"this plan keeps nothing plan() measured: {instead}")
    return p.measured


def replan(p: Plan, model: nn.Module, n: int) -> Plan:
    """A plan of ``model`` for ``n`` new procs on the host ``p`` was planned for, from
    what ``plan()`` measured for ``p`` (the blocks' costs, the links; the new procs
    taken as alike, each with the least memory the old ones had): no measuring, so it
    takes milliseconds. The dims ``p`` was forced to are not kept.

    Raises:
        PlanError: ``p`` was not made by ``plan()`` (nothing measured is kept on it),
            or no layout of ``n`` procs fits.
    """
    m = _measured(p, "plan for the procs again")
    started = time.perf_counter()
    parts = find_parts(model, m.layers)
    tp_ok, _ = tp_sizes(model, parts, n)
    kw = {"can_pipeline": parts.can_pipeline, "tp_ok": tp_ok}
    sizes = set(m.cost.blocks[0].time_s)  # the microbatch sizes measured
    cands = [
        c
        for c in candidates(n, m.batch, parts.n_blocks, **kw)  # type: ignore[arg-type]
        if m.batch // (c.dp * c.microbatches) in sizes
    ]
    if not cands:
        raise PlanError(
            f"no layout of {n} procs suits a batch of {m.batch} samples in microbatches of "
            f"the sizes measured ({sorted(sizes)})"
        )
    mesh = replace(m.mesh, procs=n, procs_per_host=n, speed=(), memory=())
    chosen = choose(
        m.cost, mesh, batch=m.batch, cands=cands, layers=m.layers, recompute=m.recompute
    )
    return _finished(chosen, m, p.precision, p.compile, 0.0, time.perf_counter() - started)


def simulate_plan(p: Plan, hosts: int, gpus: int, batch: int | None) -> SimulatedPlan:
    """:meth:`Plan.simulate` (see there)."""
    m = _measured(p, "simulate a plan plan() made")
    for name, v in (("hosts", hosts), ("gpus", gpus)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(f"{name} must be a positive int, not {v!r}")
    n = hosts * gpus
    if n % (p.pp * p.tp):
        raise PlanError(
            f"{hosts} x {gpus} devices do not hold whole replicas of pp={p.pp} x tp={p.tp}"
        )
    dp = n // (p.pp * p.tp)
    per_replica = m.batch // p.dp  # the samples of one replica's step, as measured
    batch = per_replica * dp if batch is None else batch
    size = batch // max(1, dp * p.microbatches)
    if batch % (dp * p.microbatches) or size not in m.cost.blocks[0].time_s:
        raise PlanError(
            f"a batch of {batch} over {dp} replicas in {p.microbatches} microbatches is not "
            f"microbatches of a size measured ({sorted(m.cost.blocks[0].time_s)})"
        )
    # every simulated device its own: a core each (no contention), alike, unbounded
    mesh = replace(m.mesh, procs=n, procs_per_host=gpus, cores_per_host=gpus, speed=(), memory=())
    cand = Candidate(dp, p.pp, p.tp, p.microbatches, p.sharded)
    cut = tuple(st.last - st.first + 1 for st in p.stages)
    e = estimate(cand, m.cost, mesh, batch, 1 << 62, m.recompute, cut)
    typical = e.typical
    return SimulatedPlan(
        hosts,
        gpus,
        dp,
        p.pp,
        p.tp,
        p.microbatches,
        batch,
        e.step_s,
        e.peak,
        e.stages,
        p.schedule,
        p.sharded,
        e.pipeline_s * typical,
        e.sync_s * typical,
        e.optimizer_s * typical,
        typical,
        e.copies_s * typical,
    )


def _scaled(
    tp_s: dict[int, dict[int, float]], cost: ModelCost, recompute: ModelCost
) -> dict[int, dict[int, float]]:
    """The tensor-parallel block times (measured unwrapped) as checkpointed: each as much
    slower as checkpointing made the unsplit block."""
    b0, r0 = cost.blocks[0].time_s, recompute.blocks[0].time_s
    return {
        tp: {s: t * r0[s] / max(b0[s], 1e-12) for s, t in by_size.items() if s in r0}
        for tp, by_size in tp_s.items()
    }


def plan(
    model: nn.Module,
    procs: ProcMesh,
    *,
    sample: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    layers: str | None = None,
    dp: int | None = None,
    pp: int | None = None,
    tp: int | None = None,
    microbatches: int | None = None,
    memory_per_proc: int | None = None,
    optimizer: Callable[[Iterator[Any]], Any] | None = None,
    precision: str = "fp32",
    checkpointing: bool | None = False,
    compile: bool = False,
    blocks_per_stage: Sequence[int] | None = None,
    on_lost_proc: str = "respawn",
) -> Future[Plan]:
    """Measure ``model`` and ``procs`` on the procs, and choose how to lay the model out.

    ``await`` the result, or ``.get()`` it from sync code.

    Args:
        model: the model to train (an ``nn.Module``: ``nn.Sequential``, a Hugging Face
            causal LM, or a module with one ``nn.ModuleList`` of blocks).
        procs: the mesh; its size is factored into dp x pp x tp.
        sample: one global batch (``{"input_ids", "labels", "attention_mask"...}`` or
            ``(inputs, target)``);
            its blocks are timed on it, and its size is the batch the plan is for.
        loss_fn: ``loss_fn(output, target)``; the model's own loss by default (Hugging
            Face).
        layers: dotted name of the blocks' ``nn.ModuleList`` where it cannot be found.
        dp: force the data-parallel degree (any of ``dp``, ``pp``, ``tp`` and
            ``microbatches`` may be forced; the rest are chosen).
        pp: force the number of pipeline stages.
        tp: force the tensor-parallel degree.
        microbatches: force the number of microbatches.
        memory_per_proc: bytes each proc may hold (the model's training footprint:
            weights, gradients, optimizer state, activations); by default CUDA's free
            memory, or on CPU the host's available RAM over its procs.
        optimizer: makes an optimizer from parameters, to measure its state and step
            (AdamW by default; pass the one you will train with).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``: the forward computes under
            autocast in the low precision and replicas communicate in it, while
            weights, gradients and optimizer state stay fp32 (measured so, and trained
            so); fp16 keeps a loss scale as torch's GradScaler does.
        checkpointing: activation checkpointing (torch's ``checkpoint_wrapper`` around
            every block): each block keeps only its input and recomputes its forward in
            backward, less memory for more time, both measured so. The same losses.
            ``None``: the planner decides per stage, from the blocks measured both ways:
            a stage that does not fit the memory keeping its activations recomputes
            them where that fits (each ``StagePlan.checkpointing`` says which).
        blocks_per_stage: force the stage cut: how many blocks each pipeline stage holds,
            in order (``[2, 2, 2, 2]``: four stages of two blocks; ``pp`` is its
            length, and must agree where also given).
        compile: time the blocks compiled by ``torch.compile`` (what
            ``parallelize(..., compile=True)`` runs); on CPU, Inductor needs a C++
            compiler, and the error says so where there is none.
        on_lost_proc: what the trainer will do of a lost proc (``parallelize``'s, whose
            default is this one's): with ``"respawn"`` or ``"replan"`` each proc keeps
            copies of its state and its peer's after every step, which on CPU procs
            count against their memory (about 2-4x a proc's weights and optimizer
            state); with ``"fail"`` none.

    Raises (from the future):
        PlanError: no plan fits the memory (the message gives what the smallest needs),
            forced dims that the mesh or batch cannot meet, blocks that cannot be found.
    """
    from ._trainer import check_on_lost_proc

    check_on_lost_proc(on_lost_proc)
    forced = {"dp": dp, "pp": pp, "tp": tp, "microbatches": microbatches}
    cut = _check_cut(blocks_per_stage, pp)
    opt = optimizer if optimizer is not None else _default_optimizer
    check_precision(precision)
    if checkpointing is not None and not isinstance(checkpointing, bool):
        raise PlanError(
            f"checkpointing={checkpointing!r}: give True, False, or None (the planner "
            "chooses per stage)"
        )
    # procs forked from now on (a trainer's, replacing lost ones) start with the model's
    # code imported, as these procs will have it once they are sent the model
    preload_for(procs, type(model).__module__)
    return run_task(
        current_runtime(),
        lambda: _plan(
            model,
            procs,
            sample,
            loss_fn,
            layers,
            forced,
            memory_per_proc,
            opt,
            precision,
            checkpointing,
            compile,
            cut,
            on_lost_proc,
        ),
    )


def _check_cut(blocks_per_stage: object, pp: int | None) -> tuple[int, ...] | None:
    """``blocks_per_stage`` as a tuple, or a PlanError naming what is wrong with it."""
    if blocks_per_stage is None:
        return None
    if isinstance(blocks_per_stage, (str, bytes)) or not hasattr(blocks_per_stage, "__iter__"):
        raise PlanError(
            f"blocks_per_stage={blocks_per_stage!r}: give a list of each stage's blocks"
        )
    cut = tuple(blocks_per_stage)
    if not cut or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in cut):
        raise PlanError(f"blocks_per_stage={list(cut)}: each stage holds a positive int of blocks")
    if pp is not None and pp != len(cut):
        raise PlanError(f"blocks_per_stage={list(cut)} is {len(cut)} stages, but pp={pp}")
    return cut


#: the precisions a plan runs in
PRECISIONS = ("fp32", "bf16", "fp16")


def check_precision(precision: object) -> None:
    """Raises PlanError for a precision danaus does not run."""
    if precision not in PRECISIONS:
        raise PlanError(f"precision={precision!r}: give one of {', '.join(map(repr, PRECISIONS))}")
