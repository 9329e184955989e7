"""A trainer's keepers on real procs: a copy read over the data plane and given back
whole; a copy that is being written, or of another step, refused with the reason; a
successor's copy read from the first keeper that has it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from danaus import this_host  # noqa: E402
from danaus.errors import ActorError  # noqa: E402
from danaus.parallel._copies import (  # noqa: E402
    Copy,
    Keeper,
    Keepers,
    copy_layout,
    set_stamp,
)
from danaus.parallel._staging import pack_into, views  # noqa: E402
from danaus.rdma import RDMABuffer  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _copy(step: int, stamp: int | None = None) -> tuple[Copy, dict[str, torch.Tensor]]:
    """A copy of some state after ``step``, in a buffer of this process (the controller),
    stamped ``stamp`` (default: ``step``, a whole copy)."""
    tensors = {"m.w": torch.randn(64, 32), "o.0.step": torch.tensor(float(step))}
    specs, size = copy_layout(tensors)
    data = torch.empty(size, dtype=torch.uint8)
    pack_into(data, tensors, specs)
    set_stamp(data, step if stamp is None else stamp)
    return Copy(step, RDMABuffer(data), specs, size, {"loss_scale": 1.0}), tensors


async def test_a_keeper_holds_a_copy_and_gives_it_back_whole() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        keepers = Keepers(procs.spawn("keepers", Keeper))
        copy, tensors = _copy(5)
        assert await keepers.at(1).hold.call_one(0, copy) == 5
        assert (0, 5) in await keepers.at(1).steps.call_one()
        given = await keepers.at(1).give.call_one(0, 5)
        back = torch.empty(given.nbytes, dtype=torch.uint8)
        await given.buffer.read_into(back)
        got = views(back, given.specs)
        assert torch.equal(got["m.w"], tensors["m.w"]) and given.rest == {"loss_scale": 1.0}
        assert await keepers.at(1).nbytes.call_one() == given.nbytes
        with pytest.raises(ActorError, match=r"no copy of rank 0's state after step 4 .*\(0, 5\)"):
            await keepers.at(1).give.call_one(0, 4)


async def test_a_copy_being_written_or_of_another_step_is_refused() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        keepers = Keepers(procs.spawn("keepers", Keeper))
        writing, _ = _copy(7, stamp=-1)  # cleared: the worker is writing it
        with pytest.raises(
            ActorError, match=r"copy of step 7 .* overwritten: it was being written"
        ):
            await keepers.at(0).hold.call_one(3, writing)
        later, _ = _copy(7, stamp=9)  # overwritten by step 9's
        with pytest.raises(ActorError, match=r"copy of step 7 .* overwritten: it now holds step 9"):
            await keepers.at(0).hold.call_one(3, later)
        assert await keepers.at(0).steps.call_one() == []  # nothing torn kept


async def test_a_successor_reads_its_copy_from_the_first_keeper_that_has_it_whole() -> None:
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        keepers = Keepers(procs.spawn("keepers", Keeper))
        good, tensors = _copy(2)
        torn, _ = _copy(2, stamp=-1)
        await keepers.at(2).hold.call_one(0, good)
        # keeper 0 names a copy that is being written over; keeper 1 none at all
        await keepers.at(0).mine.call_one((0,), torn)
        await keepers.at(0).adopt.call_one(0, 2, keepers, [0, 1, 2], (0,), True)
        given = await keepers.at(0).give.call_one(0, 2)
        back = torch.empty(given.nbytes, dtype=torch.uint8)
        await given.buffer.read_into(back)
        assert torch.equal(views(back, given.specs)["m.w"], tensors["m.w"])
        await keepers.at(0).settle.call_one()  # (read for a successor: dropped after)
        assert await keepers.at(0).nbytes.call_one() == 0
        with pytest.raises(ActorError, match=r"keeper 0: .*overwritten.*; keeper 1: .*no copy"):
            await keepers.at(1).adopt.call_one(0, 2, keepers, [0, 1], (0,), True)
