"""What danaus knows of a model: where its repeated blocks are, what runs before and after
them, its loss, and how to cut it into pipeline stages.

A model is an *embed* part (run on the first stage), a list of *blocks* (split into
contiguous stages), and a *head* part (run on the last stage). ``ModelParts`` finds them:

- ``nn.Sequential``: every child is a block; no embed, no head.
- Hugging Face GPT-2 (``transformer.h``: ``wte`` + ``wpe`` first, ``ln_f`` + ``lm_head`` last).
- A Hugging Face causal LM whose config carries ``base_model_pp_plan`` (Llama, Qwen2,
  Mistral, Gemma, Phi-3...): the plan names its parts in order (``embed_tokens``, the
  blocks' ``layers``, ``norm``), the model's output embeddings (``lm_head``) come last,
  and its base model's ``rotary_emb`` gives the blocks their position embeddings. A
  model whose forward does more than that (Gemma 2 caps its logits) is found out by a
  probe and trains through its own forward, data parallel.
- Any other module with exactly one ``nn.ModuleList`` (or the one ``layers=`` names):
  its blocks are found and profiled, and it trains data parallel; its forward around the
  blocks is its own code, so danaus cannot cut it into pipeline stages.

Running the parts one after the other gives exactly what the model's own ``forward``
gives (the tests hold it to that), so a pipeline computes what one process computes.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import a_type
from ._errors import PlanError
from ._tp import Plan, block_plan

Batch = Any  # a dict of tensors (Hugging Face style) or an (inputs, target) tuple
LossFn = Callable[[Any, Any], torch.Tensor]
#: a loss that also takes ``num_items_in_batch`` (the model's own, Hugging Face's)
TokenLoss = Callable[..., torch.Tensor]
#: what a label is not counted by, in Hugging Face's losses
IGNORE_INDEX = -100

#: Families whose forward around the blocks danaus runs itself (so it can pipeline them).
PIPELINE_FAMILIES = ("sequential", "gpt2", "pp_plan")
#: Hugging Face families (the model's own loss; a batch of ``input_ids`` and ``labels``)
HF_FAMILIES = ("gpt2", "pp_plan", "hf")


def _get(model: nn.Module, path: str) -> Any:
    """A submodule (typed loosely: a container's length and a block's call are used)."""
    return model.get_submodule(path)


def _module_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    found: list[tuple[str, nn.ModuleList]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            # a ModuleList inside a found block (a block's heads) is not another list of blocks
            if not any(name.startswith(f + ".") for f, _ in found):
                found.append((name, mod))
    return found


@dataclass(frozen=True)
class ModelParts:
    """Where a model's blocks are and how its parts run. Picklable; holds no module.

    Attributes:
        family: ``"sequential"``, ``"gpt2"``, ``"pp_plan"`` (a Hugging Face model cut
            where its ``base_model_pp_plan`` says), ``"modulelist"``, or ``"hf"`` (a
            Hugging Face causal LM run as one piece, see ``not_cut``).
        blocks_path: the dotted name of the blocks' container (``""`` for a Sequential).
        n_blocks: how many blocks.
        embed_paths: submodules run before the blocks (on the first stage).
        head_paths: submodules run after them (on the last stage).
        rotary_path: the submodule that gives the blocks their position embeddings.
        tp_plan: each block's tensor-parallel plan (see :mod:`._tp`); empty if none,
            ``tp_why`` says why.
    """

    family: str
    blocks_path: str
    n_blocks: int
    embed_paths: tuple[str, ...] = ()
    head_paths: tuple[str, ...] = ()
    #: why danaus does not run this model part by part, where it is a Hugging Face
    #: model laid out like one it knows (its forward does more than that layout's)
    not_cut: str = ""
    rotary_path: str = ""
    tp_plan: Plan = ()
    tp_why: str = ""

    @property
    def can_pipeline(self) -> bool:
        return self.family in PIPELINE_FAMILIES

    @property
    def can_tensor_parallel(self) -> bool:
        return bool(self.tp_plan) and self.can_pipeline

    def why_not_cut(self, model: nn.Module) -> str:
        """Why this model cannot be cut into pipeline stages (nor split tensor parallel)."""
        return f"this model ({type(model).__name__}) cannot be cut into pipeline stages: " + (
            self.not_cut
            or "danaus runs the forward around the blocks only for nn.Sequential, "
            "Hugging Face GPT-2 and Hugging Face models whose config has a "
            "base_model_pp_plan (Llama, Qwen2, Mistral, Gemma, Phi-3...)"
        )

    def block_path(self, i: int) -> str:
        return f"{self.blocks_path}.{i}" if self.blocks_path else str(i)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        container = _get(model, self.blocks_path) if self.blocks_path else model
        return list(container.children())

    # --- the model's forward, part by part -------------------------------------------

    def embed(
        self,
        model: nn.Module,
        inputs: Any,
        position_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The first stage's work before its blocks: token ids to hidden states."""
        if self.family == "gpt2":
            t = _get(model, "transformer")
            pos = _positions(inputs.shape[-1], inputs.device, position_ids)
            h = t.get_submodule("wte")(inputs) + t.get_submodule("wpe")(pos)
            if token_type_ids is not None:
                h = h + t.get_submodule("wte")(token_type_ids)
            out: torch.Tensor = t.get_submodule("drop")(h)
            return out
        if self.family == "pp_plan":
            x: torch.Tensor = inputs
            for path in self.embed_paths:
                x = _get(model, path)(x)
            return x
        return inputs  # type: ignore[no-any-return]

    def run_blocks(
        self,
        model: nn.Module,
        first: int,
        last: int,
        h: Any,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> Any:
        """Blocks ``first``..``last`` (inclusive) on hidden states ``h``; a Hugging Face
        model's blocks with the batch's padding mask and positions, as its forward runs
        them."""
        blocks = self.blocks(model)
        if self.family in ("gpt2", "pp_plan"):
            return self._run_hf_blocks(model, blocks, first, last, h, attention_mask, position_ids)
        for i in range(first, last + 1):
            h = blocks[i](h)
        return h

    def _run_hf_blocks(
        self,
        model: nn.Module,
        blocks: list[nn.Module],
        first: int,
        last: int,
        h: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        config: Any = getattr(model, "config")  # noqa: B009
        pos = _positions(h.shape[1], h.device, position_ids)
        masks = _masks(config, self.n_blocks, h, attention_mask, pos)
        if self.family == "gpt2":
            for i in range(first, last + 1):
                h = _hidden(blocks[i](h, attention_mask=masks(i), position_ids=pos))
            return h
        more = {"position_ids": pos}
        if self.rotary_path:
            more["position_embeddings"] = _get(model, self.rotary_path)(h, position_ids=pos)
        for i in range(first, last + 1):
            h = _hidden(blocks[i](h, attention_mask=masks(i), **more))
        return h

    def head(self, model: nn.Module, h: Any) -> Any:
        """The last stage's work after its blocks: hidden states to the output (logits)."""
        if self.family in ("gpt2", "pp_plan"):
            for path in self.head_paths:
                h = _get(model, path)(h)
        return h

    def forward(self, model: nn.Module, inputs: Any, **kwargs: torch.Tensor) -> Any:
        """The whole model, part by part (what one pipeline computes); ``kwargs`` are the
        batch's other inputs (``attention_mask``, ``position_ids``...). A model that is
        not cut runs its own forward (a Hugging Face model's: its logits)."""
        if self.family == "hf":  # (training keeps no cache of keys and values)
            return model(input_ids=inputs, use_cache=False, **kwargs).logits
        if not self.can_pipeline:
            return model(inputs, **kwargs)
        return StageModule(model, self, 0, self.n_blocks - 1)(inputs, **kwargs)

    def stage_keys(self) -> frozenset[str]:
        """The batch's keys besides ``input_ids`` and ``labels`` that danaus passes to
        this family's model; empty where the model's own forward says what it takes (see
        :func:`check_batch`)."""
        if self.family == "gpt2":
            return frozenset({"attention_mask", "position_ids", "token_type_ids"})
        if self.family in ("pp_plan", "hf"):
            return frozenset({"attention_mask", "position_ids"})
        return frozenset()

    def default_loss(self, model: nn.Module) -> TokenLoss | None:
        """The model's own loss on (output, target), where it has one (Hugging Face's
        causal LM loss: the mean over the labels that are not -100, after the shift);
        given ``num_items_in_batch``, the sum over them divided by that instead."""
        if self.family not in HF_FAMILIES:
            return None
        config: Any = getattr(model, "config")  # noqa: B009 (an nn.Module attribute)
        vocab = int(config.vocab_size)
        hf_loss: Any = getattr(model, "loss_function")  # noqa: B009

        def loss(
            logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | None = None
        ) -> torch.Tensor:
            out: torch.Tensor = hf_loss(
                logits=logits,
                labels=labels,
                vocab_size=vocab,
                num_items_in_batch=num_items_in_batch,
            )
            return out

        return loss

    # --- stages -------------------------------------------------------------------------

    def stage_module(self, model: nn.Module, first: int, last: int) -> StageModule:
        """A copy of ``model`` holding only what blocks ``first``..``last`` need (see
        :meth:`cut`), as one pipeline stage."""
        return StageModule(self.cut(model, first, last), self, first, last)

    def cut(self, model: nn.Module, first: int, last: int) -> nn.Module:
        """A copy of ``model`` holding only what blocks ``first``..``last`` need: the
        embed part if ``first == 0``, the head part if ``last`` is the last block; every
        other part is an ``nn.Identity`` in its place. Only the stage's own parts are
        copied (the others are never touched), so that a stage of a model too big for
        one proc costs only its own share to cut, send and hold."""
        return self.keep(model, range(first, last + 1), first == 0, last == self.n_blocks - 1)

    def keep(self, model: nn.Module, blocks: Iterable[int], embed: bool, head: bool) -> nn.Module:
        """A copy of ``model`` holding only ``blocks`` (indices) and, where asked, the
        embed and head parts; every other part is an ``nn.Identity`` in its place, never
        copied (see :meth:`cut`)."""
        if not self.can_pipeline:
            raise PlanError(f"{self.why_not_cut(model)}; give pp=1, or express it as nn.Sequential")
        wanted = set(blocks)
        container = _get(model, self.blocks_path) if self.blocks_path else model
        left_out = [b for i, b in enumerate(container.children()) if i not in wanted]
        if not embed:
            left_out += [_get(model, p) for p in self.embed_paths]
        if not head:
            left_out += [_get(model, p) for p in self.head_paths]
        # deepcopy takes what its memo already holds as the copy: each left-out part's
        # copy is an Identity, made without copying the part
        memo: dict[int, Any] = {id(m): nn.Identity() for m in left_out}
        return copy.deepcopy(model, memo)


def _positions(n: int, device: torch.device, given: torch.Tensor | None) -> torch.Tensor:
    """Token positions, as Hugging Face's forward makes them when none are given."""
    return given if given is not None else torch.arange(n, device=device).unsqueeze(0)


#: the attention kinds of a Hugging Face config's ``layer_types`` danaus makes masks for
MASK_KINDS = ("full_attention", "sliding_attention")


def _mask_kinds(config: Any, n_blocks: int) -> list[str]:
    """Each block's attention kind, as the model's forward picks its mask: by the
    config's ``layer_types`` where it has them, else sliding-window for every block
    where it has a ``sliding_window`` (Mistral, Phi-3), else full causal."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [str(t) for t in types[:n_blocks]]
    sliding = getattr(config, "sliding_window", None) is not None
    return ["sliding_attention" if sliding else "full_attention"] * n_blocks


def _masks(
    config: Any,
    n_blocks: int,
    h: torch.Tensor,
    attention_mask: torch.Tensor | None,
    pos: torch.Tensor,
) -> Callable[[int], Any]:
    """Block ``i``'s attention mask, of ``n_blocks`` (each kind made once, when a block
    first needs it)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kinds = _mask_kinds(config, n_blocks)
    made: dict[str, Any] = {}

    def mask(i: int) -> Any:
        kind = kinds[i]
        if kind not in made:
            make = create_sliding_window_causal_mask if kind == "sliding_attention" else None
            made[kind] = (make or create_causal_mask)(
                config=config,
                inputs_embeds=h,
                attention_mask=attention_mask,
                cache=None,
                position_ids=pos,
            )
        return made[kind]

    return mask


def _hidden(out: Any) -> torch.Tensor:
    """A Hugging Face block's hidden states (older releases return them in a tuple)."""
    h: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return h


def _replace(parent: nn.Module, name: str, new: nn.Module) -> None:
    if isinstance(parent, nn.ModuleList):
        parent[int(name)] = new
    else:
        setattr(parent, name, new)


def _replace_path(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    _replace(model.get_submodule(parent) if parent else model, name, new)


class StageModule(nn.Module):
    """One pipeline stage: the model's copy with only this stage's parts left in it.

    Its parameter names are the model's (under ``model.``), so a stage's state dict is a
    piece of the model's.
    """

    def __init__(self, model: nn.Module, parts: ModelParts, first: int, last: int) -> None:
        super().__init__()
        self.model = model
        self.parts = parts
        self.first = first
        self.last = last

    def forward(
        self,
        x: Any,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> Any:
        """Token ids (the first stage) or hidden states to hidden states (or, on the last
        stage, the output); every stage takes the batch's padding mask and positions (a
        pipeline hands each stage its microbatch's)."""
        p = self.parts
        if p.family == "hf":  # the model as one piece, its own forward
            given = {"attention_mask": attention_mask, "position_ids": position_ids}
            given["token_type_ids"] = token_type_ids
            return p.forward(self.model, x, **{k: v for k, v in given.items() if v is not None})
        h = p.embed(self.model, x, position_ids, token_type_ids) if self.first == 0 else x
        h = p.run_blocks(self.model, self.first, self.last, h, attention_mask, position_ids)
        return p.head(self.model, h) if self.last == p.n_blocks - 1 else h

    def extra_repr(self) -> str:
        return f"blocks {self.first}..{self.last} of {self.parts.n_blocks}"


def find_parts(model: nn.Module, layers: str | None = None) -> ModelParts:
    """Find ``model``'s blocks. ``layers`` names the container (``"transformer.h"``)
    where the model's layout is not one danaus knows."""
    if layers is not None:
        try:
            container: Any = model.get_submodule(layers) if layers else model
        except AttributeError as e:
            raise PlanError(f"layers={layers!r}: the model has no submodule of that name") from e
        if not isinstance(container, (nn.ModuleList, nn.Sequential)) or len(container) == 0:
            raise PlanError(
                f"layers={layers!r} is {a_type(container)}; it must name a "
                "non-empty nn.ModuleList or nn.Sequential of blocks"
            )
    if isinstance(model, nn.Sequential) and not layers:
        if len(model) == 0:
            raise PlanError("the nn.Sequential has no layers")
        return ModelParts("sequential", "", len(model))
    hf = _hf_parts(model, layers)
    if hf is not None:
        return _checked(model, hf)
    if layers is not None:
        return ModelParts("modulelist", layers, len(_get(model, layers)))
    lists = _module_lists(model)
    if len(lists) != 1:
        what = "no nn.ModuleList" if not lists else f"{len(lists)} ({[n for n, _ in lists]})"
        raise PlanError(
            f"cannot find the repeated blocks of {type(model).__name__}: it has {what}; "
            "give layers='dotted.name' of the nn.ModuleList that holds them"
        )
    name, mods = lists[0]
    return ModelParts("modulelist", name, len(mods))


#: what :func:`_checked` found, per model object: a model is checked once
_checked_parts: weakref.WeakKeyDictionary[nn.Module, ModelParts] = weakref.WeakKeyDictionary()


def _checked(model: nn.Module, parts: ModelParts) -> ModelParts:
    """``parts`` if running ``model`` part by part gives its own forward's logits, bit
    for bit, on a probe of a few tokens; else the model as one piece (``"hf"``: its own
    forward, its own loss, data parallel only), saying why. A model laid out like Llama
    may do more around its blocks (Gemma 2 caps its logits), which part by part would
    silently leave out."""
    if model in _checked_parts:
        return _checked_parts[model]
    config: Any = getattr(model, "config")  # noqa: B009
    vocab = int(config.vocab_size)
    device = next(model.parameters()).device
    ids = (torch.arange(14, device=device) * 7919 % vocab).view(2, 7)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # the second row is padded on the right
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            own = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            mine = parts.forward(model, ids, attention_mask=mask)
    finally:
        model.train(training)
    real = mask.bool()
    if not torch.equal(own[real], mine[real]):
        gap = float((own[real] - mine[real]).abs().max())
        parts = ModelParts(
            "hf",
            parts.blocks_path,
            parts.n_blocks,
            tp_why="its forward is its own, so danaus cannot split it tensor parallel",
            not_cut=(
                "its layout is one danaus runs part by part, but its forward does more around its "
                f"blocks (run part by part, its logits differ by up to "
                f"{gap:.3g}): it trains data parallel, through its own forward"
            ),
        )
    _checked_parts[model] = parts
    return parts


def _hf_parts(model: nn.Module, layers: str | None) -> ModelParts | None:
    """A Hugging Face causal LM's parts, where danaus knows its layout: GPT-2's, or the
    one its config's ``base_model_pp_plan`` gives; its blocks' tensor-parallel plan."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "loss_function"):
        return None
    parts: ModelParts | None = None
    if getattr(config, "model_type", "") == "gpt2" and layers in (None, "transformer.h"):
        n = len(_get(model, "transformer.h"))
        embed, head = ("transformer.wte", "transformer.wpe"), ("transformer.ln_f", "lm_head")
        parts = ModelParts("gpt2", "transformer.h", n, embed, head)
    elif getattr(config, "base_model_pp_plan", None):
        parts = _pp_plan_parts(model, config)
        if parts is not None and layers not in (None, parts.blocks_path):
            return None
    if parts is None:
        return None
    plan, why = block_plan(model, parts.blocks_path, parts.family)
    return dataclasses.replace(parts, tp_plan=plan, tp_why=why)


def _pp_plan_parts(model: nn.Module, config: Any) -> ModelParts | None:
    """The parts a Hugging Face config's ``base_model_pp_plan`` names, in order (the
    first takes ``input_ids``, one is the blocks' ``nn.ModuleList``), then the model's
    output embeddings; None where the plan or the model is not laid out so."""
    plan: dict[str, Any] = dict(config.base_model_pp_plan)
    prefix = str(getattr(model, "base_model_prefix", "") or "")
    at = (prefix + ".") if prefix else ""
    names = {id(m): n for n, m in model.named_modules()}
    own: Any = model
    head_module = own.get_output_embeddings() if hasattr(own, "get_output_embeddings") else None
    try:
        mods: dict[str, Any] = {k: model.get_submodule(at + k) for k in plan}
    except AttributeError:
        return None
    lists = [k for k, m in mods.items() if isinstance(m, nn.ModuleList) and len(m) > 0]
    keys = list(plan)
    if len(lists) != 1 or head_module is None or id(head_module) not in names:
        return None
    cut = keys.index(lists[0])
    takes = plan[keys[0]][0] if keys and isinstance(plan[keys[0]], (tuple, list)) else ()
    if cut == 0 or "input_ids" not in list(takes):
        return None
    n = len(mods[lists[0]])
    if any(k not in MASK_KINDS for k in _mask_kinds(config, n)):
        return None
    rotary = at + "rotary_emb"
    try:
        model.get_submodule(rotary)
    except AttributeError:
        rotary = ""
    return ModelParts(
        "pp_plan",
        at + lists[0],
        n,
        tuple(at + k for k in keys[:cut]),
        (*(at + k for k in keys[cut + 1 :]), names[id(head_module)]),
        rotary_path=rotary,
    )


def split_batch(batch: Batch) -> tuple[Any, Any]:
    """A batch as (inputs, target): ``{"input_ids", "labels", ...}`` (the other keys are
    :func:`model_kwargs`) or ``(inputs, target)``."""
    if isinstance(batch, dict):
        missing = [k for k in ("input_ids", "labels") if k not in batch]
        if missing:
            raise ValueError(
                f"a dict batch needs 'input_ids' and 'labels'; it has no {missing} "
                f"(its keys: {sorted(batch)})"
            )
        return batch["input_ids"], batch["labels"]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        f"a batch is a dict with 'input_ids' and 'labels' or an (inputs, target) tuple, "
        f"not {type(batch).__name__}"
    )


def model_kwargs(batch: Batch) -> dict[str, Any]:
    """A dict batch's inputs besides ``input_ids`` and ``labels`` (``attention_mask``,
    ``position_ids``...), for the model's forward; none for a tuple batch."""
    if not isinstance(batch, dict):
        return {}
    return {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}


def check_batch(batch: Batch, model: nn.Module, parts: ModelParts) -> int:
    """Check a batch against the model before any worker sees it, and return its rows.

    Raises:
        ValueError: naming the key at fault: not a tensor, not the batch's rows, a label
            or mask not the shape of the token ids, a key the model's forward does not
            take (or, for a model danaus runs part by part, one it does not pass on).
    """
    inputs, target = split_batch(batch)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0:
        raise ValueError("a batch's inputs must be a tensor whose first dim is the batch")
    rows = int(inputs.shape[0])
    if not isinstance(batch, dict):
        if isinstance(target, torch.Tensor) and (target.dim() == 0 or target.shape[0] != rows):
            raise ValueError(
                f"the batch's target is {tuple(target.shape)}; its first dim must be the "
                f"inputs' {rows} rows"
            )
        return rows
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != rows:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else a_type(value)
            raise ValueError(
                f"batch[{key!r}] must be a tensor of the batch's {rows} rows "
                f"(input_ids is {tuple(inputs.shape)}); it is {shape}"
            )
    for key in ("labels", "attention_mask", "token_type_ids"):
        if key in batch and batch[key].shape != inputs.shape:
            raise ValueError(
                f"batch[{key!r}] is {tuple(batch[key].shape)}; it must be the shape of "
                f"input_ids, {tuple(inputs.shape)}"
            )
    extra = set(model_kwargs(batch))
    if parts.stage_keys():
        unknown = sorted(extra - parts.stage_keys())
        if unknown:
            raise ValueError(
                f"batch key(s) {unknown}: danaus runs {type(model).__name__} part by part "
                f"and passes on only {sorted(parts.stage_keys())} besides input_ids and labels"
            )
    elif extra:
        import inspect

        params = inspect.signature(model.forward).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        unknown = sorted(k for k in extra if k not in params and not takes_any)
        if unknown or parts.family == "sequential":
            raise ValueError(
                f"batch key(s) {unknown or sorted(extra)}: {type(model).__name__}.forward "
                "does not take them"
            )
    return rows


@dataclass(frozen=True)
class Shard:
    """What one rank reads of a global batch: its replica's rows of the token ids (the
    first pipeline stage only), of the labels (the last stage only) and of the model's
    other inputs (every stage: the padding mask and positions)."""

    inputs: Any
    target: Any
    kwargs: dict[str, Any]
    #: the shape of the replica's inputs (what every stage's buffers are sized for)
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        parts = [self.inputs, self.target, *self.kwargs.values()]
        return sum(t.numel() * t.element_size() for t in parts if isinstance(t, torch.Tensor))


def shard_batch(batch: Batch, dp: int, dp_i: int, first: bool, last: bool) -> Shard:
    """Replica ``dp_i``'s rows of ``batch`` (of ``dp``), as a stage reads them: the
    inputs if it is the ``first``, the target if it is the ``last``. Each piece is a
    copy of its own, so that sending it sends its rows only (not the batch it came
    from)."""
    inputs, target = split_batch(batch)
    n = int(inputs.shape[0]) // dp
    rows = slice(dp_i * n, (dp_i + 1) * n)

    def take(t: Any) -> Any:
        return t[rows].clone() if isinstance(t, torch.Tensor) else t[rows]

    return Shard(
        take(inputs) if first else None,
        take(target) if last else None,
        {k: take(v) for k, v in model_kwargs(batch).items()},
        (n, *inputs.shape[1:]),
    )


def counted_tokens(labels: torch.Tensor) -> int:
    """Labels a causal LM's loss counts: those not -100 after the shift by one (the
    first position of each row predicts nothing)."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())
