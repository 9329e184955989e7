"""Whole-model parallelism on real procs: the same numbers as one process for every
strategy, a planner that plans by measured cost and memory, and clear errors."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from danaus import this_host  # noqa: E402
from danaus.errors import ActorError  # noqa: E402
from danaus.parallel import Plan, PlanError, parallelize, plan  # noqa: E402

from . import parallel_models as pm  # noqa: E402

pytestmark = pytest.mark.timeout(180)

STEPS = 5
RTOL = 1e-4

STRATEGIES = [
    ("gpt2", {"dp": 4}),
    ("gpt2", {"pp": 4}),
    ("gpt2", {"dp": 2, "pp": 2}),
    ("gpt2", {"tp": 2, "dp": 2}),  # its fused q/k/v split into each rank's heads
    ("gpt2", {"tp": 2, "pp": 2}),
    ("gpt2", {}),  # the planner's own choice
    ("llama", {"dp": 4}),
    ("llama", {"pp": 4}),
    ("llama", {"dp": 2, "pp": 2}),
    ("llama", {"tp": 2, "dp": 2}),
    ("llama", {}),
]
#: run by `make test` (the rest by `make test-all`): tensor parallel under FSDP, from
#: GPT-2's plan (a pipeline trains in test_sync_code_plans_and_trains_with_get)
QUICK = [("gpt2", {"tp": 2, "dp": 2})]


def _close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=RTOL) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("family", "dims"),
    [
        pytest.param(
            f, d, id=f"{f}-{d or 'planner'}", marks=() if (f, d) in QUICK else pytest.mark.slow
        )
        for f, d in STRATEGIES
    ],
)
async def test_four_procs_train_to_the_same_losses_and_weights_as_one_process(
    family: str, dims: dict[str, int]
) -> None:
    make = pm.gpt2 if family == "gpt2" else pm.llama
    # a fine-tuning batch: padded rows, -100 on the padding and the prompts, so that the
    # replicas' and microbatches' shares count different numbers of tokens
    batch = pm.padded_lm_batch()
    reference = make()
    expected = pm.train_locally(reference, batch, STEPS)
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        p = await plan(make(), procs, sample=batch, **dims)
        for k, v in dims.items():
            assert getattr(p, k) == v
        assert p.dp * p.pp * p.tp == 4
        trainer = parallelize(make(), procs, p, optimizer=pm.adamw)
        losses = [await trainer.step(batch) for _ in range(STEPS)]
        state = await trainer.state_dict()
        evaluated = await trainer.evaluate(batch)
        held = await trainer.held_bytes()
        await trainer.stop()
    # each proc's peak (its resident memory here) held its whole training state at once
    assert all(h["peak"] >= h["total"] > 0 for h in held), held
    assert _close(losses, expected), (str(p), losses, expected)
    want = reference.state_dict()
    assert set(state) == set(want)
    for k, v in want.items():
        assert torch.allclose(state[k], v, rtol=RTOL, atol=1e-5), k
    plain = make()
    plain.load_state_dict(state)  # strict: every key of the model, nothing else
    with torch.no_grad():
        assert math.isclose(evaluated, float(plain(**batch).loss), rel_tol=RTOL)


async def test_a_bad_batch_is_refused_at_once_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = pm.padded_lm_batch()
    expected = pm.train_locally(pm.gpt2(), batch, 3)
    wrong_labels = {**batch, "labels": batch["labels"][:, :-1]}
    unknown_key = {**batch, "pixel_values": batch["input_ids"]}
    nothing_counted = {**batch, "labels": torch.full_like(batch["labels"], -100)}
    odd_rows = {k: v[:7] for k, v in batch.items()}
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.gpt2(), procs, sample=batch, dp=2)
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
        losses = [await trainer.step(batch)]
        for bad, error, says in [
            (wrong_labels, ValueError, r"batch\['labels'\] is \(8, 15\)"),
            (unknown_key, ValueError, r"\['pixel_values'\]"),
            (nothing_counted, ValueError, "every label of the batch is -100"),
            (odd_rows, PlanError, "the batch has 7 samples; dp=2"),
        ]:
            with pytest.raises(error, match=says):
                trainer.step(bad)  # raised here, before any worker ran
        with caplog.at_level(logging.INFO, logger="danaus.parallel"):
            losses += await trainer.fit(iter([batch, batch, batch]), steps=2, log_every=1)
        # not a terminal here: no progress bar, a line a step (log_every=1) instead
        lines = [r.getMessage() for r in caplog.records if r.name == "danaus.parallel"]
        assert [line.split(":")[0] for line in lines] == ["step 1", "step 2"], lines
        assert "tokens/s" in lines[0] and "s/step (est " in lines[0]
        assert math.isclose(
            await trainer.evaluate(batch), pm.evaluate_locally(pm.gpt2(), batch, 3), rel_tol=RTOL
        )
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)


@pytest.mark.parametrize(
    ("family", "dims"),
    [
        pytest.param("qwen2", {"pp": 2}, marks=pytest.mark.slow),
        pytest.param("qwen2", {"tp": 2}, marks=pytest.mark.slow),
        pytest.param("mistral", {"pp": 2}, marks=pytest.mark.slow),
        # fused q/k/v and gate/up, split with their outputs gathered (its own plan's styles)
        pytest.param("phi3", {"tp": 2}, marks=pytest.mark.slow),
        pytest.param("gemma", {"pp": 2}, marks=pytest.mark.slow),  # tied embeddings
        # its forward does more than Llama's: it runs whole
        pytest.param("gemma2", {"dp": 2}, marks=pytest.mark.slow),
    ],
)
async def test_other_hugging_face_families_train_as_one_process(
    family: str, dims: dict[str, int]
) -> None:
    batch = pm.padded_lm_batch()
    expected = pm.train_locally(pm.causal_lm(family), batch, 3)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.causal_lm(family), procs, sample=batch, **dims)
        if family == "gemma2":
            with pytest.raises(PlanError, match=r"pp=2: this model \(Gemma2ForCausalLM\) "):
                await plan(pm.causal_lm(family), procs, sample=batch, pp=2)
        trainer = parallelize(pm.causal_lm(family), procs, p, optimizer=pm.adamw)
        losses = await trainer.fit([batch] * 3)
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)


@pytest.mark.parametrize(
    "dims", [pytest.param({"pp": 2}, marks=pytest.mark.slow), {"dp": 2}], ids=["pp=2", "dp=2"]
)
async def test_sequence_lengths_may_change_from_step_to_step(dims: dict[str, int]) -> None:
    batches = [pm.padded_lm_batch(seq=n, seed=n) for n in (16, 10, 16, 12)]
    expected = pm.train_over(pm.gpt2(), batches)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.gpt2(), procs, sample=batches[0], microbatches=2, **dims)
        assert "estimated for the sample's 8 x 16 inputs" in p.why  # the length it knew
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
        losses = await trainer.fit(batches)
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("dims", [{"dp": 2}, {"pp": 2}], ids=["dp=2", "pp=2"])
async def test_compiled_blocks_train_as_one_process_at_changing_lengths(
    dims: dict[str, int],
) -> None:
    batches = [pm.padded_lm_batch(seq=n, seed=n) for n in (16, 10, 16, 12)]
    reference = pm.llama()
    expected = pm.train_over(reference, batches)  # one process, not compiled
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.llama(), procs, sample=batches[0], compile=True, **dims)
        assert p.compile and p.layout.compile and "compiled" in str(p)
        trainer = parallelize(pm.llama(), procs, p, optimizer=pm.adamw)
        losses = await trainer.fit(batches)
        state = await trainer.state_dict()
        await trainer.stop()
        # compile=False on parallelize overrides the plan's
        plain = parallelize(pm.llama(), procs, p, optimizer=pm.adamw, compile=False)
        assert not plain.plan.compile and "compiled" not in str(plain.plan)
        await plain.stop()
    assert _close(losses, expected), (losses, expected)
    assert set(state) == set(reference.state_dict())  # the model's own keys, compiled or not


@pytest.mark.slow
@pytest.mark.parametrize(
    ("precision", "dims"),
    [
        ("bf16", {"dp": 2}),  # DDP: the gradients all-reduced in bf16
        ("bf16", {"pp": 2}),
        ("bf16", {"dp": 2, "pp": 2}),  # FSDP2's MixedPrecisionPolicy under a pipeline
        ("fp16", {"dp": 2}),  # a loss scale, as torch's GradScaler keeps it
        # from 2**30: the first steps overflow, are skipped by every rank, and halve it
        ("fp16", {"pp": 2, "scale": 2**30}),
    ],
    ids=["bf16-dp=2", "bf16-pp=2", "bf16-dp=2xpp=2", "fp16-dp=2", "fp16-pp=2-overflows"],
)
async def test_low_precision_trains_as_one_process_does_under_autocast(
    precision: str, dims: dict[str, int]
) -> None:
    scale = dims.pop("scale", 2**16)
    batch = pm.padded_lm_batch()
    reference = pm.llama()
    opt = pm.adamw(reference.parameters())
    low = torch.bfloat16 if precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, enabled=precision == "fp16")
    expected = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=low):
            loss = reference(**batch).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        expected.append(float(loss.detach()))
    with pytest.raises(PlanError, match="give one of 'fp32', 'bf16', 'fp16'"):
        plan(pm.llama(), this_host(), sample=batch, precision="int8")  # at once
    procs_n = dims.get("dp", 1) * dims.get("pp", 1)
    env = {"DANAUS_FP16_LOSS_SCALE": str(float(scale))}
    async with this_host().spawn_procs(per_host={"procs": procs_n}, env=env) as procs:
        p = await plan(pm.llama(), procs, sample=batch, precision=precision, **dims)
        assert p.precision == precision and f"{precision} compute" in str(p)
        trainer = parallelize(pm.llama(), procs, p, optimizer=pm.adamw)
        losses = await trainer.fit([batch] * 20)
        held = await trainer.held_bytes()
        await trainer.stop()
    if scale == 2**30:
        # the first steps overflowed and were skipped, by every rank and by GradScaler
        # alike (the weights stayed as they were, so the loss did too)...
        skipped = next(i for i, v in enumerate(losses) if v != losses[0])
        assert skipped > 1 and expected[skipped - 1] == expected[0] != expected[skipped]
        # ...and then the same steps, until rounding in another order puts one run's
        # gradients over fp16's edge at a scale where the other's are not (the scale
        # settles at the largest that does not overflow: at that edge)
        again = [i for i in range(skipped + 1, 20) if losses[i] == losses[i - 1]]
        again += [i for i in range(skipped + 1, 20) if expected[i] == expected[i - 1]]
        losses, expected = losses[: min(again, default=20)], expected[: min(again, default=20)]
        assert len(losses) >= 16, (losses, expected)
    # 8 (bf16) or 11 (fp16) bits of mantissa: the same steps, rounded in another order
    assert all(math.isclose(a, b, rel_tol=2e-2) for a, b in zip(losses, expected, strict=True)), (
        losses,
        expected,
    )
    assert math.isclose(losses[-1], expected[-1], rel_tol=2e-2)  # converged the same way
    assert losses[-1] < 0.9 * losses[0]
    weights = sum(t.numel() * 4 for t in pm.llama().parameters())  # kept in fp32
    assert sum(h["weights"] for h in held) >= weights


@pytest.mark.parametrize(
    ("family", "dims"),
    [
        pytest.param("gpt2", {"pp": 2}, marks=pytest.mark.slow),
        pytest.param("llama", {"dp": 2}, marks=pytest.mark.slow),
    ],
)
async def test_activation_checkpointing_keeps_less_and_gives_the_same_losses(
    family: str, dims: dict[str, int]
) -> None:
    make = pm.gpt2 if family == "gpt2" else pm.llama
    batch = pm.padded_lm_batch(n=8, seq=32)
    expected = pm.train_locally(make(), batch, 3)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        kept = await plan(make(), procs, sample=batch, microbatches=1, **dims)
        p = await plan(make(), procs, sample=batch, checkpointing=True, microbatches=1, **dims)
        assert p.checkpointing and "activation checkpointing" in str(p)
        # measured so: the blocks keep their inputs only
        assert p.peak_bytes_per_proc < kept.peak_bytes_per_proc, (str(p), str(kept))
        trainer = parallelize(make(), procs, p, optimizer=pm.adamw)
        losses = await trainer.fit([batch] * 3)
        state = await trainer.state_dict()
        await trainer.stop()
        # None: the planner recomputes where keeping the activations does not fit the cap
        # (on a pipeline, where no replicas can shard instead)
        two = {"sample": batch, "microbatches": 1, "pp": 2}
        if dims != {"pp": 2}:
            kept = await plan(make(), procs, **two)
            p = await plan(make(), procs, checkpointing=True, **two)
        cap = (p.peak_bytes_per_proc + kept.peak_bytes_per_proc) // 2
        with pytest.raises(PlanError, match="no plan fits"):
            await plan(make(), procs, memory_per_proc=cap, **two)
        auto = await plan(make(), procs, checkpointing=None, memory_per_proc=cap, **two)
        chosen = [s.checkpointing for s in auto.stages]
        assert any(chosen) and auto.peak_bytes_per_proc <= cap, str(auto)
        assert "activation checkpointing on stage(s)" in str(auto)
        roomy = await plan(make(), procs, checkpointing=None, **two)
        assert not any(s.checkpointing for s in roomy.stages), str(roomy)
        trainer = parallelize(make(), procs, auto, optimizer=pm.adamw)
        auto_losses = await trainer.fit([batch] * 3)
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)
    assert _close(auto_losses, expected), (auto_losses, expected)
    assert set(state) == set(make().state_dict())  # the model's own keys
    with pytest.raises(PlanError, match="checkpointing='yes': give True, False, or None"):
        plan(make(), this_host(), sample=batch, checkpointing="yes")  # type: ignore[arg-type]


def _global_batch(step: int) -> dict[str, torch.Tensor]:
    return pm.padded_lm_batch(seed=100 + step)


def _replica_rows(step: int, dp_rank: int, dp_size: int) -> dict[str, torch.Tensor]:
    """What a worker loads itself (data=): its replica's rows of the step's batch."""
    rows = 8 // dp_size
    return {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in _global_batch(step).items()}


@pytest.mark.parametrize(
    "dims",
    [
        pytest.param({"dp": 2}, marks=pytest.mark.slow),
        pytest.param({"pp": 2}, marks=pytest.mark.slow),
    ],
    ids=["dp=2", "pp=2"],
)
async def test_workers_that_load_their_own_rows_train_as_one_process(
    dims: dict[str, int],
) -> None:
    expected = pm.train_over(pm.gpt2(), [_global_batch(step) for step in range(3)])
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.gpt2(), procs, sample=_global_batch(0), **dims)
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw, data=_replica_rows)
        with pytest.raises(ValueError, match="load their own batches"):
            trainer.step(_global_batch(0))
        with pytest.raises(ValueError, match="needs steps="):
            trainer.fit()
        losses = [await trainer.step()]
        losses += await trainer.fit(steps=2)
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)
    assert trainer.bytes_sent == 0  # no batch went through the controller


def test_sync_code_plans_and_trains_with_get() -> None:
    batch = pm.lm_batch()
    expected = pm.train_locally(pm.gpt2(), batch, 2)
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        p = plan(pm.gpt2(), procs, sample=batch, dp=1, pp=2).get(timeout=120)
        assert isinstance(p, Plan) and (p.dp, p.pp, p.tp) == (1, 2, 1)
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
        losses = [trainer.step(batch).get(timeout=60) for _ in range(2)]
        held = trainer.held_bytes().get(timeout=60)
        trainer.stop().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)
    assert _close(losses, expected)
    # two stages, each holding only its own blocks' weights (the head ties to the embedding)
    whole = sum(t.numel() * 4 for t in pm.gpt2().parameters())
    assert all(0 < h["weights"] < whole for h in held)
    assert all(h["optimizer"] == 2 * h["weights"] for h in held)  # AdamW: two moments


def _worst_stage(costs: list[int], bounds: list[tuple[int, int]]) -> int:
    return max(sum(costs[a : b + 1]) for a, b in bounds)


def _best_split(costs: list[int], stages: int) -> int:
    n = len(costs)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = [0, *cuts, n]
        bounds = [(edges[i], edges[i + 1] - 1) for i in range(stages)]
        best = min(best, _worst_stage(costs, bounds))
    return int(best)


@pytest.mark.slow
async def test_stages_follow_measured_block_costs() -> None:
    # matmul work per block differs up to 4x; an even split by count would be far off
    units = [4, 1, 1, 4, 2, 1, 3, 4]
    # blocks big enough (about 10 ms of work per unit) that timing noise on a busy
    # machine stays well under the 15% allowed
    model = pm.mlp([384 * u for u in units], dim=384)
    x = torch.randn(512, 384)
    batch = (x, torch.randn(512, 384))
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        p = await plan(model, procs, sample=batch, loss_fn=pm.mse, pp=4, microbatches=4)
    bounds = [(s.first, s.last) for s in p.stages]
    assert bounds[0][0] == 0 and bounds[-1][1] == len(units) - 1
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(bounds)), bounds
    worst, best = _worst_stage(units, bounds), _best_split(units, 4)
    assert worst <= 1.15 * best, (str(p), worst, best)
    even = _worst_stage(units, [(0, 1), (2, 3), (4, 5), (6, 7)])
    assert best < even  # the test means something: counting blocks would lose


@pytest.mark.slow
async def test_a_memory_cap_moves_the_planner_off_pure_data_parallel() -> None:
    model = pm.gpt2(layers=8)
    batch = pm.lm_batch()
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        # a whole replica's weights, grads and AdamW state: what every proc of pure data
        # parallel (DDP) holds, before any activation
        replica = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
        free = await plan(model, procs, sample=batch, dp=4)  # fits without a cap
        assert free.peak_bytes_per_proc >= replica or free.sharded, str(free)
        # (a trainer that keeps no copies of its state for a respawn: with them, which
        # the planner counts, the cap below leaves no layout)
        cap, fail = int(replica * 0.6), {"on_lost_proc": "fail"}
        with pytest.raises(PlanError, match="no plan fits"):
            await plan(model, procs, sample=batch, memory_per_proc=cap)
        tight = await plan(model, procs, sample=batch, memory_per_proc=cap, **fail)
        assert tight.pp > 1 or tight.sharded, str(tight)
        assert tight.peak_bytes_per_proc <= cap
        assert f"{cap / 2**20:.2f} MiB" in str(tight)  # the plan says what it fitted under
        trainer = parallelize(model, procs, tight, optimizer=pm.adamw, **fail)
        await trainer.step(batch)
        held = await trainer.held_bytes()
        await trainer.stop()
        assert all(h["total"] <= cap for h in held), (held, cap)
        with pytest.raises(PlanError, match=r"no plan fits in 0\.5 MiB per proc.*need"):
            await plan(model, procs, sample=batch, memory_per_proc=2**19)


async def test_a_model_with_one_module_list_trains_data_parallel() -> None:
    model = pm.Tower()
    x = torch.randn(16, 32)
    batch = (x, torch.randn(16, 1))
    expected = pm.train_locally(pm.Tower(), batch, 3, pm.mse)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(model, procs, sample=batch, loss_fn=pm.mse)
        assert (p.dp, p.pp) == (2, 1) and p.stages[0].last == 3
        # measured on these procs: computing at once, and what FSDP holds to run a unit
        # (its weights gathered whole, at least)
        mesh = p.measured.mesh
        assert mesh.together >= 1.0 and mesh.fsdp_bytes_per_byte >= 1.0, mesh
        trainer = parallelize(model, procs, p, optimizer=pm.adamw, loss_fn=pm.mse)
        losses = [await trainer.step(batch) for _ in range(3)]
        await trainer.stop()
        with pytest.raises(PlanError, match="cannot be cut into pipeline stages"):
            await plan(model, procs, sample=batch, loss_fn=pm.mse, pp=2)
    assert _close(losses, expected)


@pytest.mark.slow
async def test_any_candidate_the_planner_weighed_trains_and_a_stage_cut_can_be_forced() -> None:
    batch = pm.padded_lm_batch()
    expected = pm.train_locally(pm.gpt2(), batch, 2)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.gpt2(), procs, sample=batch)
        shapes = [(c.dp, c.pp, c.microbatches, c.sharded) for c in p.candidates]
        assert p in p.candidates and len(set(shapes)) == len(shapes) > 3
        assert {(1, 2), (2, 1)} <= {(d, pp) for d, pp, _, _ in shapes}  # dp and pp weighed
        # the slowest estimated one trains to the same numbers as the chosen would
        slowest = p.candidates[-1]
        assert slowest.estimated_step_s >= p.estimated_step_s
        trainer = parallelize(pm.gpt2(), procs, slowest, optimizer=pm.adamw)
        losses = [await trainer.step(batch) for _ in range(2)]
        await trainer.stop()
        cut = await plan(pm.gpt2(), procs, sample=batch, blocks_per_stage=[1, 3])
        assert [(s.first, s.last, s.ranks) for s in cut.stages] == [(0, 0, (0,)), (1, 3, (1,))]
        assert all(c.pp == 2 for c in cut.candidates)
        trainer = parallelize(pm.gpt2(), procs, cut, optimizer=pm.adamw)
        cut_losses = [await trainer.step(batch) for _ in range(2)]
        await trainer.stop()
        with pytest.raises(PlanError, match=r"adds up to 3 blocks; the model has 4"):
            await plan(pm.gpt2(), procs, sample=batch, blocks_per_stage=[1, 2])
    assert _close(losses, expected), (str(slowest), losses, expected)
    assert _close(cut_losses, expected), (cut_losses, expected)


def _control_bytes_out() -> int:
    """Bytes this controller has written to its control-plane connections so far."""
    from danaus.actors._stats import proc_record
    from danaus.actors.seam import current_runtime

    return int(proc_record(current_runtime())["bytes_out"])


@pytest.mark.parametrize(
    "dims", [{"dp": 2}, pytest.param({"pp": 2}, marks=pytest.mark.slow)], ids=["dp=2", "pp=2"]
)
async def test_shards_over_a_megabyte_go_by_the_data_plane_and_train_as_one_process(
    dims: dict[str, int],
) -> None:
    from danaus.actors.seam import current_runtime
    from danaus.rdma._manager import manager

    g = torch.Generator().manual_seed(3)
    rows = 16384  # inputs of 2 MiB: each replica's (dp=2) or the first stage's (pp=2) > 1 MiB
    make = (lambda: pm.Tower()) if "dp" in dims else (lambda: pm.mlp([64, 64, 64, 64], dim=32))
    width = 1 if "dp" in dims else 32
    batch = (torch.randn(rows, 32, generator=g), torch.randn(rows, width, generator=g))
    expected = pm.train_locally(make(), batch, 3, pm.mse)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(make(), procs, sample=batch, loss_fn=pm.mse, microbatches=1, **dims)
        trainer = parallelize(make(), procs, p, optimizer=pm.adamw, loss_fn=pm.mse)
        losses = [await trainer.step(batch)]  # (set up)
        before = _control_bytes_out()
        losses += [await trainer.step(batch) for _ in range(2)]
        control = (_control_bytes_out() - before) / 2
        staged, sent = trainer.bytes_staged, trainer.bytes_sent
        await trainer.stop()
    inputs = rows * 32 * 4
    assert staged >= inputs and sent >= staged  # the inputs went by the data plane...
    assert control < inputs / 8, control  # ...not inside the calls
    assert not manager(current_runtime()).buffers  # each dropped once its step ended
    assert _close(losses, expected), (losses, expected)


@pytest.mark.parametrize(
    ("dims", "sharded"),
    [
        pytest.param({"dp": 2}, False, id="ddp"),
        pytest.param({"pp": 2}, False, id="pp", marks=pytest.mark.slow),
        pytest.param({"dp": 2}, True, id="fsdp", marks=pytest.mark.slow),
    ],
)
async def test_a_users_error_on_one_rank_rolls_the_step_back_and_training_goes_on(
    dims: dict[str, Any], sharded: bool
) -> None:
    """The user's loss raises on one rank only (its replica's targets, or the last
    stage's): that step fails with the rank's traceback, no rank applies it (the others
    met every collective on a zero loss, so none waits), and the next steps give the
    losses of a run where the bad batch was never sent."""
    torch.manual_seed(1)
    target = torch.rand(8, 16)
    good = (torch.randn(8, 16), target)
    bad = (good[0], torch.cat([target[:4], -target[4:]]))  # the second replica's half
    expected = pm.train_over(pm.mlp([32] * 4, dim=16), [good] * 3, pm.mse)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.mlp([32] * 4, dim=16), procs, sample=good, loss_fn=pm.mse, **dims)
        p = dataclasses.replace(p, sharded=sharded)  # FSDP's gathers and reduce-scatters
        trainer = parallelize(
            pm.mlp([32] * 4, dim=16), procs, p, optimizer=pm.adamw,
            loss_fn=pm.mse_refusing_negative_targets,
        )  # fmt: skip
        losses = [await trainer.step(good)]
        for _ in range(2):  # twice: a rolled-back step leaves nothing behind
            with pytest.raises(ValueError, match="negative target") as info:
                await trainer.step(bad)
            assert isinstance(info.value, ActorError)
            assert "mse_refusing_negative_targets" in info.value.remote_traceback
            assert "rolled back on every rank" in info.value.remote_traceback
            assert "{'procs': 1/2}" in str(info.value)
            with pytest.raises(ValueError, match="negative target"):
                await trainer.evaluate(bad)
        losses += [await trainer.step(good), await trainer.step(good)]
        assert "ready" in repr(trainer)
        state = await trainer.state_dict()
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)
    reference = pm.mlp([32] * 4, dim=16)
    pm.train_over(reference, [good] * 3, pm.mse)
    for k, v in reference.state_dict().items():
        assert torch.allclose(state[k], v, rtol=RTOL, atol=1e-6), k


def _refusing_lm_loss(out: Any, labels: Any) -> Any:
    """A causal LM's shifted cross-entropy that refuses a batch with the pad token (0)
    among its counted labels, as a careful user's loss refuses what it cannot trust."""
    if (labels == 0).any():
        raise ValueError("the pad token among the labels: this batch is refused")
    logits = out.logits if hasattr(out, "logits") else out
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


