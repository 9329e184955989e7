"""Ordinary values that used to kill procs or hang callers: huge plain values, results
over the frame limit, text that is not UTF-8, BaseException subclasses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from danaus import ActorError, ProcMesh, SerializationError, SupervisionError, config, this_host

from .values_actors import NOT_UTF8, Values

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def procs() -> AsyncIterator[ProcMesh]:
    async with this_host().spawn_procs(per_host={"procs": 1}) as p:
        yield p


async def test_plain_values_larger_than_a_header_travel(procs: ProcMesh) -> None:
    v = await procs.spawn("v", Values)
    pid = await v.pid.call_one()
    big_str = "y" * (17 << 20)  # over max_header_bytes (16 MiB)
    big_list = list(range(4_000_000))
    assert await asyncio.wait_for(v.echo.call_one(big_str), 60) == big_str
    assert await asyncio.wait_for(v.aecho.call_one(big_list), 60) == big_list
    assert await asyncio.wait_for(v.make.call_one("str", 17 << 20), 60) == "x" * (17 << 20)
    assert await asyncio.wait_for(v.amake.call_one("list", 4_000_000), 60) == big_list
    assert await v.pid.call_one() == pid  # the same proc, alive


async def test_values_over_the_frame_limit_fail_that_call_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DANAUS_MAX_FRAME_BYTES", str(1 << 20))
    monkeypatch.setattr(config, "max_frame_bytes", 1 << 20)
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        v = await procs.spawn("v", Values)
        pid = await v.pid.call_one()
        for endpoint in (v.make, v.amake):
            with pytest.raises(SerializationError, match="max_frame_bytes") as info:
                await asyncio.wait_for(endpoint.call_one("bytes", 2 << 20), 30)
            assert "return value of Values." in str(info.value)
        with pytest.raises(SerializationError, match=r"arguments of Values\.echo .*max_frame"):
            v.echo.call_one(b"\x00" * (2 << 20))  # the caller checks before sending
        assert await v.pid.call_one() == pid


async def test_text_that_is_not_utf8_round_trips(procs: ProcMesh) -> None:
    v = await procs.spawn("v", Values)
    assert await v.echo.call_one(NOT_UTF8) == NOT_UTF8
    assert await v.aecho.call_one({"files": [NOT_UTF8]}) == {"files": [NOT_UTF8]}
    expected = [NOT_UTF8, {"name": NOT_UTF8}]
    assert await asyncio.wait_for(v.make.call_one("not utf-8", 0), 10) == expected
    assert await asyncio.wait_for(v.amake.call_one("not utf-8", 0), 10) == expected
    for endpoint in (v.raise_not_utf8, v.araise_not_utf8):
        with pytest.raises(ActorError, match=r"no such file: report-\\udcff\.txt") as info:
            await asyncio.wait_for(endpoint.call_one(), 10)
        assert info.value.exc_type == "FileNotFoundError"
        assert f", in {endpoint.name}\n" in info.value.remote_traceback  # from its own frame
    # Nothing queued behind them hangs.
    assert await asyncio.wait_for(v.aecho.call_one("after"), 10) == "after"


@pytest.mark.parametrize("which", ["KeyboardInterrupt", "SystemExit", "Custom"])
async def test_base_exceptions_from_endpoints_fail_the_actor_not_its_proc(
    procs: ProcMesh, which: str
) -> None:
    # As in Monarch, what is not an Exception fails the actor (test_base_exceptions.py has
    # the rest); its proc, and the other actors there, go on serving.
    sibling = await procs.spawn("sibling", Values)
    pid = await sibling.pid.call_one()
    for name in ("raise_base", "araise_base"):
        v = await procs.spawn(name, Values)
        with pytest.raises(SupervisionError, match=f"{which}: .* in {name}") as info:
            await asyncio.wait_for(getattr(v, name).call_one(which), 10)
        assert "all its descendants have failed" in str(info.value)
        assert await asyncio.wait_for(sibling.pid.call_one(), 10) == pid  # the same proc
