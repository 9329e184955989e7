"""A shard packed into one buffer and viewed back, as the data plane carries it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from danaus.parallel._model import Shard  # noqa: E402
from danaus.parallel._staging import ALIGN, Staged, pack, unpack  # noqa: E402


def test_a_packed_shard_unpacks_to_the_same_tensors_each_aligned() -> None:
    g = torch.Generator().manual_seed(0)
    shard = Shard(
        torch.randint(0, 50_000, (3, 7), generator=g),  # int64
        None,  # a middle stage reads no target
        {
            "attention_mask": torch.ones(3, 7, dtype=torch.bool),  # 21 bytes: unaligned end
            "position_ids": torch.arange(7, dtype=torch.int32).expand(3, 7),  # not contiguous
            "scale": torch.randn(3, 5, generator=g, dtype=torch.bfloat16),
        },
        (3, 7),
    )
    data, specs, rest = pack(shard)
    assert rest == {"target": None}
    assert all(at % ALIGN == 0 for *_, at in specs)
    back = unpack(data, Staged(None, specs, int(data.numel()), shard.shape, rest))
    assert back.target is None and back.shape == (3, 7)
    assert torch.equal(back.inputs, shard.inputs) and back.inputs.dtype == torch.int64
    assert set(back.kwargs) == set(shard.kwargs)
    for k, v in shard.kwargs.items():
        assert back.kwargs[k].dtype == v.dtype and torch.equal(back.kwargs[k], v), k
