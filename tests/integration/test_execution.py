"""The execution model: sync endpoints that block for long, ``.get()`` inside endpoints,
explicit response ports, concurrent endpoints, cancellation, embedding in an app's loop."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from danaus import (
    Actor,
    ActorError,
    Channel,
    SupervisionError,
    concurrent_endpoint,
    config,
    this_host,
)
from danaus.mesh import set_unhandled_fault_hook

from .actors_lib import Echo
from .exec_actors import Barrier, Caller, Cancellable, Deferred, Ordered, Worker

HEARTBEAT_TIMEOUT = 1.0


@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Heartbeats every 0.2 s, a peer silent for 1 s is lost: in the controller and,
    through the environment, in the procs it spawns."""
    monkeypatch.setenv("DANAUS_HEARTBEAT_INTERVAL", "0.2")
    monkeypatch.setenv("DANAUS_HEARTBEAT_TIMEOUT", str(HEARTBEAT_TIMEOUT))
    monkeypatch.setattr(config, "heartbeat_interval", 0.2)
    monkeypatch.setattr(config, "heartbeat_timeout", HEARTBEAT_TIMEOUT)
    yield


@pytest.fixture
def failures() -> Iterator[list[object]]:
    seen: list[object] = []
    set_unhandled_fault_hook(seen.append)
    yield seen
    set_unhandled_fault_hook(None)


