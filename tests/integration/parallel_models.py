"""Tiny models for the whole-model parallelism tests: Hugging Face GPT-2 and Llama built
from their configs (no weights are downloaded), and plain torch models."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB = 256


def gpt2(layers: int = 4) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=layers,
        n_embd=64,
        n_head=4,
        n_positions=64,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(cfg)


def llama(layers: int = 4) -> nn.Module:
    return causal_lm("llama", layers)


def causal_lm(family: str, layers: int = 4, **more: Any) -> nn.Module:
    """A small Hugging Face causal LM of ``family`` ("llama", "qwen2", "mistral",
    "gemma", "gemma2", "phi3"), built from a config (no download), with grouped-query
    attention."""
    import transformers as tf

    config_class, model = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM),
    }[family]
    torch.manual_seed(0)
    cfg = config_class(
        num_hidden_layers=layers,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        **more,
    )
    return model(cfg)


def lm_batch(n: int = 8, seq: int = 16, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, seq), generator=g)
    return {"input_ids": ids, "labels": ids}


def padded_lm_batch(
    n: int = 8, seq: int = 16, seed: int = 1, side: str = "right"
) -> dict[str, torch.Tensor]:
    """A fine-tuning batch as a tokenizer and a collator make it: rows of different
    lengths padded to ``seq`` (``side``), ``attention_mask`` 0 on the padding, labels
    -100 there and on each row's prompt (its first few tokens). The rows' counted labels
    differ, so a mean of per-row or per-replica means is not the batch's token mean."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, seq), generator=g)
    mask = torch.zeros(n, seq, dtype=torch.long)
    labels = torch.full((n, seq), -100)
    for r in range(n):
        length = int(torch.randint(4, seq + 1, (1,), generator=g))
        prompt = int(torch.randint(1, length - 1, (1,), generator=g))
        span = slice(seq - length, seq) if side == "left" else slice(0, length)
        mask[r, span] = 1
        labels[r, span] = ids[r, span]
        start = span.start
        labels[r, start : start + prompt] = -100
    ids = ids.masked_fill(mask == 0, 0)  # the pad token
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def adamw(ps: Any) -> torch.optim.Optimizer:
    # eps 1e-6, not 1e-8: Adam divides each gradient by its own running size, so a
    # gradient near eps (a weight that padding barely reaches) turns float rounding of
    # the order the sums were taken in into a whole step, and one such element of a
    # model trained on padded rows was 1.5e-5 off after 5 steps; the tests compare
    # each element within 1e-4 relative, 1e-5 absolute
    return torch.optim.AdamW(ps, lr=1e-3, eps=1e-6)


def sgd(ps: Any) -> torch.optim.Optimizer:
    """An optimizer that keeps no state: training holds weights and gradients only."""
    return torch.optim.SGD(ps, lr=1e-2)


def train_locally(model: nn.Module, batch: Any, steps: int, loss_fn: Any = None) -> list[float]:
    """The reference: the same model trained in this process on the same global batch."""
    return train_over(model, [batch] * steps, loss_fn)


def train_over(model: nn.Module, batches: list[Any], loss_fn: Any = None) -> list[float]:
    """The reference: the same model trained in this process, a step per global batch."""
    opt = adamw(model.parameters())
    losses = []
    for batch in batches:
        opt.zero_grad()
        if isinstance(batch, dict):
            loss = model(**batch).loss
        else:
            loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def evaluate_locally(model: nn.Module, batch: dict[str, torch.Tensor], steps: int) -> float:
    """The loss on ``batch`` of ``model`` trained ``steps`` steps on it in this process."""
    train_locally(model, batch, steps)
    with torch.no_grad():
        return float(model(**batch).loss)


class Block(nn.Module):
    """An MLP block whose matmul work is proportional to ``width``."""

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, width)
        self.down = nn.Linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def mlp(widths: list[int], dim: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(dim, w) for w in widths))


class Tower(nn.Module):
    """A model danaus does not know: an input layer, one ModuleList of blocks, an output."""

    def __init__(self, dim: int = 32, n: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim, 2 * dim) for _ in range(n))
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class FussyTower(Tower):
    """A :class:`Tower` whose forward raises on an infinite input (to fail one rank in
    the model itself, not in the user's loss)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.isinf(x).any():
            raise ValueError("inf in the input: this tower refuses it")
        return super().forward(x)


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


def mse_refusing_negative_targets(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss that raises on the replica whose targets are negative (to fail one rank)."""
    if (target < 0).any():
        raise ValueError("negative target: this replica refuses its batch")
    return nn.functional.mse_loss(out, target)


def lm_loss(out: Any, labels: torch.Tensor) -> torch.Tensor:
    """A causal LM's shifted cross-entropy over its counted labels, as a user writes it
    (on a batch with no -100, its mean over microbatches and replicas is the batch's)."""
    logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def lm_loss_one_dies_one_busy(
    out: Any, labels: torch.Tensor, armed: str, fired: str, busy_s: float
) -> torch.Tensor:
    """:func:`lm_loss`, except that once the file ``armed`` exists, the first proc to
    compute it kills itself with SIGKILL (leaving ``fired-0``), and the second is busy
    in it for ``busy_s`` seconds first (leaving ``fired-busy``): a slow rank, which
    cannot let go of its piece while the trainer recovers."""
    import os
    import signal
    import time

    if os.path.exists(armed):
        for name in ("0", "busy"):
            try:
                os.close(os.open(f"{fired}-{name}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            if name == "0":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(busy_s)  # (the workload: a rank slow to compute its loss)
            break
    return lm_loss(out, labels)


def lm_loss_dying_once(
    out: Any, labels: torch.Tensor, armed: str, fired: str, times: int = 1
) -> torch.Tensor:
    """:func:`lm_loss`, except that once the file ``armed`` exists, the first proc to
    compute it after that kills itself with SIGKILL, mid-step (between its forward and
    its backward), leaving ``fired-0`` behind; with ``times`` > 1, the first after that
    does again (``fired-1``), and so on: ``times`` procs die in all."""
    import os
    import signal

    if os.path.exists(armed):
        for i in range(times):
            try:
                os.close(os.open(f"{fired}-{i}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            os.kill(os.getpid(), signal.SIGKILL)
    return lm_loss(out, labels)
