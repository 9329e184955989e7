"""Supervision and lifecycle: failures reach their owner, nothing hangs, nothing leaks."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from danaus import Channel, SupervisionError, this_host
from danaus.config import config

from .. import faults
from ..faults import Failures
from .actors_lib import Cleaner, Echo, Liar, Parent, Sink, Source
from .test_robustness import _wait_gone


async def test_killed_proc_fails_calls_fast_and_reaches_the_hook(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        echo = await procs.spawn("echo", Echo)
        stuck = echo.slice(procs=1).wait_forever.call_one()
        t0 = time.monotonic()
        faults.kill(procs, 1)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            await asyncio.wait_for(stuck, 5)
        assert time.monotonic() - t0 < 1.0
        f = await failures.first()
        assert f.mesh == "echo" and f.kind == "proc"
        assert [str(r) for r in f.ranks] == ["{'procs': 1/3}"]
        assert "SIGKILL" in f.report
        # Later calls into the failed rank fail at once, naming rank and cause.
        t1 = time.monotonic()
        with pytest.raises(SupervisionError, match=r"rank \{'procs': 1/3\} failed: .*SIGKILL"):
            await echo.slice(procs=1).echo.call_one(1)
        assert time.monotonic() - t1 < 0.1
        # A call on the whole mesh fails; slices without the failed rank keep working.
        with pytest.raises(SupervisionError):
            await echo.echo.call(1)
        assert (await echo.slice(procs=slice(0, 3, 2)).echo.call(2)).values() == [2, 2]
        assert echo.failed_ranks == {"{'procs': 1/3}": f.report.splitlines()[0]}


async def test_recovery_stop_and_spawn_a_new_mesh_on_the_same_host(failures: Failures) -> None:
    host = this_host()
    procs = host.spawn_procs(per_host={"procs": 2})
    echo = await procs.spawn("echo", Echo)
    faults.kill(procs, 0)
    await failures.first()
    await asyncio.wait_for(procs.stop(), 10)
    async with host.spawn_procs(per_host={"procs": 2}) as again:
        assert (await again.spawn("echo", Echo).echo.call(3)).values() == [3, 3]
    with pytest.raises(SupervisionError, match="stopped"):
        await echo.echo.call(1)


async def test_owner_actor_supervises_its_child_mesh(failures: Failures) -> None:
    port, receiver = Channel[str].open()
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        parent = await procs.spawn("parent", Parent, True, port)
        kid_pids = await parent.spawn_children.call_one(2)
        import os

        os.kill(kid_pids[1], signal.SIGKILL)
        seen = await asyncio.wait_for(receiver.recv(), 10)
        assert await parent.seen.call_one() == [seen]
        mesh, ranks, kind, report = seen.split("|", 3)
        assert (mesh, ranks, kind) == ("child", "[\"{'procs': 1/2}\"]", "proc")
        assert "SIGKILL" in report
        assert failures == []  # handled: nothing reached the controller
        # The parent keeps working, and so does its child mesh's healthy slice.
        assert await parent.call_child.call_one(0) == 0


async def test_unhandled_child_failure_goes_up_to_the_controller(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        parent = await procs.spawn("parent", Parent, False)  # __supervise__ returns False
        kid_pids = await parent.spawn_children.call_one(1)
        import os

        os.kill(kid_pids[0], signal.SIGKILL)
        f = await failures.first()
        assert f.mesh == "parent" and f.kind == "unhandled"
        assert "did not handle" in f.report and "child" in f.report
        with pytest.raises(SupervisionError, match="failed"):
            await parent.seen.call_one()


async def test_broadcast_endpoint_that_raises_fails_the_actor(failures: Failures) -> None:
    port, receiver = Channel[str].open()
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        actors = await procs.spawn("cleaner", Cleaner, port)
        actors.slice(procs=1).boom.broadcast()
        f = await failures.first()
        assert f.kind == "actor" and [str(r) for r in f.ranks] == ["{'procs': 1/2}"]
        assert "nobody is listening" in f.report and "Traceback" in f.report
        with pytest.raises(SupervisionError):
            await actors.slice(procs=1).ping.call_one()
        assert await actors.slice(procs=0).ping.call_one() == "pong"
        await actors.stop()
        with pytest.raises(SupervisionError, match="stopped"):
            await actors.slice(procs=0).ping.call_one()
    got = sorted([await asyncio.wait_for(receiver.recv(), 10) for _ in range(2)])
    assert got == ["cleanup {'procs': 0/2} exc=None", "cleanup {'procs': 1/2} exc=SupervisionError"]


async def test_malformed_reports_to_the_supervisor_are_logged_and_it_serves_on(
    failures: Failures, caplog: pytest.LogCaptureFixture
) -> None:
    # The runtime's supervisor is a system actor the procs call without waiting: a report
    # with missing or wrong arguments, or of no such kind, is an error logged there, not
    # its end; the next real failure still reaches the hook.
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        liar = await procs.spawn("liar", Liar)
        await liar.lie.call_one()
        with pytest.raises(SupervisionError):
            await liar.die.call_one()
        f = await failures.first()
        assert (f.mesh, f.kind) == ("liar", "actor") and "SystemExit" in f.report
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "missing 4 required positional arguments" in said
    assert "no endpoint 'no_such_report'" in said
    assert "__supervisor__ failed" not in said


async def test_the_fault_hook_runs_as_the_controller_and_later_failures_still_come() -> None:
    # The supervisor (a system actor) hears a proc's report and fails the mesh; the hook
    # runs as the controller, so a mesh it spawns is the controller's, and the failures
    # after it still reach the hook.
    from danaus import context
    from danaus.mesh import set_unhandled_fault_hook

    me = context().actor_instance.actor_id
    seen: list[tuple[str, str]] = []
    both = asyncio.Event()

    def hook(failure: object) -> None:
        seen.append((getattr(failure, "mesh", "?"), context().actor_instance.actor_id))
        if len(seen) == 2:
            both.set()

    old = set_unhandled_fault_hook(hook)
    try:
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            first = await procs.spawn("first", Liar)
            second = await procs.spawn("second", Liar)
            for liar in (first, second):
                with pytest.raises(SupervisionError):
                    await liar.die.call_one()
            await asyncio.wait_for(both.wait(), 10)
    finally:
        set_unhandled_fault_hook(old)
    assert seen == [("first", me), ("second", me)]


async def test_stopping_a_mesh_stops_the_meshes_its_actors_own() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    parent = await procs.spawn("parent", Parent, True)
    kid_pids = await parent.spawn_children.call_one(2)
    await asyncio.wait_for(procs.stop(), 20)
    assert _wait_gone(kid_pids, timeout=10) == []


async def test_a_frozen_proc_is_detected_by_heartbeats(failures: Failures) -> None:
    old = config.heartbeat_interval, config.heartbeat_timeout
    config.heartbeat_interval, config.heartbeat_timeout = 0.1, 0.5
    try:
        from danaus.actors._loops import close_loop_runtime

        await close_loop_runtime(asyncio.get_running_loop())  # a runtime with these settings
        async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
            echo = await procs.spawn("echo", Echo)
            pid = faults.freeze(procs, 0)
            t0 = time.monotonic()
            with pytest.raises(SupervisionError, match="did not answer"):
                await asyncio.wait_for(echo.slice(procs=0).echo.call_one(1), 10)
            assert time.monotonic() - t0 < 3
            f = await failures.first()
            assert f.kind == "proc" and "no heartbeat" in f.report
            assert _wait_gone([pid], timeout=5) == []  # frozen procs are killed, not left
            assert await echo.slice(procs=1).echo.call_one(2) == 2
    finally:
        config.heartbeat_interval, config.heartbeat_timeout = old


async def test_killing_a_proc_during_1000_pipelined_calls_resolves_every_call(
    failures: Failures,
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        futs = [echo.echo.call_one(i) for i in range(1000)]
        await futs[10]
        faults.kill(procs, 0)
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 10)
        ok = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert ok == list(range(len(ok)))  # a prefix answered, in order
        assert all(isinstance(e, SupervisionError) for e in errors)


async def test_100k_messages_from_4_senders_exactly_once_in_order_with_bounded_mailbox() -> None:
    old = config.mailbox_limit
    config.mailbox_limit = 500
    try:
        async with this_host().spawn_procs(
            per_host={"procs": 5}, env={"DANAUS_MAILBOX_LIMIT": "500"}
        ) as procs:
            sink = await procs.slice(procs=0).spawn("sink", Sink)
            sources = await procs.slice(procs=slice(1, 5)).spawn("source", Source)
            sent = await asyncio.wait_for(sources.pump.call(sink, 25_000), 120)
            assert sent.values() == [25_000] * 4
            report = await sink.report.call_one()
            got = report["got"]
            assert len(got) == 4
            for sender, seq in got.items():
                assert seq == list(range(25_000)), sender
            assert report["max_depth"] <= 500 + 64  # the limit, plus what one read brings
    finally:
        config.mailbox_limit = old


async def test_drop_connection_fails_pending_calls_and_the_proc(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = await procs.spawn("echo", Echo)
        stuck = echo.wait_forever.call_one()
        faults.drop_connection(echo.rank_addrs()[0][1])
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(stuck, 5)
        assert (await failures.first()).kind == "proc"


async def test_failures_reach_only_the_meshes_with_a_member_there(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}, name="memberthere") as procs:
        only_one = await procs.slice(procs=1).spawn("onlyone", Echo)
        stopped = await procs.spawn("stopped", Echo)
        await stopped.stop()
        faults.kill(procs, 0)
        f = await failures.first()
        # Not "onlyone" (no actor in proc 0), not "stopped": the proc mesh's owner hears.
        assert f.mesh == "memberthere" and [str(r) for r in f.ranks] == ["{'procs': 0/2}"]
        assert await only_one.echo.call_one(3) == 3
