"""Procs' output reaches the controller, prefixed with mesh and rank, and is never lost."""

from __future__ import annotations

import asyncio
import logging

import pytest

from danaus import SupervisionError, this_host
from danaus.mesh import set_unhandled_fault_hook

from .actors_lib import Talker
from .console_kit import Console


async def test_stdout_stderr_and_logging_are_prefixed_with_mesh_and_rank(console: Console) -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}, name="trainer") as procs:
        talker = await procs.spawn("talker", Talker)
        await talker.slice(procs=1).say.call_one("hello")
        seen = await console.wait_for("[trainer 1] WARNING talker: warning: hello")
        assert "[trainer 1] out: hello" in seen
        assert "[trainer 1] err: hello" in seen
        assert "info: hello" not in seen  # the procs log at WARNING by default
        procs.logging_option(level=logging.INFO)
        await talker.slice(procs=0).say.call_one("again")
        seen = await console.wait_for("[trainer 0] INFO talker: info: again")
        procs.logging_option(stream_to_client=False)
        await talker.slice(procs=0).say.call_one("quiet")
        procs.logging_option(stream_to_client=True)
        await talker.slice(procs=0).say.call_one("loud")
        seen = await console.wait_for("[trainer 0] out: loud")
        assert "quiet" not in seen


async def test_the_last_line_before_a_sigkill_is_not_lost(console: Console) -> None:
    old = set_unhandled_fault_hook(lambda f: None)
    try:
        async with this_host().spawn_procs(per_host={"procs": 1}, name="doomed") as procs:
            talker = await procs.spawn("talker", Talker)
            with pytest.raises(SupervisionError):
                await asyncio.wait_for(talker.last_words.call_one("famous last words"), 10)
            await console.wait_for("[doomed 0] famous last words")
    finally:
        set_unhandled_fault_hook(old)


def test_logging_option_is_what_monarchs_async_def_is_to_its_callers() -> None:
    # Monarch's examples call asyncio.run(procs.logging_option(...)) from plain code
    with this_host().spawn_procs(per_host={"procs": 1}, name="plain") as procs:
        talker = procs.spawn("talker", Talker)
        assert asyncio.run(procs.logging_option(level=logging.INFO)) is None
        assert procs.logging_option(stream_to_client=True).get(timeout=10) is None

        async def awaited() -> None:
            assert await procs.logging_option(aggregate_window_sec=None) is None

        asyncio.run(awaited())
        talker.say.call_one("still talking").get(timeout=30)
