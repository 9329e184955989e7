"""The callee half of the actor runtime, in this process: actors spawned into runtimes on
loops of their own (``callee_kit.Proc``, a proc without a process) and called from the
test's runtime over real connections, so that coverage sees the handlers, the actor
instance, its mailbox, its thread, its replies and the nodes of a casting tree."""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from danaus.actors._runtime import Runtime
from danaus.config import config
from danaus.errors import ActorError, EndpointNotFoundError, SupervisionError
from danaus.mesh._proc_group import ensure_supervisor

from .callee_kit import (
    GATES,
    KEY,
    TIMEOUT,
    BadInit,
    Gather,
    OnItsThread,
    Proc,
    Worker,
    call,
    cancel,
    cast,
    spawn,
    stop_actor,
    stop_proc,
)

StartProcs = Callable[[int], Awaitable[list[Proc]]]


@pytest.fixture
async def caller() -> AsyncIterator[Runtime]:
    """The test's own runtime, on its loop: what a controller calls through."""
    rt = Runtime(asyncio.get_running_loop(), key=KEY)
    ensure_supervisor(rt)  # as a spawner does: its actors' failures and stuck endpoints come here
    try:
        yield rt
    finally:
        await rt.aclose()


@pytest.fixture
async def start_procs(caller: Runtime) -> AsyncIterator[StartProcs]:
    """Start ``n`` callee runtimes; all closed (and their threads joined) after the test,
    before the caller's runtime closes."""
    made: list[Proc] = []

    async def start(n: int) -> list[Proc]:
        procs = [Proc(f"p{len(made) + i}") for i in range(n)]
        made.extend(procs)
        for p in procs:
            await p.start()
        return procs

    try:
        yield start
    finally:
        closed = await asyncio.gather(*(p.aclose() for p in made), return_exceptions=True)
        errors = [e for e in closed if e is not None]
        assert not errors, errors