@pytest.mark.slow
async def test_a_user_loss_refusing_a_batch_in_a_gpt2_pipeline_changes_nothing() -> None:
    """GPT-2 at dp=2 x pp=2 with the user's own loss, which refuses one replica's rows
    on its last stage: the step fails, and the steps after it give the losses of the
    same layout trained without it, to the bit."""
    batches = [pm.padded_lm_batch(seed=s) for s in (1, 2, 3)]
    bad = {**batches[0], "labels": batches[0]["labels"].clone()}
    bad["labels"][5, 0] = 0  # a row of the second replica
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        p = await plan(pm.gpt2(), procs, sample=batches[0], dp=2, pp=2)
        runs = []
        for send_bad in (True, False):
            trainer = parallelize(
                pm.gpt2(), procs, p, optimizer=pm.adamw, loss_fn=_refusing_lm_loss
            )
            losses = [await trainer.step(batches[0])]
            if send_bad:
                with pytest.raises(ValueError, match="the pad token among the labels") as info:
                    await trainer.step(bad)
                assert "{'procs': 3/4}" in str(info.value)  # replica 1's last stage
            losses += [await trainer.step(b) for b in batches[1:]]
            runs.append((losses, await trainer.state_dict()))
            await trainer.stop()
    (with_bad, state), (without, want) = runs
    assert with_bad == without, (with_bad, without)
    for k, v in want.items():
        assert torch.equal(state[k], v), k


