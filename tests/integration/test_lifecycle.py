"""Proc lifecycle: unguessable socket names, no orphans on host agents, quiet and clean exits.

Every test runs real procs (and, where it says so, a real host agent or a whole controller
program in a subprocess); none sleeps to wait for something.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from danaus import SupervisionError, this_host
from danaus.actors._process import process
from danaus.config import config
from danaus.mesh import set_unhandled_fault_hook
from danaus.mesh._proc_mesh import group_of
from danaus.mesh._procs import local as _local_procs

from ..faults import Failures, danaus_children, danaus_procs
from .actors_lib import Echo
from .lifecycle_actors import Where
from .test_robustness import _wait_gone

KEY = os.urandom(32).hex()


def _program_env() -> dict[str, str]:
    """The environment of a controller program run as a subprocess: this checkout first."""
    return dict(os.environ, PYTHONPATH=os.getcwd())


# ------------------------------------------------------------------ socket names

#: Another local process, as any user could run it: read the names of the listening
#: sockets of the given pids in /proc/net/unix (world-readable), and bind the names that
#: the counters in them would give next (``danaus-JOB-procs7-0`` -> ``procs8-0``,
#: ``procs9-3``, ...; ``danaus-JOB-c1234-0`` -> ``c1234-1``, ...). Prints how many names it
#: saw and how many it holds, then holds them until its stdin closes.
SQUATTER = textwrap.dedent(r"""
    import os, re, socket, sys

    inodes = set()
    for pid in sys.argv[1:]:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    seen = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            cols = line.split()
            if len(cols) >= 8 and cols[6] in inodes and cols[7].startswith("@"):
                seen.add(cols[7][1:])
    guesses = set()
    for name in seen:
        if m := re.fullmatch(r"(danaus-\w+-[a-z]\w*?)(\d+)-(\d+)", name):
            # a proc: {mesh name}{mesh counter}-{rank}
            guesses.update(f"{m[1]}{n}-{r}" for n in range(int(m[2]) + 1, int(m[2]) + 33)
                           for r in range(8))
        if m := re.fullmatch(r"(danaus-\w+-c\d+-)(\d+)", name):
            # a controller's runtime: c{pid}-{runtime counter}
            guesses.update(f"{m[1]}{n}" for n in range(int(m[2]) + 1, int(m[2]) + 65))
    held = []
    for guess in guesses:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind("\0" + guess)
        except OSError:
            s.close()
            continue
        s.listen(1)
        held.append(s)
    print(len(seen), len(held), flush=True)
    sys.stdin.read()
