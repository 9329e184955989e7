"""What the planner measures of a model, run in this process (the procs run the same)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from danaus.parallel._model import find_parts  # noqa: E402
from danaus.parallel._profile import measure_model  # noqa: E402
from tests.integration import parallel_models as pm  # noqa: E402


def _nbytes(mods: list[torch.nn.Module]) -> int:
    return sum(p.numel() * p.element_size() for m in mods for p in m.parameters())


def test_a_known_layout_is_measured_part_by_part() -> None:
    model = pm.gpt2()
    parts = find_parts(model)
    batch = pm.lm_batch(n=4)
    cost = measure_model(
        model, parts, batch, parts.default_loss(model), pm.adamw, [4, 2], repeats=1
    )
    assert len(cost.blocks) == 4
    assert cost.embed.param_bytes == _nbytes([model.transformer.wte, model.transformer.wpe])
    assert all(b.param_bytes == _nbytes([model.transformer.h[0]]) for b in cost.blocks)
    hidden = 4 * 16 * 64 * 4  # batch x seq x width x fp32
    for b in cost.blocks:
        assert b.out_bytes == {4: hidden, 2: hidden // 2}
        assert b.time_s[4] > 0 and b.time_s[2] > 0
        # a block keeps several activations of its input's size for backward
        assert hidden < b.act_bytes[4] < 50 * hidden and b.act_bytes[2] < b.act_bytes[4]
    assert cost.head.act_bytes[4] >= 4 * 16 * pm.VOCAB * 4  # the logits
    assert cost.opt_ratio == pytest.approx(2.0)  # AdamW's two moments
    assert cost.opt_s_per_byte > 0


def test_a_model_of_its_own_layout_is_timed_whole_and_block_by_block() -> None:
    model = pm.Tower(dim=32, n=3)
    parts = find_parts(model)
    batch = (torch.randn(8, 32), torch.randn(8, 1))
    cost = measure_model(model, parts, batch, pm.mse, pm.adamw, [8], repeats=1)
    # everything that is not a block (the input and output layers) counts as the head
    assert cost.head.param_bytes == _nbytes([model.inp, model.out])
    assert cost.embed.param_bytes == 0
    for b in cost.blocks:
        assert b.time_s[8] > 0 and b.out_bytes[8] == 8 * 32 * 4
        assert b.act_bytes[8] >= 8 * 64 * 4  # at least the hidden layer's activations


@pytest.mark.parametrize("make", [pm.gpt2, pm.llama], ids=["gpt2", "llama"])
def test_block_by_block_one_block_of_each_make_stands_in_for_the_others(make: object) -> None:
    """A model too big to measure whole on one proc is measured from a copy holding one
    block of each make and the parts around the blocks: every block gets the measured
    one's costs, its weights' bytes included, and the copy holds none of the others."""
    model = make()  # type: ignore[operator]
    parts = find_parts(model)
    batch = pm.lm_batch(n=4)
    loss = parts.default_loss(model)
    thin = parts.keep(model, {0}, embed=True, head=True)
    held = {id(p) for p in thin.parameters()}
    assert not held & {id(p) for p in parts.blocks(model)[1].parameters()}
    assert _nbytes([thin]) < _nbytes([model]) - _nbytes(parts.blocks(model)[1:]) / 2
    stand_in = [0] * parts.n_blocks
    cost = measure_model(thin, parts, batch, loss, pm.adamw, [4, 2], repeats=1, stand_in=stand_in)
    whole = measure_model(model, parts, batch, loss, pm.adamw, [4, 2], repeats=1)
    assert len(cost.blocks) == parts.n_blocks
    for b, w in zip(cost.blocks, whole.blocks, strict=True):
        assert b.param_bytes == w.param_bytes == _nbytes([parts.blocks(model)[0]])
        assert b.out_bytes == w.out_bytes and b.act_bytes == w.act_bytes
        assert b.time_s == cost.blocks[0].time_s and b.time_s[4] > 0
    assert cost.blocks[1] is not cost.blocks[0]  # each its own (the planner may change one)
    assert (cost.embed.param_bytes, cost.head.param_bytes) == (
        whole.embed.param_bytes,
        whole.head.param_bytes,
    )
    assert cost.head.act_bytes == whole.head.act_bytes
    assert cost.opt_ratio == pytest.approx(whole.opt_ratio)


def test_a_model_too_big_for_the_roomiest_proc_is_measured_block_by_block() -> None:
    """The planner's choice, on procs as they report themselves: whole where the
    weights and gradients fit the roomiest proc; else one block of each make; else, or
    for a model danaus cannot cut, a PlanError naming the bytes."""
    from danaus.parallel import PlanError
    from danaus.parallel._cgroup import GroupMemory
    from danaus.parallel._planning import _check_room
    from danaus.parallel._profile import ProcFacts

    model = pm.llama(layers=8)
    parts = find_parts(model)
    weights = _nbytes([model])
    block = _nbytes([parts.blocks(model)[0]])
    ends = weights - 8 * block

    def procs(room: float, device: str = "cpu") -> list[ProcFacts]:
        """16 procs, each alone under a limit with ``room`` free (on CPU), or with
        ``room`` free on its GPU."""
        if device != "cpu":
            return [ProcFacts("h", 2, int(room), device)] * 16
        return [ProcFacts("h", 2, 2**40, device, GroupMemory(f"/g{r}", 2**40, int(room)))
                for r in range(16)]  # fmt: skip

    assert _check_room(model, parts, procs(2 * weights)) is None
    assert _check_room(model, parts, procs(2 * weights - 1)) == [0] * 8
    assert _check_room(model, parts, procs(2 * (ends + block), "cuda:0")) == [0] * 8
    with pytest.raises(PlanError, match=r"block by block needs .* one block of each make"):
        _check_room(model, parts, procs(2 * (ends + block) - 1))
    tower = pm.Tower(dim=32, n=4)
    with pytest.raises(PlanError, match=r"cannot be cut into pipeline stages.*measured whole"):
        _check_room(tower, find_parts(tower), procs(_nbytes([tower])))
    # the weights and gradients spread over every proc do not fit: no layout does
    with pytest.raises(PlanError, match=r"no plan fits in"):
        _check_room(model, parts, [ProcFacts("h", 2, weights // 16, "cpu")] * 16)