def _rows_or_refuse(step: int, dp_rank: int, dp_size: int) -> tuple[Any, Any]:
    """Replica ``dp_rank``'s rows of step ``step``; replica 1's data raises at step 1."""
    if step == 1 and dp_rank == 1:
        raise OSError("shard 1 of step 1 is unreadable")
    torch.manual_seed(step)
    x, y = torch.randn(8, 16), torch.rand(8, 16)
    part = slice(dp_rank * 8 // dp_size, (dp_rank + 1) * 8 // dp_size)
    return x[part], y[part]


async def test_a_replicas_data_that_raises_fails_that_step_and_the_next_goes_on() -> None:
    """``data=`` raising on one replica (an unreadable shard): that step fails with its
    error before any rank computed, and training goes on with the next step's rows."""

    def whole(step: int) -> tuple[Any, Any]:
        x, y = zip(*(_rows_or_refuse(step, r, 1) for r in range(1)), strict=True)
        return x[0], y[0]

    expected = pm.train_over(pm.mlp([32] * 2, dim=16), [whole(0), whole(2)], pm.mse)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.mlp([32] * 2, dim=16), procs, sample=whole(0), loss_fn=pm.mse, dp=2)
        trainer = parallelize(
            pm.mlp([32] * 2, dim=16), procs, p, optimizer=pm.adamw, loss_fn=pm.mse,
            data=_rows_or_refuse,
        )  # fmt: skip
        losses = [await trainer.step()]
        with pytest.raises(OSError, match="shard 1 of step 1 is unreadable"):
            await trainer.step()
        losses.append(await trainer.step())  # step 2's rows
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)


