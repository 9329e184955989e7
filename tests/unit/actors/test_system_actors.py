"""``ensure_actor``: the one way the layers above install a system actor on a runtime
(a spawner's supervisor and controllers, a host agent, the data plane's service): the
one there is kept while it serves, and replaced once it failed or stopped."""

from __future__ import annotations

from danaus.actors._actor import Actor, endpoint
from danaus.actors._instance import ActorInstance
from danaus.actors._runtime import Runtime
from danaus.actors.seam import ensure_actor


class _Service(Actor):
    made = 0

    def __init__(self) -> None:
        type(self).made += 1
        self.n = type(self).made

    @endpoint
    def which(self) -> int:
        return self.n


async def test_a_system_actor_is_installed_once_and_replaced_when_it_ended(
    runtime: Runtime,
) -> None:
    _Service.made = 0

    def installed() -> ActorInstance:
        inst = runtime.local_actor("__svc__")
        assert isinstance(inst, ActorInstance)
        return inst

    ensure_actor(runtime, "__svc__", _Service)
    first = installed()
    assert _Service.made == 1
    ensure_actor(runtime, "__svc__", _Service)  # it serves: kept, nothing made
    assert installed() is first and _Service.made == 1
    first.failed = "it raised"  # as a failed actor is marked
    ensure_actor(runtime, "__svc__", _Service)
    second = installed()
    assert second is not first and _Service.made == 2
    await second.stop()
    ensure_actor(runtime, "__svc__", _Service)
    third = installed()
    assert third is not second and _Service.made == 3
    assert isinstance(third.obj, _Service) and third.obj.n == 3
