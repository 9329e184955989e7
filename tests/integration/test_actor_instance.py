"""``context().actor_instance.abort()`` / ``kill()`` / ``stop()``, as Monarch's actors use
them (its ``test_actor_abort``): an actor ends itself, failed or not."""

from __future__ import annotations

import asyncio
import io
import logging
import pickle

import pytest

import danaus
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

    @endpoint
    def creator(self) -> object:
        return context().actor_instance.creator

    @endpoint
    async def spawn_one(self) -> object:
        """Spawns an Ender next to itself and returns what that one says of its creator."""
        inner = await context().actor_instance.proc.spawn("inner", Ender)
        return await inner.creator.call_one()

    @endpoint
    def log(self, text: str) -> str:
        return _logged(text)


def _logged(text: str, *args: object) -> str:
    """What one record logged now reads as, through a handler that prints only it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("tests.actor_instance.capture")
    logger.addHandler(handler)
    try:
        logger.error(text, *args)
    finally:
        logger.removeHandler(handler)
    return out.getvalue().rstrip("\n")


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


async def test_the_controller_is_the_root_instance_and_every_actors_first_creator() -> None:
    root = context().actor_instance
    assert str(root) == "<root>" and root.name == "root" and root.creator is None
    assert dict(root.rank) == {} and context().is_controller
    with pytest.raises(RuntimeError, match="not an actor"):
        root.abort("no")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(root)
    async with this_host().spawn_procs(per_host={"f": 2}, name="line") as procs:
        enders = await procs.spawn("outer", Ender)
        creator = await enders.slice(f=0).creator.call_one()
        assert creator.name == "root" and creator.creator is None and str(creator) == "<root>"
        # an actor spawned by an actor: its creator is that actor, then the root
        nested = await enders.slice(f=1).spawn_one.call_one()
        assert nested.name == "outer" and dict(nested.rank) == {"f": 1}
        assert nested.creator.name == "root"
        assert str(nested) == "<root>.<tests.integration.test_actor_instance.Ender outer{'f': 1/2}>"


async def test_log_lines_name_the_instance_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _logged("plain") == "plain"  # off by default in danaus
    monkeypatch.setattr(danaus.config, "prefix_python_logs_with_actor", True)
    assert _logged("from %s, 100%%", "here") == "[actor=<root>] from here, 100%"
    assert _logged("") == ""  # torch.compile's structured lines stay empty
    env = {"DANAUS_PREFIX_PYTHON_LOGS_WITH_ACTOR": "1"}
    async with this_host().spawn_procs(per_host={"f": 2}, name="logs", env=env) as procs:
        enders = await procs.spawn("talker", Ender)
        line = await enders.slice(f=1).log.call_one("huh \udcff")
    assert line == (
        "[actor=logs[1].<tests.integration.test_actor_instance.Ender talker{'f': 1/2}>] huh \udcff"
    )
    monkeypatch.setattr(danaus.config, "prefix_python_logs_with_actor", False)
    assert _logged("plain") == "plain"