async def test_a_rank_that_fails_outside_the_users_code_breaks_the_trainer() -> None:
    """Not the user's loss or data but the model itself raising on one rank (mid-way
    through its replica's collectives): the call fails with that rank's traceback, no
    rank is left waiting, the trainer says it is broken, and a new mesh trains again."""
    model = pm.Tower(dim=16)
    bad = (torch.randn(8, 16), torch.rand(8, 1))
    good = (bad[0].abs(), bad[1])
    bad[0][4:] = float("inf")  # the second replica's rows
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(model, procs, sample=good, loss_fn=pm.mse, dp=2)
        trainer = parallelize(pm.FussyTower(dim=16), procs, p, optimizer=pm.adamw, loss_fn=pm.mse)
        await trainer.step(good)
        with pytest.raises(ActorError, match="inf in the input") as info:
            await trainer.step(bad)
        assert "{'procs': 1/2}" in str(info.value)
        with pytest.raises(ActorError, match="inf in the input"):
            await trainer.step(good)  # the trainer is broken, and says why
        assert "failed" in repr(trainer)
        await trainer.stop()
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        trainer = parallelize(model, procs, p, optimizer=pm.adamw, loss_fn=pm.mse)
        assert math.isfinite(await trainer.step(good))
        await trainer.stop()


