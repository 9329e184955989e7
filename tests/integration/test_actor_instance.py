"""``context().actor_instance.abort()`` / ``kill()`` / ``stop()``, as Monarch's actors use
them (its ``test_actor_abort``): an actor ends itself, failed or not."""

from __future__ import annotations

import asyncio

import pytest

from danaus import Actor, SupervisionError, context, endpoint, this_host

from ..faults import Failures

pytestmark = pytest.mark.timeout(120)


class Ender(Actor):
    def __init__(self) -> None:
        self.cleaned = False

    @endpoint
    def abort(self, reason: str | None = None) -> str:
        context().actor_instance.abort(reason)
        return "returned"

    @endpoint
    async def akill(self, reason: str | None = None) -> str:
        context().actor_instance.kill(reason)
        return "returned"

    @endpoint
    def finish(self) -> str:
        context().actor_instance.stop("done")
        return "returned"

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def me(self) -> str:
        return str(context().actor_instance)


@pytest.mark.parametrize("reason", [None, "test abort reason \udcff"])
@pytest.mark.parametrize("how", ["abort", "akill"])  # on its thread, on the loop
async def test_an_actor_aborts_itself(failures: Failures, how: str, reason: str | None) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        ender = await procs.spawn("ender", Ender)
        sibling = await procs.spawn("sibling", Ender)
        try:  # the endpoint's own answer may race the failure, as in Monarch
            assert await asyncio.wait_for(getattr(ender, how).call_one(reason), 30) == "returned"
        except SupervisionError:
            pass
        f = await failures.first(30)
        assert f.mesh == "ender" and f.kind == "actor"
        assert "Ender aborted" in f.report
        assert (reason or "no reason provided").encode(
            "utf-8", "backslashreplace"
        ).decode() in f.report
        with pytest.raises(SupervisionError, match="and all its descendants have failed"):
            await asyncio.wait_for(ender.ping.call_one(), 30)
        assert await sibling.ping.call_one() == "pong"
        assert len(failures) == 1


async def test_an_actor_stops_itself_without_a_failure(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        ender = await procs.spawn("ender", Ender)
        assert await asyncio.wait_for(ender.finish.call_one(), 30) == "returned"
        with pytest.raises(SupervisionError, match="was stopped"):
            await asyncio.wait_for(ender.ping.call_one(), 30)
        assert not failures  # stopped, not failed: nobody is told of a failure


async def test_an_actor_instance_prints_as_monarchs_does() -> None:
    async with this_host().spawn_procs(per_host={"f": 2}, name="named") as procs:
        enders = await procs.spawn("the_name", Ender)
        assert await enders.slice(f=1).me.call_one() == (
            "named[1].<tests.integration.test_actor_instance.Ender the_name{'f': 1/2}>"
        )
