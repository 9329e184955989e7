"""What is not an ``Exception`` (a ``BaseException`` of the user's, ``SystemExit``,
``KeyboardInterrupt``) escaping an endpoint or ``__init__`` fails that actor, as in Monarch
(its ``python/tests/test_actor_error.py``): the caller gets ``SupervisionError`` in
Monarch's words, later calls fail at once, the mesh and the slices holding the actor are
failed, its owner's ``__supervise__`` (or the fault hook) hears of it once, and it stops;
its proc and the other actors there go on serving. A segfault or ``os._exit`` takes the
proc down: the error names the signal or the exit code."""

from __future__ import annotations

import asyncio
import os
import re
import threading

import pytest

from danaus import ActorError, Channel, SupervisionError, this_host, this_proc
from danaus.mesh import MeshFailure, set_unhandled_fault_hook

from ..faults import Failures
from .actors_lib import Fragile, Guardian
from .test_robustness import _wait_gone

pytestmark = pytest.mark.timeout(120)

#: Monarch's words for a failed actor, which its users match on
FAILED = "and all its descendants have failed"
#: what each kind of not-an-Exception reads as (``Fragile`` raises them)
WHICH = {
    "ActorFailure": "tests.integration.actors_lib.ActorFailure: simulated actor failure",
    "SystemExit": "SystemExit: 3",
    "KeyboardInterrupt": "KeyboardInterrupt: interrupted",
}


@pytest.mark.parametrize("which", list(WHICH))
@pytest.mark.parametrize("name", ["raise_base", "araise_base"])  # on its thread, on the loop
async def test_it_fails_the_actor_only(failures: Failures, name: str, which: str) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        fragile = await procs.spawn("fragile", Fragile)
        sibling = await procs.spawn("sibling", Fragile)
        pid = await sibling.pid.call_one()
        with pytest.raises(SupervisionError) as info:
            await asyncio.wait_for(getattr(fragile, name).call_one(which), 10)
        err = info.value
        assert isinstance(err, RuntimeError) and not isinstance(err, ActorError)  # Monarch's
        assert re.match(
            rf"Endpoint call fragile\.{name}\(\) failed, The actor \S+\.<tests\.integration\."
            rf"actors_lib\.Fragile fragile\{{'procs': 0/1\}}> {FAILED}:\n"
            rf"  {re.escape(WHICH[which])} in {name} \(not an Exception\)\n"
            rf"  Traceback \(most recent call last\):\n    File .*, in {name}\n",
            str(err),
        ), str(err)
        f = await failures.first()
        assert (f.mesh, f.kind, [str(r) for r in f.ranks]) == (
            "fragile",
            "actor",
            ["{'procs': 0/1}"],
        )
        assert f.report.startswith(f"{WHICH[which]} in {name}") and "Traceback" in f.report
        # Every later call fails at once, here: the mesh knows it failed.
        later = (
            r"failed, The actor \S+\[0\]\.<tests\.integration\.actors_lib\.Fragile "
            r"fragile\{'procs': 0/1\}> " + FAILED + ": mesh 'fragile' rank .* failed: "
        )
        with pytest.raises(SupervisionError, match=r"Endpoint call fragile\.pid\(\) " + later):
            await fragile.pid.call_one()
        with pytest.raises(SupervisionError, match=r"Endpoint call fragile\.record\(\) " + later):
            await fragile.record.call(1)
        assert list(fragile.failed_ranks) == ["{'procs': 0/1}"]
        # Its proc goes on, and so does the other actor there; the hook heard once.
        assert await sibling.pid.call_one() == pid
        assert len(failures) == 1


async def test_the_mesh_and_the_slices_holding_it_fail(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 3}) as procs:
        fragile = await procs.spawn("fragile", Fragile)
        tail = fragile.slice(procs=slice(1, 3))
        with pytest.raises(SupervisionError, match=rf"araise_base\(\) failed, .* {FAILED}"):
            await tail.slice(procs=0).araise_base.call("ActorFailure")  # call() on a slice
        f = await failures.first()
        assert [str(r) for r in f.ranks] == ["{'procs': 1/3}"]
        for holding in (fragile, tail, fragile.slice(procs=1), tail.slice(procs=slice(0, 2))):
            with pytest.raises(
                SupervisionError, match=rf"Endpoint call fragile\.pid\(\) .*{FAILED}"
            ):
                await holding.pid.call()
        with pytest.raises(SupervisionError, match=FAILED):
            await fragile.slice(procs=1).pid.call_one()
        # Slices without it keep working; the failure was heard once.
        assert len((await fragile.slice(procs=slice(0, 3, 2)).pid.call()).values()) == 2
        assert await tail.slice(procs=1).pid.call_one() > 0
        assert fragile.failed_ranks.keys() == {"{'procs': 1/3}"}
        assert len(failures) == 1