@pytest.mark.slow
async def test_arguments_that_cannot_be_met_are_named() -> None:
    batch = pm.lm_batch(n=6)
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"dp": 3}, r"dp=3 = 3 does not divide the mesh's 4 procs"),
            ({"dp": 2, "pp": 2, "tp": 2}, r"= 8 does not equal the mesh's 4 procs"),
            ({"dp": 4}, r"dp=4 does not divide the batch of 6 samples"),
            ({"pp": 8, "dp": 1}, r"does not divide the mesh|only 4 blocks"),
            ({"dp": 2, "microbatches": 2}, r"microbatches=2 x dp=2 does not divide the batch of 6"),
            (
                {"layers": "transformer.nope"},
                r"layers='transformer.nope': the model has no submodule",
            ),
        ]
        for kwargs, message in cases:
            with pytest.raises(PlanError, match=message):
                await plan(pm.gpt2(), procs, sample=batch, **kwargs)
        with pytest.raises(PlanError, match=r"tp=4: attention heads \(4\), key/value heads \(2\)"):
            await plan(pm.llama(), procs, sample=pm.lm_batch(n=8), tp=4)
        with pytest.raises(
            PlanError, match=r"tp=2: tensor parallel needs a plan for Tower's blocks"
        ):
            await plan(pm.Tower(), procs, sample=(torch.randn(8, 32), torch.randn(8, 1)), tp=2)
        p = await plan(pm.gpt2(), procs, sample=pm.lm_batch(n=8), dp=4)
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
        with pytest.raises(PlanError, match="the batch has 6 samples; dp=4 x microbatches=1"):
            trainer.step(batch)
        await trainer.stop()
        with pytest.raises(PlanError, match="the plan is for 4 procs"):
            parallelize(pm.gpt2(), procs.slice(procs=slice(0, 2)), p, optimizer=pm.adamw)


