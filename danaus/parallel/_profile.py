"""What the planner measures on the procs, never assumes: each block's forward + backward
time and the activation memory it keeps for backward at each microbatch size, the bytes of
weights and optimizer state, each proc's usable memory and cores, and the bandwidth
between procs through the data plane."""

from __future__ import annotations

import copy
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..actors import Actor, endpoint
from ..spmd.seam import proc_host
from ._cgroup import GroupMemory, group_memory
from ._errors import PlanError
from ._model import LossFn, ModelParts, split_batch
from ._staging import copy_each, layout_of, packing
from ._worker import (
    OptimizerFactory,
    autocast,
    checkpoint_blocks,
    compile_blocks,
    current_bytes,
    device,
    optimizer_state_bytes,
    peak_bytes,
    proc_bytes,
    release_memory,
    reset_peak,
    timed,
)


@dataclass
class PartCost:
    """One block (or the embed / head part) as measured.

    Attributes:
        time_s: forward + backward seconds, by microbatch size.
        act_bytes: bytes its forward keeps for backward, by microbatch size.
        out_bytes: bytes of its output (what a pipeline sends on), by microbatch size.
        param_bytes: bytes of its weights.
    """

    time_s: dict[int, float] = field(default_factory=dict)
    act_bytes: dict[int, int] = field(default_factory=dict)
    out_bytes: dict[int, int] = field(default_factory=dict)
    param_bytes: int = 0


@dataclass
class ModelCost:
    """A model as measured on one proc."""

    blocks: list[PartCost]
    embed: PartCost
    head: PartCost
    #: optimizer state bytes per byte of weights (AdamW: 2)
    opt_ratio: float
    #: optimizer step seconds per byte of weights
    opt_s_per_byte: float
    threads: int
    #: by tensor-parallel degree and microbatch size: seconds of block 0's forward +
    #: backward split that many ways, run on every proc at once (its all-reduces, the
    #: DTensor work and the procs' contention for the cores all included)
    tp_block_s: dict[int, dict[int, float]] = field(default_factory=dict)
    #: passes each part was timed over (after a warm-up), the most of any size
    passes: int = 0
    #: the shape of the sample's inputs it was measured on (rows, tokens): a plan made
    #: at one sequence length runs at others, its estimate made at this one
    sample_shape: tuple[int, ...] = ()
    #: how much slower than its fastest pass a part's median pass was, the worst part's
    #: (0.03: 3%): what the machine's other work added while it was measured
    noise: float = 0.0
    #: a whole pass's median time over its fastest (the median over the sizes): what
    #: the machine's other work adds to a step as it was while measured. The parts'
    #: times are their fastest (so that the choice is stable); the estimate of a step
    #: is scaled by this, which ranks every layout alike
    typical: float = 1.0
    #: seconds to copy a byte of weights and optimizer state into one buffer, as a
    #: trainer that recovers lost procs copies its state after every step (._copies)
    copy_s_per_byte: float = 0.0


@dataclass
class ProcFacts:
    """What one proc reports of itself."""

    host: str
    cores: int
    memory: int  # usable bytes for this proc, before its cgroup's limit
    device: str
    #: the tightest cgroup memory limit over this proc (None: none), which the procs
    #: under that group share
    group: GroupMemory | None = None