async def test_one_nobody_waits_for_fails_the_actor(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        fragile = await procs.spawn("fragile", Fragile)
        fragile.araise_base.broadcast("SystemExit")
        f = await failures.first()
        assert f.kind == "actor" and f.report.startswith("SystemExit: 3 in araise_base")
        with pytest.raises(SupervisionError, match=rf"fragile\.pid\(\) failed, .* {FAILED}"):
            await fragile.pid.call_one()
        assert len(failures) == 1


async def test_calls_behind_it_fail_without_running_and_it_stops(failures: Failures) -> None:
    port, receiver = Channel[str].open()
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        fragile = await procs.spawn("fragile", Fragile, port)
        await fragile.record.call_one(0)  # its thread is up: the calls below pipeline there
        calls = [fragile.raise_base.call_one("KeyboardInterrupt")]
        calls += [fragile.record.call_one(i) for i in range(1, 6)]
        calls += [fragile.arecord.call_one(i) for i in range(6, 9)]
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        assert all(isinstance(e, SupervisionError) for e in outcomes), outcomes
        assert all(FAILED in str(e) for e in outcomes), outcomes
        # It stopped: __cleanup__ ran with the failure, and nothing queued behind it ran.
        told = [await asyncio.wait_for(receiver.recv(), 10) for _ in range(2)]
        assert told == ["record 0", "cleanup exc=SupervisionError"]
        assert len(failures) == 1


@pytest.mark.parametrize("which", list(WHICH))
async def test_one_from_init_fails_the_actor_only(failures: Failures, which: str) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        sibling = await procs.spawn("sibling", Fragile)
        pid = await sibling.pid.call_one()
        bad = procs.spawn("bad", Fragile, None, which)
        with pytest.raises(ActorError, match=re.escape(WHICH[which])):
            await asyncio.wait_for(bad.initialized, 10)
        f = await failures.first()
        assert (f.mesh, f.kind) == ("bad", "init") and WHICH[which] in f.report
        with pytest.raises(
            SupervisionError, match=rf"Endpoint call bad\.pid\(\) failed, .* {FAILED}"
        ):
            await bad.pid.call_one()
        assert await sibling.pid.call_one() == pid
        assert len(failures) == 1


async def test_its_owner_supervises_it_once(failures: Failures) -> None:
    port, receiver = Channel[str].open()
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        guardian = await procs.spawn("guardian", Guardian, True, port)
        await guardian.spawn_child.call_one(2)
        text = await guardian.child_raises.call_one(1, "SystemExit")
        assert re.match(
            rf"Endpoint call child\.araise_base\(\) failed, The actor \S+\.<\S+ child"
            rf"\{{'procs': 1/2\}}> {FAILED}",
            text,
        )
        seen = await asyncio.wait_for(receiver.recv(), 10)
        mesh, ranks, kind, report = seen.split("|", 3)
        assert (mesh, ranks, kind) == ("child", "[\"{'procs': 1/2}\"]", "actor")
        assert report.startswith("SystemExit: 3 in araise_base")
        # Later calls fail at once without another failure; the healthy rank serves.
        assert FAILED in await guardian.child_raises.call_one(1, "SystemExit")
        assert await guardian.child_pid.call_one(0) > 0
        assert await guardian.seen.call_one() == [seen]
        assert failures == []  # handled: nothing reached the controller


async def test_an_owner_that_leaves_it_unhandled_fails_and_stops(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        guardian = await procs.spawn("guardian", Guardian, False)
        kid_pids = await guardian.spawn_child.call_one(1)
        try:
            text = await guardian.child_raises.call_one(0, "ActorFailure")
        except SupervisionError as e:
            # __supervise__ runs beside the awaiting endpoint (as Monarch's does): the
            # guardian may fail, and its endpoint with it, before that endpoint returns
            text = str(e)
        assert FAILED in text
        f = await failures.first()
        assert (f.mesh, f.kind) == ("guardian", "unhandled") and "child" in f.report
        with pytest.raises(SupervisionError, match=rf"guardian\.seen\(\) failed, .* {FAILED}"):
            await guardian.seen.call_one()
        # It stopped, and with it the meshes it owns: its child procs are gone.
        assert await asyncio.to_thread(_wait_gone, kid_pids, 10) == []
        assert len(failures) == 1


@pytest.mark.parametrize(
    ("how", "cause"), [("segfault", "killed by SIGSEGV"), ("exit_now", "exited with code 7")]
)
async def test_a_segfault_or_os_exit_names_the_cause(
    failures: Failures, how: str, cause: str
) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        fragile = await procs.spawn("fragile", Fragile)
        call = fragile.segfault.call_one() if how == "segfault" else fragile.exit_now.call_one(7)
        with pytest.raises(SupervisionError) as info:
            await asyncio.wait_for(call, 10)
        assert re.match(
            rf"Endpoint call fragile\.{how}\(\) failed, The actor .* {FAILED}: "
            rf"its proc failed: {cause}",
            str(info.value),
        ), str(info.value)
        f = await failures.first()
        assert (f.mesh, f.kind) == ("fragile", "proc") and cause in f.report
        with pytest.raises(
            SupervisionError, match=rf"fragile\.pid\(\) failed, .* {FAILED}: .*{cause}"
        ):
            await fragile.pid.call_one()
    assert [g.mesh for g in failures] == ["fragile"]  # the proc's stop (it had exited) is none


async def test_a_call_one_that_went_the_fast_way_before_still_sees_the_failure(
    failures: Failures,
) -> None:
    # call_one learns a one-actor mesh's route on its loop and skips the mesh's lookups
    # after; a failure, a plain thread and a slice must still be seen as ever.
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        fragile = await procs.spawn("fragile", Fragile)
        # a mesh stopped after going the fast way says so, as any stopped mesh does
        other = await procs.spawn("other", Fragile)
        for _ in range(3):
            await other.pid.call_one()
        await asyncio.wait_for(other.stop(), 10)
        with pytest.raises(SupervisionError, match="mesh 'other' was stopped"):
            await asyncio.wait_for(other.pid.call_one(), 10)
        pids = {await fragile.pid.call_one() for _ in range(3)}
        assert len(pids) == 1
        assert await asyncio.to_thread(lambda: fragile.pid.call_one().get(timeout=10)) in pids
        assert await fragile.slice(procs=0).pid.call_one() in pids
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(fragile.exit_now.call_one(7), 10)
        await failures.first()
        with pytest.raises(
            SupervisionError, match=r"fragile\.pid\(\) failed, .*exited with code 7"
        ):
            await asyncio.wait_for(fragile.pid.call_one(), 10)
        with pytest.raises(SupervisionError, match="exited with code 7"):
            await asyncio.to_thread(lambda: fragile.pid.call_one().get(timeout=10))


@pytest.mark.parametrize("which", ["KeyboardInterrupt", "SystemExit"])
def test_on_this_proc_it_fails_the_actor_not_the_controllers_loop(which: str) -> None:
    # Sync code: these actors run on danaus's background loop, which asyncio leaves
    # through with a KeyboardInterrupt or SystemExit from an async endpoint.
    got: list[MeshFailure] = []
    heard = threading.Event()

    def hook(failure: MeshFailure) -> None:
        got.append(failure)
        heard.set()

    old = set_unhandled_fault_hook(hook)
    try:
        with this_proc() as here:
            fragile = here.spawn("fragile", Fragile)
            sibling = here.spawn("sibling", Fragile)
            with pytest.raises(SupervisionError, match=rf"araise_base\(\) failed, .* {FAILED}"):
                fragile.araise_base.call_one(which).get(timeout=10)
            assert heard.wait(10)
            assert sibling.pid.call_one().get(timeout=10) == os.getpid()
            with pytest.raises(SupervisionError, match=rf"fragile\.pid\(\) failed, .* {FAILED}"):
                fragile.pid.call_one().get(timeout=10)
            assert [(f.mesh, f.kind) for f in got] == [("fragile", "actor")]
    finally:
        set_unhandled_fault_hook(old)