@pytest.mark.slow
def test_the_example_plans_and_trains_gpt2_on_four_procs() -> None:
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "parallel_gpt2.py"
    out = subprocess.run(
        [sys.executable, str(example), "--steps", "4", "--batch", "8"],
        capture_output=True,
        text=True,
        timeout=170,
        check=True,
    ).stdout
    assert "Plan: " in out and "why: " in out and "runner-up: " in out
    losses = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert "held per proc (MiB): [" in out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_fine_tuning_example_shows_progress_on_a_terminal_and_learns(family: str) -> None:
    import sys
    from pathlib import Path

    import pexpect

    example = Path(__file__).parents[2] / "examples" / "finetune_hf.py"
    term = pexpect.spawn(
        sys.executable,
        [str(example), "--family", family, "--steps", "20", "--batch", "16"],
        timeout=170,
        encoding="utf-8",
        dimensions=(24, 160),
    )
    term.expect("Plan: ")
    # the bar: steps done of 20, the loss, tokens/s, the step time beside the estimate
    term.expect(r"20/20 .*20: loss \d+\.\d+, [\d,]+ tokens/s, \d+\.\d+ s/step \(est \d")
    term.expect(r"mean loss of the first 5 steps (\d+\.\d+), of the last 5 (\d+\.\d+)")
    first, last = (float(v) for v in term.match.groups())
    term.expect(pexpect.EOF)
    term.close()
    assert term.exitstatus == 0
    assert last < 0.9 * first, (first, last)


