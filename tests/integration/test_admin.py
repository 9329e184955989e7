"""The controller's admin endpoint: found through its file, authenticated, and what it
shows of a running job (the snapshot that danaus top and the dashboard draw)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time

import pytest

from danaus import set_unhandled_fault_hook, this_host
from danaus.mesh import AdminClient, AdminError
from danaus.mesh._admin.server import HELLO, admin_server, find_controllers

from .obs_actors import Busy


def _server_addr() -> str:
    server = admin_server(timeout=30)
    assert server is not None, "the controller started no admin endpoint"
    return server.addr


async def test_a_tool_finds_the_controller_and_sees_its_procs_and_actors() -> None:
    began = time.time()
    async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        busy = await procs.spawn("busy", Busy)
        await busy.ok.call()
        addr = _server_addr()
        mine = [c for c in find_controllers() if c["pid"] == os.getpid()]
        assert [c["addr"] for c in mine] == [addr]
        info_file = next(
            p for p in _admin_files() if json.loads(p.read_text())["pid"] == os.getpid()
        )
        assert info_file.stat().st_mode & 0o077 == 0, "the key file is readable by others"

        def look() -> tuple[dict, list]:
            with AdminClient() as client:  # the newest controller: this one
                snap = client.call("snapshot")
                return snap, client.call("stacks", procs=procs.name, rank=1)

        snap, stacks = await asyncio.to_thread(look)
    assert snap["controller"]["pid"] == os.getpid()
    assert snap["controller"]["started"] < began, "the uptime is not the process's"
    (pm,) = [p for p in snap["proc_meshes"] if p["name"] == procs.name]
    assert [p["pid"] for p in pm["procs"]] == procs.pids
    assert [p["health"] for p in pm["procs"]] == ["ok", "ok"]
    assert [m["name"] for m in pm["actor_meshes"]] == ["busy"]
    actors = [a for a in snap["actors"] if a["procs"] == procs.name]
    name = procs.name  # ("procs", unless a mesh of that name still runs in this process)
    assert sorted(a["actor"] for a in actors) == [f"{name}[0].busy[0]", f"{name}[1].busy[1]"]
    assert all(a["handled"] == {"ok": 1} and a["health"] == "idle" for a in actors)
    assert any(s["thread"] == "MainThread" for s in stacks)


def _admin_files() -> list:
    from danaus.mesh._admin.server import runtime_dir

    return list(runtime_dir().glob("admin-*.json"))


async def test_a_killed_proc_shows_failed_with_its_report() -> None:
    failed = threading.Event()
    old = set_unhandled_fault_hook(lambda f: failed.set())
    try:
        async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
            busy = await procs.spawn("busy", Busy)
            await busy.ok.call()
            os.kill(procs.pids[1], signal.SIGKILL)
            assert await asyncio.to_thread(failed.wait, 30), "the kill was not noticed"
            addr = _server_addr()

            def look() -> dict:
                with AdminClient(addr) as client:
                    return client.call("snapshot")

            snap = await asyncio.to_thread(look)
    finally:
        set_unhandled_fault_hook(old)
    (pm,) = [p for p in snap["proc_meshes"] if p["name"] == procs.name]
    assert [p["health"] for p in pm["procs"]] == ["ok", "failed"]
    assert "SIGKILL" in pm["procs"][1]["failure"] or "signal" in pm["procs"][1]["failure"]
    (mesh,) = pm["actor_meshes"]
    assert list(mesh["failed"]) == ["1"]
    assert any(f["mesh"] == "busy" and f["ranks"] == [1] for f in snap["failures"])
    healths = {a["actor"]: a["health"] for a in snap["actors"] if a["procs"] == procs.name}
    assert healths == {"procs[0].busy[0]": "idle"}  # the dead one cannot answer


async def test_wrong_keys_and_bad_frames_are_refused_and_the_endpoint_keeps_serving() -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}):
        addr = _server_addr()

        def attempts() -> None:
            with pytest.raises(AdminError, match="refused this key"):
                AdminClient(addr, key=b"\x01" * 32)
            good = AdminClient(addr)
            with pytest.raises(AdminError, match="unknown op 'nope'"):
                good.call("nope")
            with pytest.raises(AdminError, match="TypeError"):
                good.call("stacks", wrong=1)
            # a frame whose HMAC does not match: the connection is dropped
            good._sock.sendall((3).to_bytes(4, "big") + b"\0" * 32 + b"{}\n")
            with pytest.raises(AdminError, match="closed"):
                good._read(1)
            # a peer that says hello and then stalls, and one that sends a huge length
            family, target = _target(addr)
            stalled = socket.socket(family)
            stalled.connect(target)
            assert stalled.recv(len(HELLO)) == HELLO
            big = AdminClient(addr)
            big._sock.sendall((1 << 31).to_bytes(4, "big"))
            with pytest.raises(AdminError, match="closed"):
                big._read(1)
            # still serving, also while the stalled one waits
            with AdminClient(addr) as again:
                assert again.call("hello")["pid"] == os.getpid()
            stalled.close()
            good.close()
            big.close()

        await asyncio.to_thread(attempts)


def _target(addr: str) -> tuple[int, object]:
    if addr.startswith("unix:@"):
        return socket.AF_UNIX, "\0" + addr[6:]
    host, _, port = addr[6:].rpartition(":")
    return socket.AF_INET, (host, int(port))


async def test_two_live_proc_meshes_of_one_name_are_told_apart() -> None:
    host = this_host()
    async with (
        host.spawn_procs(per_host={"procs": 1}, name="twin") as first,
        host.spawn_procs(per_host={"procs": 2}, name="twin") as second,
    ):
        await (await first.spawn("a", Busy)).ok.call()
        await (await second.spawn("b", Busy)).ok.call()
        addr = _server_addr()

        def look() -> tuple[dict, list, list]:
            with AdminClient(addr) as client:
                snap = client.call("snapshot")
                return (
                    snap,
                    client.call("stacks", procs="twin", rank=0),
                    client.call("stacks", procs="twin#2", rank=1),
                )

        snap, _, _ = await asyncio.to_thread(look)
    twins = [p for p in snap["proc_meshes"] if p["name"].startswith("twin")]
    assert [(p["name"], len(p["procs"])) for p in twins] == [("twin", 1), ("twin#2", 2)]
    assert [p["pid"] for p in twins[1]["procs"]] == second.pids
    assert {a["procs"] for a in snap["actors"] if a["mesh"] == "b"} == {"twin#2"}
