"""Multi-host for real on one machine: host agents on 127.0.0.2 and 127.0.0.3."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from danaus import SupervisionError, attach_to_hosts, this_host
from danaus.config import config

from ..faults import Failures, danaus_procs
from .actors_lib import Counter, Echo
from .agents_kit import Agent, controller_key, host_agents

KEY = os.urandom(32).hex()


def _agent_children(pid: int) -> list[int]:
    """The agent's live procs and fork servers."""
    return danaus_procs(pid, servers=True)


@pytest.fixture(scope="module")
def agents() -> Iterator[list[Agent]]:
    env = dict(os.environ, DANAUS_AUTH_KEY=KEY, PYTHONPATH=os.getcwd())
    with host_agents([f"tcp://127.0.0.{i}:0" for i in (2, 3)], [env, env]) as out:
        yield out


@pytest.fixture
def keyed(agents: list[tuple[str, subprocess.Popen[str]]]) -> Iterator[list[str]]:
    """Run the test's controller with the agents' key."""
    with controller_key(KEY):
        yield [a for a, _ in agents]


async def test_procs_across_two_hosts_know_their_2d_rank(keyed: list[str]) -> None:
    hosts = attach_to_hosts(keyed)
    assert hosts.sizes == {"hosts": 2}
    async with hosts.spawn_procs(per_host={"gpus": 2}) as procs:
        assert procs.sizes == {"hosts": 2, "gpus": 2}
        echo = procs.spawn("echo", Echo)
        who = await asyncio.wait_for(echo.whoami.call(), 30)
        assert who.item(hosts=0, gpus=1)["rank"] == "{'hosts': 0/2, 'gpus': 1/2}"
        assert who.item(hosts=1, gpus=0)["rank"] == "{'hosts': 1/2, 'gpus': 0/2}"
        pids = procs.pids
        assert len(set(pids)) == 4 and all(p > 0 for p in pids)


async def test_calls_slicing_and_tree_casting_across_hosts(keyed: list[str]) -> None:
    old = config.cast_fanout
    config.cast_fanout = 2
    try:
        async with attach_to_hosts(keyed).spawn_procs(per_host={"procs": 3}) as procs:
            counters = procs.spawn("counter", Counter, 1)
            assert (await asyncio.wait_for(counters.incr.call(1), 30)).values() == [2] * 6
            assert await counters.slice(hosts=1, procs=2).get.call_one() == 2
            second = counters.slice(hosts=1)
            assert (await second.incr.call(10)).values() == [12] * 3
            assert (await counters.get.call()).values() == [2, 2, 2, 12, 12, 12]
    finally:
        config.cast_fanout = old


async def test_stop_leaves_no_procs_on_the_agents(
    keyed: list[str], agents: list[tuple[str, subprocess.Popen[str]]]
) -> None:
    procs = attach_to_hosts(keyed).spawn_procs(per_host={"procs": 2})
    await asyncio.wait_for(procs.initialized, 30)
    started = [pid for _, agent in agents for pid in _agent_children(agent.pid)]
    assert set(procs.pids) <= set(started)
    await asyncio.wait_for(procs.stop(), 30)
    left = {pid for _, agent in agents for pid in _agent_children(agent.pid)}
    assert not left & set(procs.pids)


async def test_a_slice_of_hosts_spawns_only_there(keyed: list[str]) -> None:
    async with (
        attach_to_hosts(keyed).slice(hosts=slice(1, 2)).spawn_procs(per_host={"procs": 2}) as procs
    ):
        echo = procs.spawn("echo", Echo)
        who = await asyncio.wait_for(echo.whoami.call(), 30)
        assert [w["rank"] for w in who.values()] == [
            "{'hosts': 0/1, 'procs': 0/2}",
            "{'hosts': 0/1, 'procs': 1/2}",
        ]


async def test_wrong_key_is_refused_by_the_agent(
    agents: list[tuple[str, subprocess.Popen[str]]],
) -> None:
    with controller_key(os.urandom(32).hex()):
        procs = attach_to_hosts([agents[0][0]]).spawn_procs(per_host={"procs": 1})
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(procs.initialized, 30)