@dataclass
class MeshFacts:
    """The mesh as measured: usable memory per proc (the smallest), procs and cores per
    host, and the data plane's bandwidth and latency between procs (the slowest pair)."""

    procs: int
    procs_per_host: int
    cores_per_host: int
    memory_per_proc: int
    bandwidth: float  # bytes/s, through the data plane
    latency_s: float
    device: str = "cpu"
    #: bus bandwidth (bytes/s) and latency of an all-reduce over every proc, through the
    #: backend the trainer uses (gloo on CPU, NCCL on GPUs): what collectives and the
    #: pipeline's sends cost
    collective_bw: float = 0.0
    collective_latency_s: float = 0.0
    #: seconds per byte (of the whole tensor) of an all-gather and of a reduce-scatter
    #: over every proc: what FSDP's replicas pay
    gather_s_per_byte: float = 0.0
    scatter_s_per_byte: float = 0.0
    #: seconds of one small send from a proc to the next through that backend: what a
    #: pipeline stage's boundary costs beyond its bytes (an all-reduce's latency is
    #: several such hops)
    hop_latency_s: float = 0.0
    #: bytes the backend holds while it all-reduces a tensor, per byte of it (gloo: two
    #: copies; NCCL: its own buffers, outside torch's): what DDP's buckets cost
    allreduce_bytes_per_byte: float = 0.0
    #: bytes FSDP2 holds beyond a unit's sharded state in its forward and backward, per
    #: byte of the unit's whole weights (the gathered weights, the unsharded gradients,
    #: the backend's buffers); 0.0: not measured
    fsdp_bytes_per_byte: float = 0.0
    #: how many times longer FSDP2's gather of a unit, and its reduce-scatter of the
    #: unit's gradients, take as it runs them (its copies in and out, its hooks) than the
    #: backend's own collectives of those bytes (``gather_s_per_byte``,
    #: ``scatter_s_per_byte``); 1.0: not measured
    fsdp_gather_over: float = 1.0
    fsdp_scatter_over: float = 1.0
    #: per rank, how many times slower than the fastest proc it computes (1.0: as fast;
    #: measured on each proc, alike procs' noise evened out); empty: all alike
    speed: tuple[float, ...] = ()
    #: per rank, the bytes it may hold; empty: each ``memory_per_proc``
    memory: tuple[int, ...] = ()
    #: where the memory was limited by a cgroup, which one and how (for the ``why``)
    memory_why: str = ""
    #: how many times slower a host's procs compute when all of them compute at once
    #: than when each runs alone (the median over procs; 1.0: not measured). Procs that
    #: outnumber the cores share them, so ``procs_per_host x threads / cores`` of it is
    #: expected; past that, what sharing costs (switches, caches, memory bandwidth)
    together: float = 1.0
    #: the trainer keeps copies of each rank's state in its procs' memory after every
    #: step (``on_lost_proc`` other than ``"fail"``, on CPU procs: on a GPU they are in
    #: the host's)
    copies: bool = False
    #: the trainer copies each rank's state after every step (``on_lost_proc`` other
    #: than ``"fail"``, on any device): the copying's time counts
    copying: bool = False


def _available_ram() -> int:
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def _param_bytes(mods: list[nn.Module]) -> int:
    seen: set[int] = set()
    n = 0
    for m in mods:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel() * p.element_size()
    return n


