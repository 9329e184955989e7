"""The example's model and the two actors that hold it: ``Replica`` and ``Trainer``.

The model is a tiny character-level language model (an embedding, one GRU layer and a
linear head over a 45-character vocabulary: 140,301 float32 parameters, 548 KiB), built
and seeded in code: nothing is downloaded. Its weights are noise until the trainer
trains them (a few dozen steps on the built-in corpus make it recite that), so its
text is gibberish, but deterministic: the same seed and prompt always give the same
tokens, which is what the tests check.

All parameters are views into one contiguous float32 tensor (``model.flat``), so a
single ``RDMABuffer`` covers every weight and ``read_into(model.flat)`` lands the new
weights directly in the parameters, with no copy and no ``load_state_dict``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from danaus import Actor, Port, endpoint
from danaus.rdma import RDMABuffer

__all__ = ["CORPUS", "VOCAB", "CharModel", "Replica", "Trainer", "build"]

#: the characters the model reads and writes; anything else reads as a space
VOCAB = " abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'-"
_INDEX = {c: i for i, c in enumerate(VOCAB)}

#: what the trainer trains on (a stand-in for a real data set)
CORPUS = (
    "the quick brown fox jumps over the lazy dog. a single controller drives a mesh of "
    "actors, one line at a time. replicas answer requests while the trainer learns, and "
    "fresh weights move from the trainer to every replica without a restart. "
)


def encode(text: str) -> list[int]:
    """Character ids of ``text`` (lower-cased; unknown characters become spaces)."""
    return [_INDEX.get(c, 0) for c in text.lower()]


class CharModel(nn.Module):
    """Embedding, one GRU layer, linear head; every parameter a view of ``self.flat``."""

    def __init__(self, embed: int = 32, hidden: int = 192) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, len(VOCAB))
        self.flat = _flatten(self)

    def forward(
        self, ids: torch.Tensor, h: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits for each position of ``ids`` (batch, time), and the last hidden state."""
        out, h = self.rnn(self.embed(ids), h)
        return self.head(out), h

    @torch.inference_mode()
    def generate(self, prompt: str, max_tokens: int) -> Iterator[str]:
        """Greedy decoding: yields ``max_tokens`` characters, one as each is produced."""
        ids = encode(prompt) or [0]
        logits, h = self(torch.tensor([ids]))
        for _ in range(max_tokens):
            nxt = int(logits[0, -1].argmax())
            yield VOCAB[nxt]
            logits, h = self(torch.tensor([[nxt]]), h)

    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()


def _flatten(model: nn.Module) -> torch.Tensor:
    """Move every parameter into one contiguous float32 tensor; returns that tensor."""
    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32)
    offset = 0
    for p in params:
        n = p.numel()
        view = flat[offset : offset + n]
        view.copy_(p.detach().reshape(-1))
        p.data = view.view_as(p)
        offset += n
    return flat


def build(seed: int) -> CharModel:
    """The example model with weights drawn from ``seed`` (same seed, same weights).

    A local generator keeps the global torch RNG untouched; the scales keep the
    recurrence lively enough that different seeds write visibly different text.
    """
    model = CharModel()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("embed"):
                scale = 1.0
            elif "bias" in name:
                scale = 0.1
            else:
                scale = 1.5 / p.shape[-1] ** 0.5
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


class Replica(Actor):
    """One model replica. It handles one message at a time, so a ``reload`` queued
    behind ``generate`` calls waits for them to finish: no request sees half-old,
    half-new weights, and none is dropped."""

    def __init__(self, seed: int) -> None:
        torch.set_num_threads(1)  # batch-1 decoding: more threads only contend
        self.model = build(seed)
        self.version = 0
        self.served = 0
        self.tokens = 0
        self.cancelled = 0  # generations stopped because their client left

    @endpoint
    async def generate(self, prompt: str, max_tokens: int, port: Port[str]) -> list[str]:
        """Send each token on ``port`` as it is produced; return all of them at the end.

        The return value is authoritative: the controller ends the stream on it (and
        fills in any tokens it has not seen yet), so it needs no end marker.
        """
        out = []
        try:
            for tok in self.model.generate(prompt, max_tokens):
                out.append(tok)
                port.send(tok)
                # Yield to the proc's loop: the token's frame goes out now, not at the
                # end; and a cancelled call (the client left) stops here.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.served += 1
        self.tokens += len(out)
        return out

    @endpoint
    async def reload(self, buf: RDMABuffer, version: int) -> dict[str, Any]:
        """Read new weights straight into the parameters (one one-sided transfer)."""
        t0 = time.perf_counter()
        await buf.read_into(self.model.flat)
        seconds = time.perf_counter() - t0
        self.version = version
        return {"bytes": buf.size(), "seconds": seconds, "version": version}

    @endpoint
    def state(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": self.version,
            "served": self.served,
            "tokens": self.tokens,
            "cancelled": self.cancelled,
        }


class Trainer(Actor):
    """Holds a second copy of the weights, trains it, and publishes it for the replicas."""

    def __init__(self, seed: int) -> None:
        torch.set_num_threads(1)
        self.model = build(seed)
        self.version = 1  # the replicas start at version 0: other weights
        self.snapshot: tuple[int, RDMABuffer] | None = None

    @endpoint
    async def train(self, steps: int) -> float:
        """``steps`` of Adam on the built-in corpus (off the proc's loop); the last loss."""
        loss = await asyncio.to_thread(self._train, steps)
        self.version += 1
        return loss

    def _train(self, steps: int) -> float:
        ids = torch.tensor(encode(CORPUS))
        opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(self.version)
        loss = torch.tensor(0.0)
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - 65, (16,), generator=g)
            batch = torch.stack([ids[s : s + 65] for s in starts.tolist()])
            logits, _ = self.model(batch[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, len(VOCAB)), batch[:, 1:].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        return float(loss.detach())

    @endpoint
    async def publish(self) -> tuple[int, RDMABuffer]:
        """``(version, buffer)`` of the current weights.

        The buffer is a snapshot, so a later ``train`` never tears a read in progress.
        Only the latest snapshot stays registered; the one before is dropped (the
        server serializes reloads, so nobody is reading it any more).
        """
        if self.snapshot is not None and self.snapshot[0] == self.version:
            return self.snapshot
        old = self.snapshot
        self.snapshot = (self.version, RDMABuffer(self.model.flat.clone()))
        if old is not None:
            await old[1].drop()
        return self.snapshot
