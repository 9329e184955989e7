"""Tensor-parallel plans for a model's blocks, and how to apply and undo them.

A plan is, for one block, pairs of (the submodule's path inside the block, a style):

- A Hugging Face model whose config carries ``base_model_tp_plan`` uses its own plan: the
  entries under its blocks' container (``"layers.*.self_attn.q_proj": "colwise"``), with
  the styles ``colwise``, ``rowwise``, ``colwise_gather_output`` and
  ``rowwise_split_input`` (the other styles are not applied, and the error says which).
- GPT-2 has no plan of its own: its fused ``c_attn`` is split into q/k/v column shards
  (each rank computes its heads' q, k and v), ``c_proj`` row-wise; the MLP's ``c_fc``
  column-wise and ``c_proj`` row-wise. Its ``Conv1D`` layers (weights stored in x out)
  become ``nn.Linear`` (out x in) so that torch's styles apply.

:func:`whole` turns a gathered weight back into the model's own layout, so that a
tensor-parallel trainer's ``state_dict()`` loads into a plain copy of the model, and
:func:`split_layout` turns one of the model's own (a checkpoint's) into the layout
the plan split.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: the styles of a Hugging Face tp plan danaus applies
STYLES = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input")
#: GPT-2's q, k and v in one projection, split so each rank holds its heads' three
QKV = "qkv_colwise"

Plan = tuple[tuple[str, str], ...]

GPT2_PLAN: Plan = (
    ("attn.c_attn", QKV),
    ("attn.c_proj", "rowwise"),
    ("mlp.c_fc", "colwise"),
    ("mlp.c_proj", "rowwise"),
)


def block_plan(model: nn.Module, blocks_path: str, family: str) -> tuple[Plan, str]:
    """The tensor-parallel plan of one of ``model``'s blocks (at ``blocks_path``), or an
    empty plan and why there is none."""
    name = type(model).__name__
    if family == "gpt2":
        return GPT2_PLAN, ""
    config = getattr(model, "config", None)
    hf_plan = getattr(config, "base_model_tp_plan", None)
    if not hf_plan:
        return (), (
            f"{name} has no tensor-parallel plan (a Hugging Face config's "
            "base_model_tp_plan, or GPT-2's)"
        )
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    inner = blocks_path.removeprefix(prefix + ".") if prefix else blocks_path
    head = f"{inner}.*."
    plan = tuple((k.removeprefix(head), str(v)) for k, v in hf_plan.items() if k.startswith(head))
    if not plan:
        return (), f"{name}'s base_model_tp_plan has no entry under its blocks ({head}...)"
    odd = sorted({s for _, s in plan if s not in STYLES})
    if odd:
        return (), (
            f"{name}'s base_model_tp_plan uses the style(s) {odd}, which danaus does not "
            f"apply (it applies {list(STYLES)})"
        )
    return plan, ""


def _style(style: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if style in ("colwise", QKV):
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel()
    if style == "colwise_gather_output":
        return ColwiseParallel(output_layouts=Replicate())
    if style == "rowwise_split_input":
        return RowwiseParallel(input_layouts=Replicate())
    raise ValueError(f"unknown tensor-parallel style {style!r}")


def _is_conv1d(m: nn.Module) -> bool:
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf")


def _qkv_order(rows: int, tp: int) -> torch.Tensor:
    """The rows of a fused [q; k; v] projection reordered [q0; k0; v0; q1; k1; v1...], so
    that a column shard ``r`` of ``tp`` holds rank ``r``'s part of each."""
    third, part = rows // 3, rows // 3 // tp
    return torch.tensor(
        [w * third + r * part + i for r in range(tp) for w in range(3) for i in range(part)]
    )


def _as_linear(conv: Any, order: torch.Tensor | None) -> nn.Linear:
    weight: torch.Tensor = conv.weight.detach().t()
    bias: torch.Tensor = conv.bias.detach()
    if order is not None:
        weight, bias = weight[order], bias[order]
    lin = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    return lin


def apply(block: nn.Module, mesh: Any, plan: Plan) -> None:
    """Split ``block`` over the ``tp`` device mesh ``mesh`` by ``plan``."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = mesh.size()
    for path, style in plan:
        mod: Any = block.get_submodule(path)
        if _is_conv1d(mod):
            order = _qkv_order(int(mod.nf), tp) if style == QKV else None
            parent, _, leaf = path.rpartition(".")
            owner: Any = block.get_submodule(parent) if parent else block
            setattr(owner, leaf, _as_linear(mod, order))
            if style == QKV:  # each rank splits its local [q; k; v] in three
                owner.split_size = int(mod.nf) // 3 // tp
    parallelize_module(block, mesh, {path: _style(style) for path, style in plan})


def whole(
    name: str, t: torch.Tensor, plan: Plan, blocks_path: str, tp: int, conv: bool
) -> torch.Tensor:
    """The model's own layout of the gathered tensor ``name`` (``conv``: the plan turned
    the model's ``Conv1D`` layers into ``nn.Linear``, as GPT-2's)."""
    if not conv or not name.startswith(f"{blocks_path}." if blocks_path else ""):
        return t
    rest = name.removeprefix(f"{blocks_path}.").partition(".")[2]  # after the block's index
    path, _, kind = rest.rpartition(".")
    style = dict(plan).get(path)
    if style is None:
        return t
    if style == QKV:
        t = t[torch.argsort(_qkv_order(t.shape[0], tp))]
    return t.t().contiguous() if kind == "weight" else t


def split_layout(
    name: str, t: torch.Tensor, plan: Plan, blocks_path: str, tp: int, conv: bool
) -> torch.Tensor:
    """:func:`whole` undone: the model's own layout of tensor ``name`` (a weight, or an
    optimizer's state of one) in the layout the plan split, before it is sharded."""
    if not conv or not name.startswith(f"{blocks_path}." if blocks_path else ""):
        return t
    rest = name.removeprefix(f"{blocks_path}.").partition(".")[2]
    path, _, kind = rest.rpartition(".")
    style = dict(plan).get(path)
    if style is None:
        return t
    if kind == "weight":
        t = t.t()
    if style == QKV:
        t = t[_qkv_order(t.shape[0], tp)]
    return t.contiguous()