class _SavedBytes:
    """Counts the bytes autograd keeps for backward (parameters excluded) while active."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in self.params:
            st = t.untyped_storage()
            self.storages[st.data_ptr()] = st.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return int(x.numel() * x.element_size())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return 0


def _as_leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().requires_grad_(True)
    return x


def measure_model(
    model: nn.Module,
    parts: ModelParts,
    sample: Any,
    loss_fn: LossFn,
    optimizer: OptimizerFactory,
    sizes: list[int],
    repeats: int = 5,
    stand_in: list[int] | None = None,
) -> ModelCost:
    """Time and size each part of ``model`` on microbatches of each of ``sizes`` samples
    cut from ``sample``. Blocks run one at a time on detached inputs, so each one's
    backward is timed apart from the others'.

    Block by block, where ``stand_in`` is given (for a model too big to measure whole
    on one proc): block ``i`` is measured as block ``stand_in[i]``, a block of its make
    (see :func:`_alike`), and ``model`` need hold only those (the others may be
    ``nn.Identity``, as :meth:`ModelParts.keep` leaves them).

    Each time is the fastest of at least ``repeats`` passes after a warm-up one: other
    work on the machine only ever adds time, so the fastest pass is the part's own cost
    (the median of 5 once came out 17% off on a busy 2-core machine, enough to choose a
    worse split). Passes go on, up to ``4 * repeats``, until every part's two fastest
    agree within ``STABLE``; ``ModelCost.noise`` says how far the median was off."""
    dev = device()
    model = model.to(dev).train()
    inputs, target = split_batch(sample)
    shape = tuple(int(d) for d in getattr(inputs, "shape", ()))
    inputs, target = inputs.to(dev), target.to(dev)
    blocks = parts.blocks(model)
    embed_mods = [model.get_submodule(p) for p in parts.embed_paths]
    head_mods = [model.get_submodule(p) for p in parts.head_paths]
    cost = ModelCost(
        blocks=[PartCost(param_bytes=_param_bytes([b])) for b in blocks],
        embed=PartCost(param_bytes=_param_bytes(embed_mods)),
        head=PartCost(param_bytes=_param_bytes(head_mods)),
        opt_ratio=0.0,
        opt_s_per_byte=0.0,
        threads=torch.get_num_threads(),
        sample_shape=shape,
    )
    if not parts.can_pipeline:  # what is not a block runs in the model's own forward
        cost.head.param_bytes = _param_bytes([model]) - _param_bytes(blocks)
    params = {p.data_ptr() for p in model.parameters()}
    one_pass = _one_pass if parts.can_pipeline else _one_pass_whole
    if stand_in is not None:
        if not parts.can_pipeline:
            raise PlanError(f"{parts.why_not_cut(model)}: it is measured whole")
        one_pass = functools.partial(_one_pass, only=sorted(set(stand_in)))
    ratios: list[float] = []
    for s in sizes:
        x, y = inputs[:s], target[:s]
        runs: list[list[float]] = []
        one_pass(model, parts, blocks, x, y, loss_fn, params)  # warms up
        while len(runs) < repeats or (len(runs) < 4 * repeats and not _stable(runs)):
            times, acts, outs = one_pass(model, parts, blocks, x, y, loss_fn, params)
            runs.append(times)
        n = len(blocks)
        best = [min(run[i] for run in runs) for i in range(n + 2)]
        med = [statistics.median(run[i] for run in runs) for i in range(n + 2)]
        cost.passes = max(cost.passes, len(runs))
        whole = [sum(run) for run in runs]
        ratios.append(statistics.median(whole) / max(min(whole), 1e-12))
        cost.noise = max(
            [cost.noise, *(m / b - 1 for m, b in zip(med, best, strict=True) if b > 0)]
        )
        cost.embed.time_s[s], cost.head.time_s[s] = best[0], best[n + 1]
        cost.embed.act_bytes[s], cost.head.act_bytes[s] = acts[0], acts[n + 1]
        cost.embed.out_bytes[s], cost.head.out_bytes[s] = outs[0], outs[n + 1]
        for i, b in enumerate(cost.blocks):
            b.time_s[s], b.act_bytes[s], b.out_bytes[s] = best[i + 1], acts[i + 1], outs[i + 1]
    cost.typical = statistics.median(ratios) if ratios else 1.0
    if stand_in is None:
        _even_out(cost, _alike(model, parts, blocks))
    else:
        cost.blocks = [copy.deepcopy(cost.blocks[k]) for k in stand_in]
    _measure_optimizer(model, optimizer, cost, blocks)
    return cost


def _alike(model: nn.Module, parts: ModelParts, blocks: list[nn.Module]) -> list[Any]:
    """Each block's make: its class, its weights' names, shapes and types, and the
    attention it is given (a config's ``layer_types``). Blocks of one make cost the same;
    what their measured times differ by is noise."""
    from ._model import _mask_kinds

    config = getattr(model, "config", None)
    kinds = _mask_kinds(config, len(blocks)) if config is not None else [""] * len(blocks)
    return [
        (
            type(b).__name__,
            kinds[i] if i < len(kinds) else "",
            tuple((n, tuple(p.shape), p.dtype) for n, p in b.named_parameters()),
        )
        for i, b in enumerate(blocks)
    ]


def _even_out(cost: ModelCost, makes: list[Any]) -> None:
    """Blocks of one make get their median time at each size: the stage split, which
    minimises the slowest stage, should not be decided by a block that happened to be
    timed 2% slower than its twin (an even cut of equal blocks stays even)."""
    groups: dict[Any, list[PartCost]] = {}
    for make, block in zip(makes, cost.blocks, strict=True):
        groups.setdefault(make, []).append(block)
    for same in groups.values():
        for s in same[0].time_s:
            t = statistics.median(b.time_s[s] for b in same)
            for b in same:
                b.time_s[s] = t


#: two passes of a part agree when the slower is at most this much slower
STABLE = 0.05


def _stable(runs: list[list[float]]) -> bool:
    """Every part's two fastest passes agree within ``STABLE`` (one pass agrees with
    nothing yet)."""
    if len(runs) < 2:
        return False
    for i in range(len(runs[0])):
        a, b = sorted(run[i] for run in runs)[:2]
        if b > a * (1 + STABLE) and b - a > 1e-4:  # parts under 0.1 ms are noise-bound
            return False
    return True


def _one_pass(
    model: nn.Module,
    parts: ModelParts,
    blocks: list[nn.Module],
    x: Any,
    y: Any,
    loss_fn: LossFn,
    params: set[int],
    only: list[int] | None = None,
) -> tuple[list[float], list[int], list[int]]:
    """One forward and backward, part by part: (seconds, kept bytes, output bytes) of
    embed, each block, head + loss; of the blocks, ``only`` those (indices, in order),
    each on the one before's output, the others' left at nothing."""
    model.zero_grad(set_to_none=True)
    n = len(blocks)
    run_ = list(range(n)) if only is None else only
    fwd = [0.0] * (n + 2)
    acts = [0] * (n + 2)
    outs = [0] * (n + 2)
    leaves: list[Any] = []
    results: list[Any] = []

    def run(k: int, fn: Any, arg: Any) -> Any:
        out, fwd[k], acts[k] = _forward(fn, arg, params)
        outs[k] = _nbytes(out)
        return out

    h = run(0, lambda a: parts.embed(model, a), x) if parts.can_pipeline else x
    for i in run_:
        leaf = _as_leaf(h)
        leaves.append(leaf)
        h = run(i + 1, lambda a, i=i: parts.run_blocks(model, i, i, a), leaf)
        results.append(h)
    last = _as_leaf(h)
    loss = run(
        n + 1,
        lambda a: loss_fn(parts.head(model, a) if parts.can_pipeline else a, y),
        last,
    )
    bwd = [0.0] * (n + 2)
    bwd[n + 1] = timed(loss.backward)
    grad = last.grad
    for k in reversed(range(len(run_))):
        out = results[k]
        if grad is None or not isinstance(out, torch.Tensor) or not out.requires_grad:
            break
        bwd[run_[k] + 1] = timed(functools.partial(out.backward, grad))
        grad = leaves[k].grad if isinstance(leaves[k], torch.Tensor) else None
    if parts.embed_paths and grad is not None and leaves:
        emb = parts.embed(model, x)
        bwd[0] = timed(lambda: emb.backward(grad))  # type: ignore[no-untyped-call]
    return [f + b for f, b in zip(fwd, bwd, strict=True)], acts, outs


def _one_pass_whole(
    model: nn.Module,
    parts: ModelParts,
    blocks: list[nn.Module],
    x: Any,
    y: Any,
    loss_fn: LossFn,
    params: set[int],
) -> tuple[list[float], list[int], list[int]]:
    """:func:`_one_pass` for a model whose forward around its blocks is its own: the whole
    model is timed, each block again on the input it got there (with the keywords it got:
    a Hugging Face layer's mask and position embeddings), and the rest (all but the
    blocks) is put down to the head. A block whose input is not one tensor gets an equal
    share of the blocks' time."""
    n = len(blocks)
    captured: list[Any] = [None] * n

    def keep(i: int) -> Any:
        def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            one = len(args) == 1 and isinstance(args[0], torch.Tensor)
            captured[i] = (args[0].detach(), _detached(kwargs)) if one else None

        return hook

    handles = [b.register_forward_pre_hook(keep(i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        model.zero_grad(set_to_none=True)
        loss, whole, kept = _forward(lambda a: loss_fn(parts.forward(model, a), y), x, params)
        whole += timed(loss.backward)
    finally:
        for h in handles:
            h.remove()
    times, acts, outs = [0.0] * (n + 2), [0] * (n + 2), [0] * (n + 2)
    if any(c is None for c in captured):
        for i in range(n):
            times[i + 1], acts[i + 1] = whole / (n + 1), kept // (n + 1)
    else:
        for i, (inp, kw) in enumerate(captured):
            block = functools.partial(_block_output, blocks[i], kw)
            out, t, acts[i + 1] = _forward(block, _as_leaf(inp), params)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                t += timed(functools.partial(out.backward, torch.ones_like(out)))
            times[i + 1], outs[i + 1] = t, _nbytes(out)
    times[n + 1] = max(0.0, whole - sum(times))
    acts[n + 1] = max(0, kept - sum(acts))
    return times, acts, outs


def _detached(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A block's keywords, tensors (and tuples of them) cut from the graph they came in."""

    def cut(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.detach()
        if isinstance(v, tuple):
            return tuple(cut(x) for x in v)
        return v

    return {k: cut(v) for k, v in kwargs.items()}


def _block_output(block: nn.Module, kwargs: dict[str, Any], h: Any) -> Any:
    """A block's hidden states for ``h`` (a Hugging Face layer may return a tuple)."""
    out = block(h, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _forward(fn: Callable[[Any], Any], arg: Any, params: set[int]) -> tuple[Any, float, int]:
    """``fn(arg)``, timed, counting the bytes autograd keeps for its backward
    (parameters excluded): (output, seconds, kept bytes)."""
    saved = _SavedBytes(params)
    out: list[Any] = []
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        seconds = timed(functools.partial(_call_into, out, fn, arg))
    return out[0], seconds, saved.total


def _call_into(out: list[Any], fn: Callable[[Any], Any], arg: Any) -> None:
    out.append(fn(arg))


def _measure_optimizer(
    model: nn.Module, optimizer: OptimizerFactory, cost: ModelCost, blocks: list[nn.Module]
) -> None:
    """The optimizer's state bytes and step seconds per byte of weights, measured on the
    largest block (on the whole model where it has none): its state for every weight at
    once would double what measuring holds, and a model that fits one proc only
    sharded or cut must still be measurable there."""
    biggest = max(blocks, key=lambda b: _param_bytes([b]), default=model)
    params = [p for p in biggest.parameters() if p.grad is not None]
    if not params:
        params = [p for p in model.parameters() if p.grad is not None]
    weight_bytes = sum(p.numel() * p.element_size() for p in params) or 1
    opt = optimizer(iter(params))
    opt.step()  # the first step makes the state
    cost.opt_ratio = optimizer_state_bytes(opt) / weight_bytes
    cost.opt_s_per_byte = statistics.median(timed(opt.step) for _ in range(3)) / weight_bytes
    # a copy of the weights and their state, packed as the copies are (._copies)
    state = {f"w{i}": p.detach() for i, p in enumerate(params)}
    for i, p in enumerate(params):
        for k, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                state[f"o{i}.{k}"] = v
    specs, size = layout_of(state)
    out = torch.empty(size, dtype=torch.uint8)
    lists = packing(out, state, specs)  # (made once, as a trainer's copier makes them)
    copy_each(*lists)  # (its pages made)
    copy_s = statistics.median(timed(lambda: copy_each(*lists)) for _ in range(3))
    cost.copy_s_per_byte = copy_s / max(1, size)


#: seconds a proc's pace is timed over: several of a CPU quota's periods (100 ms by
#: default), so that a proc held to its quota is timed at the pace it keeps
PACE_WINDOW_S = 0.3


class Profiler(Actor):
    """Measures on its proc for the planner: the model, the proc, and data-plane links."""

    def __init__(self) -> None:
        self._held: Any = None

    @endpoint
    def facts(self, memory_per_proc: int | None, local_procs: int) -> ProcFacts:
        """This proc's host, cores and usable memory: the least of CUDA's free memory
        (on a GPU), ``memory_per_proc`` where given, and the host's available RAM over
        its procs (on CPU); and the tightest cgroup memory limit over it, which the
        planner shares among the procs under it."""
        host = proc_host()
        cores = len(os.sched_getaffinity(0))
        if torch.cuda.is_available():
            dev = device()
            free, _ = torch.cuda.mem_get_info(dev)
            mem = min(free, memory_per_proc) if memory_per_proc else free
            return ProcFacts(host, cores, int(mem), str(dev))
        mem = _available_ram() // max(1, local_procs)
        mem = min(mem, memory_per_proc) if memory_per_proc else mem
        return ProcFacts(host, cores, int(mem), "cpu", group_memory())

    @endpoint
    def model(
        self,
        model: nn.Module,
        parts: ModelParts,
        sample: Any,
        loss_fn: LossFn,
        optimizer: OptimizerFactory,
        sizes: list[int],
        threads: int,
        precision: str = "fp32",
        checkpointing: bool = False,
        compile: bool = False,
        stand_in: list[int] | None = None,
    ) -> ModelCost:
        """Measure ``model`` here (see :func:`measure_model`) with ``threads`` torch
        threads, as a worker of the plan will have, computing in ``precision``, its
        blocks checkpointed if ``checkpointing``, compiled if ``compile`` (the passes
        that compile are slower than the rest, and the fastest pass counts); block by
        block where ``stand_in`` is given."""
        if checkpointing:
            checkpoint_blocks(model, parts, 0, parts.n_blocks - 1)
        if compile:
            compile_blocks(model, parts, 0, parts.n_blocks - 1)
        old = torch.get_num_threads()
        if not torch.cuda.is_available():
            torch.set_num_threads(threads)
        try:
            with autocast(device(), precision):
                return measure_model(
                    model, parts, sample, loss_fn, optimizer, sizes, stand_in=stand_in
                )
        finally:
            torch.set_num_threads(old)

    @endpoint
    def pace(
        self,
        model: nn.Module,
        parts: ModelParts,
        sample: Any,
        loss_fn: LossFn,
        size: int,
        threads: int,
        window_s: float = PACE_WINDOW_S,
    ) -> float:
        """Seconds of one forward + backward of the model's first block (of the whole
        model, where it is not cut into blocks) on ``size`` samples, as this proc runs
        them over ``window_s``: passes go on for that long, so that a proc under a CPU
        quota (cgroup ``cpu.cfs_quota_us``, ``cpu.max``), which runs at full speed until
        its quota for a period is spent and then waits out the period, is timed at the
        pace it keeps, not at the speed of its first few milliseconds."""
        dev = device()
        old = torch.get_num_threads()
        if not torch.cuda.is_available():
            torch.set_num_threads(threads)
        try:
            model = model.to(dev).train()
            inputs, target = split_batch(sample)
            x, y = inputs[:size].to(dev), target[:size].to(dev)
            run: Callable[[], None]
            if parts.can_pipeline:
                with torch.no_grad():
                    hidden = parts.embed(model, x)
                h = hidden.detach().requires_grad_(True)

                def run() -> None:
                    out = parts.run_blocks(model, 0, 0, h)
                    out.backward(torch.ones_like(out))
            else:

                def run() -> None:
                    loss_fn(parts.forward(model, x), y).backward()  # type: ignore[no-untyped-call]

            run()  # warm up
            passes, start = 0, time.perf_counter()
            while passes < 3 or time.perf_counter() - start < window_s:
                run()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                passes += 1
            return (time.perf_counter() - start) / passes
        finally:
            torch.set_num_threads(old)

    @endpoint
    def release(self) -> None:
        """Drop what measuring held and give the memory back (the trainer comes next,
        in the same procs, under the same limits)."""
        self._held = None
        release_memory()

    @endpoint
    def room(self) -> GroupMemory | None:
        """The tightest cgroup memory limit over this proc, read now (None on a GPU,
        whose memory no cgroup limits)."""
        return None if torch.cuda.is_available() else group_memory()

    @endpoint
    def offer(self, nbytes: int) -> Any:
        """A buffer of ``nbytes`` held here, for another proc to read."""
        from ..rdma import RDMABuffer

        self._held = torch.zeros(nbytes, dtype=torch.uint8)
        return RDMABuffer(self._held)

    @endpoint
    def read(
        self, buf: Any, nbytes: int, small: int = 4096, repeats: int = 5
    ) -> tuple[float, float]:
        """Read ``buf`` (``nbytes``) from its owner through the data plane: (bytes/s of
        the best large read, seconds of the best small read)."""
        big = torch.empty(nbytes, dtype=torch.uint8)
        little = torch.empty(small, dtype=torch.uint8)
        buf.read_into(big).get()  # warm the path and the pages
        bw = max(
            nbytes / max(timed(lambda: buf.read_into(big).get()), 1e-9) for _ in range(repeats)
        )
        lat = min(
            timed(lambda: buf.read_into(little, offset=nbytes - small).get())
            for _ in range(repeats)
        )
        return bw, lat

    @endpoint
    def collective(
        self, nbytes: int, tp: TPProbe | None = None, repeats: int = 3, small: int = 15
    ) -> tuple[
        float, float, float, float, dict[int, dict[int, float]], float, float, float, float,
        float,
    ]:  # fmt: skip
        """All-reduce, all-gather and reduce-scatter ``nbytes`` over every proc of the
        mesh through the backend the trainer will use (the environment set by
        ``danaus.spmd``), and time a tensor-parallel block where ``tp`` asks: (all-reduce
        bus bytes/s, seconds of a small all-reduce, seconds per byte of an all-gather, of
        a reduce-scatter, :attr:`ModelCost.tp_block_s`, seconds of a small send to the
        next proc, the memory the backend and FSDP hold beyond a model's state:
        :attr:`MeshFacts.allreduce_bytes_per_byte`, :attr:`MeshFacts.fsdp_bytes_per_byte`,
        and FSDP2's own gathers and reduce-scatters over the backend's:
        :attr:`MeshFacts.fsdp_gather_over`, :attr:`MeshFacts.fsdp_scatter_over`). Call
        every proc of the mesh.

        Small messages cost the machine's wake-ups more than their bytes, and another
        program's work only ever adds to that: their times are the fastest of ``small``."""
        import torch.distributed as dist

        dev = device()
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        try:
            tp_s = _tp_block_times(tp, TP_REPEATS) if tp is not None else {}
            n = dist.get_world_size()
            big = torch.zeros(nbytes // 4, dtype=torch.float32, device=dev)
            little = torch.zeros(1, dtype=torch.float32, device=dev)
            dist.all_reduce(big)  # warm up: connections, pages
            t = min(timed(lambda: dist.all_reduce(big)) for _ in range(repeats))
            lat = min(timed(lambda: dist.all_reduce(little)) for _ in range(small))
            hop = _hop_latency(little, small)
            shard = torch.zeros(big.numel() // n, dtype=big.dtype, device=dev)
            whole = shard.new_zeros(shard.numel() * n)
            # torch 2.13 renamed them (the old names warn); older releases have only those
            all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            scatter_ = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            all_gather(whole, shard)
            gather = min(timed(lambda: all_gather(whole, shard)) for _ in range(repeats))
            scatter_(shard, whole)
            scatter = min(timed(lambda: scatter_(shard, whole)) for _ in range(repeats))
            size = whole.numel() * whole.element_size()
            held = _held_while(lambda: dist.all_reduce(big)) / nbytes
            fsdp, gather_s, scatter_s, weights = _fsdp_unit(nbytes, dev, 2 * repeats - 1)
            # over what the backend's own collectives of the unit's bytes take
            gather_over = max(1.0, gather_s / (gather / size * weights)) if gather else 1.0
            scatter_over = max(1.0, scatter_s / (scatter / size * weights)) if scatter else 1.0
            return (
                nbytes * 2 * (n - 1) / n / t, lat, gather / size, scatter / size, tp_s, hop,
                held, fsdp, gather_over, scatter_over,
            )  # fmt: skip
        finally:
            dist.destroy_process_group()


def _held_while(fn: Callable[[], Any]) -> int:
    """The most bytes this proc held while ``fn`` ran beyond what it held before (on
    CPU its resident memory, on CUDA what torch allocated), what ``fn`` freed again."""
    dev = device()
    release_memory()
    reset_peak(dev)
    before = current_bytes(dev)
    fn()
    return max(0, peak_bytes(dev) - before)


def _fsdp_unit(nbytes: int, dev: torch.device, repeats: int) -> tuple[float, float, float, int]:
    """One FSDP2 unit of ``nbytes`` of weights over every proc, resharded after its
    forward, run on one row: (what FSDP2 holds beyond the unit's sharded state while it
    runs forward and backward, per byte of the unit's whole weights: the gathered
    weights, the unsharded gradients and the backend's buffers for the gather and the
    reduce-scatter, on CPU gloo's copies; the seconds of its gather as FSDP2 runs it: a
    forward less the same layer's unsharded; of its reduce-scatter of the gradients: a
    forward and backward, less the same layer's unsharded, less its two gathers; the
    unit's weight bytes). Each time is the fastest of ``repeats``. Measured on 4 CPU procs
    here: the gather 1.06-1.13x gloo's own, the reduce-scatter 2.2-3.3x (FSDP2 copies the
    gradients in, divides them, and copies the shard out)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    n = dist.get_world_size()
    width = max(n, int((nbytes // 4) ** 0.5) // n * n)
    unit = nn.Linear(width, width, bias=False, device=dev)
    alone = nn.Linear(width, width, bias=False, device=dev)
    fully_shard(unit, mesh=init_device_mesh(dev.type, (n,)), reshard_after_forward=True)
    x = torch.ones(1, width, device=dev)

    def step(layer: nn.Module) -> None:
        layer(x).sum().backward()

    def forward(layer: nn.Module) -> None:
        with torch.no_grad():
            layer(x)

    step(unit)  # warm up: the gradients' shards are made
    weights = width * width * 4
    held = _held_while(functools.partial(step, unit))
    dist.barrier()
    both = min(timed(functools.partial(step, unit)) for _ in range(repeats))
    dist.barrier()
    fwd = min(timed(functools.partial(forward, unit)) for _ in range(repeats))
    step(alone)
    both_alone = min(timed(functools.partial(step, alone)) for _ in range(repeats))
    fwd_alone = min(timed(functools.partial(forward, alone)) for _ in range(repeats))
    gather_s = max(0.0, fwd - fwd_alone)
    scatter_s = max(0.0, both - both_alone - 2 * gather_s)
    return held / weights, gather_s, scatter_s, weights


#: tensor-parallel passes timed per degree and microbatch size (their median counts)
TP_REPEATS = 5


def _hop_latency(little: torch.Tensor, repeats: int) -> float:
    """Seconds of one small send between neighbouring ranks (the fastest of ``repeats``
    ping-pongs, halved): even ranks ping the rank after them (an odd count leaves the
    last rank out, and it reports 0)."""
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    if peer >= n:
        return 0.0
    ping = rank % 2 == 0

    def once() -> None:
        if ping:
            dist.send(little, peer)
            dist.recv(little, peer)
        else:
            dist.recv(little, peer)
            dist.send(little, peer)

    once()  # warm up the pair's connection
    return min(timed(once) for _ in range(repeats)) / 2


@dataclass
class TPProbe:
    """What to time split tensor-parallel: the model's first block, at each degree and
    microbatch size, with ``threads`` torch threads per proc."""

    model: nn.Module
    parts: ModelParts
    sample: Any
    degrees: list[int]
    sizes: list[int]
    threads: int


def _tp_block_times(probe: TPProbe, repeats: int) -> dict[int, dict[int, float]]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from . import _tp
    from ._model import _replace_path

    dev = device()
    n = dist.get_world_size()
    model, parts = probe.model.to(dev), probe.parts
    if not torch.cuda.is_available():
        torch.set_num_threads(probe.threads)
    original = parts.blocks(model)[0]
    with torch.no_grad():
        hidden = parts.embed(model, split_batch(probe.sample)[0].to(dev))
    out: dict[int, dict[int, float]] = {}
    for tp in probe.degrees:
        mesh = init_device_mesh(dev.type, (n // tp, tp), mesh_dim_names=("rest", "tp"))
        block = copy.deepcopy(original)
        _tp.apply(block, mesh["tp"], parts.tp_plan)
        _replace_path(model, parts.block_path(0), block)
        out[tp] = {}
        for s in probe.sizes:
            x = hidden[:s].detach().requires_grad_(True)

            def run(x: torch.Tensor = x) -> None:
                y = parts.run_blocks(model, 0, 0, x)
                y.backward(torch.ones_like(y))

            run()  # warm up
            # the median: every proc computes and waits on the others at once here, and
            # the fastest of a few such passes ran up to 1.4x under a step's (the median
            # of 3 up to 1.7x over: these are the noisiest times the planner takes)
            out[tp][s] = statistics.median(timed(run) for _ in range(repeats))
    _replace_path(model, parts.block_path(0), original)
    return out
