"""attach(addr) (Monarch's): a controller that reaches its job, and is reached by it,
only through one host agent's gateway. Each test starts a real host agent and runs the
controller as a program of its own (attach must come first in its process)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..ports import free_port

ROOT = Path(__file__).resolve().parents[2]

CONTROLLER = textwrap.dedent(
    """
    import sys
    from danaus import Actor, attach, attach_to_workers, endpoint, this_host
    from danaus.actors.seam import current_runtime
    from danaus.mesh._gateway import GATEWAY, Gateway
    from danaus.mesh.seam import mesh_ref
    from danaus.mesh import Shape

    class Echo(Actor):
        @endpoint
        async def echo(self, m: str) -> str:
            return m

    class Relay(Actor):
        def __init__(self, target):
            self.target = target

        @endpoint
        async def relay(self, m: str) -> str:
            return await self.target.echo.call_one(m)

    agent = sys.argv[1]
    attach(agent)
    rt = current_runtime()
    print("ADDR", rt.addr, flush=True)
    # nobody can dial this controller where it listens: only through the gateway
    rt._listener.close()
    hosts = attach_to_workers(workers=[agent])
    remote = hosts.spawn_procs(per_host={"workers": 2})
    echo = remote.spawn("echo", Echo)
    print("REMOTE", sorted(echo.echo.call("hello").get(timeout=60).values()), flush=True)
    local = this_host().spawn_procs(per_host={"local": 1})
    local_echo = local.spawn("local_echo", Echo)
    print("LOCAL", local_echo.echo.call_one("x").get(timeout=60), flush=True)
    relays = hosts.spawn_procs(per_host={"relay": 1}).spawn("relay", Relay, local_echo)
    print("RELAY", relays.relay.call_one("through").get(timeout=60), flush=True)
    key = "unix:" + agent[len("ipc://"):] if agent.startswith("ipc://") else agent
    stats = mesh_ref(GATEWAY, Gateway, Shape.from_sizes({}), {0: key}).counts.call_one()
    print("STATS", stats.get(timeout=30), flush=True)
    # relayed connections to TCP peers tag their frames, as the peers' sockets are TCP
    relayed = [c for c in rt.conns.values() if c.tag_as_tcp is not None]
    print("TAGGED", sorted({(c.peer.split(":")[0], c._tag_frames) for c in relayed}), flush=True)
    attach(agent)  # the same agent again: nothing to do
    try:
        attach("ipc:///elsewhere")
    except RuntimeError as e:
        print("ELSEWHERE", e, flush=True)
    for m in (remote, local):
        m.stop().get(timeout=30)
    print("DONE", flush=True)
    """
)


class Agent:
    """A host agent in a subprocess, and its output lines, read by a thread."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from danaus import run_worker_loop_forever; "
                f"run_worker_loop_forever(address={addr!r})",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "DANAUS_ATTACH_TIMEOUT": "2", "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, text: str, timeout: float = 60.0) -> str:
        """The next line of its output holding ``text`` (within ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no line with {text!r} within {timeout} s"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"the agent's output ended before a line with {text!r}"
            if text in line:
                return line

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture(params=["ipc", "tcp"])
def agent(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Agent]:
    where = f"ipc://{tmp_path / 'agent0'}" if request.param == "ipc" else None
    a = Agent(where or f"tcp://127.0.0.1:{free_port()}")
    try:
        a.wait_line("listening on")
        yield a
    finally:
        a.close()


def test_a_controller_reaches_and_is_reached_by_its_job_through_the_gateway(
    agent: Agent,
) -> None:
    addr = agent.addr
    out = subprocess.run(
        [sys.executable, "-c", CONTROLLER, addr],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["REMOTE"] == "['hello', 'hello']"
    assert lines["LOCAL"] == "x"
    assert lines["RELAY"] == "through"  # a proc of the agent's calling one of ours
    stats = eval(lines["STATS"])  # a dict printed by the program
    # the controller dialed the agent's three procs through it, and was dialed through it
    assert stats["dialed"] >= 3 and stats["accepted"] >= 1 and stats["reserved"] == 1
    assert "attached through" in lines["ELSEWHERE"] and "new process" in lines["ELSEWHERE"]
    assert "DONE" in out.stdout
    # the controller is gone: the agent closes its address (and kills its procs)
    assert lines["ADDR"] in agent.wait_line("is gone: closing its address")


def test_a_reservation_nobody_claims_closes(agent: Agent) -> None:
    addr = agent.addr
    key = "unix:" + addr[len("ipc://") :] if addr.startswith("ipc://") else addr
    program = textwrap.dedent(
        f"""
        import asyncio
        from danaus.mesh._gateway import _reserve
        from danaus.mesh._procs.host_agent import use_key, user_key
        use_key(user_key()[0])  # (as attach does)
        print("RESERVED", asyncio.run(_reserve("{key}"))[0], flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    reserved = out.stdout.split()[-1]
    # the agent's log, as it closes the reservation (after 2 s here)
    assert reserved in agent.wait_line("was not claimed in time")


def test_attach_refuses_what_is_no_host_agent(tmp_path: Path) -> None:
    program = textwrap.dedent(
        f"""
        from danaus import attach
        from danaus.actors.seam import current_runtime
        for addr in ("http://nowhere", "ipc://{tmp_path}/nobody"):
            try:
                attach(addr)
            except Exception as e:
                print("REFUSED", type(e).__name__, str(e).splitlines()[0], flush=True)
        current_runtime()  # danaus runs now (as after a first spawn or call): too late
        try:
            attach("ipc://{tmp_path}/late")
        except RuntimeError as e:
            print("LATE", e, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DANAUS_CONNECT_TIMEOUT": "2", "DANAUS_ATTACH_TIMEOUT": "5"},
    )
    assert out.returncode == 0, out.stderr
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 2, out.stdout
    assert "ValueError" in refused[0] and "host agent" in refused[0]
    assert "nobody" in refused[1]
    assert "call attach(addr) before anything else" in out.stdout