""")


async def test_squatting_the_names_a_counter_would_give_next_does_not_stop_spawning() -> None:
    async with this_host().spawn_procs(per_host={"procs": 2}) as probe:
        where = probe.spawn("where", Where)
        await asyncio.wait_for(where.initialized, 30)
        squatter = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SQUATTER,
            *map(str, probe.pids),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert squatter.stdout is not None and squatter.stdin is not None
            line = await asyncio.wait_for(squatter.stdout.readline(), 30)
            seen, _ = map(int, line.split())
            assert seen == 2, "the squatter saw the socket names of both procs"
            for _ in range(2):  # later meshes, while the squatter holds what it could
                async with this_host().spawn_procs(per_host={"procs": 2}) as procs:
                    got = await asyncio.wait_for(procs.spawn("where", Where).where.call(), 30)
                    addrs = [addr for addr, _ in got.values()]
                    assert len(set(addrs)) == 2 and all(a.startswith("unix:@") for a in addrs)
        finally:
            if squatter.stdin is not None:
                squatter.stdin.close()  # it lets go of its names and exits
            await asyncio.wait_for(squatter.wait(), 10)


async def test_squatting_the_names_later_runtimes_would_get_does_not_stop_a_new_event_loop() -> (
    None
):
    """A controller makes a runtime per event loop it is used on (a server's worker
    loop, each ``asyncio.run``): a squatter on its next names must not break those."""
    from danaus.actors._loops import close_loop_runtime, current_runtime

    current_runtime()  # this loop's runtime: its name is what the squatter sees
    squatter = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SQUATTER,
        str(os.getpid()),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert squatter.stdout is not None and squatter.stdin is not None
        line = await asyncio.wait_for(squatter.stdout.readline(), 30)
        seen, _ = map(int, line.split())
        assert seen >= 1, "the squatter saw this controller's socket names"

        async def on_a_new_loop() -> tuple[str, int]:
            try:
                async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
                    got = procs.spawn("where", Where).where.call_one()
                    return await asyncio.wait_for(got, 30)
            finally:
                await close_loop_runtime(asyncio.get_running_loop())

        addr, _ = await asyncio.to_thread(asyncio.run, on_a_new_loop())
        assert addr.startswith("unix:@")
    finally:
        if squatter.stdin is not None:
            squatter.stdin.close()
        await asyncio.wait_for(squatter.wait(), 10)


async def test_a_taken_socket_name_is_given_up_for_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Another socket holds a name; make it the first two names the spawner draws, as if
    # the squatter had guessed them.
    taken = f"danaus-{secrets.token_hex(16)}"
    squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squat.bind("\0" + taken)
    squat.listen(1)
    draws = iter([taken, taken])
    fresh = _local_procs.fresh_name
    monkeypatch.setattr(_local_procs, "fresh_name", lambda: next(draws, None) or fresh())
    try:
        async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            addr, pid = await asyncio.wait_for(procs.spawn("where", Where).where.call_one(), 30)
            assert addr != f"unix:@{taken}" and pid == procs.pids[0]
    finally:
        squat.close()
    assert caplog.text.count(f"@{taken} is taken by another process; trying another") == 2


def test_spawn_says_so_when_every_fresh_name_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = f"danaus-{secrets.token_hex(16)}"
    squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squat.bind("\0" + taken)
    monkeypatch.setattr(_local_procs, "fresh_name", lambda: taken)
    try:
        with pytest.raises(OSError, match="fresh abstract socket names in a row were taken"):
            this_host().spawn_procs(per_host={"procs": 1})
    finally:
        squat.close()


# ------------------------------------------------------------------ host agents


@pytest.fixture
def agent() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A host agent of its own (its procs are this test's alone), with the key ``KEY``."""
    env = dict(_program_env(), DANAUS_AUTH_KEY=KEY)
    with subprocess.Popen(
        [sys.executable, "-m", "danaus", "host-agent", "--listen", "tcp://127.0.0.6:0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as p:
        try:
            assert p.stdout is not None
            line = p.stdout.readline()  # printed once it listens
            assert "listening on tcp://" in line, line
            yield line.split()[-1], p
        finally:
            p.terminate()
            p.wait(timeout=10)
            if p.stdout is not None:
                p.stdout.close()


@pytest.fixture
def keyed() -> Iterator[None]:
    """This test's own controller uses the agent's key."""
    old_cfg, old_key = config.auth_key, process.job_key()
    config.auth_key = KEY
    process.set_job_key(bytes.fromhex(KEY))
    yield
    config.auth_key = old_cfg
    process.set_job_key(old_key)


#: Asks the agent for four meshes at once (the agent handles one request at a time, so
#: three wait in its mailbox), waits for the first, and is then SIGKILLed.
QUEUED_SPAWNS = textwrap.dedent("""
    import sys
    from danaus import attach_to_hosts

    hosts = attach_to_hosts([sys.argv[1]])
    meshes = [hosts.spawn_procs(per_host={"procs": 2}) for _ in range(4)]
    meshes[0].initialized.get(timeout=60)
    print("ready", flush=True)
    sys.stdin.read()
""")


@pytest.mark.timeout(120)
async def test_a_controller_killed_with_spawns_queued_leaves_no_procs_on_the_agent(
    agent: tuple[str, subprocess.Popen[str]], keyed: None
) -> None:
    addr, agent_proc = agent
    env = dict(_program_env(), DANAUS_AUTH_KEY=KEY)
    ctl = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        QUEUED_SPAWNS,
        addr,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert ctl.stdout is not None
        line = await asyncio.wait_for(ctl.stdout.readline(), 60)
        assert line.strip() == b"ready"
    finally:
        ctl.kill()
        await asyncio.wait_for(ctl.wait(), 10)
    # The agent handles one request at a time, in arrival order: our own request comes
    # after everything the dead controller had sent, so its answer means the agent has
    # dealt with all of it.
    from danaus.geometry import Shape
    from danaus.mesh._actor_mesh import mesh_ref
    from danaus.mesh._procs.host_agent import AGENT, HostAgent

    one = mesh_ref(AGENT, HostAgent, Shape.from_sizes({}), {0: addr})
    info = await asyncio.wait_for(one.info.call_one(), 60)
    left = await asyncio.to_thread(_wait_gone, danaus_children(agent_proc.pid), 10)
    assert left == [], f"procs of the dead controller still run on the agent: {left}"
    assert info["procs"] == 0
    assert agent_proc.poll() is None  # and the agent keeps serving


@pytest.mark.timeout(120)
async def test_a_killed_host_agent_takes_its_procs_and_fork_server_along(
    agent: tuple[str, subprocess.Popen[str]], keyed: None
) -> None:
    from danaus import attach_to_hosts

    addr, agent_proc = agent
    procs = attach_to_hosts([addr]).spawn_procs(per_host={"procs": 2})
    echo = procs.spawn("echo", Echo)
    await asyncio.wait_for(echo.pid.call(), 60)
    everything = danaus_procs(agent_proc.pid, servers=True)
    assert set(procs.pids) <= set(everything)
    if config.spawn_method == "fork":  # and the agent's own fork server
        assert len(everything) == len(procs.pids) + 1, everything
    previous = set_unhandled_fault_hook(lambda failure: None)  # expected: not logged
    try:
        agent_proc.kill()
        left = await asyncio.to_thread(_wait_gone, everything, 10)
        assert left == [], f"outlived their host agent: {left}"
        with pytest.raises(SupervisionError):
            await asyncio.wait_for(echo.pid.call(), 30)
    finally:
        set_unhandled_fault_hook(previous)


# ------------------------------------------------------------------ exits


def _run(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_program_env(),
    )


#: What a short sync program does: spawn, call, stop, exit.
SHORT = textwrap.dedent("""
    from danaus import this_host
    from tests.integration.actors_lib import Counter

    procs = this_host().spawn_procs(per_host={"procs": 2})
    counters = procs.spawn("counter", Counter, 1)
    assert counters.incr.call(1).get(timeout=30).values() == [2, 2]
    procs.stop().get(timeout=30)
""")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_sync_program_exits_cleanly_50_times() -> None:
    # It crashed in libpython at exit about once in six runs: the background loop's
    # thread woke up while the interpreter was finalizing. Three at a time.
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda _: _run(SHORT), range(50)))
    bad = [(r.returncode, r.stderr) for r in runs if r.returncode != 0 or r.stderr]
    assert bad == []


