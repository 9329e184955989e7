"""Fixtures of the wire tests: a real Runtime on a unix socket, hand-written peers
dialing it, and its dispatch recorded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from danaus.actors._runtime import Runtime

from .wire_kit import KEY, Dial, RawPeer, record_dispatch


@pytest.fixture
async def runtime() -> AsyncIterator[Runtime]:
    rt = Runtime(
        asyncio.get_running_loop(), addr=f"unix:@danaus-test-{secrets.token_hex(8)}", key=KEY
    )
    try:
        yield rt
    finally:
        await rt.aclose()


@pytest.fixture
async def dial(runtime: Runtime) -> AsyncIterator[Dial]:
    writers: list[asyncio.StreamWriter] = []
    name = runtime.addr.removeprefix("unix:@")

    async def dial_() -> RawPeer:
        reader, writer = await asyncio.open_unix_connection("\0" + name)
        writers.append(writer)
        return RawPeer(reader, writer)

    yield dial_
    for w in writers:
        w.close()
        with contextlib.suppress(ConnectionError):
            await w.wait_closed()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.ERROR, logger="danaus.connection")
    return caplog


@pytest.fixture
def seen(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, list[Any]]]:
    """Each message ``runtime`` dispatches, recorded from before the test's connections
    exist (a connection hands messages to the dispatch it found when it was made)."""
    return record_dispatch(runtime, monkeypatch)
