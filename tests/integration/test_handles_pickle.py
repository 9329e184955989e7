"""Every handle a user can reach pickles to a reference and works on the other side (real
procs): proc meshes (whole, sliced, this_proc(), an actor's own), host meshes, actor
meshes and their endpoints, value meshes and RDMA buffers passed to actors and used
there; what cannot travel (a Future, context(), an actor instance) says so; and a
pickled handle holds no socket, loop, lock, runtime or key (unpickled in a fresh
interpreter)."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus import (
    SerializationError,
    SupervisionError,
    attach_to_hosts,
    context,
    this_host,
    this_proc,
)
from danaus.actors._process import process
from danaus.rdma import RDMABuffer

from .agents_kit import controller_key, host_agents
from .handles_actors import Holder, Leaf, User

ROOT = Path(__file__).resolve().parents[2]
#: seconds any one test may wait for its procs and calls
DEADLINE = 90


async def test_a_proc_mesh_passed_to_an_actor_is_spawned_on_and_called_through() -> None:
    async with asyncio.timeout(DEADLINE):
        async with (
            this_host().spawn_procs(per_host={"procs": 1}, name="a") as a,
            this_host().spawn_procs(per_host={"procs": 2}, name="b") as b,
        ):
            holder = a.spawn("holder", Holder)
            assert await holder.take.call_one(b) == "ProcMesh"
            # The actor spawns on the mesh it was given (unpickled in its proc) and
            # calls through it: one actor in each of b's procs.
            assert await holder.spawn_and_call.call_one("x") == [(b.pids[0], 0), (b.pids[1], 1)]
            # Passed on again by that proc, to another actor, which spawns on it too.
            other = a.spawn("other", Holder)
            assert await holder.pass_on.call_one(other, "y") == [(b.pids[0], 0), (b.pids[1], 1)]
            # Back in the controller, it is the controller's own mesh again.
            back = await holder.held_procs.call_one()
            assert back.pids == b.pids
            assert back.proc_group is b.proc_group
            # A slice travels as a slice.
            await holder.take.call_one(b.slice(procs=1))
            assert await holder.spawn_and_call.call_one("z") == [(b.pids[1], 0)]


async def test_an_actor_spawns_in_its_init_on_a_proc_mesh_it_was_given() -> None:
    async with asyncio.timeout(DEADLINE):
        async with (
            this_host().spawn_procs(per_host={"procs": 1}, name="a") as a,
            this_host().spawn_procs(per_host={"procs": 2}, name="b") as b,
        ):
            holder = a.spawn("holder", Holder, b)
            assert await holder.call_init_spawned.call_one() == [(b.pids[0], 0), (b.pids[1], 1)]


async def test_what_an_actor_spawns_through_a_given_mesh_stops_with_it_not_the_procs() -> None:
    async with asyncio.timeout(DEADLINE):
        async with (
            this_host().spawn_procs(per_host={"procs": 1}, name="a") as a,
            this_host().spawn_procs(per_host={"procs": 2}, name="b") as b,
        ):
            holder = a.spawn("holder", Holder)
            await holder.take.call_one(b)
            await holder.spawn_and_call.call_one("x")
            leaves = await holder.held_leaves.call_one()
            # Stopping a reference stops the actors spawned through it; the procs stay.
            assert await holder.stop_held.call_one()
            with pytest.raises(SupervisionError):
                await leaves.where.call()
            assert len((await b.spawn("again", Leaf).where.call()).values()) == 2
            # The actor that spawned through a given mesh owns what it spawned there.
            keeper = a.spawn("keeper", Holder)
            await keeper.take.call_one(b)
            await keeper.spawn_and_call.call_one("kept")
            kept = await keeper.held_leaves.call_one()
            await keeper.stop()
            with pytest.raises(SupervisionError):
                await kept.where.call()


async def test_actor_meshes_endpoints_value_meshes_and_buffers_are_used_where_sent() -> None:
    async with asyncio.timeout(DEADLINE):
        async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
            leaves = procs.spawn("leaf", Leaf)
            user = procs.slice(procs=0).spawn("user", User)
            assert await user.call_mesh.call_one(leaves) == [
                (procs.pids[0], 0),
                (procs.pids[1], 1),
            ]
            assert await user.call_mesh.call_one(leaves.slice(procs=1)) == [(procs.pids[1], 0)]
            assert await user.call_endpoint.call_one(leaves.add, 2, 3) == [5, 5]
            values = await leaves.add.call(1, 1)
            assert await user.values_of.call_one(values) == ([2, 2], {"procs": 2})
            data = bytes(range(256)) * 16
            buf = RDMABuffer(memoryview(data))
            assert await user.read_buffer.call_one(buf) == data


async def test_this_proc_and_this_host_are_used_where_sent() -> None:
    async with asyncio.timeout(DEADLINE):
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            user = procs.spawn("user", User)
            # An actor spawned on the controller's own proc, by an actor elsewhere.
            assert await user.spawn_on.call_one(this_proc()) == [(os.getpid(), 0)]
            # Procs started on the host given, by the actor it was given to.
            mine, _, (leaf_pid, proc_pid) = await user.spawn_on_host.call_one(this_host())
            assert mine == procs.pids[0]
            assert leaf_pid == proc_pid
            assert leaf_pid not in (os.getpid(), mine)


async def test_an_actors_own_handles_pickle_its_context_says_why_not() -> None:
    async with asyncio.timeout(DEADLINE):
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            user = procs.spawn("user", User)
            got = await user.own_handles.call_one()
            for what in ("this_proc", "proc_mesh", "proc"):
                assert got[what] == "ProcMesh"
            assert got["this_host"] == "HostMesh"
            assert got["context"].startswith("TypeError: context() cannot be pickled")
            assert got["actor_instance"].startswith(
                "TypeError: context().actor_instance (procs[0].user[0]) cannot be pickled"
            )
            other = procs.spawn("other", User)
            said = await user.send_actor_instance.call_one(other)
            assert "actor_instance (procs[0].user[0]) cannot be pickled" in said


async def test_a_future_or_the_context_as_an_argument_fails_the_call_saying_why() -> None:
    async with asyncio.timeout(DEADLINE):
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            leaves = procs.spawn("leaf", Leaf)
            user = procs.spawn("user", User)
            pending = leaves.add.call_one(1, 2)
            with pytest.raises(SerializationError, match="a danaus Future cannot be pickled"):
                user.values_of.call_one(pending)
            assert await pending == 3
            with pytest.raises(SerializationError, match=r"context\(\) cannot be pickled"):
                user.values_of.call_one(context())


def test_pickled_handles_hold_no_socket_loop_lock_runtime_or_key() -> None:
    # Unpickled in a fresh interpreter with no runtime: the globals the pickle names are
    # danaus's reference types, nothing else; loading starts no thread and no runtime.
    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        leaves = procs.spawn("leaf", Leaf)
        leaves.initialized.get(timeout=DEADLINE)
        handles = {
            "procs": procs,
            "slice": procs.slice(procs=1),
            "this_proc": this_proc(),
            "host": this_host(),
            "leaves": leaves,
            "endpoint": leaves.where,
            "values": leaves.add.call(1, 2).get(timeout=DEADLINE),
        }
        data = pickle.dumps(handles)
    key = process.job_key()
    assert key not in data
    assert key.hex().encode() not in data
    program = textwrap.dedent("""
        import io, pickle, sys, threading

        class Recorder(pickle.Unpickler):
            seen = set()

            def find_class(self, module, name):
                self.seen.add(f"{module}.{name}")
                return super().find_class(module, name)

        handles = Recorder(io.BytesIO(sys.stdin.buffer.read())).load()
        from danaus.actors._loops import all_runtimes
        print(sorted(Recorder.seen))
        print({k: type(v).__name__ for k, v in handles.items()})
        print(handles["procs"], handles["slice"], handles["host"], handles["leaves"])
        print(handles["procs"].proc_group.addrs() == handles["slice"].proc_group.addrs())
        print(handles["values"].values())
        print([t.name for t in threading.enumerate()], list(all_runtimes()))
    """)
    out = subprocess.run(
        [sys.executable, "-c", program],
        input=data,
        cwd=ROOT,
        capture_output=True,
        timeout=DEADLINE,
    )
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert eval(lines[0]) == [  # what the pickle names: references, never a process
        "danaus.geometry._shape.Shape",
        "danaus.mesh._actor_endpoint.ActorEndpoint",
        "danaus.mesh._actor_mesh._rebuild",
        "danaus.mesh._host_mesh.HostMesh",
        "danaus.mesh._proc_group.GroupRef",
        "danaus.mesh._proc_mesh._rebuild",
        "danaus.mesh._value_mesh.ValueMesh",
        "tests.integration.handles_actors.Leaf",
    ]
    assert eval(lines[1]) == {
        "procs": "ProcMesh",
        "slice": "ProcMesh",
        "this_proc": "ProcMesh",
        "host": "HostMesh",
        "leaves": "ActorMesh",
        "endpoint": "ActorEndpoint",
        "values": "ValueMesh",
    }
    assert lines[2] == (
        "ProcMesh(procs, {'procs': 2}, running) ProcMesh(procs, {}, running) "
        "HostMesh(local, {}) ActorMesh(leaf: Leaf, {'procs': 2})"
    )
    assert lines[3] == "True"
    assert lines[4] == "[3, 3]"
    assert lines[5] == "['MainThread'] []"


def test_handles_held_at_module_level_of_main_reach_its_actor_classes(tmp_path: Path) -> None:
    # Classes defined in __main__ travel by value (cloudpickle), with the module-level
    # objects their methods use: a proc mesh, a host mesh after spawning on it, an
    # actor mesh, a proc mesh of a module __main__ imported; the context does not
    # travel, and the spawn says so.
    (tmp_path / "shared_handles.py").write_text(
        "from danaus import this_host\n"
        "shared = this_host().spawn_procs(per_host={'procs': 1}, name='shared')\n"
    )
    program = textwrap.dedent("""
        import os
        from danaus import Actor, endpoint, this_host, context
        from shared_handles import shared

        host = this_host()
        procs = host.spawn_procs(per_host={"procs": 2})
        ctx = context()

        class Leaf(Actor):
            @endpoint
            def pid(self) -> int:
                return os.getpid()

        leaves = procs.spawn("leaf", Leaf)

        class UsesProcs(Actor):
            @endpoint
            def run(self):
                return sorted(procs.spawn("inner", Leaf).pid.call().get(timeout=60).values())

        class UsesHost(Actor):
            @endpoint
            def run(self):
                return repr(host)

        class UsesLeaves(Actor):
            @endpoint
            def run(self):
                return sorted(leaves.pid.call().get(timeout=60).values())

        class UsesImported(Actor):
            @endpoint
            def run(self):
                return shared.spawn("inner", Leaf).pid.call_one().get(timeout=60)

        class UsesContext(Actor):
            @endpoint
            def run(self):
                return repr(ctx)

        print("pids", sorted(procs.pids), shared.pids[0])
        for cls in [UsesProcs, UsesHost, UsesLeaves, UsesImported, UsesContext]:
            try:
                user = procs.slice(procs=0).spawn(cls.__name__.lower(), cls)
                print(cls.__name__, user.run.call_one().get(timeout=60))
            except Exception as e:
                print(cls.__name__, type(e).__name__, e)
        procs.stop().get(timeout=60)
        shared.stop().get(timeout=60)
    """)
    out = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if not line.startswith("[")]
    pids, _, shared_pid = lines[0].removeprefix("pids ").rpartition(" ")
    assert lines[1] == f"UsesProcs {pids}"
    assert lines[2] == "UsesHost HostMesh(local, {})"
    assert lines[3] == f"UsesLeaves {pids}"
    assert lines[4] == f"UsesImported {shared_pid}"
    assert lines[5].startswith(
        "UsesContext SerializationError actor class UsesContext and its arguments could not "
        "be pickled: TypeError: context() cannot be pickled"
    )


@pytest.fixture
def two_agents() -> Iterator[list[str]]:
    """Host agents on 127.0.0.2 and 127.0.0.3, and this controller with their key (the
    local procs it starts get it too: a key never travels in a pickle)."""
    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=str(ROOT))
    with (
        host_agents([f"tcp://127.0.0.{i}:0" for i in (2, 3)], [env, env]) as agents,
        controller_key(key),
    ):
        yield [addr for addr, _ in agents]


async def test_host_agents_procs_passed_to_a_local_actor_are_spawned_on(
    two_agents: list[str],
) -> None:
    hosts = attach_to_hosts(two_agents)
    async with asyncio.timeout(DEADLINE), this_host().spawn_procs(per_host={"procs": 1}) as local:
        holder = local.spawn("holder", Holder)
        remote = hosts.spawn_procs(per_host={"procs": 1})
        try:
            # Their addresses come with the agents' answer, on this loop: code on it
            # cannot wait for that, and is told to await first...
            with pytest.raises(SerializationError, match=r"await procs\.initialized"):
                pickle.dumps(remote)
            # ...while sync code (a thread without a loop) waits for the answer.
            data = await asyncio.to_thread(pickle.dumps, remote)
            assert remote.pids[0] > 0
            assert process.job_key() not in data
            await holder.take.call_one(remote)
            got = await holder.spawn_and_call.call_one("x")
            assert got == [(remote.pids[0], 0), (remote.pids[1], 1)]
            # The agents' host mesh, given to the actor: it starts procs through them.
            user = local.spawn("user", User)
            mine, _, (leaf_pid, proc_pid) = await user.spawn_on_host.call_one(hosts.slice(hosts=1))
            assert leaf_pid == proc_pid
            assert proc_pid not in (mine, *remote.pids)
        finally:
            await remote.stop()
