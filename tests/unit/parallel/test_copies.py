"""The copies of each rank's state that a lost proc's successor starts from: packed and
read back whole, and the step a recovery restores chosen from what the survivors hold."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from danaus.parallel._copies import (  # noqa: E402
    STAMP,
    Places,
    copy_layout,
    lacking,
    restore_point,
    whole_state,
)
from danaus.parallel._staging import ALIGN, copy_each, pack_into, packing, views  # noqa: E402


def test_a_packed_copy_reads_back_every_tensor_bit_for_bit() -> None:
    tensors = {
        "m.weight": torch.randn(3, 5),
        "m.ids": torch.arange(7, dtype=torch.int64),
        "o.0.step": torch.tensor(12.0),  # Adam's step: no dims
        "o.0.exp_avg": torch.randn(3, 5, dtype=torch.float64),
        "m.empty": torch.empty(0, 4),
        "m.half": torch.randn(9).to(torch.bfloat16),
        "m.flag": torch.tensor([True, False, True]),
    }
    specs, size = copy_layout(tensors)
    assert all(at % ALIGN == 0 for _, _, _, at in specs)
    assert size >= specs[-1][3] + STAMP  # (the step's stamp after the tensors)
    out = torch.full((size,), 0xAB, dtype=torch.uint8)
    pack_into(out, tensors, specs)
    back = views(out, specs)
    assert list(back) == list(tensors)
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and back[k].shape == t.shape, k
        assert torch.equal(back[k], t), k


def test_a_copy_of_a_non_contiguous_tensor_is_of_its_values() -> None:
    t = torch.arange(12.0).view(3, 4).t()  # (a transposed view: not contiguous)
    specs, size = copy_layout({"m.t": t})
    out = torch.empty(size, dtype=torch.uint8)
    pack_into(out, {"m.t": t}, specs)
    assert torch.equal(views(out, specs)["m.t"], t)


def test_a_copy_made_again_each_step_copies_the_values_of_that_step() -> None:
    """What a worker's copier does: where each tensor goes is worked out once
    (``packing``), and each step copies the state as it is then (the optimizer changed
    it in place), the buffers first and the rest after, as two lists."""
    weight, avg = torch.randn(4, 6), torch.randn(6, 4).t()  # (one not contiguous)
    tensors = {"m.weight": weight, "m.buf": torch.zeros(3), "o.0.exp_avg": avg}
    specs, size = copy_layout(tensors)
    out = torch.empty(size, dtype=torch.uint8)
    now = packing(out, tensors, specs, only={"m.buf"})
    rest = packing(out, tensors, specs, skip={"m.buf"})
    assert len(now[0]) == 1 and len(rest[0]) == 2
    for step in range(3):
        with torch.no_grad():
            weight.add_(1.0)
            avg.mul_(2.0)
            tensors["m.buf"].fill_(step)
        copy_each(*now)
        copy_each(*rest)
        back = views(out, specs)
        for k, t in tensors.items():
            assert torch.equal(back[k], t), (step, k)


def _ring(n: int, done: int, late: set[int] = frozenset()) -> dict[int, list[tuple[int, int]]]:
    """What each keeper of a trainer of ``n`` ranks, none of them DDP replicas, holds
    once step ``done`` ended on the controller: its own rank's copies of the last two
    steps, and the previous rank's (``late``: ranks whose peer has not read the copy of
    ``done`` yet, so holds the two before)."""
    held: dict[int, list[tuple[int, int]]] = {}
    for k in range(n):
        src = (k - 1) % n
        peer = [done - 2, done - 1] if src in late else [done - 1, done]
        held[k] = [(k, done - 1), (k, done)] + [(src, s) for s in peer]
    return held


def test_one_lost_rank_restores_every_rank_at_the_step_that_ended() -> None:
    held = _ring(4, done=7)
    del held[2]  # lost: its own copies, and its copy of rank 1's
    step, where = restore_point(4, held, latest=7, oldest=4)
    assert step == 7
    # each from its own proc's copy first, then its peer's; rank 2 from its peer's
    assert where == {0: [0, 1], 1: [1], 2: [3], 3: [3, 0]}


def test_a_copy_not_yet_read_restores_the_step_before() -> None:
    held = _ring(4, done=7, late={2})
    del held[2]
    assert restore_point(4, held, latest=7, oldest=4) == (6, {0: [0, 1], 1: [1], 2: [3], 3: [3, 0]})
    # and no step before those kept to run again
    assert restore_point(4, held, latest=7, oldest=7) is None


def test_neighbours_lost_together_leave_no_step_covered() -> None:
    held = _ring(4, done=7)
    del held[1], held[2]  # rank 1's copies were on procs 1 and 2
    assert restore_point(4, held, latest=7, oldest=0) is None
    held = _ring(4, done=7)
    del held[0], held[2]  # not neighbours: each one's copy survives on the next
    assert restore_point(4, held, latest=7, oldest=0) == (7, {0: [1], 1: [1], 2: [3], 3: [3]})


def test_a_step_after_the_one_the_controller_saw_end_is_never_chosen() -> None:
    # every rank finished step 8 as the proc died, but the controller had not heard:
    # its batch is the call that runs again, so the workers must start from step 7
    held = {k: [(k, 7), (k, 8), ((k - 1) % 3, 7), ((k - 1) % 3, 8)] for k in range(3)}
    del held[0]
    assert restore_point(3, held, latest=7, oldest=5) == (7, {0: [1], 1: [1, 2], 2: [2]})


def test_ddp_replicas_serve_every_rank_from_two_of_them() -> None:
    # dp=4 under DDP: replicas 0 and 1 keep their two latest steps for all four ranks
    serves = [(r, s) for r in range(4) for s in (4, 5)]
    held = {0: serves, 1: serves, 2: [], 3: []}
    del held[0]
    assert restore_point(4, held, latest=5, oldest=2) == (5, {0: [1], 1: [1], 2: [1], 3: [1]})


def _places(
    rank: int, shape: tuple[int, ...], offset: tuple[int, ...], local: tuple[int, ...]
) -> Places:
    return Places(
        rank,
        1,
        {"m.w": ("w", (shape, offset, local)), "m.b": ("b", None)},
        (("w", (shape, offset, local)),),
    )


def test_the_whole_tensors_are_built_from_each_ranks_shards() -> None:
    w = torch.arange(20.0).view(5, 4)  # 5 rows over 2 ranks: 3 and 2 (torch.chunk's)
    avg = -w
    copies = {
        0: {
            "m.w": w[:3],
            "m.b": torch.ones(4),
            "o.0.exp_avg": avg[:3],
            "o.0.step": torch.tensor(7.0),
        },
        1: {
            "m.w": w[3:],
            "m.b": torch.ones(4),
            "o.0.exp_avg": avg[3:],
            "o.0.step": torch.tensor(7.0),
        },
    }
    places = {0: _places(0, (5, 4), (0, 0), (3, 4)), 1: _places(1, (5, 4), (3, 0), (2, 4))}
    got = whole_state(copies, places, lambda name, t, tp: t)
    assert set(got) == {"model.w", "model.b", "optim.w.exp_avg", "optim.w.step"}
    assert torch.equal(got["model.w"], w) and torch.equal(got["optim.w.exp_avg"], avg)
    assert got["optim.w.step"].item() == 7.0 and torch.equal(got["model.b"], torch.ones(4))


def test_a_rank_whose_copy_is_missing_leaves_its_tensors_short_and_says_so() -> None:
    w = torch.arange(20.0).view(5, 4)
    copies = {0: {"m.w": w[:3], "m.b": torch.ones(4)}}
    places = {0: _places(0, (5, 4), (0, 0), (3, 4))}
    with pytest.raises(LookupError, match=r"cover model\.w only in part"):
        whole_state(copies, places, lambda name, t, tp: t)


def test_what_a_partial_state_lacks_is_named_per_tensor_and_per_parameter() -> None:
    places = {
        0: Places(0, 1, {"m.a": ("a", None)}, (("a", None),)),
        1: Places(1, 1, {"m.b": ("b", None), "m.mask": ("mask", None)}, (("b", None),)),
    }
    state = {"model.a": torch.ones(1), "optim.a.exp_avg": torch.ones(1)}
    assert lacking(state, places) == ["model.b", "model.mask", "optim.b"]
    whole = {**state, "model.b": torch.ones(1), "model.mask": torch.ones(1)}
    assert lacking(whole | {"optim.b.step": torch.tensor(1.0)}, places) == []
