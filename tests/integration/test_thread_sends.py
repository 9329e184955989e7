"""Frames written by threads that are not the runtime's loop: calls (a plain thread's
``.get()``, a sync endpoint's calls) and a sync endpoint's small replies. The thread
writes the frame itself where nothing could be overtaken, and hands it to the loop where
not. Either way each sender's messages arrive in order, a frame the socket takes only in
part is finished by the loop, and a peer that dies fails the calls instead of leaving
them waiting."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import numpy as np
import pytest

from danaus import Channel, SupervisionError, this_host

from .exec_actors import Caller, Recorder, Worker


def test_calls_from_many_threads_arrive_each_in_its_threads_order() -> None:
    """Four threads send 200 calls each without waiting (so that some find a frame
    queued and go through the loop, others write their own), then wait for all."""
    with this_host().spawn_procs(per_host={"procs": 1}, name="threadsends") as procs:
        rec = procs.spawn("rec", Recorder)
        rec.initialized.get(60)
        errors: list[BaseException] = []
        replies: dict[str, list[int]] = {}

        def sender(name: str) -> None:
            try:
                futs = [rec.note.call_one(name, i) for i in range(200)]
                replies[name] = [f.get(60) for f in futs]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=sender, args=(f"t{n}",)) for n in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not errors
        assert replies == {f"t{n}": list(range(200)) for n in range(4)}
        seen = rec.log.call_one().get(60)
    for n in range(4):
        assert [i for s, i, _ in seen if s == f"t{n}"] == list(range(200))
    assert len(seen) == 800


def test_a_frame_larger_than_the_socket_buffer_is_finished_in_order() -> None:
    """A 24 MiB argument (inline bytes), then one carried out of band (a numpy array,
    written as several buffers), each followed by small calls sent at once: the socket
    takes part of the large frame, the loop writes the rest, and what follows waits
    behind it."""
    big = b"\xff" * (24 << 20)
    array = np.arange(3 << 20, dtype=np.int64)  # 24 MiB
    with this_host().spawn_procs(per_host={"procs": 1}, name="bigframe") as procs:
        rec = procs.spawn("rec", Recorder)
        rec.initialized.get(60)
        futs = [rec.note.call_one("main", 0, big)]
        futs += [rec.note.call_one("main", i) for i in range(1, 11)]
        futs += [rec.note.call_one("main", 11, array)]
        futs += [rec.note.call_one("main", i) for i in range(12, 22)]
        assert [f.get(60) for f in futs] == list(range(22))
        seen = rec.log.call_one().get(60)
    assert [i for _, i, _ in seen] == list(range(22))
    assert seen[0][2] == len(big) and seen[11][2] == array.nbytes


def test_calls_to_a_stopped_peer_wait_in_order_and_go_out_when_it_resumes() -> None:
    """A peer that is merely busy (stopped by SIGSTOP): a thread's calls fill the socket,
    the rest queue, and nothing is lost or reordered once it runs again."""
    payload = b"\x00" * (6 << 20)
    with this_host().spawn_procs(per_host={"procs": 1}, name="stoppedpeer") as procs:
        rec = procs.spawn("rec", Recorder)
        rec.initialized.get(60)
        pid = procs.pids[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            futs = [
                rec.note.call_one("main", i, payload if i % 3 == 0 else None) for i in range(30)
            ]
            assert not any(f.done() for f in futs)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert [f.get(60) for f in futs] == list(range(30))
        seen = rec.log.call_one().get(60)
    assert [i for _, i, _ in seen] == list(range(30))


def test_a_thread_waiting_on_a_proc_that_is_killed_gets_supervision_errors() -> None:
    with this_host().spawn_procs(per_host={"procs": 1}, name="threadkill") as procs:
        worker = procs.spawn("worker", Worker)
        worker.initialized.get(60)
        assert worker.incr.call_one(1).get(60) == 1  # (the connection is open)
        in_flight = worker.sleep.call_one(60)
        os.kill(procs.pids[0], signal.SIGKILL)
        with pytest.raises(SupervisionError):
            in_flight.get(30)
        with pytest.raises(SupervisionError):
            worker.incr.call_one(1).get(30)


async def test_a_sync_endpoint_calling_another_actor_writes_from_its_thread() -> None:
    """An actor's thread calls another proc's actor many times (each with ``.get()``):
    the replies come back right, as from the loop."""
    async with this_host().spawn_procs(per_host={"procs": 2}, name="endpointcalls") as procs:
        callee = await procs.slice(procs=1).spawn("worker", Worker)
        caller = await procs.slice(procs=0).spawn("caller", Caller)
        assert await caller.call_many.call_one(callee, 100) == sum(range(1, 101))


def test_a_threads_calls_keep_their_order_when_some_go_through_the_loop() -> None:
    """Calls to the whole mesh go through the loop (a cast); those to one actor the
    thread may write itself: interleaved, rank 0 still runs them in the order sent."""
    with this_host().spawn_procs(per_host={"procs": 2}, name="mixedsends") as procs:
        recs = procs.spawn("rec", Recorder)
        recs.initialized.get(60)
        one = recs.slice(procs=0)
        futs = [
            recs.note.call("main", i) if i % 3 == 0 else one.note.call_one("main", i)
            for i in range(300)
        ]
        for f in futs:
            f.get(60)
        seen = one.log.call_one().get(60)
    assert [i for _, i, _ in seen] == list(range(300))


async def test_what_a_sync_endpoint_sent_before_returning_arrives_before_its_reply() -> None:
    """Its port sends go through the loop; its small reply could go from its thread, but
    waits behind them: when the call returns, the values are there."""
    async with this_host().spawn_procs(per_host={"procs": 1}, name="sendfirst") as procs:
        rec = await procs.spawn("rec", Recorder)
        for attempt in range(50):
            port, receiver = Channel[int].open()
            assert await rec.send_then_return.call_one(port, 3) == 3
            got = [receiver.recv() for _ in range(3)]
            assert all(f.done() for f in got), f"attempt {attempt}: the reply came first"
            assert [f.result() for f in got] == [0, 1, 2]
            receiver.close()


async def test_replies_from_the_thread_and_from_the_loop_settle_in_call_order() -> None:
    """Pipelined calls to a sync endpoint whose replies are small atoms (written by the
    actor's thread) or lists (pickled by the loop): they settle in the order called."""
    async with this_host().spawn_procs(per_host={"procs": 1}, name="replyorder") as procs:
        rec = await procs.spawn("rec", Recorder)
        settled: list[int] = []
        futs = []
        for i in range(600):
            fut = rec.small_or_not.call_one(i)
            fut.add_done_callback(lambda _, i=i: settled.append(i))
            futs.append(fut)
        values = await asyncio.gather(*futs)
    assert values == [i if i % 3 else [i] for i in range(600)]
    assert settled == list(range(600))