#: The exit hook registered first runs last: by then danaus's threads must be gone.
LAST_AT_EXIT = textwrap.dedent("""
    import atexit, sys, threading

    def last() -> None:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("danaus")]
        if alive:
            print(f"still running when the interpreter finalizes: {alive}", file=sys.stderr)

    atexit.register(last)
""")


def test_the_background_loop_thread_has_stopped_before_the_interpreter_finalizes() -> None:
    out = _run(LAST_AT_EXIT + SHORT)
    assert (out.returncode, out.stderr) == (0, "")


#: A sync program that leaves without stopping its mesh.
NO_STOP = textwrap.dedent("""
    from danaus import this_host
    from tests.integration.actors_lib import Echo

    procs = this_host().spawn_procs(per_host={"procs": 3})
    echo = procs.spawn("echo", Echo)
    print(*echo.pid.call().get(timeout=30).values(), flush=True)
""")


def test_a_program_that_exits_without_stopping_its_mesh_is_quiet_and_leaves_no_procs() -> None:
    out = _run(NO_STOP)
    assert out.returncode == 0
    assert "unhandled failure" not in out.stderr
    assert out.stderr == ""
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3
    assert _wait_gone(pids, timeout=10) == []


#: Exits right after asking for a stop, without waiting for it.
STOP_NOT_AWAITED = NO_STOP + "procs.stop()\n"


