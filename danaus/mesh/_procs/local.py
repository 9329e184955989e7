"""Starting proc processes on this host, watching them die, and stopping them.

Each proc is forked by this host's fork server (``forkserver``: milliseconds, with danaus
and the heavy modules already imported) or, with ``config.spawn_method = "exec"`` or where
forking is unsafe, started as ``python -m danaus.actors._proc_main``. Either way it gets the job
key on stdin and keeps stdin open as a lifeline; the kernel's parent-death signal backs
that up. Every proc is
also killed by an ``atexit`` hook, so none outlives the controller; procs killed that way
(or by a mesh's ``stop``) are stopped, not failed, and their exits are not reported.

This module owns the handles of the local procs not reaped yet (``process.live_procs``: added as they
start, dropped as they are reaped, killed at exit; :func:`started_here` asks it). What the
runtimes know of them (readiness, exit status) is :data:`~danaus.actors._peers.peers`'s,
told as each starts; which proc mesh each is in is its ``ProcGroup``'s.

A proc's listening socket is bound here, under a name nobody can predict, and handed to
the proc: abstract socket names are visible to every local process (``/proc/net/unix``),
so a name derived from a counter could be taken by another process before the proc binds
it, and the proc would fail to start.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import functools
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future as ThreadFuture

from ...actors.seam import Runtime, peers, run_on
from ...config import config
from ...errors import SupervisionError
from .._process import process
from .._supervision import interpreter_exiting
from .forkserver import ForkedPopen, fork_server, python_path, stop_fork_server
from .handles import ProcHandle, describe_exit
from .logs import LineReader, LineSink

log = logging.getLogger("danaus.procs")


#: Fresh names tried before giving up on binding a proc's socket: a random 128-bit name
#: is taken only by bad luck or by a process binding names blindly, so a few tries do.
_BIND_TRIES = 8

#: At interpreter exit, after SIGKILL, how long (s) to wait for each proc to be reaped.
#: A killed process goes at once unless the kernel is stuck (uninterruptible I/O); then
#: exit moves on rather than hang. Not a setting: nothing can be done differently.
_REAP_WAIT = 5.0
#: At interpreter exit, how long (s) the fork server gets to exit on SIGTERM before it is
#: killed (its children die with it either way). Kept short: the controller is exiting.
_FORK_SERVER_EXIT_WAIT = 1.0


def start_proc(
    rt: Runtime,
    addr: str,
    rank: int,
    env: dict[str, str] | None = None,
    sink: LineSink | None = None,
    executable: str | None = None,
) -> ProcHandle:
    """Start one proc that will listen on ``addr`` and dial ``rt`` when it is up.

    ``tcp://HOST:0`` picks a free port, and ``unix:@`` an abstract socket name that
    nobody can predict: either way the socket is bound here and handed to the proc, so
    the address is known at once and no other process can take it meanwhile.

    ``executable``: a Python other than this one (``HostMesh.with_python_executable``);
    such a proc starts as a fresh interpreter of it (a fork server runs this Python).

    The process is started from ``rt``'s loop thread: the kernel's parent-death signal
    follows the *thread* that forked, so a proc started from a short-lived thread (a
    worker thread of a web framework, say) would die with that thread.
    """
    if rt.on_loop() or threading.current_thread() is threading.main_thread():
        return _start_proc(rt, addr, rank, env, sink, executable)
    started: ThreadFuture[ProcHandle] = ThreadFuture()

    def start() -> None:
        try:
            started.set_result(_start_proc(rt, addr, rank, env, sink, executable))
        except BaseException as e:
            started.set_exception(e)

    rt.loop.call_soon_threadsafe(start)
    return started.result(timeout=config.proc_start_timeout)


def _start_proc(
    rt: Runtime,
    addr: str,
    rank: int,
    env: dict[str, str] | None,
    sink: LineSink | None,
    executable: str | None = None,
) -> ProcHandle:
    sock = None
    pass_fds: tuple[int, ...] = ()
    extra: list[str] = []
    if addr == "unix:@":
        sock, addr = bind_abstract()
        pass_fds = (sock.fileno(),)
        extra = ["--listen-fd", str(sock.fileno())]
    elif addr.startswith("tcp://") and addr.endswith(":0"):
        host = addr[len("tcp://") :].rpartition(":")[0].strip("[]")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(512)
        port = sock.getsockname()[1]
        addr = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
        pass_fds = (sock.fileno(),)
        extra = ["--listen-fd", str(sock.fileno())]
    proc_env = dict(os.environ)
    proc_env["PYTHONUNBUFFERED"] = "1"  # every line reaches the pipe at once, also before a crash
    # The procs import what the controller can: classes pickled by reference resolve.
    proc_env["PYTHONPATH"] = python_path()
    if env:
        proc_env.update(env)
    ready = peers.expect(addr)
    popen: subprocess.Popen[bytes] | ForkedPopen
    python = executable or sys.executable
    other_python = os.path.realpath(python) != os.path.realpath(sys.executable)
    if executable:  # its procs' own this_host() spawns with it too (a wrapper runs again)
        proc_env["DANAUS_PROC_PYTHON"] = executable
    server = None if other_python else fork_server()
    try:
        if server is not None:
            listen_fd = sock.fileno() if sock is not None else None
            popen = server.fork(addr, rt.addr, proc_env, listen_fd, capture=sink is not None)
        else:
            popen = _exec_proc(rt, python, addr, extra, pass_fds, proc_env, sink is not None)
    finally:
        if sock is not None:
            sock.close()  # the proc holds its own copy
    assert popen.stdin is not None
    popen.stdin.write(rt.key.hex().encode() + b"\n")
    popen.stdin.flush()
    handle = ProcHandle(addr, rank, popen, ready)
    with process.live_procs_lock:
        process.live_procs.add(handle)
    peers.spawned(addr, handle.exited, handle.exit_reason)
    run_on(rt, _watch, rt, handle, sink)
    return handle


def _exec_proc(
    rt: Runtime,
    python: str,
    addr: str,
    extra: list[str],
    pass_fds: tuple[int, ...],
    env: dict[str, str],
    capture: bool,
) -> subprocess.Popen[bytes]:
    """Start a proc as a fresh interpreter of ``python``."""
    cmd = [
        python,
        "-m",
        "danaus.actors._proc_main",
        "--addr",
        addr,
        "--parent",
        rt.addr,
        "--parent-pid",
        str(os.getpid()),
        *extra,
    ]
    out = subprocess.PIPE if capture else None
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        env=env,
        close_fds=True,
        pass_fds=pass_fds,
        stdout=out,
        stderr=out,
    )


def _watch(rt: Runtime, h: ProcHandle, sink: LineSink | None) -> None:
    """On ``rt``'s loop: expect the proc's dial, time out its start, notice its exit,
    forward its output."""
    loop = rt.loop
    if not h.ready.done():
        rt.expect(h.addr)
    if sink is not None:
        for stream, pipe in (("out", h.popen.stdout), ("err", h.popen.stderr)):
            if pipe is not None:
                rt.spawn_task(
                    loop.connect_read_pipe(functools.partial(LineReader, stream, sink), pipe)
                )
    _call_on_exit(loop, h, functools.partial(_exited, rt, h))
    loop.call_later(config.proc_start_timeout, _start_expired, h)


def _call_on_exit(loop: asyncio.AbstractEventLoop, h: ProcHandle, fn: Callable[[], None]) -> None:
    """Call ``fn`` on ``loop`` once the proc has exited."""
    if isinstance(h.popen, ForkedPopen):  # a forked proc's exit comes from its server

        def exited() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(fn)

        h.popen.on_exit(exited)
        return
    try:
        pidfd = os.pidfd_open(h.popen.pid)
    except (AttributeError, OSError):  # no pidfd: a thread waits

        def wait() -> None:
            h.popen.wait()
            loop.call_soon_threadsafe(fn)

        threading.Thread(target=wait, daemon=True).start()
        return

    def readable() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        fn()

    loop.add_reader(pidfd, readable)


def _exited(rt: Runtime, h: ProcHandle) -> None:
    """On ``rt``'s loop, once the proc has exited: reap it, tell who waits, and fail its
    start if it never came up."""
    code = h.popen.wait()
    with process.live_procs_lock:
        process.live_procs.discard(h)
    if h.popen.stdin is not None:
        try:
            h.popen.stdin.close()
        except OSError:
            pass
    if not h.exited.done():
        h.exited.set_result(code)
    why = describe_exit(code)
    for callback in () if h.stopping else h.exit_callbacks:
        try:
            callback(why)
        except Exception:
            log.exception("exit callback of %s", h.addr)
    if not h.ready.done():
        err = SupervisionError(f"proc {h.addr} {why} before it came up")
        h.ready.set_exception(err)
        rt.fail_peer(h.addr, err)


def _start_expired(h: ProcHandle) -> None:
    if not h.ready.done():
        log.error(
            "proc %s did not come up within %s s; killing it", h.addr, config.proc_start_timeout
        )
        h.kill()


async def wait_exited(h: ProcHandle, deadline: float) -> bool:
    """Wait up to ``deadline`` s for ``h`` to exit; True if it did."""
    if h.exited.done() or h.popen.poll() is not None:
        return True
    try:
        async with asyncio.timeout(deadline):
            await asyncio.shield(asyncio.wrap_future(h.exited))
    except TimeoutError:
        return h.popen.poll() is not None
    return True


async def stop_procs(rt: Runtime, handles: Sequence[ProcHandle], grace: float) -> None:
    """Stop local procs as danaus's own decision (their exits are not failures): each
    that came up is asked to stop, one that did not is killed; any still running after
    ``grace`` s is killed. Returns once every one has been reaped (or ``grace`` more
    seconds passed)."""
    for h in handles:
        h.expect_exit()
        if not h.is_alive():
            pass
        elif h.ready.done() and h.ready.exception() is None:
            rt.stop_proc(h.addr)
        else:
            h.kill()  # never came up: nothing to stop cleanly
    exited = await asyncio.gather(*(wait_exited(h, grace) for h in handles))
    for h, ok in zip(handles, exited, strict=True):
        if not ok:
            log.warning("proc %s did not stop within %s s; killing it", h.addr, grace)
            h.kill()
    await asyncio.gather(*(wait_exited(h, grace) for h in handles))


def fresh_name() -> str:
    """An abstract socket name for a proc: 128 random bits, so no other process can
    know it before it is bound."""
    return f"danaus-{secrets.token_hex(16)}"


def started_here(addr: str) -> bool:
    """Whether the proc at ``addr`` was started by this process and still runs."""
    with process.live_procs_lock:
        return any(h.addr == addr for h in process.live_procs)


def bind_abstract() -> tuple[socket.socket, str]:
    """A listening Unix socket bound to a fresh abstract name, and its ``unix:@`` address.

    A name that is taken is given up for another fresh one, up to ``_BIND_TRIES`` times.
    """
    for _ in range(_BIND_TRIES):
        name = fresh_name()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise
            log.warning(
                "abstract socket name @%s is taken by another process; trying another", name
            )
            continue
        sock.listen(512)
        return sock, f"unix:@{name}"
    raise OSError(
        errno.EADDRINUSE,
        f"{_BIND_TRIES} fresh abstract socket names in a row were "
        "taken: another process is binding them",
    )


def _kill_all() -> None:
    """Kill every proc this process started (at exit: none outlives the controller).

    They are stopped by danaus, not failed: their exits reach no fault hook.
    """
    with process.live_procs_lock:
        procs = list(process.live_procs)
    for h in procs:
        h.stop_now()
    for h in procs:
        try:
            h.popen.wait(timeout=_REAP_WAIT)
        except subprocess.TimeoutExpired:
            pass


def _at_exit() -> None:
    interpreter_exiting()  # what our own kills cause is not a failure
    _kill_all()
    stop_fork_server(timeout=_FORK_SERVER_EXIT_WAIT)


atexit.register(_at_exit)