def test_a_key_adopted_after_the_background_runtime_started_is_the_one_it_dials_with() -> None:
    """The background runtime (sync calls go through it) lives as long as the process; a
    job key adopted later, as a job's agents take it, is the one its new connections prove,
    and the earlier key again once that is restored."""
    first = this_host().spawn_procs(per_host={"procs": 1})  # the background runtime exists
    assert first.spawn("echo", Echo).whoami.call_one().get(timeout=30)["rank"]
    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=os.getcwd())
    with host_agents(["tcp://127.0.0.2:0"], [env]) as agents, controller_key(key):
        procs = attach_to_hosts([a for a, _ in agents]).spawn_procs(per_host={"procs": 1})
        who = procs.spawn("echo", Echo).whoami.call_one().get(timeout=30)
        assert who["rank"] == "{'hosts': 0/1, 'procs': 0/1}"
        procs.stop().get(timeout=30)
    again = this_host().spawn_procs(per_host={"procs": 1})
    assert again.spawn("echo", Echo).whoami.call_one().get(timeout=30)["rank"]
    again.stop().get(timeout=30)
    first.stop().get(timeout=30)


CONTROLLER = """
import asyncio, os, sys
from danaus import attach_to_hosts
async def main():
    procs = attach_to_hosts(sys.argv[1:]).spawn_procs(per_host={"procs": 2})
    await procs.initialized
    print(" ".join(map(str, procs.pids)), flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def test_procs_on_agents_die_with_their_controller(
    agents: list[tuple[str, subprocess.Popen[str]]],
) -> None:
    from .test_robustness import _wait_gone

    env = dict(os.environ, DANAUS_AUTH_KEY=KEY)
    with subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, *[a for a, _ in agents]],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as ctl:
        assert ctl.stdout is not None
        pids = [int(p) for p in ctl.stdout.readline().split()]
        assert len(pids) == 4
        ctl.kill()
        ctl.wait(timeout=10)
    assert _wait_gone(pids, timeout=10) == []
    assert all(agent.poll() is None for _, agent in agents)  # the agents keep serving


def _make_certs(d: str) -> dict[str, str]:
    """A throwaway CA and one certificate it signed, made with the openssl command."""
    import shutil

    assert shutil.which("openssl"), "the TLS test makes its certificates with the openssl command"
    run = lambda *a: subprocess.run(a, cwd=d, check=True, capture_output=True)  # noqa: E731
    run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=danaus-test-ca",
    )
    run(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "node.key",
        "-out",
        "node.csr",
        "-subj",
        "/CN=danaus-node",
    )
    run(
        "openssl",
        "x509",
        "-req",
        "-in",
        "node.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "node.pem",
        "-days",
        "1",
    )
    return {
        "DANAUS_TLS_CERT": f"{d}/node.pem",
        "DANAUS_TLS_KEY": f"{d}/node.key",
        "DANAUS_TLS_CA": f"{d}/ca.pem",
    }


TLS_CONTROLLER = """
import asyncio, sys
from danaus import attach_to_hosts, Actor, endpoint
class E(Actor):
    @endpoint
    def hi(self):
        return "hi over tls"
async def main():
    async with attach_to_hosts([sys.argv[1]]).spawn_procs(per_host={"procs": 1}) as procs:
        print((await procs.spawn("e", E).hi.call()).values()[0], flush=True)
asyncio.run(main())
"""


@pytest.mark.slow
def test_mutual_tls_between_controller_agent_and_procs(tmp_path: Any) -> None:
    certs = _make_certs(str(tmp_path))
    env = dict(os.environ, DANAUS_AUTH_KEY=KEY, PYTHONPATH=os.getcwd(), **certs)
    with subprocess.Popen(
        [sys.executable, "-m", "danaus", "host-agent", "--listen", "tcp://127.0.0.4:0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as agent:
        try:
            assert agent.stdout is not None
            addr = agent.stdout.readline().split()[-1]
            out = subprocess.run(
                [sys.executable, "-c", TLS_CONTROLLER, addr],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.stdout.strip() == "hi over tls", out.stderr
            plain = dict(os.environ, DANAUS_AUTH_KEY=KEY)  # no certificate: refused
            bad = subprocess.run(
                [sys.executable, "-c", TLS_CONTROLLER, addr],
                env=plain,
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert bad.returncode != 0 and "SupervisionError" in bad.stderr, bad.stderr
        finally:
            agent.terminate()
            agent.wait(timeout=10)


KEYFILE_CONTROLLER = """
import asyncio, sys
from danaus import attach_to_hosts, Actor, endpoint
class E(Actor):
    @endpoint
    def hi(self):
        return "hi with a key file"
