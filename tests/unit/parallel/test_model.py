"""Finding a model's blocks, running it part by part, cutting it into stages."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from danaus.parallel import Plan, PlanError, StagePlan  # noqa: E402
from danaus.parallel._model import (  # noqa: E402
    check_batch,
    counted_tokens,
    find_parts,
    model_kwargs,
    split_batch,
)
from tests.integration import parallel_models as pm  # noqa: E402


@pytest.mark.parametrize("make", [pm.gpt2, pm.llama], ids=["gpt2", "llama"])
def test_part_by_part_is_the_models_own_forward_and_loss(make: object) -> None:
    model = make().eval()  # type: ignore[operator]
    parts = find_parts(model)
    batch = pm.lm_batch()
    with torch.no_grad():
        ref = model(**batch)
        logits = parts.forward(model, batch["input_ids"])
        loss = parts.default_loss(model)(logits, batch["labels"])
    assert torch.equal(logits, ref.logits)
    assert torch.equal(loss, ref.loss)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("make", [pm.gpt2, pm.llama], ids=["gpt2", "llama"])
def test_part_by_part_on_a_padded_batch_is_the_models_own(make: object, side: str) -> None:
    model = make().eval()  # type: ignore[operator]
    parts = find_parts(model)
    batch = pm.padded_lm_batch(side=side)
    kwargs = model_kwargs(batch)
    assert set(kwargs) == {"attention_mask"}
    with torch.no_grad():
        ref = model(**batch)
        logits = parts.forward(model, batch["input_ids"], **kwargs)
        own = parts.default_loss(model)
        assert own is not None
        loss = own(logits, batch["labels"])
        counted = counted_tokens(batch["labels"])
        # the loss's sum over the counted labels, over their count: the same mean
        summed = own(logits, batch["labels"], num_items_in_batch=counted)
        # halves of the batch add up to it when each is divided by the whole's count
        halves = sum(
            own(logits[h], batch["labels"][h], num_items_in_batch=counted)
            for h in (slice(0, 3), slice(3, None))
        )
    assert torch.equal(logits, ref.logits)
    assert torch.equal(loss, ref.loss)
    assert torch.allclose(summed, ref.loss) and torch.allclose(halves, ref.loss)
    # and the padding matters: without the mask the logits differ
    with torch.no_grad():
        assert not torch.allclose(parts.forward(model, batch["input_ids"]), ref.logits)
    # every stage takes the mask: two stages chained are the whole model
    stages = [parts.stage_module(model, 0, 1), parts.stage_module(model, 2, 3)]
    with torch.no_grad():
        h = batch["input_ids"]
        for stage in stages:
            h = stage(h, **kwargs)
    assert torch.equal(h, ref.logits)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma", "phi3"])
def test_families_with_a_pp_plan_run_part_by_part_as_their_own_forward(family: str) -> None:
    model = pm.causal_lm(family).eval()
    parts = find_parts(model)
    assert (parts.family, parts.n_blocks, parts.not_cut) == ("pp_plan", 4, "")
    assert (parts.blocks_path, parts.embed_paths) == ("model.layers", ("model.embed_tokens",))
    assert parts.head_paths == ("model.norm", "lm_head")
    batch = pm.padded_lm_batch(side="left")
    with torch.no_grad():
        ref = model(**batch)
        logits = parts.forward(model, batch["input_ids"], **model_kwargs(batch))
    assert torch.equal(logits, ref.logits)
    own = parts.default_loss(model)
    assert own is not None and torch.equal(own(logits, batch["labels"]), ref.loss)
    # its blocks' tensor-parallel plan is its config's own, under the blocks
    hf_plan = model.config.base_model_tp_plan
    assert dict(parts.tp_plan) == {
        k.removeprefix("layers.*."): v for k, v in hf_plan.items() if k.startswith("layers.*.")
    }
    assert parts.can_tensor_parallel and parts.tp_why == ""


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_a_sliding_window_shorter_than_the_batch_masks_as_the_models_own(family: str) -> None:
    # Mistral slides every block's window; Qwen2 only the blocks its layer_types say
    more: dict[str, Any] = {"sliding_window": 4}
    if family == "qwen2":
        more.update(use_sliding_window=True, max_window_layers=2)
    model = pm.causal_lm(family, **more).eval()
    if family == "qwen2":
        assert model.config.layer_types[:3] == ["full_attention"] * 2 + ["sliding_attention"]
    parts = find_parts(model)
    assert parts.family == "pp_plan"
    batch = pm.padded_lm_batch(seq=16)
    with torch.no_grad():
        ref = model(**batch).logits
        logits = parts.forward(model, batch["input_ids"], **model_kwargs(batch))
        h = batch["input_ids"]
        for stage in (parts.stage_module(model, 0, 2), parts.stage_module(model, 3, 3)):
            h = stage(h, **model_kwargs(batch))
    assert torch.equal(logits, ref) and torch.equal(h, ref)


def test_a_tp_plan_style_danaus_does_not_apply_is_named() -> None:
    model = pm.causal_lm("llama")
    model.config.base_model_tp_plan = {
        **model.config.base_model_tp_plan,
        "layers.*.self_attn.q_proj": "local_colwise",
    }
    parts = find_parts(model)
    assert parts.can_pipeline and not parts.can_tensor_parallel
    assert "uses the style(s) ['local_colwise'], which danaus does not apply" in parts.tp_why
    from danaus.parallel._planning import tp_sizes

    assert tp_sizes(model, parts, 4) == ([1], parts.tp_why)


def test_a_model_laid_out_like_llama_whose_forward_does_more_runs_whole() -> None:
    model = pm.causal_lm("gemma2")  # it caps its logits after the head
    training = model.training
    parts = find_parts(model)
    assert model.training == training  # (the probe left its mode as it was)
    assert parts.family == "hf" and not parts.can_pipeline and not parts.can_tensor_parallel
    assert "danaus runs part by part, but its forward does more around its blocks" in (
        parts.not_cut
    )
    assert find_parts(model) is parts  # checked once per model
    batch = pm.padded_lm_batch()
    with torch.no_grad():
        ref = model(**batch)
        logits = parts.forward(model, batch["input_ids"], **model_kwargs(batch))
        own = parts.default_loss(model)
        assert own is not None
        assert torch.equal(logits, ref.logits) and torch.equal(
            own(logits, batch["labels"]), ref.loss
        )
    with pytest.raises(PlanError, match=r"Gemma2ForCausalLM.* does more around its blocks"):
        parts.stage_module(model, 0, 1)


def test_counted_tokens_are_the_labels_after_the_shift_that_are_not_minus_100() -> None:
    labels = torch.tensor([[5, -100, 7, 8], [-100, -100, 3, -100]])
    assert counted_tokens(labels) == 2 + 1  # each row's first label predicts nothing


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda b: b.pop("labels"), r"needs 'input_ids' and 'labels'; it has no \['labels'\]"),
        (lambda b: b.update(labels=b["labels"][:, :-1]),
         r"batch\['labels'\] is \(8, 15\); it must be the shape of input_ids, \(8, 16\)"),
        (lambda b: b.update(attention_mask=b["attention_mask"][:4]),
         r"batch\['attention_mask'\] must be a tensor of the batch's 8 rows .* it is \(4, 16\)"),
        (lambda b: b.update(attention_mask=[1] * 8),
         r"batch\['attention_mask'\] must be a tensor .* it is a list"),
        (lambda b: b.update(pixel_values=b["input_ids"]),
         r"batch key\(s\) \['pixel_values'\]: danaus runs GPT2LMHeadModel part by part and "
         r"passes on only \['attention_mask', 'position_ids', 'token_type_ids'\]"),
    ],
)  # fmt: skip
def test_a_batch_that_disagrees_with_the_model_is_named(change: Any, says: str) -> None:
    model = pm.gpt2()
    batch = pm.padded_lm_batch()
    change(batch)
    with pytest.raises(ValueError, match=says):
        check_batch(batch, model, find_parts(model))


def test_a_batch_key_the_models_own_forward_does_not_take_is_named() -> None:
    model = pm.Tower()
    parts = find_parts(model)
    x = torch.randn(4, 32)
    assert check_batch((x, torch.randn(4, 1)), model, parts) == 4
    with pytest.raises(ValueError, match=r"the batch's target is \(3, 1\); its first dim"):
        check_batch((x, torch.randn(3, 1)), model, parts)
    with pytest.raises(ValueError, match=r"\['mask'\]: Tower.forward does not take them"):
        check_batch({"input_ids": x, "labels": x, "mask": x}, model, parts)


@pytest.mark.parametrize("make", [pm.gpt2, pm.llama], ids=["gpt2", "llama"])
def test_stages_chained_are_the_whole_model_and_hold_only_their_blocks(make: object) -> None:
    model = make().eval()  # type: ignore[operator]
    parts = find_parts(model)
    ids = pm.lm_batch()["input_ids"]
    stages = [
        parts.stage_module(model, 0, 0),
        parts.stage_module(model, 1, 2),
        parts.stage_module(model, 3, 3),
    ]
    with torch.no_grad():
        h = ids
        for s in stages:
            h = s(h)
        assert torch.equal(h, model(input_ids=ids).logits)
    names = [set(dict(s.named_parameters())) for s in stages]
    prefix = f"model.{parts.blocks_path}."
    assert {n.split(".")[len(prefix.split(".")) - 1] for n in names[1] if n.startswith(prefix)} == {
        "1",
        "2",
    }
    assert not any(
        n.startswith(f"model.{p}") for n in names[1] for p in parts.embed_paths + parts.head_paths
    )
    whole = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for s in stages[1:2] for p in s.parameters()) < whole / 2


def test_layouts_known_and_unknown() -> None:
    assert find_parts(pm.gpt2()).family == "gpt2"
    assert find_parts(pm.llama()).family == "pp_plan"
    seq = find_parts(pm.mlp([8, 8, 8], dim=4))
    assert (seq.family, seq.n_blocks, seq.can_pipeline) == ("sequential", 3, True)
    tower = find_parts(pm.Tower(n=5))
    assert (tower.family, tower.blocks_path, tower.n_blocks, tower.can_pipeline) == (
        "modulelist",
        "blocks",
        5,
        False,
    )
    with pytest.raises(PlanError, match="cannot be cut into pipeline stages"):
        tower.stage_module(pm.Tower(n=5), 0, 1)


def test_blocks_that_cannot_be_found_name_the_argument_to_give() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.ModuleList([nn.Linear(2, 2)])
            self.b = nn.ModuleList([nn.Linear(2, 2)])

    with pytest.raises(PlanError, match=r"it has 2 \(\['a', 'b'\]\); give layers="):
        find_parts(Two())
    with pytest.raises(PlanError, match=r"it has no nn\.ModuleList; give layers="):
        find_parts(nn.Linear(2, 2))
    assert find_parts(Two(), layers="b").blocks_path == "b"
    with pytest.raises(PlanError, match=r"layers=.a\.0. is a Linear; it must name"):
        find_parts(Two(), layers="a.0")
    with pytest.raises(PlanError, match=r"the nn\.Sequential has no layers"):
        find_parts(nn.Sequential())


def test_batches_are_dicts_of_ids_and_labels_or_pairs() -> None:
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert split_batch({"input_ids": ids, "labels": ids})[0] is ids
    assert split_batch((ids, ids))[1] is ids
    padded = {"input_ids": ids, "labels": ids, "attention_mask": ids}
    assert split_batch(padded)[1] is ids
    assert model_kwargs(padded) == {"attention_mask": ids}
    with pytest.raises(ValueError, match=r"it has no \['input_ids'\] \(its keys: \['labels'\]\)"):
        split_batch({"labels": ids})
    with pytest.raises(ValueError, match="not list"):
        split_batch([ids])


def test_a_plan_prints_as_a_table_with_its_reasons() -> None:
    p = Plan(
        dp=2,
        pp=2,
        tp=1,
        microbatches=4,
        stages=(
            StagePlan(0, 3, 2**20, 0.0125, 3 * 2**20),
            StagePlan(4, 7, 2**21, 0.0130, 5 * 2**20),
        ),
        estimated_step_s=0.071,
        peak_bytes_per_proc=5 * 2**20,
        memory_per_proc=2**30,
        why="fastest of 12",
        runner_up="dp=4: 80 ms",
    )
    text = str(p)
    assert p.strategy == "dp=2 x pp=2"
    assert "Plan: dp=2 x pp=2, 4 microbatches per replica, 1f1b schedule" in text
    assert "estimated step 71.00 ms, peak 5.00 MiB per proc (cap 1024.00 MiB)" in text
    assert "    1       4..7     2.00 MiB     13.00 ms     5.00 MiB" in text
    assert "why: fastest of 12" in text and "runner-up: dp=4: 80 ms" in text
    assert p.layout.coords(3) == (1, 1, 0) and p.layout.rank(1, 1, 0) == 3


def test_compile_without_a_cpp_compiler_says_so_and_compiles_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._inductor import config

    from danaus.parallel._worker import compile_blocks, compile_problem

    model = pm.llama()
    parts = find_parts(model)
    assert compile_problem(torch.device("cpu")) == ""  # this machine has g++
    monkeypatch.setattr(config.cpp, "cxx", ("/nonexistent/g++",))
    problem = compile_problem(torch.device("cpu"))
    assert problem.startswith("compile=True: torch.compile's Inductor needs a C++ compiler")
    assert "/nonexistent/g++" in problem and "install g++" in problem
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler"):
        compile_blocks(model, parts, 0, parts.n_blocks - 1)
    assert not any(getattr(b, "_compiled_call_impl", None) for b in parts.blocks(model))


@pytest.mark.parametrize("tp", [2, 4])
def test_a_checkpoint_s_own_layout_and_tensor_parallel_s_undo_each_other(tp: int) -> None:
    """GPT-2's Conv1D weights (in x out) become nn.Linear (out x in) under tensor
    parallel, with q/k/v interleaved per rank: ``split_layout`` makes that layout from the
    model's own (a checkpoint's), ``whole`` makes the model's own back, for weights and
    biases (and so for the optimizer's state of them)."""
    from danaus.parallel import _tp

    model = pm.gpt2()
    path = "transformer.h"
    plan = _tp.GPT2_PLAN
    for name, t in model.state_dict().items():
        split = _tp.split_layout(name, t, plan, path, tp, conv=True)
        assert torch.equal(_tp.whole(name, split, plan, path, tp, conv=True), t), name
        if name.endswith("attn.c_attn.weight"):  # (in, 3 x out): rows of q, k, v per rank
            assert split.shape == (t.shape[1], t.shape[0])
            linear = _tp._as_linear(model.get_submodule(name.rpartition(".")[0]),
                                    _tp._qkv_order(t.shape[1], tp))  # fmt: skip
            assert torch.equal(split, linear.weight)  # what apply() makes of it