# make test keeps "spin" (pure Python, contending for the GIL: the hardest of the three);
# the others run in make test-all
@pytest.mark.parametrize(
    "how",
    [
        pytest.param("sleep", marks=pytest.mark.slow),
        "spin",
        pytest.param("matmul", marks=pytest.mark.slow),
    ],
)
async def test_a_sync_endpoint_may_block_for_three_heartbeat_timeouts(
    fast_heartbeat: None, how: str
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        busy = await procs.spawn("busy", Worker)
        other = await procs.spawn("other", Worker)  # another actor in the same proc
        long = getattr(busy, how).call_one(3 * HEARTBEAT_TIMEOUT)
        # Meanwhile the proc serves its other actors, sync and async.
        assert await asyncio.wait_for(other.incr.call_one(5), 5) == 5
        assert await asyncio.wait_for(other.aget.call_one(), 5) == 5
        assert not long.done()
        result = await asyncio.wait_for(long, 60)
        assert result == "slept" if how == "sleep" else result > 0
        # Never declared lost: the same actor still answers.
        assert await busy.incr.call_one(1) == 1


async def test_a_frozen_proc_is_still_lost_while_a_sync_endpoint_runs(
    fast_heartbeat: None, failures: list[object]
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", Worker)
        long = w.sleep.call_one(60)
        os.kill(procs.pids[0], signal.SIGSTOP)
        try:
            with pytest.raises(SupervisionError, match="did not answer"):
                await asyncio.wait_for(long, 10 * HEARTBEAT_TIMEOUT)
        finally:
            os.kill(procs.pids[0], signal.SIGCONT)


async def test_a_proc_wedged_in_c_holding_the_gil_is_lost(
    fast_heartbeat: None, failures: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "stop_timeout", 1.0)  # it cannot exit by itself: kill it
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", Worker)
        with pytest.raises(SupervisionError, match="did not answer"):
            await asyncio.wait_for(w.wedge.call_one(), 10 * HEARTBEAT_TIMEOUT)


async def test_get_inside_a_sync_endpoint_on_another_mesh_and_on_other_ranks() -> None:
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        counter = await procs.slice(procs=0).spawn("counter", Worker)
        callers = await procs.spawn("callers", Caller, counter)
        assert await asyncio.wait_for(callers.slice(procs=2).relay.call_one(7), 30) == 7
        assert (
            await asyncio.wait_for(callers.slice(procs=0).sum_of_others.call_one(callers), 30)
            == 10 + 20
        )
        assert (
            await asyncio.wait_for(callers.slice(procs=1).sum_of_others.call_one(callers), 30)
            == 0 + 20
        )


@pytest.mark.parametrize("endpoint_name", ["call_self", "acall_self"])
async def test_an_actor_waiting_on_itself_gets_a_deadlock_error(endpoint_name: str) -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        callers = await procs.spawn("callers", Caller)
        me = callers.slice(procs=1)
        with pytest.raises(ActorError, match="DeadlockError") as info:
            await asyncio.wait_for(getattr(me, endpoint_name).call_one(callers), 30)
        assert "waits for its own endpoint 'value_of'" in str(info.value)
        assert "one message at a time" in str(info.value)
        assert await me.value_of.call_one() == 10  # still healthy
        # Sending to itself without waiting is fine.
        assert await me.send_later.call_one(callers) == "sent"


async def test_ports_and_logs_flow_while_a_sync_endpoint_blocks(
    fast_heartbeat: None, capfd: pytest.CaptureFixture[str]
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", Worker)
        port, receiver = Channel[int].open()
        n = 8
        fut = w.ticks.call_one(port, n, 0.25)  # 2 s, twice the heartbeat timeout
        got = [await asyncio.wait_for(receiver.recv(), 10) for _ in range(n // 2)]
        assert got == list(range(n // 2))
        assert not fut.done()  # those values came while the endpoint still ran
        assert await asyncio.wait_for(fut, 30) == n
    assert "tick 0" in capfd.readouterr().out


async def test_explicit_response_port_answers_later_from_another_message() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        d = await procs.spawn("d", Deferred)
        a = d.ask.call_one("one")
        b = d.ask.call_one("two")
        assert await d.ping.call_one() == "pong"  # the actor is free meanwhile
        assert not a.done() and not b.done()
        assert await d.answer_all.call_one("re: ") == 2
        assert await asyncio.wait_for(asyncio.gather(a, b), 10) == ["re: one", "re: two"]


async def test_explicit_response_port_exceptions_and_unanswered_raises(
    failures: list[object],
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        d = await procs.spawn("d", Deferred)
        with pytest.raises(ActorError, match="no answer for you") as info:
            await asyncio.wait_for(d.refuse.call_one(), 10)
        assert info.value.exc_type == "ValueError"
        assert await d.ping.call_one() == "pong"  # answering with an error is fine
        # Raising instead of answering fails the actor, as in Monarch.
        with pytest.raises(SupervisionError, match="forgot to answer"):
            await asyncio.wait_for(d.raise_instead.call_one(), 10)
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(d.ping.call_one(), 10)


async def test_concurrent_endpoint_may_wait_for_a_later_message() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        b = await procs.spawn("b", Barrier)
        got = await asyncio.wait_for(asyncio.gather(*(b.arrive.call_one(3) for _ in range(3))), 10)
        assert got == [3, 3, 3]
        assert await b.count.call_one() == 3


async def test_plain_async_endpoints_still_run_one_at_a_time_in_order() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        o = await procs.spawn("o", Ordered)
        results = await asyncio.gather(*(o.step.call_one(n) for n in "abc"))
        assert results[-1] == ["start a", "end a", "start b", "end b", "start c", "end c"]


def test_concurrent_endpoint_must_be_async() -> None:
    with pytest.raises(ValueError, match="only wrap async endpoints"):

        class Bad(Actor):
            @concurrent_endpoint
            def nope(self) -> None:
                pass


async def test_cancelling_a_call_cancels_the_async_endpoint() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", Cancellable)
        port, started = Channel[str].open()
        call = c.wait.call_one(port)
        assert await asyncio.wait_for(started.recv(), 10) == "started"
        call.cancel()
        assert await c.history.call_one() == ["cancelled"]
        # A deadline does the same.
        call = c.wait.call_one(port)
        assert await asyncio.wait_for(started.recv(), 10) == "started"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call, 0.2)
        assert await c.history.call_one() == ["cancelled", "cancelled"]
        # So does cancelling the task that awaits it.
        call = c.wait.call_one(port)
        waiter = asyncio.ensure_future(call)
        assert await asyncio.wait_for(started.recv(), 10) == "started"
        waiter.cancel()
        assert await c.history.call_one() == ["cancelled"] * 3


async def test_cancelling_sync_and_queued_calls() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        c = await procs.spawn("c", Cancellable)
        port, started = Channel[str].open()
        running = c.sync_wait.call_one(port, 0.5)
        queued_sync = c.record.call_one("queued sync")  # handed to the actor's thread
        queued_async = c.arecord.call_one("queued async")  # waits in the mailbox
        assert await asyncio.wait_for(started.recv(), 10) == "started"
        running.cancel()
        queued_sync.cancel()
        queued_async.cancel()
        # The sync endpoint finished (its result dropped); the queued ones never ran.
        assert await asyncio.wait_for(c.history.call_one(), 10) == ["sync finished"]
        assert await c.record.call_one("after") == "after"


async def test_calls_from_async_code_stay_on_the_applications_loop() -> None:
    """Embedding: a handler of the application's own loop calls with no thread hop."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", Worker)
        loops = []

        def helper(n: int) -> object:  # a sync helper called from async code
            return w.incr.call_one(n)

        async def handle(request: web.Request) -> web.Response:
            fut = w.incr.call_one(1)
            other = helper(1)
            loops.extend([fut.get_loop(), other.get_loop()])  # type: ignore[attr-defined]
            value = await fut
            await asyncio.gather(other)  # type: ignore[arg-type]
            return web.json_response({"value": value})

        app = web.Application()
        app.router.add_get("/", handle)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/")
            assert (await resp.json())["value"] == 1
        here = asyncio.get_running_loop()
        assert loops == [here, here]


def test_threads_waiting_in_get_are_each_woken_by_their_reply() -> None:
    """Many plain threads, each waiting in ``.get()`` for call after call: the reply's
    port wakes its thread itself, and no wake is lost (a lost one would end in the
    TimeoutError of that ``get``)."""
    import threading

    with this_host().spawn_procs(per_host={"procs": 2}, name="waking") as procs:
        echoes = procs.spawn("echo", Echo)
        echoes.initialized.get(60)
        one, two = echoes.slice(procs=0), echoes.slice(procs=1)
        errors: list[BaseException] = []
        got: dict[int, list[int]] = {}

        def caller(t: int) -> None:
            mine = got.setdefault(t, [])
            try:
                for i in range(150):
                    mine.append((one if (t + i) % 2 else two).echo.call_one(t * 1000 + i).get(30))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    assert not errors
    assert got == {t: [t * 1000 + i for i in range(150)] for t in range(6)}


def test_a_call_cancelled_while_a_thread_waits_in_get_wakes_it() -> None:
    with this_host().spawn_procs(per_host={"procs": 1}, name="cancelwake") as procs:
        waiter = procs.spawn("cancellable", Cancellable)
        waiter.initialized.get(60)
        started, receiver = Channel[str].open()
        fut = waiter.wait.call_one(started)
        assert receiver.recv().get(30) == "started"
        fut.get_loop().call_soon_threadsafe(fut.cancel)
        with pytest.raises(asyncio.CancelledError):
            fut.get(30)  # (a wake lost here would end in TimeoutError instead)
