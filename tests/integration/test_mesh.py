"""Meshes: shapes, adverbs, references between actors, and the casting tree."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Iterator

import pytest

from danaus import Accumulator, Channel, this_host
from danaus.config import config

from .actors_lib import Caller, Counter, Echo, Recorder, Streamer


@pytest.fixture
def fanout() -> Iterator[None]:
    """A fan-out of 2, so a mesh of 7 casts down a tree of depth 3."""
    old = config.cast_fanout
    config.cast_fanout = 2
    yield
    config.cast_fanout = old


async def test_broadcast_incr_then_streamed_values_sum_to_8() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter, 3)
        counters.incr.broadcast()
        assert sum([v async for v in counters.get.stream()]) == 8


async def test_current_rank_in_a_2d_mesh() -> None:
    async with this_host().spawn_procs(per_host={"hosts": 1, "gpus": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        ranks = await echo.whoami.call()
        assert ranks.item(hosts=0, gpus=1)["rank"] == "{'hosts': 0/1, 'gpus': 1/2}"
        assert ranks.sizes == {"hosts": 1, "gpus": 2}


async def test_accumulator_sums_over_the_mesh() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter, 2)
        assert await Accumulator(counters.get, 0, operator.add).accumulate() == 4


async def test_port_passed_to_a_broadcast_endpoint_gets_100_values_in_order() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = procs.spawn("s", Streamer)
        port, receiver = Channel[int].open()
        s.feed.broadcast(port, 100)
        assert [await asyncio.wait_for(receiver.recv(), 10) for _ in range(100)] == list(range(100))


async def test_a_mesh_slice_passed_to_another_actor_is_called_from_there() -> None:
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        counters = procs.spawn("counter", Counter, 10)
        caller = procs.slice(procs=0).spawn("caller", Caller)
        assert await caller.call_mesh.call_one(counters.slice(procs=slice(1, 3)), 5) == [15, 15]
        assert await caller.call_each.call_one(counters) == [10, 15, 15]
        assert await caller.sum_values.call_one(counters) == 40


async def test_shape_vocabulary_on_meshes() -> None:
    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        echo = procs.spawn("echo", Echo)
        grid = echo.split("procs", {"x": 2, "y": 2})
        assert grid.sizes == {"x": 2, "y": 2}
        col = grid.slice(y=1)
        assert [w["rank_int"] for w in (await col.whoami.call()).values()] == [0, 1]
        assert grid.rename(x="row").sizes == {"row": 2, "y": 2}
        assert len(grid.flatten("all")) == 4
        assert procs.split("procs", {"x": 2, "y": 2}).slice(x=1).pids == procs.pids[2:]


async def test_choose_prefers_the_least_loaded_actor() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        busy = echo.wait_forever.choose()  # occupies one actor (never returns)
        pids = {await asyncio.wait_for(echo.pid.choose(), 10) for _ in range(3)}
        assert len(pids) == 1  # every later choice avoided the busy actor
        busy.cancel()


async def test_await_spawn_gives_the_initialized_mesh() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = await procs.spawn("counter", Counter, 1)
        assert (await counters.get.call()).values() == [1, 1]


async def test_tree_cast_reaches_every_actor_and_gathers(fanout: None) -> None:
    async with this_host().spawn_procs(per_host={"procs": 7}) as procs:
        counters = procs.spawn("counter", Counter, 0)
        result = await asyncio.wait_for(counters.incr.call(1), 20)
        assert result.values() == [1] * 7
        counters.incr.broadcast(2)
        assert (await counters.get.call()).values() == [3] * 7
        assert await Accumulator(counters.get, 100, operator.add).accumulate() == 121
        assert sorted([v async for v in counters.get.stream()]) == [3] * 7
        whos = await procs.spawn("echo", Echo).whoami.call()
        assert [w["rank_int"] for w in whos.values()] == list(range(7))


async def test_order_per_sender_holds_across_tree_casts_and_direct_calls(fanout: None) -> None:
    async with this_host().spawn_procs(per_host={"procs": 7}) as procs:
        rec = procs.spawn("rec", Recorder)
        await rec.initialized
        futs = []
        for i in range(200):
            if i % 3 == 0:
                futs.append(rec.record.call(i))
            else:  # direct to the last actor: overtakes the tree unless order is kept
                futs.append(rec.slice(procs=6).record.call_one(i))
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        history = (await rec.history.call()).values()
        assert history[6] == list(range(200))
        assert history[3] == list(range(0, 200, 3))


async def test_tree_cast_error_comes_back_as_actor_error(fanout: None) -> None:
    from danaus import ActorError

    async with this_host().spawn_procs(per_host={"procs": 5}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(ActorError, match="tree boom"):
            await asyncio.wait_for(echo.fail.call("tree boom"), 20)
        assert (await echo.echo.call(1)).values() == [1] * 5


async def test_this_proc_runs_actors_in_the_controller() -> None:
    import os

    from danaus import this_proc

    async with this_proc() as here:
        counters = await here.spawn("counter", Counter, 5)
        assert await counters.incr.call_one(1) == 6
        echo = await here.spawn("echo", Echo)
        assert await echo.pid.call_one() == os.getpid()
        who = await echo.whoami.call_one()
        assert who["rank"] == "{}"
    from danaus import SupervisionError

    with pytest.raises(SupervisionError, match="stopped"):
        await counters.incr.call_one(1)


async def test_choose_skips_failed_ranks() -> None:
    import os
    import signal

    from danaus.mesh import set_unhandled_fault_hook

    got: list[object] = []
    event = asyncio.Event()
    old = set_unhandled_fault_hook(lambda f: (got.append(f), event.set()))
    try:
        async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
            echo = await procs.spawn("echo", Echo)
            os.kill(procs.pids[1], signal.SIGKILL)
            await asyncio.wait_for(event.wait(), 10)
            pids = {await echo.pid.choose() for _ in range(6)}
            assert pids == {procs.pids[0], procs.pids[2]}
    finally:
        set_unhandled_fault_hook(old)


async def test_a_missing_sequence_number_delays_but_never_blocks_an_actor() -> None:
    """A message whose predecessor was lost (e.g. with a failed cast-tree node) is handled
    after seq_gap_timeout instead of waiting forever."""
    from danaus.actors._loops import current_runtime

    async with this_host().spawn_procs(
        per_host={"procs": 1}, env={"DANAUS_SEQ_GAP_TIMEOUT": "0.3"}
    ) as procs:
        rec = await procs.spawn("rec", Recorder)
        rt = current_runtime()
        addr = rec.rank_addrs()[0][1]
        rt.next_seq(addr, rec.wire_name)  # this number is never sent: "lost"
        fut = rec.record.call_one(7)
        assert await asyncio.wait_for(fut, 10) == 7
        assert await rec.history.call_one() == [7]


async def test_this_host_is_not_fake_its_procs_are_os_processes() -> None:
    import os

    host = this_host()
    assert not host.is_fake_in_process  # Monarch's flag: danaus never fakes procs
    async with host.spawn_procs(per_host={"gpus": 4}) as procs:
        pids = (await asyncio.wait_for(procs.spawn("echo", Echo).pid.call(), 60)).values()
    assert len(set(pids)) == 4 and os.getpid() not in pids


async def test_labels_give_rank_zeros_coordinates_as_monarchs_examples_read_them() -> None:
    async with this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        first = dict.fromkeys(procs._labels, 0)  # Monarch's DDP example does this
        assert first == {"hosts": 0, "gpus": 0}
        pids = (await asyncio.wait_for(echo.pid.call(), 60)).values()
        assert await echo.slice(**first).pid.call_one() == pids[0]
        assert echo.slice(hosts=1)._labels == ["gpus"]


def test_two_threads_spawning_unnamed_meshes_at_once_get_two_names() -> None:
    import threading

    barrier = threading.Barrier(2)
    meshes: list[object] = []
    errors: list[BaseException] = []

    def spawn() -> None:
        try:
            barrier.wait(30)
            meshes.append(this_host().spawn_procs(per_host={"procs": 1}))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=spawn) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    try:
        assert not errors
        names = {m.name for m in meshes}  # type: ignore[attr-defined]
        assert len(names) == 2, names
    finally:
        for m in meshes:
            m.stop().get(60)  # type: ignore[attr-defined]
