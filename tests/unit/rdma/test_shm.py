"""The shm backend's copy off the event loop: a cancelled transfer (its deadline passed)
reports only after the thread stopped writing into the caller's memory."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest

from danaus.rdma._shm import _uncancellable


async def test_a_cancelled_copy_ends_only_after_its_thread() -> None:
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def copy() -> None:  # stands in for process_vm_readv into the caller's memory
        started.set()
        release.wait(10)
        ended.set()

    task = asyncio.create_task(_uncancellable(asyncio.to_thread(copy)))
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    for _ in range(20):  # plenty of loop turns for a cancellation that did not wait
        await asyncio.sleep(0)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert ended.is_set()


async def test_a_copy_that_fails_after_its_caller_left_is_not_reported_as_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started, release = threading.Event(), threading.Event()

    def copy() -> None:
        started.set()
        release.wait(10)
        raise OSError("the owner went away")

    task = asyncio.create_task(_uncancellable(asyncio.to_thread(copy)))
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    del task
    gc.collect()  # an unretrieved exception is reported when its task is collected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_an_uncancelled_copy_gives_its_outcome() -> None:
    def copy() -> None:
        raise OSError("boom")

    with pytest.raises(OSError, match="boom"):
        await _uncancellable(asyncio.to_thread(copy))
