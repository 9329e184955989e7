"""The planner on costs given by hand: stage splits, memory, forced dims, what it prints."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

pytest.importorskip("torch")

from danaus.parallel import PlanError
from danaus.parallel._planner import candidates, check_forced, choose, estimate
from danaus.parallel._profile import MeshFacts, ModelCost, PartCost

MiB = 2**20


def _cost(times: list[float], params: list[int], batch: int = 8, act: int = MiB) -> ModelCost:
    sizes = [s for s in range(1, batch + 1) if batch % s == 0]

    def part(t: float, p: int) -> PartCost:
        return PartCost(
            time_s={s: t * s / batch for s in sizes},
            act_bytes={s: act * s // batch for s in sizes},
            out_bytes={s: 1024 * s for s in sizes},
            param_bytes=p,
        )

    return ModelCost(
        blocks=[part(t, p) for t, p in zip(times, params, strict=True)],
        embed=part(0.0, 0),
        head=part(0.0, 0),
        opt_ratio=2.0,
        opt_s_per_byte=0.0,
        threads=1,
    )


def _mesh(procs: int = 4, memory: int = 1 << 40) -> MeshFacts:
    return MeshFacts(
        procs=procs,
        procs_per_host=procs,
        cores_per_host=procs,
        memory_per_proc=memory,
        bandwidth=1e10,
        latency_s=1e-6,
        collective_bw=1e10,
        collective_latency_s=1e-6,
        gather_s_per_byte=1e-10,
        scatter_s_per_byte=1e-10,
    )


def _all(n: int = 4, batch: int = 8, blocks: int = 8, **forced: int) -> list:
    return list(candidates(n, batch, blocks, can_pipeline=True, tp_ok=[1], **forced))


def _best_contiguous(times: list[float], stages: int) -> float:
    n = len(times)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        e = [0, *cuts, n]
        best = min(best, max(sum(times[e[i] : e[i + 1]]) for i in range(stages)))
    return best


@pytest.mark.parametrize(
    "times", [[4, 1, 1, 4, 2, 1, 3, 4], [1, 1, 1, 1, 1, 1, 1, 8], [8, 1, 2, 2, 1, 1, 1, 1]]
)
def test_stage_boundaries_are_the_best_contiguous_split(times: list[float]) -> None:
    cost = _cost([float(t) for t in times], [MiB] * 8)
    cands = _all(pp=4, microbatches=8)
    p = choose(cost, _mesh(), batch=8, cands=cands, layers=None)
    got = max(sum(times[s.first : s.last + 1]) for s in p.stages)
    assert got == _best_contiguous(times, 4)
    assert p.stages[0].first == 0 and p.stages[-1].last == 7


def test_with_memory_to_spare_cheap_replicas_win() -> None:
    p = choose(_cost([1.0] * 8, [MiB] * 8), _mesh(), batch=8, cands=_all(), layers=None)
    assert (p.dp, p.pp, p.tp, p.sharded) == (4, 1, 1, False)
    # weights + grads + AdamW's two moments, and the activations of a quarter of the batch
    # kept by the 8 blocks, the embed part and the head
    assert p.peak_bytes_per_proc == 8 * MiB * 4 + 10 * MiB // 4
    assert "fastest (or simplest within 5% of it) of 14 layouts" in p.why and p.runner_up


def test_a_near_tie_goes_to_the_simpler_layout() -> None:
    # a slow optimizer step: sharding it 4 ways saves a few ms of a 2 s step
    cost = _cost([1.0] * 8, [MiB] * 8)
    cost.opt_s_per_byte = 1e-9
    cands = _all(dp=4, microbatches=1)
    est = {c.sharded: estimate(c, cost, _mesh(), 8, 1 << 40).step_s for c in cands}
    assert est[True] < est[False] < est[True] * 1.05  # FSDP is faster, but barely
    p = choose(cost, _mesh(), batch=8, cands=cands, layers=None)
    assert (p.dp, p.sharded) == (4, False)
    assert p.runner_up.startswith("fsdp=4")


def test_the_optimizer_steps_a_shard_wherever_fsdp_shards_the_state() -> None:
    """FSDP2 runs a replicated pipeline (ZeRO-2: the weights kept whole between forward
    and backward) as it runs a sharded replica: each rank's optimizer steps its shard of
    the stage, not the whole stage, as DDP's replicas each step the whole."""
    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    cost.opt_s_per_byte = 1e-8
    by = {(c.dp, c.pp, c.sharded): c for c in _all(microbatches=1)}
    stage = 4 * MiB * cost.opt_s_per_byte  # a stage of pp=2: 4 of the 8 blocks
    zero2 = estimate(by[2, 2, False], cost, _mesh(), 8, 1 << 40)
    assert zero2.optimizer_s == pytest.approx(stage / 2)
    zero3 = estimate(by[4, 1, True], cost, _mesh(), 8, 1 << 40)
    assert zero3.optimizer_s == pytest.approx(2 * stage / 4)
    whole = estimate(by[4, 1, False], cost, _mesh(), 8, 1 << 40)  # DDP
    assert whole.optimizer_s == pytest.approx(2 * stage)
    alone = estimate(by[1, 4, False], cost, _mesh(), 8, 1 << 40)  # no replicas
    assert alone.optimizer_s == pytest.approx(stage / 2)


