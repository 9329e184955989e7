"""Bad peers, dead procs and dead controllers: errors are clear and nothing else breaks."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from danaus import SupervisionError, _auth, this_host
from danaus.actors._wire import MAGIC, PREFIX, Auth, Challenge, Hello, frame

from .actors_lib import Echo


def _abstract(addr: str) -> str:
    assert addr.startswith("unix:@")
    return "\0" + addr[len("unix:@") :]


async def _hammer(echo: object, n: int) -> list[int]:
    return list(await asyncio.gather(*(echo.echo.call_one(i) for i in range(n))))  # type: ignore[attr-defined]


async def test_garbage_from_an_unauthenticated_socket_is_refused_while_callers_succeed() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        addr = echo.rank_addrs()[0][1]
        caller = asyncio.create_task(_hammer(echo, 2000))
        reader, writer = await asyncio.open_unix_connection(_abstract(addr))
        writer.write(os.urandom(4096))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the proc hung up on us
        writer.close()
        assert await asyncio.wait_for(caller, 30) == list(range(2000))


async def test_a_peer_with_the_wrong_key_is_refused_while_callers_succeed() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        addr = echo.rank_addrs()[0][1]
        caller = asyncio.create_task(_hammer(echo, 2000))
        import msgspec

        reader, writer = await asyncio.open_unix_connection(_abstract(addr))
        nonce = _auth.new_nonce()
        writer.writelines(frame(msgspec.msgpack.encode(Hello(nonce, "unix:@intruder"))))
        magic, hlen, nparts = PREFIX.unpack(await asyncio.wait_for(reader.readexactly(12), 10))
        assert magic == MAGIC and nparts == 0
        challenge = msgspec.msgpack.decode(await reader.readexactly(hlen), type=Challenge)
        wrong = _auth.proof(b"not the key", b"dialer", challenge.nonce, nonce)
        writer.writelines(frame(msgspec.msgpack.encode(Auth(wrong))))
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert await asyncio.wait_for(caller, 30) == list(range(2000))


async def test_oversized_frame_header_closes_only_that_connection() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        reader, writer = await asyncio.open_unix_connection(_abstract(echo.rank_addrs()[0][1]))
        writer.write(PREFIX.pack(MAGIC, 1 << 30, 0))
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert await echo.echo.call_one("ok") == "ok"


async def test_calls_in_flight_to_a_killed_proc_fail_with_supervision_error() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        echo = procs.spawn("echo", Echo)
        await echo.initialized
        victim = echo.slice(procs=1)
        stuck = victim.wait_forever.call_one()
        pending = [victim.echo.call_one(i) for i in range(1000)]
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            await asyncio.wait_for(stuck, 10)
        results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)
        assert all(isinstance(r, (int, SupervisionError)) for r in results)
        assert any(isinstance(r, SupervisionError) for r in results)
        # The other proc keeps serving.
        assert await echo.slice(procs=0).echo.call_one(5) == 5
        # Later calls to the dead proc fail too, rather than hang.
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(victim.echo.call_one(1), 10)


async def test_a_proc_that_exits_fails_the_call_with_its_exit_code() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        with pytest.raises(SupervisionError, match="exited with code 3"):
            await asyncio.wait_for(echo.exit_now.call_one(3), 10)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds, no polling) until the pids are gone; return those still alive."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    try:
        deadline = time.monotonic() + timeout
        while fds:
            ready, _, _ = select.select(list(fds), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for fd in ready:
                fds.pop(fd)
                os.close(fd)
        return sorted(fds.values())
    finally:
        for fd in fds:
            os.close(fd)


CONTROLLER = textwrap.dedent("""
    import asyncio, sys
    from danaus import Actor, endpoint, this_host

    class Local(Actor):  # defined in __main__: travels by value (cloudpickle)
        def __init__(self, k):
            self.k = k

        @endpoint
        def pid(self):
            import os
            return (os.getpid(), self.k)

    async def main():
        procs = this_host().spawn_procs(per_host={"procs": 2})
        actors = procs.spawn("local", Local, 42)
        for pid, k in (await actors.pid.call()).values():
            assert k == 42
            print(pid, flush=True)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "exit"])
def test_no_proc_outlives_its_controller(how: str) -> None:
    script = (
        CONTROLLER
        if how != "exit"
        else CONTROLLER.replace(
            "await asyncio.Event().wait()", "sys.stdin.readline(); raise SystemExit(0)"
        )
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    ) as ctl:
        try:
            assert ctl.stdout is not None and ctl.stdin is not None
            pids = []
            for line in ctl.stdout:
                if line.strip() == "ready":
                    break
                pids.append(int(line))
            assert len(pids) == 2
            if how == "exit":
                ctl.stdin.write("\n")
                ctl.stdin.flush()
            else:
                ctl.send_signal(getattr(signal, how))
            ctl.wait(timeout=10)
            assert _wait_gone(pids, timeout=5) == []
        finally:
            if ctl.poll() is None:
                ctl.kill()


def test_sync_api_from_plain_code() -> None:
    from .actors_lib import Counter

    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        counters = procs.spawn("counter", Counter, 1)
        assert counters.incr.call(1).get(timeout=10).values() == [2, 2]
        assert counters.slice(procs=0).get.call_one().get(timeout=10) == 2
        assert sorted(f.get(timeout=10) for f in counters.get.stream()) == [2, 2]


async def test_handshake_deadline_drops_a_silent_peer(caplog: pytest.LogCaptureFixture) -> None:
    from danaus.actors._loops import current_runtime
    from danaus.config import config

    rt = current_runtime()
    old = config.handshake_timeout
    config.handshake_timeout = 0.2
    try:
        with caplog.at_level(logging.ERROR, logger="danaus.connection"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            await asyncio.get_running_loop().sock_connect(s, _abstract(rt.addr))
            data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(s, 10), 5)
            s.close()
        assert data == b""
        assert "did not authenticate" in caplog.text
    finally:
        config.handshake_timeout = old


def test_procs_spawned_from_a_short_lived_thread_outlive_it() -> None:
    """The kernel's parent-death signal follows the forking thread: procs must not die
    when the thread that asked for them ends."""
    import threading

    from .actors_lib import Echo

    made: dict[str, object] = {}

    def spawn() -> None:
        procs = this_host().spawn_procs(per_host={"procs": 1})
        made["procs"] = procs
        made["echo"] = echo = procs.spawn("echo", Echo)
        echo.initialized.get(timeout=20)  # the proc is up (it set its parent-death signal)

    t = threading.Thread(target=spawn)
    t.start()
    t.join(timeout=30)
    procs: Any = made["procs"]
    echo: Any = made["echo"]
    try:
        assert echo.echo.call_one("still here").get(timeout=20) == "still here"
    finally:
        procs.stop().get(timeout=20)