async def main():
    hosts = attach_to_hosts([sys.argv[1]], key_file=sys.argv[2])
    async with hosts.spawn_procs(per_host={"procs": 1}) as procs:
        print((await procs.spawn("e", E).hi.call()).values()[0], flush=True)
asyncio.run(main())
"""


def test_new_key_and_key_files(tmp_path: Any) -> None:
    key = subprocess.run(
        [sys.executable, "-m", "danaus", "new-key"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    assert len(bytes.fromhex(key)) == 32
    keyfile = tmp_path / "key"
    keyfile.write_text(key + "\n")
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_AUTH_KEY"}
    env["PYTHONPATH"] = os.getcwd()
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "danaus",
            "host-agent",
            "--listen",
            "tcp://127.0.0.5:0",
            "--key-file",
            str(keyfile),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as agent:
        try:
            assert agent.stdout is not None
            addr = agent.stdout.readline().split()[-1]
            out = subprocess.run(
                [sys.executable, "-c", KEYFILE_CONTROLLER, addr, str(keyfile)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.stdout.strip() == "hi with a key file", out.stderr
        finally:
            agent.terminate()
            agent.wait(timeout=10)


async def test_tensor_engine_across_hosts(keyed: list[str]) -> None:
    import torch

    import danaus.tensor_engine  # noqa: F401 - enables procs.activate()
    from danaus.tensor_engine import fetch_shard

    async with attach_to_hosts(keyed).spawn_procs(per_host={"gpus": 1}) as procs:
        await asyncio.wait_for(procs.initialized, 30)
        with procs.activate():
            x = torch.full((3,), 1.0) * 2
            total = x.reduce("hosts", "sum")
        got = await asyncio.wait_for(fetch_shard(total, hosts=1, gpus=0), 60)
        assert torch.equal(got, torch.full((3,), 4.0))


def test_a_mesh_on_host_agents_passed_on_right_after_spawn_from_sync_code(
    keyed: list[str], tmp_path: Any
) -> None:
    # A sync program cannot await the agents' answer: passing the mesh waits for it. (Sync
    # code runs on danaus's background loop, which may hold another job key already: the
    # agents' key comes as key_file.)
    from .exec_actors import Caller, Worker

    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    procs = attach_to_hosts(keyed, key_file=str(key_file)).spawn_procs(per_host={"gpus": 1})
    try:
        target = procs.slice(hosts=0).spawn("target", Worker)  # not awaited
        callers = procs.slice(hosts=1).spawn("callers", Caller, target)  # passed on at once
        assert callers.relay.call_one(5).get(timeout=60) == 5
        assert callers.relay.call_one(1).get(timeout=60) == 6
    finally:
        procs.stop().get(timeout=60)


async def test_async_code_is_told_to_await_a_mesh_on_host_agents_first(keyed: list[str]) -> None:
    from danaus import SerializationError

    from .exec_actors import Caller, Worker

    async with (
        attach_to_hosts(keyed).spawn_procs(per_host={"gpus": 1}) as procs,
        this_host().spawn_procs() as local,
    ):
        target = procs.slice(hosts=0).spawn("target", Worker)
        with pytest.raises(SerializationError, match=r"await mesh\.initialized"):
            local.spawn("callers", Caller, target)
        callers = local.spawn("callers", Caller, await target)
        assert await asyncio.wait_for(callers.relay.call_one(5), 60) == 5


class _InjectingRelay:
    """A man in the middle between the controller and a host agent: it forwards both
    ways, and once the controller has sent its two handshake frames (the session is
    open) it slips a frame of its own, with a made-up tag, to the controller."""

    def __init__(self, target: str) -> None:
        self.host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.port = int(port)
        self.injected = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"tcp://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        a_reader, a_writer = await asyncio.open_connection(self.host, self.port)

        async def agent_to_controller() -> None:
            while data := await a_reader.read(65536):
                c_writer.write(data)

        async def controller_to_agent() -> None:
            from danaus.actors._wire import MAGIC, PREFIX

            for _ in range(2):  # Hello, Auth: untagged frames without parts
                prefix = await c_reader.readexactly(PREFIX.size)
                _, hlen, _ = PREFIX.unpack(prefix)
                a_writer.write(prefix + await c_reader.readexactly(hlen))
            c_writer.write(PREFIX.pack(MAGIC, 3, 0) + b"\x91\x00\x00" + os.urandom(32))
            self.injected.set()
            while data := await c_reader.read(65536):
                a_writer.write(data)

        self.tasks = [
            asyncio.ensure_future(agent_to_controller()),
            asyncio.ensure_future(controller_to_agent()),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for w in (a_writer, c_writer):
            w.close()

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.server.close()
        await self.server.wait_closed()


async def test_a_frame_that_fails_its_tag_on_the_agent_connection_is_named_as_such(
    keyed: list[str],
) -> None:
    relay = _InjectingRelay(keyed[0])
    through = await relay.start()
    try:
        procs = attach_to_hosts([through]).spawn_procs(per_host={"procs": 1})
        counters = procs.spawn("counter", Counter)
        await asyncio.wait_for(relay.injected.wait(), 30)
        with pytest.raises(
            SupervisionError,
            match=r"never started: host agent tcp://127\.0\.0\.1:\d+ could not start procs: .*"
            r"the connection was closed: a frame from .* failed authentication",
        ):
            await asyncio.wait_for(counters.incr.call_one(), 30)
        await procs.stop()
    finally:
        await relay.close()


@pytest.mark.slow  # (about 10 s: the lost agent's procs are waited for)
async def test_a_new_agent_at_a_lost_agents_address_is_reached(
    tmp_path: Any, failures: Failures
) -> None:
    """TCP ports and socket paths are handed out again: an agent that took the address of
    one this controller lost is reached when attached, not failed as that lost one."""
    sock = f"unix:{tmp_path}/agent.sock"
    env = dict(os.environ, DANAUS_AUTH_KEY=KEY, PYTHONPATH=os.getcwd())
    with controller_key(KEY):
        with host_agents([sock], [env]) as [(addr, first)]:
            async with attach_to_hosts([addr]).spawn_procs(per_host={"procs": 1}) as procs:
                echo = procs.spawn("echo", Echo)
                assert (await asyncio.wait_for(echo.whoami.call(), 30)).values()
                first.kill()  # the agent (and its procs) gone: its address is lost
                lost = await failures.first(30)  # (the controller has seen it go)
                assert "host agent" in lost.report
        os.unlink(f"{tmp_path}/agent.sock")  # (a killed agent leaves its socket file)
        with host_agents([sock], [env]) as [(again, _)]:  # a new agent, the same path
            assert again == addr
            async with attach_to_hosts([again]).spawn_procs(per_host={"procs": 1}) as procs:
                echo = procs.spawn("echo", Echo)
                assert (await asyncio.wait_for(echo.whoami.call(), 30)).values()


async def test_procs_that_cannot_reach_their_agent_exit_saying_why(
    tmp_path: Any, failures: Failures
) -> None:
    """A proc whose spawner cannot be dialed (its host agent's socket file removed) exits
    once dialing gives up (``connect_timeout``, 2 s here), saying so, and the spawn fails
    then, instead of when the agent's ``proc_start_timeout`` (60 s) kills the proc."""
    sock = f"{tmp_path}/agent.sock"
    env = dict(os.environ, DANAUS_AUTH_KEY=KEY, PYTHONPATH=os.getcwd(), DANAUS_CONNECT_TIMEOUT="2")
    with controller_key(KEY):
        with host_agents([f"unix:{sock}"], [env]) as [(addr, _)]:
            hosts = attach_to_hosts([addr])
            await hosts.initialized
            os.unlink(sock)  # the agent's procs dial it there: nobody can any more
            procs = hosts.spawn_procs(per_host={"procs": 1}, name="unreachable")
            try:
                echo = procs.spawn("echo", Echo)
                with pytest.raises(SupervisionError, match="exited with code 1") as info:
                    await asyncio.wait_for(echo.whoami.call(), 30)  # (well under 60 s)
                assert "never started" in str(info.value)
                await failures.first(30)  # (reported as unhandled, which is expected here)
            finally:
                await procs.stop()
