"""Monarch names with Monarch's semantics, where a Monarch program would notice: actors and
their endpoints, futures, ranks, remote exceptions, controllers and ports. Proc and host
meshes: test_monarch_compat_meshes.py; whole programs, and workers in other processes:
test_monarch_compat_programs.py."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import danaus
from danaus import Actor, ActorError, MeshFailure, endpoint, this_host

from ..faults import Failures
from .exec_actors import Worker


class Shadowing(Actor):
    @endpoint
    def stop(self) -> str:
        return "the endpoint"

    @endpoint
    def slice(self) -> str:
        return "the endpoint"


async def test_an_endpoint_an_actor_mesh_attribute_would_shadow_is_refused_at_spawn() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        with pytest.raises(ValueError, match="could never reach: slice, stop"):
            procs.spawn("s", Shadowing)


async def test_the_module_attribute_fault_hook_and_report_as_a_method(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got: asyncio.Future[MeshFailure] = asyncio.get_running_loop().create_future()
    monkeypatch.setattr(danaus, "unhandled_fault_hook", lambda f: got.done() or got.set_result(f))
    async with this_host().spawn_procs(per_host={"procs": 1}, name="hooked") as procs:
        w = await procs.spawn("w", Worker)
        os.kill(procs.pids[0], signal.SIGKILL)
        failure = await asyncio.wait_for(got, 30)
        assert failure.mesh_name == failure.mesh
        # report() is Monarch's report, which names the actor and the cause in its words
        assert failure.report().startswith(
            "The actor hooked[0].<tests.integration.exec_actors.Worker w{'procs': 0/1}> and "
            "all its descendants have failed: the process this actor was running on failed: "
            "Killed(sig=9) ("
        ), failure.report()
        assert "SIGKILL" in failure.report and failure.report in failure.report()
        del w


async def test_future_result_and_exception_wait_like_monarchs() -> None:
    from danaus import ActorError

    from .exec_actors import Caller

    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", Worker)
        c = await procs.spawn("c", Caller)  # no `other`: relay() raises
        ok = w.incr.call_one(2)
        with pytest.raises(asyncio.InvalidStateError):
            ok.result()  # pending, on its own loop: asyncio's behaviour, never a deadlock
        assert ok.as_asyncio() is ok
        # From another thread they wait, as Monarch's do.
        assert await asyncio.to_thread(ok.result, 30) == 2
        bad = c.relay.call_one(1)
        err = await asyncio.to_thread(bad.exception, 30)
        assert isinstance(err, ActorError) and "AttributeError" in err.exc_type
        assert await asyncio.to_thread(w.incr.call_one(1).exception, 30) is None
        assert ok.result() == 2  # done: at once, anywhere


async def test_stop_with_a_reason_and_value_mesh_get() -> None:
    from danaus import SupervisionError

    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        w = await procs.spawn("w", Worker)
        values = await w.incr.call(3)
        assert values.get(0) == values.get(1) == 3
        with pytest.raises(IndexError):
            values.get(2)
        await w.stop(reason="drained for maintenance")
        with pytest.raises(SupervisionError, match="drained for maintenance"):
            await asyncio.wait_for(w.slice(procs=0).incr.call_one(1), 10)
        other = await procs.spawn("other", Worker)
        await procs.stop(reason="job done")
        with pytest.raises(SupervisionError, match="job done"):
            await asyncio.wait_for(other.slice(procs=1).incr.call_one(1), 10)


async def test_a_mesh_passed_on_right_after_spawn_works() -> None:
    from .exec_actors import Caller

    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        target = procs.slice(procs=0).spawn("target", Worker)  # not awaited
        callers = procs.slice(procs=1).spawn("callers", Caller, target)  # passed on at once
        assert await asyncio.wait_for(callers.relay.call_one(5), 60) == 5
        assert await asyncio.wait_for(callers.relay.call_one(1), 60) == 6


async def test_stream_yields_futures_in_arrival_order_as_monarchs() -> None:
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        w = await procs.spawn("w", Worker)
        futures = list(w.incr.stream(2))  # the stream object itself is gone now
        assert len(futures) == 3 and all(isinstance(f, danaus.Future) for f in futures)
        assert [await f for f in futures] == [2, 2, 2]
        assert sorted([await f for f in w.incr.stream(1)]) == [3, 3, 3]
        assert sorted([v async for v in w.aget.stream()]) == [3, 3, 3]


async def test_split_with_monarchs_keywords_size_of_dims_and_extent() -> None:
    from .compat_actors import Ranks

    async with this_host().spawn_procs(per_host={"procs": 4}) as procs:
        grid = procs.split(procs=("x", "y"), y=2)
        assert grid.extent.labels == ["x", "y"] and grid.extent.sizes == [2, 2]
        assert grid.size(["x", "y"]) == 4 and grid.size("y") == 2
        ranks = await procs.spawn("ranks", Ranks)
        mesh = ranks.split(procs=("x", "y"), x=2)
        assert mesh.extent == danaus.Extent(["x", "y"], [2, 2])
        column = await mesh.slice(y=1).who.call()
        assert [v["own_rank"] for v in column.values()] == [1, 3]
        assert [v["pid"] for v in column.values()] == procs.split(procs=("x", "y"), y=2).slice(
            y=1
        ).pids
        values = await ranks.who.call()
        assert values.split(procs=("x", "y"), y=2).slice(x=1).extent.sizes == [2]


@pytest.mark.parametrize("fanout", [16, 2], ids=["direct", "cast-tree"])
async def test_current_rank_is_the_message_rank_and_the_own_rank_stays_in_context(
    fanout: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .compat_actors import Ranks

    monkeypatch.setattr(danaus.config, "cast_fanout", fanout)
    async with this_host().spawn_procs(per_host={"procs": 5}) as procs:
        ranks = await procs.spawn("ranks", Ranks)
        whole = (await ranks.who.call()).values()
        assert [v["message"] for v in whole] == [v["own"] for v in whole]
        assert [v["size"] for v in whole] == [{"procs": 5}] * 5
        tail = (await ranks.slice(procs=slice(1, 5, 1)).who.call()).values()
        assert [v["own_rank"] for v in tail] == [1, 2, 3, 4]
        assert [v["message"] for v in tail] == [{"procs": i} for i in range(4)]
        assert [v["size"] for v in tail] == [{"procs": 4}] * 4
        odd = (await ranks.slice(procs=slice(1, None, 2)).awho.call()).values()
        assert odd == [{"message": {"procs": i}, "size": {"procs": 2}} for i in range(2)]
        one = await ranks.slice(procs=3).who.call_one()
        assert (one["own_rank"], one["message"], one["size"]) == (3, {}, {})
        grid = ranks.slice(procs=slice(0, 4)).split(procs=("x", "y"), y=2).slice(y=1)
        col = (await grid.who.call()).values()
        assert [(v["own_rank"], v["message"]) for v in col] == [(1, {"x": 0}), (3, {"x": 1})]


async def test_the_actor_instance_its_name_and_logger(capfd: pytest.CaptureFixture[str]) -> None:
    from .compat_actors import Ranks

    assert danaus.current_actor_name() == "client"
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        ranks = await procs.spawn("ranks", Ranks)
        who = await ranks.slice(procs=1).who.call_one()
        assert who["name"].endswith("ranks[1]") and who["proc_id"] + ".ranks[1]" == who["name"]
        await ranks.slice(procs=1).log.call_one("a line from Actor.logger")
    assert "a line from Actor.logger" in capfd.readouterr().err


async def test_a_remote_exception_is_caught_by_its_own_type_and_kept_in_exception() -> None:
    from danaus import ActorError, SupervisionError

    from .compat_actors import CodedError, Raiser

    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        r = await procs.spawn("r", Raiser)
        with pytest.raises(ValueError) as value:
            await r.raise_.call_one("value")
        err = value.value
        assert isinstance(err, ActorError) and isinstance(err.exception, ValueError)
        assert err.exception.args == ("bad value", 42) and err.args == ("bad value", 42)
        assert err.exc_type == "ValueError" and "raise_" in err.remote_traceback
        assert "bad value" in str(err) and "raised in actor" in str(err)
        with pytest.raises(CodedError) as coded:
            await r.raise_.call(kind="coded")  # through call() too
        assert coded.value.code == 7 and isinstance(coded.value, ActorError)
        # Fall back to the plain ActorError, with the text fields, never worse:
        for kind, exc_type in [
            ("odd", "OddInitError"),
            ("unpicklable", "RuntimeError"),
        ]:
            with pytest.raises(ActorError) as plain:
                await r.raise_.call_one(kind)
            assert type(plain.value) is ActorError and plain.value.exception is None
            assert plain.value.exc_type.endswith(exc_type)
        with pytest.raises(Exception, match="defined in the endpoint") as local:
            await r.raise_.call_one("local")
        assert isinstance(local.value, ActorError)
        # Not an Exception: no error of the caller's to catch, the actor fails (Monarch).
        with pytest.raises(SupervisionError, match="KeyboardInterrupt: stop") as interrupt:
            await r.raise_.call_one("interrupt")
        assert not isinstance(interrupt.value, ActorError)


async def test_get_or_spawn_controller_is_one_actor_for_the_controller_and_its_procs() -> None:
    from danaus import get_or_spawn_controller

    from .compat_actors import Client, Registry

    registry = await get_or_spawn_controller("registry", Registry, 100)
    assert await registry.register.call_one() == 101
    again = await get_or_spawn_controller("registry", Registry, 0)  # args of the first call win
    assert again.wire_name == registry.wire_name
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        clients = await procs.spawn("clients", Client)
        assert sorted((await clients.register_sync.call()).values()) == [102, 103]
        assert sorted((await clients.register_async.call()).values()) == [104, 105]
        assert await clients.slice(procs=0).register_from_child.call_one() == 106
    assert await registry.register.call_one() == 107
    with pytest.raises(TypeError, match=r"subclass of danaus\.Actor"):
        get_or_spawn_controller("x", object)  # type: ignore[type-var]


async def test_send_to_a_ranked_port_and_as_endpoint() -> None:
    from danaus import Channel, EndpointNotFoundError, as_endpoint, send

    from .compat_actors import Plain

    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        p = await procs.spawn("p", Plain)
        port, ranked = Channel[int].open_ranked()
        send(p.slice(procs=slice(1, 3)).double, (5,), {}, port=port)
        assert sorted([await ranked.recv(), await ranked.recv()]) == [(0, 10), (1, 10)]
        send(p.double, (-1,), {}, port=port, selection="choose")
        with pytest.raises(ValueError, match="negative -1"):
            await ranked.recv()
        plain_port, receiver = Channel[int].open()
        send(p.double, (), {"x": 4}, port=plain_port)
        assert [await receiver.recv() for _ in range(3)] == [8, 8, 8]
        with pytest.raises(ValueError, match="selection"):
            send(p.double, (1,), {}, selection="some")
        # A plain method is no endpoint, until as_endpoint makes one of it.
        with pytest.raises(EndpointNotFoundError, match="as_endpoint"):
            p.plain.call(1)
        values = await as_endpoint(p.plain).call(3)
        assert values.values() == [6, 7, 8]
        assert await as_endpoint(p.slice(procs=2).aplain).call_one(3) == -3
        assert (await p.calls_made.call()).values() == [1, 1, 1]
        with pytest.raises(ValueError, match="plain method of an actor mesh"):
            as_endpoint(p.double)
        with pytest.raises(EndpointNotFoundError, match="no endpoint 'nope'"):
            p.nope  # noqa: B018


async def test_thread_local_state_set_in_init_is_the_sync_endpoints(failures: Failures) -> None:
    from .compat_actors import ThreadLocalCounter

    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counter = await procs.spawn("counter", ThreadLocalCounter)
        for _ in range(3):
            await counter.bump.call()
        assert (await counter.seen.call()).values() == [(3, True), (3, True)]
        # __init__ failing on the actor's thread: the spawn fails as any __init__ does
        with pytest.raises(ActorError, match="init failed on the actor's thread"):
            await procs.spawn("bad", ThreadLocalCounter, True)
        f = await failures.first()
        assert (f.mesh, f.kind) == ("bad", "init")
        assert (await counter.seen.call()).values() == [(3, True), (3, True)]  # still serves
