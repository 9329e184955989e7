"""Actors for the Monarch compatibility tests (importable by procs)."""

from __future__ import annotations

import os
from typing import Any

from danaus import Actor, context, current_actor_name, current_rank, current_size, endpoint


class Ranks(Actor):
    """Says who it is and where the message found it."""

    @endpoint
    def who(self) -> dict[str, Any]:
        me = context().actor_instance
        assert me is not None
        return {
            "pid": os.getpid(),
            "own": dict(me.rank),
            "own_rank": me.rank.rank,
            "message": dict(current_rank()),
            "message_rank": current_rank().rank,
            "size": current_size(),
            "proc_id": me.proc_id,
            "name": current_actor_name(),
        }

    @endpoint
    def log(self, text: str) -> None:
        self.logger.info(text)

    @endpoint
    async def awho(self) -> dict[str, Any]:
        return {"message": dict(current_rank()), "size": current_size()}


class CodedError(Exception):
    """An exception with an attribute of its own."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message, code)
        self.code = code


class OddInitError(Exception):
    """Its __init__ takes other arguments than its args: it does not unpickle."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}+{b}")


class Raiser(Actor):
    @endpoint
    def raise_(self, kind: str) -> None:
        import threading

        if kind == "value":
            raise ValueError("bad value", 42)
        if kind == "coded":
            raise CodedError("coded", code=7)
        if kind == "odd":
            raise OddInitError("a", "b")
        if kind == "unpicklable":
            err = RuntimeError("holds a lock")
            err.lock = threading.Lock()  # type: ignore[attr-defined]
            raise err
        if kind == "interrupt":
            raise KeyboardInterrupt("stop")
        if kind == "local":

            class LocalError(Exception):
                pass

            raise LocalError("defined in the endpoint")
        raise AssertionError(kind)


class Registry(Actor):
    """A singleton service: counts who registered."""

    def __init__(self, start: int = 0) -> None:
        self.count = start

    @endpoint
    def register(self) -> int:
        self.count += 1
        return self.count


class Client(Actor):
    """Finds the registry from inside an endpoint, sync and async, and from a child."""

    @endpoint
    def register_sync(self) -> int:
        from danaus import get_or_spawn_controller

        registry = get_or_spawn_controller("registry", Registry, 100).get(timeout=30)
        return int(registry.register.call_one().get(timeout=30))

    @endpoint
    async def register_async(self) -> int:
        from danaus import get_or_spawn_controller

        registry = await get_or_spawn_controller("registry", Registry, 100)
        return int(await registry.register.call_one())

    @endpoint
    async def register_from_child(self) -> int:
        from danaus import this_host

        procs = this_host().spawn_procs(per_host={"procs": 1}, name="child")
        child = procs.spawn("child", Client)
        try:
            return int(await child.register_async.call_one())
        finally:
            await procs.stop()


class Plain(Actor):
    """A plain method beside an endpoint."""

    def __init__(self) -> None:
        self.calls = 0

    def plain(self, x: int) -> int:
        self.calls += 1
        return x * 2 + current_rank().rank

    async def aplain(self, x: int) -> int:
        return -x

    @endpoint
    def double(self, x: int) -> int:
        if x < 0:
            raise ValueError(f"negative {x}")
        return x * 2

    @endpoint
    def calls_made(self) -> int:
        return self.calls


def gpu_setup() -> None:
    """A spawn_procs bootstrap: each proc's CUDA_VISIBLE_DEVICES from its gpus coordinate."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(current_rank()["gpus"])


async def async_setup() -> None:
    import asyncio

    await asyncio.sleep(0)
    os.environ["SETUP_RANK"] = str(current_rank().rank)


def failing_setup() -> None:
    raise RuntimeError(f"setup failed at {current_rank()}")


class Env(Actor):
    """Reads its proc's environment (set by a bootstrap function before it started)."""

    def __init__(self) -> None:
        self.at_init = os.environ.get("CUDA_VISIBLE_DEVICES")

    @endpoint
    def get(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def seen_at_init(self) -> str | None:
        return self.at_init

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Spawner(Actor):
    """Spawns a sibling actor in its own proc through context().actor_instance.proc."""

    @endpoint
    async def sibling_pid(self) -> tuple[int, int]:
        me = context().actor_instance
        assert me is not None
        sibling = await me.proc.spawn("sibling", Env)
        return os.getpid(), int(await sibling.pid.call_one())


class Sibling(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class MeshSpawner(Actor):
    """Spawns actors on the proc mesh it was spawned on (actor_instance.proc_mesh)."""

    @endpoint
    async def siblings(self) -> dict[str, Any]:
        me = context().actor_instance
        assert me is not None
        pm = me.proc_mesh
        sib = pm.spawn("sib", Sibling)
        pids = (await sib.pid.call()).values()
        await pm.stop()  # stops the siblings, not the procs
        return {"pids": pids, "sizes": pm.sizes, "name": pm.name}


class ThreadLocalCounter(Actor):
    """All sync, so its __init__ runs on its own thread, as Monarch runs it: thread-local
    state set there is its endpoints'."""

    def __init__(self, fail: bool = False) -> None:
        import threading

        self.local = threading.local()
        self.local.count = 0
        self.init_thread = threading.get_ident()
        if fail:
            raise ValueError("init failed on the actor's thread")

    @endpoint
    def bump(self) -> None:
        self.local.count += 1

    @endpoint
    def seen(self) -> tuple[int, bool]:
        import threading

        return self.local.count, threading.get_ident() == self.init_thread