def test_a_cap_under_a_whole_replica_picks_stages_or_shards_that_fit() -> None:
    cost = _cost([1.0] * 8, [4 * MiB] * 8)
    whole = 8 * 4 * MiB * 4  # a replica's weights, grads and AdamW state
    p = choose(cost, _mesh(memory=whole // 2), batch=8, cands=_all(), layers=None)
    assert p.pp > 1 or p.sharded
    assert p.peak_bytes_per_proc <= whole // 2
    assert all(s.peak_bytes <= whole // 2 for s in p.stages)


def test_a_cap_nothing_fits_under_says_what_the_smallest_needs() -> None:
    cost = _cost([1.0] * 8, [4 * MiB] * 8)
    with pytest.raises(
        PlanError, match=r"no plan fits in 1\.0 MiB per proc: the smallest, .* needs [\d.]+ MiB"
    ):
        choose(cost, _mesh(memory=MiB), batch=8, cands=_all(), layers=None)


def test_estimated_step_counts_the_pipeline_bubble() -> None:
    cost = _cost([1.0] * 4, [MiB] * 4, batch=8)
    (c1,) = [c for c in _all(blocks=4, pp=4, microbatches=1)]
    (c8,) = [c for c in _all(blocks=4, pp=4, microbatches=8)]
    one, eight = estimate(c1, cost, _mesh(), 8, 1 << 40), estimate(c8, cost, _mesh(), 8, 1 << 40)
    # 1 microbatch: 4 stages one after another; 8: (8 + 3) slots of 1/8 the work
    assert one.step_s == pytest.approx(4 * 1.0, rel=0.05)
    assert eight.step_s == pytest.approx(11 * 1.0 / 8, rel=0.05)
    assert c1.schedule == "gpipe" and c8.schedule == "1f1b"


def test_candidates_respect_forced_dims_the_batch_and_the_model() -> None:
    assert {(c.dp, c.pp, c.tp) for c in _all(dp=2)} == {(2, 2, 1)}
    assert all(8 % (c.dp * c.microbatches) == 0 for c in _all())
    assert {c.pp for c in candidates(4, 8, 8, can_pipeline=False, tp_ok=[1])} == {1}
    assert {c.tp for c in candidates(4, 8, 8, can_pipeline=True, tp_ok=[1, 2])} == {1, 2}
    assert {c.pp for c in _all(blocks=2)} == {1, 2}  # no more stages than blocks


@pytest.mark.parametrize(
    ("forced", "message"),
    [
        ({"dp": 3}, "dp=3 = 3 does not divide the mesh's 4 procs"),
        ({"dp": 2, "pp": 2, "tp": 2}, "dp=2 x pp=2 x tp=2 = 8 does not equal the mesh's 4 procs"),
        ({"dp": 0}, "dp=0: each forced dim is a positive int"),
        ({"pp": 4}, "pp=4: the model has only 2 blocks"),
        ({"tp": 2}, "tp=2: no plan for this model"),
        ({"dp": 4}, "dp=4 does not divide the batch of 6 samples"),
        ({"microbatches": 4}, "microbatches=4 does not divide the batch of 6 samples"),
    ],
)
def test_forced_dims_that_cannot_be_met_are_named(forced: dict[str, int], message: str) -> None:
    args = {"dp": None, "pp": None, "tp": None, "microbatches": None, **forced}
    with pytest.raises(PlanError, match=message):
        check_forced(
            4, 6, 2, can_pipeline=True, tp_ok=[1], why_no_tp="no plan for this model", **args
        )


def test_checkpointing_none_recomputes_only_where_keeping_activations_does_not_fit() -> None:
    # 8 blocks (and the embed and head) of 1 s and 64 MiB of activations at the whole
    # batch; checkpointed: 1.3 s and 1 MiB. pp=2 with 2 microbatches of 4 rows under 1F1B:
    # a part takes 0.5 s (0.65 s checkpointed) and keeps 32 MiB per microbatch; the first
    # stage holds 2 microbatches' activations, the last 1.
    plain = _cost([1.0] * 8, [1024] * 8, act=64 * MiB)
    recompute = _cost([1.3] * 8, [1024] * 8, act=MiB)  # the blocks measured checkpointed
    cands = _all(n=2, blocks=8, pp=2, microbatches=2)
    tight = _mesh(procs=2, memory=170 * MiB)  # keeping: 1 block first, 4 last at most
    with pytest.raises(PlanError, match=r"no plan fits in 170\.0 MiB per proc"):
        choose(plain, tight, batch=8, cands=cands, layers=None)
    p = choose(plain, tight, batch=8, cands=cands, layers=None, recompute=recompute)
    # fastest: 4 blocks recomputed first (2.6 s), 4 kept last (2 s; they fit); 3 first
    # (1.95 s) leaves 5 last, which fit only recomputed (3.25 s)
    got = [(s.first, s.last, s.checkpointing) for s in p.stages]
    assert got == [(0, 3, True), (4, 7, False)]
    assert all(s.peak_bytes <= 170 * MiB for s in p.stages)
    assert p.layout.checkpointing == (True, False)
    assert "activation checkpointing on stage(s) 0: they fit only" in p.why
    # with memory to spare, nothing recomputes: it is slower
    roomy = choose(plain, _mesh(procs=2), batch=8, cands=cands, layers=None, recompute=recompute)
    assert not any(s.checkpointing for s in roomy.stages)
    assert "no activation checkpointing: every stage fits keeping its activations" in roomy.why


def test_every_layout_that_fits_is_a_candidate_fastest_first_with_its_ranks() -> None:
    cost = _cost([1.0] * 8, [MiB] * 8)
    cands = _all(n=4, blocks=8)
    p = choose(cost, _mesh(), batch=8, cands=cands, layers=None)
    assert len(p.candidates) == len(cands)  # with memory to spare, every one fits
    steps = [c.estimated_step_s for c in p.candidates]
    assert steps == sorted(steps)
    assert p in p.candidates and all(not c.candidates for c in p.candidates)
    shapes = {(c.dp, c.pp, c.tp, c.microbatches, c.sharded) for c in p.candidates}
    assert shapes == {(c.dp, c.pp, c.tp, c.microbatches, c.sharded) for c in cands}
    for c in p.candidates:
        # each stage is held by one rank per replica (and tensor-parallel shard), and
        # every rank of the mesh holds exactly one stage
        assert sorted(r for s in c.stages for r in s.ranks) == list(range(4))
        for k, s in enumerate(c.stages):
            assert s.ranks == tuple(c.layout.rank(d, k, 0) for d in range(c.dp))
        assert c.why.startswith("a candidate the planner weighed") or c == p
    two = next(c for c in p.candidates if (c.dp, c.pp) == (2, 2))
    assert [s.ranks for s in two.stages] == [(0, 2), (1, 3)]
    # under a cap, only those that fit
    tight = choose(cost, _mesh(memory=int(two.peak_bytes_per_proc * 1.01)), batch=8,
                   cands=cands, layers=None)  # fmt: skip
    assert all(c.peak_bytes_per_proc <= tight.memory_per_proc for c in tight.candidates)
    assert 0 < len(tight.candidates) < len(cands)


def test_a_forced_stage_cut_is_kept_and_estimated() -> None:
    cost = _cost([4, 1, 1, 1, 1, 1, 1, 1], [MiB] * 8)
    cands = _all(n=4, blocks=8, pp=4)
    free = choose(cost, _mesh(), batch=8, cands=cands, layers=None)
    assert (free.stages[0].first, free.stages[0].last) == (0, 0)  # the heavy block alone
    even = choose(cost, _mesh(), batch=8, cands=cands, layers=None, cut=(2, 2, 2, 2))
    assert [(s.first, s.last) for s in even.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert even.estimated_step_s > free.estimated_step_s  # the planner's cut was better
    assert all([(s.first, s.last) for s in c.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]
               for c in even.candidates)  # fmt: skip


@pytest.mark.parametrize(
    ("cut", "pp", "says"),
    [
        ("2222", None, r"blocks_per_stage='2222': give a list of each stage's blocks"),
        ([2, 0, 2], None, r"blocks_per_stage=\[2, 0, 2\]: each stage holds a positive int"),
        ([2, 2.5], None, r"each stage holds a positive int of blocks"),
        ([4, 4], 4, r"blocks_per_stage=\[4, 4\] is 2 stages, but pp=4"),
    ],
)
def test_a_stage_cut_that_cannot_be_is_named(cut: object, pp: int | None, says: str) -> None:
    from danaus.parallel._planning import _check_cut

    with pytest.raises(PlanError, match=says):
        _check_cut(cut, pp)


# --- unlike procs -----------------------------------------------------------------------


def test_a_slow_proc_s_stage_gets_fewer_blocks() -> None:
    cost = _cost([1.0] * 8, [MiB] * 8)
    cands = _all(n=4, blocks=8, pp=4)
    even = choose(cost, _mesh(), batch=8, cands=cands, layers=None)
    assert [s.last - s.first + 1 for s in even.stages] == [2, 2, 2, 2]
    # ranks 1 and 2 run 6x slower (a CPU quota of about 15%)
    slow = replace(_mesh(), speed=(1.0, 6.0, 6.0, 1.0))
    p = choose(cost, slow, batch=8, cands=cands, layers=None)
    blocks = [s.last - s.first + 1 for s in p.stages]
    assert blocks == [3, 1, 1, 3], str(p)
    assert [s.ranks for s in p.stages] == [(0,), (1,), (2,), (3,)]  # no reordering needed
    assert "rank 1 6.0x slower" in p.why and "blocks per stage 3, 1, 1, 3" in p.why
    # the even cut, forced, is estimated slower on these procs, as it will run
    forced = choose(cost, slow, batch=8, cands=cands, layers=None, cut=(2, 2, 2, 2))
    assert forced.estimated_step_s > 1.3 * p.estimated_step_s
    # and on alike procs their speed does not change the cut
    alike = choose(cost, replace(_mesh(), speed=(2.0,) * 4), batch=8, cands=cands, layers=None)
    assert [(s.first, s.last) for s in alike.stages] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_replicas_are_balanced_by_putting_alike_procs_on_one_stage() -> None:
    cost = _cost([1.0] * 8, [MiB] * 8)
    cands = _all(n=4, blocks=8, dp=2, pp=2)
    # ranks 2 and 3 are slow: as numbered, replica 1 (ranks 2, 3) would be all slow and
    # each stage would wait for a slow proc; reordered, stage 1 is both slow procs
    slow = replace(_mesh(), speed=(1.0, 1.0, 4.0, 4.0))
    p = choose(cost, slow, batch=8, cands=cands, layers=None)
    assert [s.ranks for s in p.stages] == [(0, 1), (2, 3)], str(p)
    assert [s.last - s.first + 1 for s in p.stages] == [7, 1]  # 7 x 1 against 1 x 4
    assert p.layout.order == (0, 2, 1, 3)
    assert [p.layout.coords(r) for r in range(4)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert "stage 1: ranks [2, 3]" in p.why
    # where they already are alike per stage (ranks 1 and 3 slow: stage 1 as numbered),
    # nothing moves
    q = choose(cost, replace(_mesh(), speed=(1.0, 4.0, 1.0, 4.0)), batch=8, cands=cands,
               layers=None)  # fmt: skip
    assert [s.ranks for s in q.stages] == [(0, 2), (1, 3)] and q.layout.order == ()
    # ranks 1 and 2 slow: stage groups {0, 3} and {1, 2} cannot have ranks rising along
    # the pipeline (torch numbers a group's members in rank order): left as numbered
    r = choose(cost, replace(_mesh(), speed=(1.0, 4.0, 4.0, 1.0)), batch=8, cands=cands,
               layers=None)  # fmt: skip
    assert r.layout.order == () and [s.last - s.first + 1 for s in r.stages] == [4, 4]
    # and every reordered layout rises along each dim
    for speed in itertools.permutations((1.0, 1.0, 4.0, 4.0)):
        lay = choose(cost, replace(_mesh(), speed=speed), batch=8, cands=cands,
                     layers=None).layout  # fmt: skip
        g = lay.grid()
        assert all(g[0][k][0] < g[1][k][0] for k in range(2)), g
        assert all(g[d][0][0] < g[d][1][0] for d in range(2)), g


def test_a_proc_with_less_memory_gets_a_smaller_stage() -> None:
    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    cands = _all(n=4, blocks=8, pp=4)
    # AdamW: each block holds 4 MiB (weights, grads, two moments); rank 3 may hold 4.5,
    # the others 13
    mesh = replace(_mesh(memory=9 * MiB // 2), memory=(13 * MiB,) * 3 + (9 * MiB // 2,))
    p = choose(cost, mesh, batch=8, cands=cands, layers=None)
    assert p.stages[3].last == p.stages[3].first, str(p)  # one block on rank 3
    assert p.stages[3].limit_bytes == 9 * MiB // 2 and p.stages[0].limit_bytes == 13 * MiB
    assert all(s.peak_bytes <= s.limit_bytes for s in p.stages)
    assert p.memory_per_proc == 9 * MiB // 2  # the least any proc of it may hold
    assert "fit in 4.5 MiB per proc or more" in p.why
    # no cut fits where that rank cannot hold one block
    with pytest.raises(PlanError, match="no plan fits"):
        choose(cost, replace(mesh, memory=(64 * MiB,) * 3 + (MiB,)), batch=8, cands=cands,
               layers=None)  # fmt: skip


def test_speed_classes_even_out_noise_but_not_a_real_difference() -> None:
    from danaus.parallel._planner import classes

    assert classes([1.0, 1.1, 0.95, 1.5]) == [0, 0, 0, 0]  # a busy machine's noise
    assert classes([1.0, 6.5, 6.9, 1.1]) == [0, 1, 1, 0]
    assert classes([]) == []


def test_a_layout_order_maps_ranks_and_rejects_a_non_permutation() -> None:
    from danaus.parallel._layout import Layout, order_of

    lay = Layout(2, 2, 1, 1, ((0, 1), (2, 3)), order=(0, 2, 1, 3))
    assert lay.grid() == [[[0], [2]], [[1], [3]]]
    assert lay.stage_ranks(1) == (2, 3)
    assert all(lay.rank(*lay.coords(r)) == r for r in range(4))
    assert order_of(2, 2, 1, [(0, 2), (1, 3)]) == ()  # the plain numbering
    assert order_of(2, 2, 1, [(0, 1), (2, 3)]) == (0, 2, 1, 3)
    with pytest.raises(ValueError, match="give each of the mesh's 4 ranks once"):
        Layout(2, 2, 1, 1, ((0, 1), (2, 3)), order=(0, 0, 1, 3))
    with pytest.raises(ValueError, match="ranks must rise along each of dp, pp and tp"):
        Layout(2, 2, 1, 1, ((0, 1), (2, 3)), order=(3, 1, 0, 2))


def test_a_shard_goes_to_its_ranks_in_runs_of_neighbours() -> None:
    from danaus.parallel._trainer import _runs

    assert _runs([3, 0, 1, 5]) == (range(0, 2), range(3, 4), range(5, 6))
    assert _runs(range(4)) == (range(0, 4),)


def test_a_trainer_that_lost_a_proc_replans_from_what_was_measured() -> None:
    """``replan``: the plan for 3 procs from the costs measured for 4, in milliseconds
    and without a proc; a batch of 8 that 3 replicas cannot split goes to stages."""
    from torch import nn

    from danaus.parallel._planning import Measured, replan

    model = nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(8)))
    cost = _cost([1.0] * 8, [MiB] * 8)
    mesh = _mesh(4)
    p = choose(cost, mesh, batch=8, cands=_all(4), layers=None)
    p = replace(p, measured=Measured(cost, mesh, None, 8, None, None, False))
    q = replan(p, model, 3)
    assert (q.dp, q.pp, q.tp) == (1, 3, 1), str(q)
    assert sorted(s.last - s.first + 1 for s in q.stages) == [2, 3, 3]
    assert q.measured is p.measured and q.estimated_step_s > 0 and q.profile_s == 0.0
    assert all(c.dp * c.pp * c.tp == 3 for c in q.candidates)
    with pytest.raises(PlanError, match=r"keeps nothing plan\(\) measured"):
        replan(replace(p, measured=None), model, 3)


def test_a_plan_is_simulated_on_a_bigger_mesh_from_what_was_measured() -> None:
    """``Plan.simulate``: the plan's own size gives its own estimate; more devices give
    more replicas of the same stages, each with the microbatches measured, and the
    step's collectives grow with them; what cannot be simulated is named."""
    from danaus.parallel._planning import Measured

    cost = _cost([1.0] * 8, [MiB] * 8)
    mesh = _mesh(4)
    p = choose(cost, mesh, batch=8, cands=_all(4, dp=2, pp=2), layers=None)
    p = replace(p, measured=Measured(cost, mesh, None, 8, None, None, False))
    same = p.simulate(1, 4)
    assert (same.dp, same.pp, same.batch) == (2, 2, 8)
    assert same.step_s == pytest.approx(p.estimated_step_s, rel=1e-9)
    assert same.peak_bytes_per_proc == p.peak_bytes_per_proc
    big = p.simulate(4, 8)  # 32 devices: 16 replicas of the two stages, 64 samples
    assert (big.dp, big.pp, big.tp, big.batch) == (16, 2, 1, 64)
    assert [(s.first, s.last) for s in big.stages] == [(s.first, s.last) for s in p.stages]
    # each replica computes what it did; the gradients' all-reduce over 16 takes longer
    assert same.step_s < big.step_s < 1.5 * same.step_s
    # the replicas run under FSDP: a stage's state (4 MiB of weights, grads the same,
    # AdamW's moments twice that) shared over 16 of them, not 2
    held = 4 * (4 * MiB)
    assert same.peak_bytes_per_proc - big.peak_bytes_per_proc == held // 2 - held // 16
    assert "simulated on 4 x 8 devices: dp=16 x pp=2" in str(big)
    with pytest.raises(PlanError, match="do not hold whole replicas of pp=2"):
        p.simulate(1, 3)
    with pytest.raises(PlanError, match="not microbatches of a size measured"):
        p.simulate(1, 4, batch=6)
    with pytest.raises(PlanError, match=r"keeps nothing plan\(\) measured"):
        replace(p, measured=None).simulate(1, 4)


def test_a_simulated_plan_gives_its_step_as_a_trace(tmp_path: Path) -> None:
    """``SimulatedPlan.trace()``: a process per simulated device, each microbatch's
    forward and backward of its stage in the schedule's order, the gradients' sync
    linked across each group of replicas, then the optimizer; the step ends at the
    estimate; ``write_trace`` writes the same as JSON."""
    import json

    from danaus.parallel._planning import Measured

    cost = _cost([1.0] * 8, [MiB] * 8)
    p = choose(cost, _mesh(4), batch=8, cands=_all(4, dp=2, pp=2), layers=None)
    p = replace(p, measured=Measured(cost, _mesh(4), None, 8, None, None, False))
    big = p.simulate(4, 8)  # 16 replicas of 2 stages
    events = big.trace()["traceEvents"]
    assert isinstance(events, list)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names) == list(range(32))
    assert names[9] == "device 9 (host=1, gpu=1): stage 1, blocks 4-7"
    work = [e for e in events if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in work) == pytest.approx(big.step_s * 1e6, rel=1e-9)
    stage_of = {r: k for k, st in enumerate(big.stages) for r in st.ranks}
    for r in (0, 9, 31):
        mine = sorted((e for e in work if e["pid"] == r), key=lambda e: e["ts"])
        compute = [e["name"] for e in mine if e["tid"] == 0]
        assert sorted(compute[:-1]) == sorted(
            f"{kind} {i}" for kind in ("forward", "backward") for i in range(big.microbatches)
        )
        assert compute[-1] == "optimizer step"
        for a, b in pairwise(e for e in mine if e["tid"] == 0):  # one thing at a time
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
        [sync] = [e for e in mine if e["tid"] == 1]
        last_backward = max(e["ts"] + e["dur"] for e in mine if e["name"].startswith("backward"))
        assert sync["ts"] >= last_backward - 1e-6 and sync["dur"] == pytest.approx(big.sync_s * 1e6)
        [memory] = [e for e in events if e["ph"] == "C" and e["pid"] == r]
        assert memory["args"]["bytes"] == big.stages[stage_of[r]].peak_bytes

    # stage 0 runs forward 0 first; the last stage's backward of a microbatch follows its
    # forward, and stage 0's backward follows the last stage's
    def op(rank: int, name: str) -> dict[str, float]:
        [e] = [e for e in work if e["pid"] == rank and e["name"] == name]
        return e

    s0, s1 = big.stages[0].ranks[0], big.stages[1].ranks[0]
    assert min((e for e in work if e["pid"] == s0), key=lambda e: e["ts"])["name"] == "forward 0"
    assert op(s1, "backward 0")["ts"] >= op(s1, "forward 0")["ts"] + op(s1, "forward 0")["dur"]
    assert op(s0, "backward 0")["ts"] >= op(s1, "backward 0")["ts"] + op(s1, "backward 0")["dur"]
    flows = [e for e in events if e["ph"] in "sf"]
    # an arrow from each group's first device to each of its 15 others (2 groups of 16)
    assert sorted(e["ph"] for e in flows) == ["f"] * 30 + ["s"] * 30
    for fid in {e["id"] for e in flows}:
        [start] = [e["pid"] for e in flows if e["id"] == fid and e["ph"] == "s"]
        [end] = [e["pid"] for e in flows if e["id"] == fid and e["ph"] == "f"]
        assert end == fid and start != end and stage_of[start] == stage_of[end]
    assert len({e["pid"] for e in flows if e["ph"] == "s"}) == 2
    path = tmp_path / "plan.json"
    big.write_trace(path)
    assert json.loads(path.read_text()) == big.trace()
    # one replica: nothing to sync, so no collective; the step still ends at the estimate
    one = p.simulate(1, 2)
    solo = one.trace()["traceEvents"]
    assert isinstance(solo, list)
    assert not [e for e in solo if e.get("cat") == "collective"]
    end = max(e["ts"] + e["dur"] for e in solo if e["ph"] == "X")
    assert end == pytest.approx(one.step_s * 1e6, rel=1e-9)


def test_sharing_the_cores_costs_what_it_measured_past_an_even_share() -> None:
    # 4 procs on 2 cores: an even share is 2x slower per proc; measured 2.5x is 1.25x more
    cost = _cost([1.0] * 8, [MiB] * 8)
    shared = replace(_mesh(), cores_per_host=2)
    dp4 = next(c for c in _all(dp=4, microbatches=1) if not c.sharded)
    pp4 = _all(pp=4, microbatches=1)[0]
    even = estimate(dp4, cost, replace(shared, together=2.0), 8, 1 << 40)
    more = estimate(dp4, cost, replace(shared, together=2.5), 8, 1 << 40)
    assert more.pipeline_s == pytest.approx(even.pipeline_s * 1.25)
    # every proc at once: 4 replicas' work over 2 cores
    assert even.pipeline_s == pytest.approx(4 * 8 * 0.25 / 2)
    # one microbatch through 4 stages: one proc computes at a time, sharing costs nothing
    a = estimate(pp4, cost, replace(shared, together=2.0), 8, 1 << 40)
    b = estimate(pp4, cost, replace(shared, together=2.5), 8, 1 << 40)
    assert a.pipeline_s == b.pipeline_s == pytest.approx(8.0)
    # below an even share (a proc under a CPU quota waits, not computes): no discount
    less = estimate(dp4, cost, replace(shared, together=1.2), 8, 1 << 40)
    assert less.pipeline_s == pytest.approx(even.pipeline_s)


def test_memory_counts_what_fsdp_and_the_backend_hold_as_measured() -> None:
    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    mesh = replace(_mesh(), fsdp_bytes_per_byte=3.0, allreduce_bytes_per_byte=2.0)
    w = 8 * MiB  # a replica's weights: grads the same, AdamW's two moments twice that
    by = {(c.dp, c.pp, c.sharded): c for c in _all(microbatches=1)}
    sharded = estimate(by[4, 1, True], cost, mesh, 8, 1 << 40)
    assert sharded.peak == 4 * w // 4 + 3 * w  # its shard of the state, the unit gathered
    ddp = estimate(by[4, 1, False], cost, mesh, 8, 1 << 40)
    assert ddp.peak == 4 * w + 2 * w  # a bucket (all 8 MiB of them) copied twice
    # a replicated pipeline runs under FSDP, its state sharded, each stage one unit
    dp2pp2 = estimate(by[2, 2, False], cost, mesh, 8, 1 << 40)
    assert dp2pp2.peak == 4 * (w // 2) // 2 + 3 * (w // 2)
    # not measured (0.0): the biggest block gathered at once, as before
    old = estimate(by[4, 1, True], cost, _mesh(), 8, 1 << 40)
    assert old.peak == 4 * w // 4 + MiB
    assert estimate(by[1, 4, False], cost, mesh, 8, 1 << 40).peak == 4 * (w // 4)


def test_copying_each_procs_state_after_a_step_adds_its_measured_time() -> None:
    """A trainer that recovers lost procs copies each proc's weights and optimizer state
    after every step (``MeshFacts.copying``, on any device): packed by the proc (at the
    seconds per byte ``plan()`` measured packing them), and read by its peer where no
    replica holds the same (DDP: packed only; at the data plane's bandwidth between
    procs); the trace shows it before the optimizer's step."""
    from danaus.parallel._plan import SimulatedPlan

    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    cost.copy_s_per_byte = 1e-9
    off = replace(_mesh(), bandwidth=1e9)  # (the data plane's, between procs)
    on = replace(off, copying=True)
    by = {(c.dp, c.pp, c.sharded): c for c in _all(microbatches=1)}
    state = 8 * MiB * (1 + cost.opt_ratio)  # the whole model's weights and AdamW's state

    def extra(dp: int, pp: int, sharded: bool) -> float:
        c = by[dp, pp, sharded]
        e = estimate(c, cost, on, 8, 1 << 40)
        assert e.copies_s == pytest.approx(e.step_s - estimate(c, cost, off, 8, 1 << 40).step_s)
        return e.copies_s

    assert extra(4, 1, False) == pytest.approx(1e-9 * state)  # DDP: its own, packed
    assert extra(1, 4, False) == pytest.approx(1e-9 * state / 4 * 2)  # a stage, and read
    assert extra(4, 1, True) == pytest.approx(1e-9 * state / 4 * 2)  # a shard, and read
    cost.copy_s_per_byte = 0.0  # (the read alone: at the data plane's bandwidth)
    assert extra(1, 4, False) == pytest.approx(state / 4 / 1e9)
    assert extra(4, 1, False) == 0.0
    cost.copy_s_per_byte = 1e-9
    c = by[1, 4, False]
    e = estimate(c, cost, on, 8, 1 << 40)
    sim = SimulatedPlan(
        1, 4, c.dp, c.pp, c.tp, c.microbatches, 8, e.step_s, e.peak, e.stages,
        pipeline_s=e.pipeline_s, sync_s=e.sync_s, optimizer_s=e.optimizer_s,
        copies_s=e.copies_s,
    )  # fmt: skip
    events = sim.trace()["traceEvents"]
    copied = [ev for ev in events if ev.get("name") == "state copied"]
    assert len(copied) == 4 and all(ev["dur"] == pytest.approx(e.copies_s * 1e6) for ev in copied)
    ends = [ev["ts"] + ev["dur"] for ev in events if ev.get("ph") == "X"]
    assert max(ends) == pytest.approx(e.step_s * 1e6)


def test_a_respawns_copies_count_against_each_procs_memory() -> None:
    """``on_lost_proc="respawn"`` (``MeshFacts.copies``): weights and optimizer state
    (3 bytes per byte of weights under AdamW) copied twice on each proc, and twice more
    of its peer's where no replica holds the same."""
    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    off = replace(_mesh(), fsdp_bytes_per_byte=3.0, allreduce_bytes_per_byte=2.0)
    on = replace(off, copies=True)
    w = 8 * MiB
    by = {(c.dp, c.pp, c.sharded): c for c in _all(microbatches=1)}

    def extra(dp: int, pp: int, sharded: bool) -> int:
        c = by[dp, pp, sharded]
        return estimate(c, cost, on, 8, 1 << 40).peak - estimate(c, cost, off, 8, 1 << 40).peak

    assert extra(4, 1, False) == 2 * 3 * w  # DDP: two replicas' own serve every rank
    assert extra(4, 1, True) == 4 * 3 * w // 4  # sharded: its shard, and its peer's
    assert extra(1, 4, False) == 4 * 3 * (w // 4)  # a pipeline stage, and its peer's
    assert extra(2, 2, False) == 4 * 3 * (w // 2) // 2  # a replicated pipeline's shard


def test_fsdps_gathers_and_reduce_scatter_count_as_fsdp2_ran_them_on_the_probe() -> None:
    """Where FSDP2's gather of a unit measured 1.1x the backend's own collective of its
    bytes and its reduce-scatter 3x (its copies in and out, its hooks), every layout
    FSDP2 runs pays each gather (one per microbatch's forward, and per backward where
    sharded) 1.1x and the one reduce-scatter 3x; DDP's all-reduce does not change."""
    from dataclasses import replace

    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    plain = _mesh()
    slow = replace(plain, fsdp_gather_over=1.1, fsdp_scatter_over=3.0)
    for mb in (1, 2):
        by = {(c.dp, c.pp, c.sharded): c for c in _all(microbatches=mb)}
        for fsdp in (by[4, 1, True], by[2, 2, False], by[2, 2, True]):
            a = estimate(fsdp, cost, plain, 8, 1 << 40)
            b = estimate(fsdp, cost, slow, 8, 1 << 40)
            if fsdp.pp == 1:
                gathers = (2 if fsdp.sharded else 1) * mb
            else:  # torch's pipeline stage keeps them gathered after each backward
                gathers = mb + 1 if fsdp.sharded else 1
            lat = (gathers + 1) * plain.collective_latency_s
            # equal gather and scatter rates here: each collective is 1 / (gathers + 1)
            each = (a.sync_s - lat) / (gathers + 1)
            assert b.sync_s - lat == pytest.approx(each * (1.1 * gathers + 3.0)), (fsdp, mb)
        ddp = by[4, 1, False]
        assert (
            estimate(ddp, cost, slow, 8, 1 << 40).sync_s
            == estimate(ddp, cost, plain, 8, 1 << 40).sync_s
        )


def test_under_a_pipeline_fsdp_gathers_the_weights_once_or_once_more_than_the_microbatches() -> (
    None
):
    """torch's pipeline stage keeps an FSDP2 stage's weights gathered after each
    microbatch's backward until the last: a stage kept whole between forward and backward
    (ZeRO-2) gathers once a step however many microbatches; one resharded after each
    forward gathers for each forward and once more for the first backward. Without a
    pipeline, each microbatch's forward gathers (and its backward, where sharded)."""
    cost = _cost([1.0] * 8, [MiB] * 8, act=0)
    mesh = _mesh()

    def sync(dp: int, pp: int, sharded: bool, mb: int) -> float:
        [c] = [c for c in _all(microbatches=mb) if (c.dp, c.pp, c.sharded) == (dp, pp, sharded)]
        return estimate(c, cost, mesh, 8, 1 << 40).sync_s

    lat = mesh.collective_latency_s
    assert sync(2, 2, False, 4) == pytest.approx(sync(2, 2, False, 1))  # one gather
    one, four = sync(2, 2, True, 1), sync(2, 2, True, 4)  # 2 and 5 gathers, 1 scatter
    each = (one - 3 * lat) / 3
    assert four - 6 * lat == pytest.approx(6 * each)
    one, two = sync(4, 1, True, 1), sync(4, 1, True, 2)  # 2 and 4 gathers, 1 scatter
    each = (one - 3 * lat) / 3
    assert two - 5 * lat == pytest.approx(5 * each)
