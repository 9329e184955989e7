"""Checkpoints that reshard: a trainer saved under one plan resumes under another (other
dims, another number of procs) with the losses of a run that never stopped, a plain
model loads one, ``fit`` keeps the newest few, and bad paths and failed writes are
named without breaking the trainer."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from danaus import this_host  # noqa: E402
from danaus.parallel import load_state_dict, parallelize, plan  # noqa: E402

from . import parallel_models as pm  # noqa: E402

pytestmark = pytest.mark.timeout(300)

RTOL = 1e-4


def _batches(n: int) -> list[dict[str, torch.Tensor]]:
    return [pm.padded_lm_batch(seed=s) for s in range(1, n + 1)]


def _close(a: list[float], b: list[float]) -> bool:
    return all(math.isclose(x, y, rel_tol=RTOL) for x, y in zip(a, b, strict=True))


def _same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want), set(got) ^ set(want)
    for k, v in want.items():
        assert torch.allclose(got[k], v, rtol=RTOL, atol=1e-5), k


def _distcp_sizes(where: str) -> list[int]:
    return [f.stat().st_size for f in Path(where).iterdir() if f.suffix == ".distcp"]


async def _train(
    family: str, procs: Any, dims: dict[str, int], batches: list[Any], **kw: Any
) -> tuple[Any, list[float]]:
    make = pm.gpt2 if family == "gpt2" else pm.llama
    p = await plan(make(), procs, sample=batches[0], **dims)
    trainer = parallelize(make(), procs, p, optimizer=pm.adamw, **kw)
    return trainer, [await trainer.step(b) for b in batches]


@pytest.mark.parametrize(
    ("family", "saved", "resumed"),
    [
        pytest.param("gpt2", {"dp": 2}, {"pp": 2}, id="gpt2-dp2-to-pp2"),
        pytest.param(
            "gpt2", {"dp": 4}, {"dp": 2, "pp": 2}, id="gpt2-dp4-to-dp2pp2", marks=pytest.mark.slow
        ),
        # GPT-2's Conv1D weights are split as nn.Linear (transposed) under tp; FSDP's
        # shards: both put back to the model's own layout, then cut again
        pytest.param(
            "gpt2", {"tp": 2, "dp": 2}, {"pp": 4}, id="gpt2-tp2dp2-to-pp4", marks=pytest.mark.slow
        ),
        pytest.param(
            "llama",
            {"dp": 2, "pp": 2},
            {"tp": 2, "dp": 2},
            id="llama-dp2pp2-to-tp2dp2",
            marks=pytest.mark.slow,
        ),
    ],
)
async def test_a_checkpoint_resumes_under_another_plan_as_if_never_stopped(
    family: str, saved: dict[str, int], resumed: dict[str, int], tmp_path: Path
) -> None:
    batches = _batches(4)
    make = pm.gpt2 if family == "gpt2" else pm.llama
    reference = make()
    expected = pm.train_over(reference, batches)
    n = max(math.prod(d.values()) for d in (saved, resumed))
    async with this_host().spawn_procs(per_host={"procs": n}) as procs:
        first, losses = await _train(family, procs, saved, batches[:2])
        assert first.steps == 2
        where = await first.save(tmp_path / "ckpt")
        await first.stop()
        p = await plan(make(), procs, sample=batches[0], **resumed)
        # a fresh model's weights: the checkpoint's replace them
        second = parallelize(make(), procs, p, optimizer=pm.adamw, resume=where)
        assert second.steps == 2
        losses += [await second.step(b) for b in batches[2:]]
        assert second.steps == 4
        state = await second.state_dict()
        await second.stop()
    assert _close(losses, expected), (losses, expected)
    _same_weights(state, reference.state_dict())
    # each stage's first rank wrote its own stage's tensors, at once (DCP: a .distcp
    # file a rank; the others' hold nothing)
    sizes = _distcp_sizes(where)
    assert len([n for n in sizes if n > 100_000]) == saved.get("pp", 1), sizes


@pytest.mark.slow
async def test_a_checkpoint_loads_into_a_plain_model_and_resumes_on_one_proc(
    tmp_path: Path,
) -> None:
    batches = _batches(3)
    reference = pm.gpt2()
    expected = pm.train_over(reference, batches)
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        trainer, losses = await _train("gpt2", procs, {"pp": 2}, batches[:2])
        where = await trainer.save(tmp_path / "ckpt")
        await trainer.stop()
    plain = pm.gpt2()
    plain.load_state_dict(load_state_dict(where))  # strict: every key, nothing else
    after_two = pm.gpt2()
    pm.train_over(after_two, batches[:2])
    _same_weights(plain.state_dict(), after_two.state_dict())
    async with this_host().spawn_procs(per_host={"procs": 1}) as one:
        p = await plan(pm.gpt2(), one, sample=batches[0])
        trainer = parallelize(pm.gpt2(), one, p, optimizer=pm.adamw, resume=where)
        losses.append(await trainer.step(batches[2]))
        state = await trainer.state_dict()
        await trainer.stop()
    assert _close(losses, expected), (losses, expected)
    _same_weights(state, reference.state_dict())


@pytest.mark.slow
async def test_fit_keeps_the_newest_checkpoints_and_data_resumes_at_its_step(
    tmp_path: Path,
) -> None:
    """``fit(checkpoint=, every=, keep=)`` with ``data=``: the newest two are kept, and
    a resumed trainer asks ``data`` for the step after the saved one."""

    def rows(step: int, dp_rank: int, dp_size: int) -> tuple[Any, Any]:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
        part = slice(dp_rank * 8 // dp_size, (dp_rank + 1) * 8 // dp_size)
        return x[part], y[part]

    whole = [rows(s, 0, 1) for s in range(7)]
    expected = pm.train_over(pm.mlp([32] * 4, 16), whole, pm.mse)
    kw = {"optimizer": pm.adamw, "loss_fn": pm.mse, "data": rows}
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.mlp([32] * 4, 16), procs, sample=whole[0], loss_fn=pm.mse, dp=2)
        trainer = parallelize(pm.mlp([32] * 4, 16), procs, p, **kw)
        losses = await trainer.fit(steps=5, checkpoint=tmp_path, every=2, keep=2)
        await trainer.stop()
        assert sorted(os.listdir(tmp_path)) == ["step-00000004", "step-00000005"]
        p = await plan(pm.mlp([32] * 4, 16), procs, sample=whole[0], loss_fn=pm.mse, pp=2)
        resumed = parallelize(
            pm.mlp([32] * 4, 16), procs, p, **kw, resume=tmp_path / "step-00000005"
        )
        losses += await resumed.fit(steps=2)
        assert resumed.steps == 7
        await resumed.stop()
    assert _close(losses, expected), (losses, expected)


async def test_bad_paths_and_failed_writes_are_named_and_the_trainer_goes_on(
    tmp_path: Path,
) -> None:
    batches = _batches(2)
    (tmp_path / "empty").mkdir()
    blocked = tmp_path / "a-file"
    blocked.write_text("in the way")
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        p = await plan(pm.gpt2(), procs, sample=batches[0], dp=2)
        with pytest.raises(
            FileNotFoundError, match=r"is no danaus checkpoint: it has no \.metadata"
        ):
            parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw, resume=tmp_path / "empty")
        trainer = parallelize(pm.gpt2(), procs, p, optimizer=pm.adamw)
        before = await trainer.step(batches[0])
        with pytest.raises(NotADirectoryError, match="a-file"):  # a file where a dir goes
            await trainer.save(blocked / "ckpt")
        # a rank's own file cannot be written (a directory in its place): DCP's save
        # fails on every rank, each saying why, and none is left waiting
        (tmp_path / "taken" / "__1_0.distcp").mkdir(parents=True)
        with pytest.raises(IsADirectoryError, match=r"__1_0\.distcp") as info:
            await trainer.save(tmp_path / "taken")
        assert "rolled back on every rank" in info.value.remote_traceback
        assert "ready" in repr(trainer)
        gpt2_ckpt = await trainer.save(tmp_path / "gpt2")  # and it goes on: it saves,
        after = await trainer.step(batches[1])  # and trains
        await trainer.stop()
        assert math.isfinite(before) and math.isfinite(after)
        p = await plan(pm.llama(), procs, sample=batches[0], dp=2)
        with pytest.raises(KeyError, match=r"has no model\.model\.embed_tokens\.weight: it was"):
            parallelize(pm.llama(), procs, p, optimizer=pm.adamw, resume=gpt2_ckpt)
        narrow = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=pm.VOCAB))
        with pytest.raises(
            ValueError, match=r"holds model\.transformer\.wte\.weight as \(256, 64\)"
        ):
            parallelize(narrow, procs, p, optimizer=pm.adamw, resume=gpt2_ckpt)


@pytest.mark.slow
async def test_fp16_resumes_at_the_loss_scale_the_run_had_reached(tmp_path: Path) -> None:
    """From a scale of 2**30 the first fp16 steps overflow and halve it; a run resumed
    from a checkpoint goes on at the scale reached (its first steps are not skipped
    again), as the run that was not stopped would."""
    from danaus.parallel._checkpoint import meta

    batch = pm.padded_lm_batch()
    env = {"DANAUS_FP16_LOSS_SCALE": str(float(2**30))}
    where = str(tmp_path / "ckpt")
    async with this_host().spawn_procs(per_host={"procs": 2}, env=env) as procs:
        p = await plan(pm.llama(), procs, sample=batch, precision="fp16", dp=2)
        trainer = parallelize(pm.llama(), procs, p, optimizer=pm.adamw)
        first = await trainer.fit([batch] * 20)
        await trainer.save(where)
        await trainer.stop()
        reached = meta(where)["loss_scale"]
        skipped = next(i for i, v in enumerate(first) if v != first[0])
        assert skipped > 1 and reached < 2**30  # overflowed, and halved
        resumed = parallelize(pm.llama(), procs, p, optimizer=pm.adamw, resume=where)
        then = await resumed.fit([batch] * 4)
        await resumed.save(str(tmp_path / "again"))
        await resumed.stop()
    # not the 2**30 the procs start from (its first ten or so steps would all overflow
    # and be skipped, the loss unchanged): at the reached scale, at most the odd step
    # at its edge is skipped, as in the run that went on
    assert len(set(then)) >= 3, then
    assert meta(str(tmp_path / "again"))["loss_scale"] <= 2 * reached
