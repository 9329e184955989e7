"""Actors for test_handles_pickle.py: they receive danaus handles as arguments (so each
is unpickled in their proc) and use them there."""

from __future__ import annotations

import os
import pickle
from typing import Any

from danaus import (
    Actor,
    ActorMesh,
    HostMesh,
    ProcMesh,
    SerializationError,
    ValueMesh,
    context,
    current_rank,
    endpoint,
    this_host,
    this_proc,
)
from danaus.rdma import RDMABuffer


class Leaf(Actor):
    """Says where it runs."""

    @endpoint
    def where(self) -> tuple[int, int]:
        """(its proc's pid, its rank in the mesh called)."""
        return os.getpid(), current_rank().rank

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b


class Holder(Actor):
    """Keeps handles it was given and uses them later, in other endpoints."""

    def __init__(self, procs: ProcMesh | None = None) -> None:
        self.procs = procs
        self.leaves: Any = None
        self.spawned_in_init: Any = None
        if procs is not None:  # spawning in __init__, on a mesh unpickled for it
            self.spawned_in_init = procs.spawn("from_init", Leaf)

    @endpoint
    def take(self, procs: ProcMesh) -> str:
        self.procs = procs
        return type(procs).__name__

    @endpoint
    def spawn_and_call(self, name: str) -> list[tuple[int, int]]:
        """Spawn Leaf actors on the held proc mesh and call them through it."""
        assert self.procs is not None
        self.leaves = self.procs.spawn(name, Leaf)
        return list(self.leaves.where.call().get(timeout=60).values())

    @endpoint
    def call_init_spawned(self) -> list[tuple[int, int]]:
        return list(self.spawned_in_init.where.call().get(timeout=60).values())

    @endpoint
    def held_procs(self) -> ProcMesh:
        """Give the held proc mesh back (pickled again, by this proc)."""
        assert self.procs is not None
        return self.procs

    @endpoint
    def held_leaves(self) -> ActorMesh[Leaf]:
        return self.leaves  # type: ignore[no-any-return]

    @endpoint
    def pass_on(self, other: Holder, name: str) -> list[tuple[int, int]]:
        """Pass the held (unpickled) proc mesh on to ``other``, which spawns on it."""
        other.take.call_one(self.procs).get(timeout=60)
        return other.spawn_and_call.call_one(name).get(timeout=60)  # type: ignore[no-any-return]

    @endpoint
    def stop_held(self) -> bool:
        """Stop the held proc mesh: from a reference, its actors stop, its procs stay."""
        assert self.procs is not None
        self.procs.stop().get(timeout=60)
        return True


class User(Actor):
    """Uses handles passed as arguments, once each."""

    @endpoint
    def call_mesh(self, mesh: Leaf) -> list[tuple[int, int]]:
        return list(mesh.where.call().get(timeout=60).values())

    @endpoint
    def call_endpoint(self, ep: Any, a: int, b: int) -> list[int]:
        return list(ep.call(a, b).get(timeout=60).values())

    @endpoint
    def values_of(self, vm: ValueMesh[int]) -> tuple[list[int], dict[str, int]]:
        return list(vm.values()), dict(vm.sizes)

    @endpoint
    def read_buffer(self, buf: RDMABuffer) -> bytes:
        dst = bytearray(buf.size())
        buf.read_into(memoryview(dst)).get(timeout=60)
        return bytes(dst)

    @endpoint
    def spawn_on_host(self, host: HostMesh) -> tuple[int, int, list[int]]:
        """Start a proc on the host mesh given, call an actor there, stop it: (this
        proc's pid, the new proc's parent pid, the new proc's pid)."""
        procs = host.spawn_procs(per_host={"procs": 1}, name="nested")
        try:
            leaf = procs.spawn("leaf", Leaf)
            ((pid, _),) = leaf.where.call().get(timeout=60).values()
            return os.getpid(), os.getppid(), [pid, procs.pids[0]]
        finally:
            procs.stop().get(timeout=60)

    @endpoint
    def spawn_on(self, procs: ProcMesh) -> list[tuple[int, int]]:
        leaves = procs.spawn("on_given", Leaf)
        return list(leaves.where.call().get(timeout=60).values())

    @endpoint
    def my_pid(self) -> int:
        return os.getpid()

    @endpoint
    def own_handles(self) -> dict[str, str]:
        """Pickle this actor's own handles here: what each gives (a type, or the error)."""
        out: dict[str, str] = {}
        me = context().actor_instance
        assert me is not None
        for what, obj in [
            ("this_proc", this_proc()),
            ("this_host", this_host()),
            ("proc_mesh", me.proc_mesh),
            ("proc", me.proc),
            ("context", context()),
            ("actor_instance", me),
        ]:
            try:
                out[what] = type(pickle.loads(pickle.dumps(obj))).__name__
            except TypeError as e:
                out[what] = f"TypeError: {e}"
        return out

    @endpoint
    def send_actor_instance(self, other: User) -> str:
        """Try to pass this actor's own instance to another actor."""
        try:
            other.my_pid.call_one(context().actor_instance).get(timeout=60)
        except SerializationError as e:
            return str(e)
        return "sent"