@pytest.fixture
def fanout_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Casts to more than two procs go down a tree."""
    monkeypatch.setattr(config, "cast_fanout", 2)


async def settle(*futs: Awaitable[object]) -> list[object]:
    """Each outcome, a value or the exception raised (bounded)."""
    async with asyncio.timeout(TIMEOUT):
        return await asyncio.gather(*futs, return_exceptions=True)


async def spawned(caller: Runtime, procs: list[Proc], cls: type[Worker], *args: object) -> str:
    """Spawn ``cls(*args)`` in every proc and wait until each ``__init__`` has run."""
    wire, replies = spawn(caller, procs, cls, *args)
    assert await settle(*(r for r in replies)) == [None] * len(procs)
    return wire


# ---------------------------------------------------------------- calls to one actor


async def test_sync_and_async_endpoints_answer(caller: Runtime, start_procs: StartProcs) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker, 2)
    big = b"x" * (config.oob_threshold + 1)  # pickled, out of band both ways
    sent = [
        call(caller, p.addr, w, "add", 2, 3),
        call(caller, p.addr, w, "echo", {"a": [1, 2]}),
        call(caller, p.addr, w, "echo", {1, 2}),
        call(caller, p.addr, w, "echo", big),
    ]
    assert await settle(*(s.reply for s in sent)) == [10, {"a": [1, 2]}, {1, 2}, big]


async def test_an_endpoint_that_raises_gives_the_caller_its_error(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    sync_err, async_err, missing, after = await settle(
        call(caller, p.addr, w, "fail", "bad input").reply,
        call(caller, p.addr, w, "fail_async", "no such key").reply,
        call(caller, p.addr, w, "nope").reply,
        call(caller, p.addr, w, "add", 1, 1).reply,
    )
    assert isinstance(sync_err, ActorError) and isinstance(sync_err, ValueError)
    assert (sync_err.exc_type, sync_err.message) == ("ValueError", "bad input")
    assert sync_err.actor == "procs[0].worker[0]"
    assert "in fail" in sync_err.remote_traceback
    assert "raise ValueError(why)" in sync_err.remote_traceback
    assert isinstance(async_err, ActorError) and isinstance(async_err, KeyError)
    assert async_err.exc_type == "KeyError" and "no such key" in async_err.message
    assert isinstance(missing, EndpointNotFoundError)
    assert "no endpoint 'nope'" in str(missing) and "add" in str(missing)
    assert after == 2  # the actor serves on after its endpoints raised


async def test_a_call_sent_right_after_the_spawn_waits_for_init_on_the_actors_thread(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    wire, [spawned_reply] = spawn(caller, [p], OnItsThread)
    first = call(caller, p.addr, wire, "threads")  # not waiting for the spawn's reply
    [threads] = await settle(first.reply)
    assert isinstance(threads, tuple)
    init_thread, call_thread = threads
    assert init_thread == call_thread and call_thread.startswith("danaus-actor")
    assert await settle(spawned_reply) == [None]


async def test_an_actor_whose_init_raises_fails_its_spawn_and_every_call(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    wire, [reply] = spawn(caller, [p], BadInit)
    [err] = await settle(reply)
    assert isinstance(err, ActorError) and isinstance(err, RuntimeError)
    assert err.message == "no accelerator here"
    [later] = await settle(call(caller, p.addr, wire, "ping").reply)
    assert isinstance(later, SupervisionError)
    assert "__init__ raised RuntimeError: no accelerator here" in str(later)


async def test_a_spawn_that_cannot_make_its_actor_says_why(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    _, [again] = spawn(caller, [p], Worker, wire=w)
    _, [not_a_class] = spawn(caller, [p], Worker, payload=("Worker", (), {}))
    again_err, payload_err = await settle(again, not_a_class)
    assert isinstance(again_err, ActorError) and isinstance(again_err, ValueError)
    assert f"an actor named {w!r} already lives in proc {p.addr}" in str(again_err)
    assert isinstance(payload_err, ActorError)
    assert "not (class, args, kwargs)" in str(payload_err)
    [still] = await settle(call(caller, p.addr, w, "add", 1, 2).reply)
    assert still == 3  # the first actor of that name is untouched


@pytest.mark.parametrize("mailbox_limit", [10_000, 4], ids=["roomy", "full-mailbox"])
async def test_calls_in_flight_run_and_answer_in_the_order_sent(
    caller: Runtime, start_procs: StartProcs, monkeypatch: pytest.MonkeyPatch, mailbox_limit: int
) -> None:
    # Sync endpoints run on the actor's thread, async ones on the loop: alternating
    # them hands the mailbox back and forth. A full mailbox stops reading its sender.
    monkeypatch.setattr(config, "mailbox_limit", mailbox_limit)
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    n = 200
    sent = [call(caller, p.addr, w, "record" if i % 2 else "record_async", i) for i in range(n)]
    assert await settle(*(s.reply for s in sent)) == list(range(n))
    assert await call(caller, p.addr, w, "logged").reply == list(range(n))


async def test_a_call_its_caller_cancels_is_cancelled_in_the_callee(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    started = call(caller, p.addr, w, "wait_started")
    running = call(caller, p.addr, w, "hang")
    queued = call(caller, p.addr, w, "record", "never")
    assert await settle(started.reply) == [True]  # hang runs; record waits behind it
    cancel(caller, queued)
    cancel(caller, running)
    was_cancelled, log = await settle(
        call(caller, p.addr, w, "was_cancelled").reply,
        call(caller, p.addr, w, "logged").reply,
    )
    assert was_cancelled is True  # the endpoint saw CancelledError
    assert log == []  # the queued call was dropped, never run
    assert running.reply.cancelled() and queued.reply.cancelled()


async def test_stopping_an_actor_fails_its_calls_and_later_ones_clearly(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    other = await spawned(caller, [p], Worker, 3)
    started = call(caller, p.addr, w, "wait_started")
    running = call(caller, p.addr, w, "hang")
    queued = call(caller, p.addr, w, "add", 1, 2)
    assert await settle(started.reply) == [True]
    stopped, running_err, queued_err = await settle(
        stop_actor(caller, p.addr, w), running.reply, queued.reply
    )
    assert stopped is None
    assert isinstance(running_err, SupervisionError)
    assert "was stopped while handling hang" in str(running_err)
    assert isinstance(queued_err, SupervisionError)
    assert "was stopped before handling add" in str(queued_err)
    later, others = await settle(
        call(caller, p.addr, w, "add", 1, 2).reply,
        call(caller, p.addr, other, "add", 1, 2).reply,
    )
    assert isinstance(later, SupervisionError)
    assert f"no actor named {w!r} in proc {p.addr} (it was stopped)" in str(later)
    assert others == 9  # the proc's other actor serves on


async def test_stopping_a_proc_stops_its_actors_and_asks_it_to_end(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    started = call(caller, p.addr, w, "wait_started")
    running = call(caller, p.addr, w, "hang")
    assert await settle(started.reply) == [True]
    stopped, running_err = await settle(stop_proc(caller, p.addr), running.reply)
    assert stopped is None
    assert isinstance(running_err, SupervisionError)
    assert "was stopped while handling hang" in str(running_err)
    await p.stop_requested()  # what a proc's main waits for before it exits
    # a call that arrives before the proc exits fails at once, not after spawn_wait
    [late] = await settle(call(caller, p.addr, w, "add", 1, 2).reply)
    assert isinstance(late, SupervisionError)
    assert f"no actor named {w!r} in proc {p.addr} (it was stopped)" in str(late)


async def test_an_endpoint_that_raises_a_base_exception_fails_its_actor(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    other = await spawned(caller, [p], Worker, 3)
    [err] = await settle(call(caller, p.addr, w, "exit").reply)
    assert isinstance(err, SupervisionError) and "SystemExit: 3 in exit" in str(err)
    later, others = await settle(
        call(caller, p.addr, w, "add", 1, 2).reply,
        call(caller, p.addr, other, "add", 1, 2).reply,
    )
    assert isinstance(later, SupervisionError) and "SystemExit: 3 in exit" in str(later)
    assert others == 9  # the proc and its other actor serve on


async def test_an_explicit_response_port_endpoint_answers_when_it_chooses(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    owed = call(caller, p.addr, w, "answer_later")
    answered = call(caller, p.addr, w, "answer_owed", {"late": True})
    assert await settle(answered.reply, owed.reply) == [None, {"late": True}]


async def test_a_procs_control_actor_reports_what_runs_there(
    caller: Runtime, start_procs: StartProcs
) -> None:
    [p] = await start_procs(1)
    w = await spawned(caller, [p], Worker)
    started = call(caller, p.addr, w, "wait_started")
    running = call(caller, p.addr, w, "hang")
    assert await settle(started.reply) == [True]
    pid, stats, stacks = await settle(
        call(caller, p.addr, "__proc__", "pid").reply,
        call(caller, p.addr, "__proc__", "stats").reply,
        call(caller, p.addr, "__proc__", "stacks").reply,
    )
    assert pid == os.getpid()  # (a proc in this process)
    assert isinstance(stats, dict) and stats["proc"]["pid"] == os.getpid()
    record = stats["actors"][w]
    assert record["actor"] == "procs[0].worker[0]"
    assert record["handled"] == {"wait_started": 1, "hang": 1}
    assert [m for m, _ in record["running"]] == ["hang"]
    assert isinstance(stacks, list)
    [hang] = [s for s in stacks if s.get("endpoint") == "hang"]
    assert hang["actor"] == "procs[0].worker[0]" and "in hang" in hang["stack"]
    cancel(caller, running)


async def test_an_endpoint_running_too_long_is_reported_to_its_spawner(
    caller: Runtime, start_procs: StartProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "heartbeat_interval", 0.02)  # (the procs' check runs on it)
    monkeypatch.setattr(config, "stuck_warn_after", 0.05)
    reported: asyncio.Future[logging.LogRecord] = asyncio.get_running_loop().create_future()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "has been running" in record.getMessage() and not reported.done():
                reported.set_result(record)  # (on the caller's loop: its handler logs it)

    catch = Catch(logging.WARNING)
    logging.getLogger("danaus.supervision").addHandler(catch)
    try:
        [p] = await start_procs(1)
        w = await spawned(caller, [p], Worker)
        running = call(caller, p.addr, w, "hang")
        async with asyncio.timeout(TIMEOUT):
            warning = (await reported).getMessage()
        cancel(caller, running)
    finally:
        logging.getLogger("danaus.supervision").removeHandler(catch)
    assert "endpoint hang of procs[0].worker[0]" in warning
    assert "in hang" in warning  # with the running endpoint's stack


# ---------------------------------------------------------------- casts down a tree


@pytest.mark.usefixtures("fanout_2")
async def test_a_cast_down_a_tree_gathers_every_ranks_result(
    caller: Runtime, start_procs: StartProcs
) -> None:
    procs = await start_procs(5)
    w = await spawned(caller, procs, Worker)
    gather = Gather(caller)
    cast(caller, procs, w, "value", port=gather.port)
    await gather.until(lambda: len(gather.got) == 5)
    assert gather.got == {r: 10 * r for r in range(5)}


@pytest.mark.usefixtures("fanout_2")
async def test_a_cast_sent_right_after_the_spawn_reaches_every_rank(
    caller: Runtime, start_procs: StartProcs
) -> None:
    # Down the tree a cast may reach a proc before the caller's Spawn does: it waits there.
    procs = await start_procs(5)
    wire, replies = spawn(caller, procs, Worker)
    gather = Gather(caller)
    cast(caller, procs, wire, "value", port=gather.port)
    await gather.until(lambda: len(gather.got) == 5)
    assert gather.got == {r: 10 * r for r in range(5)}
    assert await settle(*replies) == [None] * 5


@pytest.mark.usefixtures("fanout_2")
async def test_a_cast_to_ranks_whose_actor_never_spawned_fails_them_after_spawn_wait(
    caller: Runtime, start_procs: StartProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ranks 1 and 2 (reached through rank 0) hold the cast for a Spawn that never comes.
    monkeypatch.setattr(config, "spawn_wait", 0.05)
    procs = await start_procs(5)
    wire, replies = spawn(caller, procs, Worker, ranks=[0, 3, 4])
    assert await settle(*replies) == [None] * 3
    gather = Gather(caller)
    cast(caller, procs, wire, "value", port=gather.port)
    await gather.until(lambda: len(gather.got) == 5)
    assert {r: gather.got[r] for r in (0, 3, 4)} == {0: 0, 3: 30, 4: 40}
    for r in (1, 2):
        assert isinstance(gather.got[r], SupervisionError)
        assert f"no actor named {wire!r} in proc {procs[r].addr}" in str(gather.got[r])


@pytest.mark.usefixtures("fanout_2")
async def test_a_reduce_down_a_tree_gives_the_combined_value(
    caller: Runtime, start_procs: StartProcs
) -> None:
    procs = await start_procs(5)
    w = await spawned(caller, procs, Worker)
    # As Accumulator.accumulate: each of the caller's subtrees answers once, reduced.
    gather = Gather(caller)
    cast(caller, procs, w, "value", port=gather.port, reducer=(0, operator.add))
    await gather.until(lambda: len(gather.deliveries) == 2)
    # by the rank heading each subtree: its ranks' values combined on the way up
    assert dict(gather.deliveries) == {0: 0 + 10 + 20, 3: 30 + 40}


@pytest.mark.usefixtures("fanout_2")
async def test_a_reduce_where_one_rank_raises_gives_that_ranks_error(
    caller: Runtime, start_procs: StartProcs
) -> None:
    procs = await start_procs(5)
    w = await spawned(caller, procs, Worker)
    gather = Gather(caller)
    cast(
        caller,
        procs,
        w,
        "value_or_fail",
        4,
        port=gather.port,
        reducer=(0, operator.add),
    )
    await gather.until(lambda: len(gather.deliveries) == 2)
    errors = [(r, v) for r, v in gather.deliveries if isinstance(v, BaseException)]
    values = [v for _, v in gather.deliveries if not isinstance(v, BaseException)]
    [(rank, err)] = errors
    assert rank == 4 and isinstance(err, ActorError) and err.message == "rank 4 cannot"
    assert values == [0 + 10 + 20]  # the other subtree (ranks 0-2) reduced as usual


@pytest.mark.usefixtures("fanout_2")
async def test_order_holds_across_direct_calls_and_casts_down_the_tree(
    caller: Runtime, start_procs: StartProcs
) -> None:
    # Casts reach most ranks through other procs, direct calls straight: each actor
    # still handles the caller's messages in the order sent.
    procs = await start_procs(5)
    w = await spawned(caller, procs, Worker)
    for i in range(0, 40, 2):
        cast(caller, procs, w, "record", i)  # nobody waits for the casts' replies
        for rank, p in enumerate(procs):
            call(caller, p.addr, w, "record", i + 1, rank=rank)
    logs = await settle(*(call(caller, p.addr, w, "logged").reply for p in procs))
    assert logs == [list(range(40))] * 5


@pytest.mark.usefixtures("fanout_2")
@pytest.mark.parametrize("leaf", ["answers-it-stopped", "silent"])
async def test_a_cast_whose_leaf_proc_closes_midway_fails_only_that_rank(
    caller: Runtime, start_procs: StartProcs, monkeypatch: pytest.MonkeyPatch, leaf: str
) -> None:
    # The tree: the caller sends to ranks 0 (which forwards to 1 and 2) and 3 (to 4).
    # Rank 4's endpoint is running when its proc closes: an async one is cancelled and
    # its proc answers that it stopped; a sync one blocked on its thread cannot answer
    # (as a proc that was killed), and rank 3 learns of it from the lost connection.
    procs = await start_procs(5)
    w = await spawned(caller, procs, Worker)
    started = call(caller, procs[4].addr, w, "wait_started", rank=4)
    gather = Gather(caller)
    gate = f"midway-{id(gather)}"
    GATES[gate] = threading.Event()
    try:
        if leaf == "silent":
            monkeypatch.setattr(config, "stop_timeout", 0.05)  # (stop gives up on the thread)
            cast(caller, procs, w, "value_or_block", 4, gate, port=gather.port)
        else:
            cast(caller, procs, w, "value_or_hang", 4, port=gather.port)
        assert await settle(started.reply) == [True]  # rank 4 is in its endpoint now
        await gather.until(lambda: len(gather.got) == 3)
        assert gather.got == {0: 0, 1: 10, 2: 20}  # rank 3's node still waits for rank 4
        await procs[4].aclose()
        await gather.until(lambda: len(gather.got) == 5)
    finally:
        GATES.pop(gate).set()
    assert {r: v for r, v in gather.got.items() if r != 4} == {r: 10 * r for r in range(4)}
    assert isinstance(gather.got[4], SupervisionError)


@pytest.mark.usefixtures("fanout_2")
async def test_a_cast_to_a_lost_subtree_fails_its_ranks_and_skips_their_turns(
    caller: Runtime, start_procs: StartProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rank 3 heads the subtree {3, 4}: with its proc gone, rank 4 never gets the cast,
    # and only the caller's skip of that message's number lets its next call run (no
    # waiting out the gap timeout).
    monkeypatch.setattr(config, "seq_gap_timeout", 60.0)
    procs = await start_procs(5)
    w = await spawned(caller, procs, Worker)
    lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    caller.on_lost.append(lambda addr: None if lost.done() else lost.set_result(addr))
    await procs[3].aclose()
    async with asyncio.timeout(TIMEOUT):
        assert await lost == procs[3].addr
    gather = Gather(caller)
    cast(caller, procs, w, "value", port=gather.port)
    await gather.until(lambda: len(gather.got) == 5)
    assert {r: gather.got[r] for r in range(3)} == {0: 0, 1: 10, 2: 20}
    for r in (3, 4):
        assert isinstance(gather.got[r], SupervisionError)
        assert f"proc at {procs[3].addr} failed" in str(gather.got[r])
    [answer] = await settle(call(caller, procs[4].addr, w, "add", 2, 2, rank=4).reply)
    assert answer == 4
