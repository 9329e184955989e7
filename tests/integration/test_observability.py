"""What a running job is doing: per-actor stats, proc records and stacks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from danaus import ActorError, this_host

from .obs_actors import Busy


async def _until(get: Callable[[], Any], cond: Callable[[Any], bool], within: float = 30) -> Any:
    """Ask ``get()`` again until ``cond`` holds for its answer (bounded); the answer."""
    deadline = time.monotonic() + within
    while True:
        value = await get()
        if cond(value) or time.monotonic() > deadline:
            assert cond(value), value
            return value


async def test_stats_count_messages_and_failures_per_endpoint() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}, name="procs") as procs:
        busy = await procs.spawn("busy", Busy)
        for _ in range(3):
            await busy.ok.call()
        with pytest.raises(ActorError):
            await busy.slice(procs=1).boom.call_one()
        stats = (await busy.stats()).values()
    assert [s["handled"] for s in stats] == [{"ok": 3}, {"ok": 3, "boom": 1}]
    assert [s["errors"] for s in stats] == [{}, {"boom": 1}]
    assert stats[0]["last_failure"] is None
    assert "ValueError: boom on purpose" in stats[1]["last_failure"]
    assert [s["actor"] for s in stats] == ["procs[0].busy[0]", "procs[1].busy[1]"]
    assert all(s["mailbox"] == 0 and s["running"] == [] for s in stats)
    assert [s["proc"]["pid"] for s in stats] == procs.pids
    for s in stats:
        proc = s["proc"]
        assert proc["rss_bytes"] > 1 << 20 and proc["connections"] >= 1
        assert proc["bytes_in"] > 0 and proc["bytes_out"] > 0 and proc["cpu_percent"] >= 0


async def test_a_blocked_sync_endpoint_shows_in_stats_and_stacks() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="procs") as procs:
        busy = await procs.spawn("busy", Busy)
        other = await procs.spawn("other", Busy)  # in the same proc: it releases busy
        blocked = busy.block.call_one()  # runs on the actor's thread, waiting
        queued = [busy.ok.call_one() for _ in range(2)]  # wait behind it
        stats = await _until(
            lambda: busy.stats(),
            lambda vm: vm.values()[0]["running"] and vm.values()[0]["mailbox"] == 2,
        )
        ((method, seconds),) = stats.values()[0]["running"]
        assert method == "block" and seconds >= 0
        stacks = (await busy.stacks()).values()[0]
        mine = [s for s in stacks if s.get("endpoint") == "block"]
        assert len(mine) == 1 and mine[0]["actor"] == "procs[0].busy[0]"
        assert "_gate.wait(60)" in mine[0]["stack"]
        assert any(s["thread"] == "MainThread" for s in stacks)  # every thread is there
        await other.release.call_one()
        assert await asyncio.wait_for(blocked, 30) == "released"
        assert await asyncio.wait_for(asyncio.gather(*queued), 30) == [1, 1]
        after = (await busy.stats()).values()[0]
        assert after["running"] == [] and after["handled"]["ok"] == 2


async def test_a_waiting_async_endpoint_shows_as_a_task_and_proc_stats_list_actors() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}, name="procs") as procs:
        busy = await procs.spawn("busy", Busy)
        other = await procs.spawn("other", Busy)
        waiting = busy.asleep.call_one()
        await _until(lambda: busy.stats(), lambda vm: vm.values()[0]["running"])
        tasks = [s for s in (await busy.stacks()).values()[0] if "task" in s]
        assert [t["endpoint"] for t in tasks] == ["asleep"]
        assert "_wake[0].wait()" in tasks[0]["stack"]
        record = (await procs.stats()).values()[0]
        assert record["pid"] == procs.pids[0]
        assert sorted(a["actor"] for a in record["actors"]) == [
            "procs[0].busy[0]",
            "procs[0].other[0]",
        ]
        await other.wake_up.call_one()
        assert await asyncio.wait_for(waiting, 30) == "woken"
        assert (await other.stats()).values()[0]["handled"] == {"wake_up": 1}


async def test_an_actors_own_stats_endpoint_wins_and_mesh_stats_still_reaches_the_records() -> None:
    from danaus import mesh_stacks, mesh_stats

    from .obs_actors import OwnStats

    async with this_host().spawn_procs(per_host={"procs": 1}, name="procs") as procs:
        own = await procs.spawn("own", OwnStats)  # not refused as shadowing ActorMesh.stats
        assert await own.stats.call_one() == "mine"
        record = (await mesh_stats(own)).values()[0]
        assert record["actor"] == "procs[0].own[0]" and record["handled"] == {"stats": 1}
        assert any(s["thread"] == "MainThread" for s in (await mesh_stacks(own)).values()[0])


@contextlib.contextmanager
def _stuck_warnings() -> Iterator[tuple[threading.Event, list[logging.LogRecord]]]:
    """Inside, danaus.supervision's stuck-endpoint warnings are kept: (an event set at
    the first, the records)."""
    seen = threading.Event()
    records: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "has been running for" in record.getMessage():
                records.append(record)
                seen.set()

    catch = Catch(level=logging.WARNING)
    logging.getLogger("danaus.supervision").addHandler(catch)
    try:
        yield seen, records
    finally:
        logging.getLogger("danaus.supervision").removeHandler(catch)


async def test_an_endpoint_running_too_long_is_reported_on_the_controller_with_its_stack() -> None:
    from danaus.mesh._process import process

    with _stuck_warnings() as (seen, records):
        env = {"DANAUS_STUCK_WARN_AFTER": "0.5", "DANAUS_HEARTBEAT_INTERVAL": "0.25"}
        async with this_host().spawn_procs(per_host={"procs": 1}, env=env, name="procs") as procs:
            busy = await procs.spawn("busy", Busy)
            other = await procs.spawn("other", Busy)
            blocked = busy.block.call_one()
            assert await asyncio.to_thread(seen.wait, 30), "no stuck-endpoint warning"
            await other.release.call_one()
            assert await asyncio.wait_for(blocked, 30) == "released"
    text = records[0].getMessage()
    assert "endpoint block of procs[0].busy[0] (mesh busy, rank {'procs': 0/1})" in text
    assert "_gate.wait(60)" in text  # where it is stuck
    _, report = process.stuck_reports[-1]
    assert report.endpoint == "block" and report.seconds >= 0.5


async def test_an_endpoint_marked_long_running_is_never_reported_stuck() -> None:
    """``@endpoint(long_running=True)`` (a shell's, a server loop's) runs as long as what
    it serves: no warning, no report, its actor busy, not stuck; a plain endpoint
    running as long beside it on the same proc is reported."""
    from danaus.config import configured
    from danaus.mesh._admin.metrics import _Collector
    from danaus.mesh._admin.snapshot import snapshot
    from danaus.mesh._process import process

    with (
        _stuck_warnings() as (seen, records),
        configured(stuck_warn_after=0.5, heartbeat_interval=0.25),  # (here and the procs)
    ):
        async with this_host().spawn_procs(per_host={"procs": 1}, name="procs") as procs:
            serving = await procs.spawn("serving", Busy)
            waiting = await procs.spawn("waiting", Busy)
            busy = await procs.spawn("busy", Busy)
            other = await procs.spawn("other", Busy)
            served = serving.serve.call_one()
            served_async = waiting.serve_async.call_one()
            blocked = busy.block.call_one()  # (sent after them: it has run the least)
            assert await asyncio.to_thread(seen.wait, 30), "no stuck-endpoint warning"
            # (one check of the proc reports all it finds: both long ones ran longer)
            picture = await snapshot()
            metrics = await asyncio.to_thread(lambda: list(_Collector().collect()))
            await other.release.call_one()
            await other.wake_up.call_one()
            assert await asyncio.wait_for(blocked, 30) == "released"
            assert await asyncio.wait_for(served, 30) == "served"
            assert await asyncio.wait_for(served_async, 30) == "served"
    said = " ".join(r.getMessage() for r in records)
    assert "endpoint block of procs[0].busy[0]" in said
    assert "serve" not in said, said
    assert all(s.endpoint == "block" for _, s in process.stuck_reports if "busy" in s.actor_id)
    assert not [s for _, s in process.stuck_reports if s.endpoint.startswith("serve")]
    health = {a["actor"]: a["health"] for a in picture["actors"]}
    assert health["procs[0].busy[0]"] == "stuck"
    assert health["procs[0].serving[0]"] == health["procs[0].waiting[0]"] == "busy", health
    # nor does the metric of the longest-running endpoint count it
    running = {
        s.labels["actor"]: s.value
        for family in metrics
        if family.name == "danaus_actor_running_seconds"
        for s in family.samples
        if s.labels["mesh"] != "_stats"
    }
    assert running["procs[0].busy[0]"] >= 0.5, running
    assert running["procs[0].serving[0]"] == running["procs[0].waiting[0]"] == 0.0, running


async def test_a_hanging_init_on_the_actors_thread_is_reported_with_its_stack() -> None:
    from danaus.mesh._admin.snapshot import snapshot

    from .obs_actors import OpensInit, SlowInit

    with _stuck_warnings() as (seen, records):
        env = {"DANAUS_STUCK_WARN_AFTER": "0.5", "DANAUS_HEARTBEAT_INTERVAL": "0.25"}
        async with this_host().spawn_procs(per_host={"procs": 1}, env=env, name="procs") as procs:
            opener = await procs.spawn("opener", OpensInit)
            slow = procs.spawn("slow", SlowInit)  # its __init__ waits for the gate
            assert await asyncio.to_thread(seen.wait, 30), "no report of __init__"
            # the proc kept serving meanwhile: the other actor opens the gate
            await opener.open_init_gate.call_one()
            assert await asyncio.wait_for(slow.ok.call_one(), 30) == 1
            picture = await snapshot()
    text = records[0].getMessage()
    assert text.startswith("__init__ of procs[0].slow[0] (mesh slow, rank {'procs': 0/1})")
    assert "_init_gate.wait(60)" in text  # where it waits
    [report] = [s for s in picture["stuck"] if s["actor"] == "procs[0].slow[0]"][:1]
    assert report["endpoint"] == "__init__" and report["seconds"] >= 0.5


async def test_a_hanging_init_on_the_procs_loop_is_reported_and_stop_ends_it() -> None:
    from danaus import config
    from danaus.config import configured

    from .obs_actors import HangingAsyncInit

    # (the spawner reports it: the controller's setting counts, the procs' too)
    with (
        _stuck_warnings() as (seen, records),
        configured(stuck_warn_after=0.5, heartbeat_interval=0.25),
    ):
        procs = this_host().spawn_procs(per_host={"procs": 1}, name="procs")
        procs.spawn("hangs", HangingAsyncInit)
        assert await asyncio.to_thread(seen.wait, 30), "no report of __init__"
        started = time.monotonic()
        await asyncio.wait_for(procs.stop(), 30)
        took = time.monotonic() - started
    text = records[0].getMessage()
    assert text.startswith("__init__ of procs[0].hangs[0] (mesh hangs, rank {'procs': 0/1})")
    assert "runs on its proc's event loop" in text  # why there is no stack
    assert took < config.stop_timeout + 5  # the proc could not stop itself: it was ended


async def test_serve_metrics_exposes_actor_and_proc_figures_to_prometheus() -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from danaus import serve_metrics

    async with this_host().spawn_procs(per_host={"procs": 2}, name="metered") as procs:
        busy = await procs.spawn("busy", Busy)
        for _ in range(3):
            await busy.ok.call()
        with pytest.raises(ActorError):
            await busy.slice(procs=0).boom.call_one()
        server = serve_metrics(0)
        try:
            url = f"http://127.0.0.1:{server.port}/metrics"

            def scrape() -> str:
                with urllib.request.urlopen(url, timeout=30) as r:
                    return str(r.read().decode())

            text = await asyncio.to_thread(scrape)
        finally:
            server.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    actor = {"procs": "metered", "mesh": "busy"}
    for r in (0, 1):
        a = {**actor, "rank": str(r), "actor": f"metered[{r}].busy[{r}]"}
        assert value("danaus_actor_messages_total", **a, endpoint="ok") == 3
        assert value("danaus_actor_mailbox_depth", **a) == 0
    a0 = {**actor, "rank": "0", "actor": "metered[0].busy[0]"}
    assert value("danaus_actor_errors_total", **a0, endpoint="boom") == 1
    rss = [v for (n, _), v in samples.items() if n == "danaus_proc_rss_bytes"]
    assert len(rss) == 2 and all(v > 1 << 20 for v in rss)


async def test_stats_can_be_switched_off_per_proc() -> None:
    env = {"DANAUS_ACTOR_STATS": "0"}
    async with this_host().spawn_procs(per_host={"procs": 1}, env=env, name="procs") as procs:
        busy = await procs.spawn("busy", Busy)
        await busy.ok.call()
        with pytest.raises(ActorError):
            await busy.boom.call_one()
        (record,) = (await busy.stats()).values()
    assert record["handled"] == {}  # not counted
    assert record["errors"] == {"boom": 1}  # failures are rare: always kept
    assert record["proc"]["pid"] == procs.pids[0]
