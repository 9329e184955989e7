"""Strangers on a proc's socket, written as the attacks: another local process holding
hundreds of idle connections, and one that opens connections only to close them
mid-frame or with garbage. Key-holding peers must get through, and the logs must say
"someone is probing" once per interval, not once per connection."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap

import pytest

from danaus import config, this_host

from .exec_actors import Caller, Worker

pytestmark = pytest.mark.timeout(120)

#: a separate process that opens N idle connections to an abstract socket, says how
#: many it holds, and keeps them until its stdin closes
_HOLDER = textwrap.dedent(
    """
    import socket, sys
    name, n = sys.argv[1], int(sys.argv[2])
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\\0" + name)
        socks.append(s)
    print(len(socks), flush=True)
    sys.stdin.read()
    """
)


def _abstract_name(addr: str) -> str:
    assert addr.startswith("unix:@"), addr
    return addr.removeprefix("unix:@")


async def _hold_strangers(addr: str, n: int) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, _abstract_name(addr), str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 30)
    assert int(line) == n
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.close()
    holder.wait(timeout=30)
    holder.stdout.close()


async def test_idle_strangers_do_not_lock_out_a_peer_dialing_for_the_first_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DANAUS_HANDSHAKE_TIMEOUT", "60")  # the strangers stay throughout
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        target = await procs.slice(procs=0).spawn("target", Worker)
        caller = await procs.slice(procs=1).spawn("caller", Caller, target)
        addr = target.rank_addrs()[0][1]
        holder = await _hold_strangers(addr, config.max_unauthenticated + 44)
        try:
            # the caller's proc dials the target's for the first time, behind 300 strangers
            assert await asyncio.wait_for(caller.relay.call_one(5), 30) == 5
        finally:
            _release(holder)
        # and the peer is not recorded as lost: later calls work too
        assert await asyncio.wait_for(caller.relay.call_one(1), 30) == 6
        assert await asyncio.wait_for(target.incr.call_one(1), 30) == 7
