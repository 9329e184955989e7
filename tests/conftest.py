"""Shared fixtures: a uvloop event loop per test, and no leftover procs after any test."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator

import pytest

# Controllers' admin files of this test run in a directory of its own: a tool attaching to
# "the newest controller" finds this run's, not another program's on the same host.
os.environ.setdefault("DANAUS_RUNTIME_DIR", tempfile.mkdtemp(prefix="danaus-test-run-"))

from .faults import danaus_children


def _children() -> list[int]:
    """Pids of live (non-zombie) danaus procs whose parent is this process.

    A fork server forks a proc some time after ``spawn_procs`` returned: procs asked for
    before now are waited for, so that they are not counted as a later test's."""
    from danaus.mesh._process import process

    server = process.fork_server
    if server is not None:
        server.settle(30)
    return danaus_children(os.getpid())


@pytest.fixture(autouse=True)
def no_leftover_procs() -> Iterator[None]:
    """Fail a test that leaves danaus procs running (and kill them)."""
    before = set(_children())
    yield
    left = set(_children()) - before
    if left:
        from danaus.mesh._procs.local import _kill_all

        _kill_all()
        pytest.fail(f"test left procs running: {sorted(left)}")


@pytest.fixture(autouse=True)
async def close_runtime() -> AsyncIterator[None]:
    """Close the runtime danaus made for this test's event loop, if it made one."""
    yield
    from danaus.actors._loops import close_loop_runtime

    await close_loop_runtime(asyncio.get_running_loop())
