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
