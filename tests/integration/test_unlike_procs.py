"""The planner on unlike procs: procs put under real CPU quotas by the cgroup cpu
controller are measured slower, their stages given fewer blocks (and the cut runs
faster than the even one), and replicas balanced by placing alike procs on one stage,
training to the same losses as one process."""

from __future__ import annotations

import math
import statistics
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from danaus import this_host  # noqa: E402
from danaus.parallel import parallelize, plan  # noqa: E402

from . import cgroups  # noqa: E402
from . import parallel_models as pm  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


async def _step_s(trainer, batch, steps: int = 5) -> float:  # type: ignore[no-untyped-def]
    """The median seconds of ``steps`` steps, after one that warms up."""
    await trainer.step(batch)
    took = []
    for _ in range(steps):
        start = time.perf_counter()
        await trainer.step(batch)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


async def test_slow_procs_stages_hold_fewer_blocks_and_the_cut_beats_the_even_one() -> None:
    cgroups.skip_unless("cpu")
    # 8 equal blocks, each ~1 GFLOP of forward + backward per microbatch: a stage's
    # work per step is well over one quota period's 15 ms of CPU
    model = pm.mlp([2048] * 8, 512)
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(256, 512, generator=g), torch.randn(256, 512, generator=g))
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        with cgroups.each_cpu_quota(procs.pids[1:3], 0.15):
            kw = {"sample": batch, "loss_fn": pm.mse, "pp": 4, "microbatches": 4}
            p = await plan(model, procs, **kw)
            blocks = [s.last - s.first + 1 for s in p.stages]
            # ranks 1 and 2 hold stages 1 and 2 (nothing to reorder: one proc a stage)
            assert [s.ranks for s in p.stages] == [(0,), (1,), (2,), (3,)], str(p)
            assert max(blocks[1], blocks[2]) < min(blocks[0], blocks[3]), str(p)
            assert "rank 1" in p.why and "slower" in p.why, p.why
            even = await plan(model, procs, **kw, blocks_per_stage=[2, 2, 2, 2])
            times = {}
            for name, layout in (("planned", p), ("even", even)):
                trainer = parallelize(pm.mlp([2048] * 8, 512), procs, layout, optimizer=pm.adamw)
                times[name] = await _step_s(trainer, batch)
                await trainer.stop()
    print(f"\nstep: planned cut {times['planned']:.3f} s, even cut {times['even']:.3f} s")
    assert times["even"] >= 1.3 * times["planned"], (times, str(p))


async def test_replicas_of_unlike_procs_are_balanced_and_train_as_one_process() -> None:
    cgroups.skip_unless("cpu")
    batch = pm.padded_lm_batch()
    expected = pm.train_locally(pm.gpt2(), batch, 3)
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        # as numbered, ranks 2 and 3 are replica 1: each stage would wait on a slow proc
        with cgroups.each_cpu_quota(procs.pids[2:], 0.3):
            p = await plan(pm.gpt2(), procs, sample=batch, dp=2, pp=2)
            assert [s.ranks for s in p.stages] == [(0, 1), (2, 3)], str(p)
            assert p.layout.order == (0, 2, 1, 3)
            assert p.stages[1].last - p.stages[1].first <= p.stages[0].last - p.stages[0].first
            trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
            losses = [await trainer.step(batch) for _ in range(3)]
            await trainer.stop()
    # GPT-2's tied embedding and head, on the first and last stage of each pipeline, are
    # summed between the reordered ranks as between numbered ones
    assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(losses, expected, strict=True)), (
        losses,
        expected,
    )
