"""Strangers on a proc's socket, written as the attacks: another local process holding
hundreds of idle connections, and one that opens connections only to send garbage or
close mid-frame. Key-holding peers must get through, and the proc's log must say
"someone local is probing" about once a second with a count, not once per connection."""

from __future__ import annotations

import asyncio
import re
import sys
import textwrap

import pytest

from danaus import config, this_host

from .console_kit import Console
from .exec_actors import Caller, Worker

pytestmark = pytest.mark.timeout(120)

#: opens N idle connections to an abstract socket, says how many it holds, and keeps
#: them until its stdin closes
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

#: opens N connections one after another; on each sends a frame with a bad magic, or
#: half a frame and then closes its side; waits until the proc has closed it; prints N
_FLOODER = textwrap.dedent(
    """
    import socket, struct, sys
    name, n = sys.argv[1], int(sys.argv[2])
    closed = 0
    for i in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\\0" + name)
        if i % 2:
            s.sendall(b"GARBAGE!" * 4)                       # no frame magic
        else:
            s.sendall(struct.pack("<4sII", b"DNS1", 64, 0)[:6])  # half a prefix
            s.shutdown(socket.SHUT_WR)                       # then closes mid-frame
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        s.close()
        closed += 1
    print(closed, flush=True)
    """
)


def _abstract_name(addr: str) -> str:
    assert addr.startswith("unix:@"), addr
    return addr.removeprefix("unix:@")


async def _run_script(script: str, addr: str, n: int) -> asyncio.subprocess.Process:
    """Start ``script`` in another process against ``addr``; returns once it printed
    the count (it held or closed that many connections)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        _abstract_name(addr),
        str(n),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert int(line) == n
    return proc


async def _release(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    await asyncio.wait_for(proc.wait(), 30)


async def test_idle_strangers_do_not_lock_out_a_peer_dialing_for_the_first_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DANAUS_HANDSHAKE_TIMEOUT", "60")  # the strangers stay throughout
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        target = await procs.slice(procs=0).spawn("target", Worker)
        caller = await procs.slice(procs=1).spawn("caller", Caller, target)
        addr = target.rank_addrs()[0][1]
        holder = await _run_script(_HOLDER, addr, config.max_unauthenticated + 44)
        try:
            # the caller's proc dials the target's for the first time, behind 300 strangers
            assert await asyncio.wait_for(caller.relay.call_one(5), 30) == 5
        finally:
            await _release(holder)
        # and the peer is not recorded as lost: later calls work too
        assert await asyncio.wait_for(caller.relay.call_one(1), 30) == 6
        assert await asyncio.wait_for(target.incr.call_one(1), 30) == 7


_LINE = re.compile(r"refused connection\(s\) before they authenticated: (\d+) since")


async def test_a_flood_of_garbage_and_truncated_frames_logs_a_count_not_a_line_each(
    console: Console,
) -> None:
    n = 200
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        worker = await procs.spawn("worker", Worker)
        addr = worker.rank_addrs()[0][1]
        await _release(await _run_script(_FLOODER, addr, n))
        # every connection was closed by the proc; its lines add up to all of them
        async with asyncio.timeout(10):
            while sum(int(c) for c in _LINE.findall(console.text)) < n:
                console.changed.clear()
                await console.changed.wait()
        assert await asyncio.wait_for(worker.incr.call_one(1), 30) == 1  # still serving
    lines = _LINE.findall(console.text)
    assert sum(int(c) for c in lines) == n
    assert len(lines) <= 4, console.text  # about one a second, however fast they came
    assert "closed mid-frame" in console.text or "bad magic" in console.text.lower()
    assert console.text.count("ERROR") <= len(lines) + 1