@pytest.mark.slow
async def test_a_measured_plan_is_simulated_on_a_bigger_mesh_with_its_trace(
    tmp_path: Any,
) -> None:
    # plan() measures a GPT-2 on 2 procs here; simulate() lays that plan on 2 x 4 devices
    # (dp=8) from those measurements, and its trace is the step it estimates.
    import json

    batch = pm.padded_lm_batch()
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.gpt2(), procs, sample=batch, dp=2)
    sim = p.simulate(2, 4)
    assert (sim.dp, sim.pp, sim.tp, sim.batch) == (8, 1, 1, 4 * len(batch["input_ids"]))
    # (the copies of each device's state: plan()'s trainer recovers lost procs)
    parts = sim.pipeline_s + sim.sync_s + sim.optimizer_s + sim.copies_s
    assert sim.step_s == pytest.approx(parts)
    assert sim.sync_s > 0 and sim.copies_s > 0 and sim.peak_bytes_per_proc > 0
    path = tmp_path / "sim.json"
    sim.write_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    devices = {e["pid"] for e in events if e["name"] == "process_name"}
    assert devices == set(range(8))
    ends = [e["ts"] + e["dur"] for e in events if e["ph"] == "X"]
    assert max(ends) == pytest.approx(sim.step_s * 1e6, rel=1e-6)
    syncs = [e for e in events if e["ph"] == "X" and e["cat"] == "collective"]
    assert len(syncs) == 8 and {e["name"] for e in syncs} == {"gradients' all-reduce"}
    copied = [e for e in events if e["ph"] == "X" and e["cat"] == "copies"]
    assert len(copied) == 8 and all(e["name"] == "state copied" for e in copied)
