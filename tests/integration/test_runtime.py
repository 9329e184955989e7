"""The actor runtime end to end: real procs, real sockets."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from danaus import (
    Actor,
    ActorError,
    Channel,
    EndpointNotFoundError,
    SerializationError,
    SupervisionError,
    endpoint,
    this_host,
)
from danaus.actors._wire import CallSpec

from .actors_lib import BadInit, Counter, Echo, Recorder, Streamer


async def test_call_gathers_a_value_mesh_over_two_procs() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter, 3)
        result = await counters.incr.call(2)
        assert result.values() == [5, 5]
        assert [str(p) for p, _ in result.items()] == ["{'procs': 0/2}", "{'procs': 1/2}"]
        assert await counters.slice(procs=1).get.call_one() == 5


async def test_broadcast_then_calls_see_its_effect_in_order() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter, 3)
        counters.incr.broadcast()
        values = [v async for v in counters.get.stream()]
        assert sum(values) == 8


async def test_call_one_on_many_actors_is_a_value_error() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter)
        with pytest.raises(ValueError, match="exactly one actor"):
            counters.incr.call_one()


async def test_context_rank_and_size() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        who = (await echo.whoami.call()).values()
        assert [w["rank"] for w in who] == ["{'procs': 0/2}", "{'procs': 1/2}"]
        assert [w["rank_int"] for w in who] == [0, 1]
        assert who[1]["coords"] == {"procs": 1}
        assert who[0]["size"] == {"procs": 2}
        assert who[1]["actor_id"].endswith("echo[1]")


async def test_ten_thousand_pipelined_calls_arrive_in_order() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        rec = procs.spawn("rec", Recorder)
        futs = [rec.record.call_one(i) for i in range(10_000)]
        results = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert results == list(range(10_000))
        assert await rec.history.call_one() == list(range(10_000))


async def test_async_endpoints_still_handle_one_message_at_a_time_in_order() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        rec = procs.spawn("rec", Recorder)
        futs = [rec.arecord.call_one(i) if i % 2 else rec.record.call_one(i) for i in range(500)]
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert await rec.history.call_one() == list(range(500))


async def test_64_mib_numpy_array_round_trips_intact() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        a = np.random.default_rng(0).random(8 << 20)  # 64 MiB of float64
        b = await asyncio.wait_for(echo.echo.call_one(a), 30)
        assert b.dtype == a.dtype and b.shape == a.shape
        assert np.array_equal(a, b)


async def test_torch_tensors_round_trip_with_dtype_and_shape() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        t = torch.arange(1 << 18, dtype=torch.float32).reshape(512, 512)
        for x in (t, t.T, t.to(torch.bfloat16), torch.zeros(0, 3)):
            y = await echo.echo.call_one({"x": x})
            assert torch.equal(y["x"], x)
            assert y["x"].dtype == x.dtype


async def test_endpoint_error_carries_actor_rank_and_traceback_and_actor_survives() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(ActorError) as info:
            await echo.slice(procs=1).fail.call_one("boom")
        err = info.value
        assert err.exc_type == "ValueError"
        assert err.message == "boom"
        assert err.rank == "{'procs': 1/2}"
        assert "echo[1]" in err.actor
        assert "raise ValueError(msg)" in err.remote_traceback
        # Monarch's name for it, with Monarch's first line
        assert err.exception_formatted.startswith(
            "Traceback of where the remote call failed (most recent call last):"
        )
        assert "raise ValueError(msg)" in err.exception_formatted
        assert "boom" in str(err) and "{'procs': 1/2}" in str(err)
        assert await echo.slice(procs=1).echo.call_one(7) == 7


async def test_unknown_endpoint_lists_the_endpoints() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(EndpointNotFoundError, match="echo, exit_now, fail"):
            echo.nope  # noqa: B018
        # The proc checks too, for callers that bypass the class (e.g. an old client).
        from danaus.actors._loops import current_runtime
        from danaus.actors._serialize import dumps

        rt = current_runtime()
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        port = rt.open_port(lambda rank, status, value: fut.set_result(value) or True)
        raw, pickled, parts = dumps([[], {}], lambda: "args")
        spec = CallSpec(echo.wire_name, "nope", raw, pickled, parts)
        rt.send_call(echo.rank_addrs()[0][1], 0, port, spec)
        err = await asyncio.wait_for(fut, 10)
        assert isinstance(err, EndpointNotFoundError)
        assert "no endpoint 'nope'" in str(err) and "whoami" in str(err)


async def test_unpicklable_argument_fails_only_that_call() -> None:
    import threading

    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(
            SerializationError, match=r"arguments of Echo\.echo could not be pickled"
        ):
            echo.echo.call_one(threading.Lock())
        assert await echo.echo.call_one("still fine") == "still fine"


async def test_unpicklable_result_fails_only_that_call() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(SerializationError, match=r"return value of Echo\.unpicklable_result"):
            await echo.unpicklable_result.call_one()
        assert await echo.echo.call_one(1) == 1


async def test_port_passed_to_an_actor_receives_values_in_order() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = procs.spawn("s", Streamer)
        port, receiver = Channel[int].open()
        s.feed.broadcast(port, 100)
        got = [await asyncio.wait_for(receiver.recv(), 10) for _ in range(100)]
        assert got == list(range(100))


async def test_port_exception_raises_in_the_receiver() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        s = procs.spawn("s", Streamer)
        port, receiver = Channel[int].open()
        await s.feed_error.call_one(port)
        assert await receiver.recv() == 1
        with pytest.raises(ActorError, match="KeyError"):
            await receiver.recv()


async def test_local_port_send_and_close() -> None:
    port, receiver = Channel[str].open()
    port.send("a")
    port.close()
    assert await asyncio.wait_for(receiver.recv(), 5) == "a"
    from danaus import ClosedError

    with pytest.raises(ClosedError):
        await asyncio.wait_for(receiver.recv(), 5)


async def test_init_that_raises_fails_the_spawn_naming_the_rank() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        actors = procs.spawn("bad", BadInit, 1)
        with pytest.raises(ActorError, match="init failed on purpose") as info:
            await asyncio.wait_for(actors.initialized, 10)
        assert info.value.rank == "{'procs': 1/2}"
        assert await actors.slice(procs=0).ping.call_one() == "pong"
        with pytest.raises(
            SupervisionError, match=r"rank \{'procs': 1/2\} failed: .*init failed on purpose"
        ):
            await actors.slice(procs=1).ping.call_one()


async def test_spawn_rejects_a_non_actor_class() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        with pytest.raises(TypeError, match=r"subclass of danaus\.Actor"):
            procs.spawn("x", dict)  # type: ignore[type-var]


async def test_get_inside_a_running_loop_says_to_await() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        fut = echo.echo.call_one(1)
        with pytest.raises(RuntimeError, match="await"):
            fut.get()
        assert await fut == 1


async def test_choose_spreads_calls_over_the_mesh() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        pids = {await echo.pid.choose() for _ in range(4)}
        assert pids == set(procs.pids)


async def test_a_malformed_plain_argument_payload_fails_only_that_call() -> None:
    from danaus.actors._loops import current_runtime
    from danaus.actors._serialize import encode_plain

    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        rt = current_runtime()
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        port = rt.open_port(lambda rank, status, value: fut.set_result(value) or True)
        # not [args, kwargs]
        rt.send_call(
            echo.rank_addrs()[0][1], 0, port, CallSpec(echo.wire_name, "echo", encode_plain(5))
        )
        err = await asyncio.wait_for(fut, 10)
        assert isinstance(err, SerializationError)
        assert "arguments of Echo.echo could not be decoded" in str(err)
        assert await echo.echo.call_one("fine") == "fine"


class HandlerCheck(Actor):
    @endpoint
    def unhandled(self) -> list[str]:
        return _unhandled()


def _unhandled() -> list[str]:
    """Message types of the wire union that the calling runtime has no handler for."""
    from typing import get_args

    from danaus.actors._loops import current_runtime
    from danaus.actors._wire import Message

    handlers = current_runtime().handlers
    return sorted(t.__name__ for t in get_args(Message) if t not in handlers)


@pytest.mark.parametrize("method", ["fork", "exec"])
async def test_every_message_type_has_a_handler_in_a_fresh_proc(method: str) -> None:
    from danaus.config import config

    old, config.spawn_method = config.spawn_method, method
    try:
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            assert await procs.spawn("check", HandlerCheck).unhandled.call_one() == []
    finally:
        config.spawn_method = old
    assert _unhandled() == []  # and in the controller