def test_a_program_that_exits_while_its_mesh_stops_is_quiet() -> None:
    out = _run(STOP_NOT_AWAITED)
    assert (out.returncode, out.stderr) == (0, "")


async def test_procs_killed_by_the_exit_hook_are_stopped_not_failed(failures: Failures) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    echo = procs.spawn("echo", Echo)
    assert (await asyncio.wait_for(echo.echo.call("hi"), 30)).values() == ["hi", "hi"]
    handles = list(group_of(procs).handles)
    assert [h.state for h in handles] == ["running", "running"]
    _local_procs._kill_all()  # what runs at interpreter exit
    for h in handles:  # its exit was handled on our loop (exit callbacks included)
        await asyncio.wait_for(asyncio.wrap_future(h.exited), 10)
    assert [h.state for h in handles] == ["stopped (killed by SIGKILL)"] * 2
    assert failures == []
    with pytest.raises(SupervisionError):
        await asyncio.wait_for(echo.echo.call("anyone?"), 10)
    await asyncio.wait_for(procs.stop(), 10)


async def test_a_proc_killed_by_someone_else_is_still_a_failure(failures: Failures) -> None:
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        echo = procs.spawn("echo", Echo)
        assert await asyncio.wait_for(echo.echo.call_one("hi"), 30) == "hi"
        handle = group_of(procs).handles[0]
        os.kill(procs.pids[0], signal.SIGKILL)
        await asyncio.wait_for(asyncio.wrap_future(handle.exited), 10)
        assert handle.state == "killed by SIGKILL"
        assert [f.kind for f in failures] == ["proc"]
        assert "killed by SIGKILL" in failures[0].report


# ------------------------------------------------------------------ the proc group


async def test_a_proc_group_holds_the_actor_meshes_of_its_mesh_and_every_slice() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 2})
    group = group_of(procs)
    assert group_of(procs.slice(procs=1)) is group
    assert repr(group) == f"<ProcGroup {procs.name} {{'procs': 2}} running, 0 actor meshes>"
    a = procs.spawn("a", Echo)
    b = procs.slice(procs=1).spawn("b", Echo)
    await asyncio.wait_for(asyncio.gather(a.initialized, b.initialized), 30)
    assert [s.name for s in group.states_at(0)] == ["a"]
    assert [s.name for s in group.states_at(1)] == ["a", "b"]
    await asyncio.wait_for(a.stop(), 10)
    assert [s.name for s in group.states_at(1)] == ["b"]
    assert repr(group) == f"<ProcGroup {procs.name} {{'procs': 2}} running, 1 actor meshes>"
    await asyncio.wait_for(procs.stop(), 10)
    assert group.stopped
    assert group.states_at(1) == []
    assert repr(group) == f"<ProcGroup {procs.name} {{'procs': 2}} stopped, 0 actor meshes>"
    with pytest.raises(SupervisionError, match="was stopped"):
        await asyncio.wait_for(b.echo.call("anyone?"), 10)


@pytest.mark.parametrize("method", ["fork", "exec"])
async def test_a_graceful_stop_runs_the_finalizers_of_module_globals(
    method: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in Monarch (its procs exit through the interpreter's finalization): a module
    global's __del__ runs when the proc mesh stops; a killed proc runs none."""
    from .finalizer_actors import HoldsFinalizer

    monkeypatch.setattr(config, "spawn_method", method)
    marker = os.path.join(str(tmp_path), "marker")
    async with this_host().spawn_procs(per_host={"procs": 1}) as procs:
        holder = await procs.spawn("holder", HoldsFinalizer, marker)
        pids = (await holder.pid.call()).values()
    assert await asyncio.to_thread(_wait_gone, pids, 10) == []
    with open(marker) as f:  # noqa: ASYNC230 - a few bytes, after the procs are gone
        assert f.read() == "finalized"
