"""Monarch names with Monarch's semantics, where a Monarch program would notice."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import danaus
from danaus import Actor, MeshFailure, endpoint, this_host

from .exec_actors import Worker

ROOT = Path(__file__).resolve().parents[2]


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
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        w = await procs.spawn("w", Worker)
        os.kill(procs.pids[0], signal.SIGKILL)
        failure = await asyncio.wait_for(got, 30)
        assert failure.mesh_name == failure.mesh
        assert failure.report() == failure.report and "SIGKILL" in failure.report()
        del w


def test_activate_imports_the_tensor_engine_on_demand() -> None:
    # A fresh interpreter: nothing imported danaus.tensor_engine before activate().
    program = textwrap.dedent("""
        import sys
        import torch
        from danaus import this_host
        assert "danaus.tensor_engine" not in sys.modules
        with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            with procs.activate():
                x = torch.ones(3) * 2
            from danaus.tensor_engine import inspect
            print(inspect(x).tolist())
    """)
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[2.0, 2.0, 2.0]"


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
    from danaus import ActorError

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
        with pytest.raises(ActorError) as interrupt:
            await r.raise_.call_one("interrupt")  # a BaseException: kept, not mixed in
        assert type(interrupt.value) is ActorError
        assert isinstance(interrupt.value.exception, KeyboardInterrupt)
        with pytest.raises(Exception, match="defined in the endpoint") as local:
            await r.raise_.call_one("local")
        assert isinstance(local.value, ActorError)


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


def test_a_program_using_more_monarch_names_runs_through_the_runner() -> None:
    program = Path(__file__).parent / "monarch_programs" / "more_names.py"
    out = subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "extent {hosts: 2, gpus: 2} True" in lines
    assert "joined [1, 2, 3, 4]" in lines
    assert "where [\"{'a': 0} of {'a': 2}\", \"{'a': 1} of {'a': 2}\"]" in lines
    assert (
        "ranked [(0, \"{'hosts': 0} of {'hosts': 2}\"), (1, \"{'hosts': 1} of {'hosts': 2}\")]"
        in lines
    )
    assert "helpers ['helper 0', 'helper 1', 'helper 2', 'helper 3']" in lines
    assert "concurrent_endpoint concurrent_endpoint" in lines  # monarch.actor.concurrent
    assert lines[-1] == "done"


async def test_spawn_procs_bootstrap_sets_per_coordinate_environment_first() -> None:
    from danaus import ActorError

    from .compat_actors import Env, async_setup, failing_setup, gpu_setup

    procs = this_host().spawn_procs({"hosts": 1, "gpus": 3}, gpu_setup, "trainers")
    async with procs:
        env = procs.spawn("env", Env)  # not awaited: still runs after the bootstrap
        assert (await env.seen_at_init.call()).values() == ["0", "1", "2"]
        await procs.initialized
    async with this_host().spawn_procs(per_host={"procs": 2}, bootstrap=async_setup) as procs:
        env = await procs.spawn("env", Env)
        assert (await env.get.call("SETUP_RANK")).values() == ["0", "1"]
    async with this_host().spawn_procs(per_host={"procs": 2}, bootstrap=failing_setup) as procs:
        with pytest.raises(ActorError, match="setup failed at"):
            await procs.initialized
    with pytest.raises(TypeError, match="bootstrap must be a function"):
        this_host().spawn_procs(per_host={"procs": 1}, bootstrap="setup.sh")  # type: ignore[arg-type]


async def test_default_mesh_names_are_distinct_and_to_table() -> None:
    first = this_host().spawn_procs(per_host={"procs": 2})
    second = this_host().spawn_procs(per_host={"procs": 1})
    try:
        assert first.name != second.name
        assert first.name.startswith("procs") and second.name.startswith("procs")
        await first.initialized
        table = first.to_table().splitlines()
        assert table[0].split() == ["rank", "procs", "pid", "address"]
        assert [line.split()[:3] for line in table[1:]] == [
            ["0", "0", str(first.pids[0])],
            ["1", "1", str(first.pids[1])],
        ]
    finally:
        await first.stop()
        await second.stop()
    third = this_host().spawn_procs(per_host={"procs": 1})  # a stopped mesh's name is free
    async with third:
        assert third.name in (first.name, second.name)


async def test_host_mesh_shutdown_stops_its_proc_meshes() -> None:
    from danaus import SupervisionError

    from .compat_actors import Env

    host = this_host()
    procs = host.spawn_procs(per_host={"procs": 2})
    env = await procs.spawn("env", Env)
    pids = procs.pids
    await host.shutdown()
    with pytest.raises(SupervisionError):
        await env.get.call("HOME")
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: gone


async def test_hosts_from_config_without_a_config_is_two_local_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from .compat_actors import Ranks

    monkeypatch.delenv("MONARCH_HOSTS", raising=False)
    hosts = danaus.hosts_from_config("MONARCH_HOSTS")
    assert hosts.extent == danaus.Extent(["hosts"], [2])
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    async with procs:
        assert procs.extent.labels == ["hosts", "gpus"] and procs.extent.sizes == [2, 2]
        ranks = await procs.spawn("ranks", Ranks)
        who = await ranks.slice(hosts=1).who.call()
        assert [w["message"] for w in who.values()] == [{"gpus": 0}, {"gpus": 1}]
        await hosts.shutdown()


async def test_logging_option_is_awaitable_and_aggregates_identical_lines(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from .compat_actors import Env

    async with this_host().spawn_procs(per_host={"procs": 4}, name="agg") as procs:
        env = await procs.spawn("env", Env)
        await procs.logging_option(stream_to_client=True, aggregate_window_sec=0.5)
        await env.say.call("the same line from every rank")
        await env.slice(procs=2).say.call_one("only rank 2")
        await procs.logging_option(aggregate_window_sec=None)  # flushes what is pending
        await env.slice(procs=1).say.call_one("one by one")
    out = capfd.readouterr().out
    assert out.count("the same line from every rank") == 1
    assert "[agg 0-3] the same line from every rank" in out
    assert "[agg 2] only rank 2" in out
    assert "[agg 1] one by one" in out
    with pytest.raises(ValueError, match="aggregate_window_sec"):
        procs.logging_option(aggregate_window_sec=-1)


def test_run_worker_loop_forever_and_attach_to_workers() -> None:
    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=str(ROOT))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from danaus import run_worker_loop_forever; "
            "run_worker_loop_forever(address='tcp://127.0.0.2:0', ca='trust_all_connections')",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert "listening on tcp://" in line, line
        program = textwrap.dedent(f"""
            from danaus import attach_to_workers
            from tests.integration.compat_actors import Ranks
            hosts = attach_to_workers(workers=["{line.split()[-1]}"], ca="trust_all_connections")
            with hosts.spawn_procs(per_host={{"gpus": 2}}) as procs:
                ranks = procs.spawn("ranks", Ranks)
                print([w["own"] for w in ranks.who.call().get(timeout=60).values()])
        """)
        out = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == (
            "[{'hosts': 0, 'gpus': 0}, {'hosts': 0, 'gpus': 1}]"
        )
    finally:
        worker.terminate()
        worker.wait(30)
        if worker.stdout is not None:
            worker.stdout.close()


def _run_program(name: str) -> subprocess.CompletedProcess[str]:
    program = Path(__file__).parent / "monarch_programs" / name
    return subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_crawler_pattern_runs_through_the_runner() -> None:
    out = _run_program("crawler.py")
    assert out.returncode == 0, out.stderr
    # Pages 0..39 are within depth 3 of page 0 (1 + 3 + 9 + 27); each is crawled once.
    assert "Finished - Found 40 (seen 40)." in out.stdout
    lines = out.stdout.splitlines()
    assert lines[-5] == "ValueMesh({procs: 4}):"
    assert sum(int(line.rsplit(": ", 1)[1]) for line in lines[-4:]) == 40
    found = {line.split("found page ")[1].split()[0] for line in lines if "found page" in line}
    assert found == {str(p) for p in range(40)}
    # The crawlers' last get() timed out and failed later, at stop: nobody is told twice.
    assert "never retrieved" not in out.stderr, out.stderr


def test_the_grpo_pattern_runs_through_the_runner() -> None:
    out = _run_program("grpo.py")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    losses = [line for line in lines if line.startswith("[Step ")]
    assert [line[:9] for line in losses] == [f"[Step {i:02d}]" for i in range(5)]
    assert all(math.isfinite(float(line.split("loss=")[1])) for line in losses)
    assert "weights in sync True" in lines  # pulled from the learner over RDMA
    assert "scored 12" in lines  # 2 generators x (1 + 5 steps)
    assert lines[-1] == "Training complete"


def test_attach_to_hosts_after_local_procs_already_run(tmp_path: Path) -> None:
    agent_key = os.urandom(32).hex()
    key_file = tmp_path / "key"
    key_file.write_text(agent_key)
    agent_env = dict(os.environ, DANAUS_AUTH_KEY=agent_key, PYTHONPATH=str(ROOT))
    agent = subprocess.Popen(
        [sys.executable, "-m", "danaus", "host-agent", "--listen", "tcp://127.0.0.2:0"],
        stdout=subprocess.PIPE,
        text=True,
        env=agent_env,
    )
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert "listening on tcp://" in line, line
        program = textwrap.dedent(f"""
            import asyncio
            import numpy as np
            from danaus import attach_to_hosts, this_host
            from tests.integration.compat_actors import Client, Ranks
            from tests.conformance.test_rdma import Owner, _expected

            async def main():
                async with this_host().spawn_procs(per_host={{"procs": 1}}) as local:
                    mine = await local.spawn("mine", Ranks)  # runs with this job's own key
                    hosts = attach_to_hosts(["{line.split()[-1]}"], key_file="{key_file}")
                    async with hosts.spawn_procs(per_host={{"gpus": 2}}) as remote:
                        ranks = await remote.spawn("ranks", Ranks)
                        print([w["own"] for w in (await ranks.who.call()).values()])
                        owner = await remote.slice(gpus=1).spawn("owner", Owner)
                        buf = await owner.make.call_one("b", 1000)
                        dst = np.empty(1000, np.uint8)
                        await buf.read_into(dst)
                        print("rdma over tcp", dst.tobytes() == _expected(1000))
                        clients = await remote.spawn("clients", Client)
                        got = (await clients.register_async.call()).values()
                        print("singleton", sorted(got))
                    print("local", (await mine.who.call_one())["own"])

            asyncio.run(main())
        """)
        env = dict(os.environ, PYTHONPATH=str(ROOT), DANAUS_RDMA_BACKEND="tcp")
        env.pop("DANAUS_AUTH_KEY", None)
        out = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[-4:] == [
            "[{'hosts': 0, 'gpus': 0}, {'hosts': 0, 'gpus': 1}]",
            "rdma over tcp True",
            "singleton [101, 102]",  # get_or_spawn_controller from the agents' procs
            "local {'procs': 0}",
        ]
    finally:
        agent.terminate()
        agent.wait(30)
        if agent.stdout is not None:
            agent.stdout.close()


async def test_actor_instance_proc_spawns_next_to_the_actor() -> None:
    from .compat_actors import Spawner

    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        spawners = await procs.spawn("spawners", Spawner)
        pairs = (await spawners.sibling_pid.call()).values()
        assert [a for a, _ in pairs] == procs.pids
        assert all(a == b for a, b in pairs)


async def test_shutdown_context_stops_every_proc_mesh_of_this_process() -> None:
    first = this_host().spawn_procs(per_host={"procs": 2})
    second = this_host().spawn_procs(per_host={"procs": 1})
    await first.initialized
    await second.initialized
    pids = first.pids + second.pids
    await danaus.shutdown_context()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    await danaus.shutdown_context()  # nothing left: done at once


def test_a_program_using_monarch_spmd_runs_through_the_runner() -> None:
    program = Path(__file__).parent / "monarch_programs" / "spmd_env.py"
    out = subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["all_reduce [3.0, 3.0]", "done"]


async def test_actor_instance_proc_mesh_spawns_on_every_proc_of_the_actors_mesh() -> None:
    from .compat_actors import MeshSpawner

    async with this_host().spawn_procs(per_host={"procs": 3}, name="pm") as procs:
        spawner = await procs.slice(procs=1).spawn("spawner", MeshSpawner)
        got = await asyncio.wait_for(spawner.siblings.call_one(), 60)
        assert got == {"pids": procs.pids, "sizes": {"procs": 3}, "name": "pm"}
        again = await asyncio.wait_for(spawner.siblings.call_one(), 60)  # procs still serve
        assert again["pids"] == procs.pids


def test_the_distributed_tensors_pattern_runs_through_the_runner() -> None:
    program = Path(__file__).parent / "monarch_programs" / "distributed_tensors.py"
    out = subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for line in [
        "inspect (3, 4)",
        "obj (3, 3)",
        "failed as expected: RemoteException",
        "RECOVERED!",
        "reduce ok True",
        "2d {'dp': 2, 'tp': 2}",
        "3d {'dp': 1, 'pp': 2, 'tp': 2}",
        "pipeline (3, 4)",
        "trained True",
    ]:
        assert line in lines, (line, out.stdout)
    assert lines[-1] == "done"
