"""A fork server: one warm process per host that forks procs in milliseconds.

Starting a proc as a fresh interpreter costs an ``import`` of danaus and of whatever the
actors need; with torch that is about 1.5 s of CPU per proc. The fork server imports
danaus and the heavy modules once (``config.preload``, plus those of ``SAFE_PRELOAD``
that the spawning process has imported, plus each actor class's module as it is first
spawned) and forks every proc from that state, so they share those pages copy-on-write.

Fork safety: the server never creates an event loop, a socket other than its control
socket, a Python thread or a CUDA context; it checks after every import that this still
holds and says "unsafe" otherwise, and the spawner then starts procs with ``exec``. Each
child closes what it inherited, resets signal handlers, takes its environment, working
directory and standard streams from the request, reseeds numpy's and torch's generators
(``random`` reseeds itself at fork) and only then builds its own loop and connections.

The server dies with the process that started it: a parent-death signal (set from a
thread that lives as long as the spawner) and its stdin, held by the spawner, as a
lifeline. Each child dies with the server (its own parent-death signal) and with the
spawner (its stdin lifeline, as with ``exec``).

Wire: one ``SOCK_SEQPACKET`` socket pair, msgpack messages, file descriptors as
``SCM_RIGHTS``. Requests ``fork`` (with the child's stdin, stdout, stderr and listening
socket), ``preload``, ``status``; answers ``ready``, ``forked``, ``exit``, ``unsafe``,
``status``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

from .._process import process
from .forkserver_main import (
    _MAX_MSG,
    SAFE_PRELOAD,
    Answer,
    ForkRequest,
    PreloadRequest,
    ServerStatus,
    StatusRequest,
    _encode,
    decode_answer,
)

log = logging.getLogger("danaus.procs")

# --- the client (in the spawning process) --------------------------------------------


class ForkedPopen:
    """The part of ``subprocess.Popen`` that ``ProcHandle`` uses, for a forked proc.

    Its parent is the fork server, which reports its exit; ``stdin``, ``stdout`` and
    ``stderr`` are pipes of this process, as with ``Popen``.
    """

    def __init__(self, server: ForkServer, stdin: int, stdout: int, stderr: int) -> None:
        self.server = server
        self.stdin = os.fdopen(stdin, "wb")
        self.stdout = os.fdopen(stdout, "rb") if stdout >= 0 else None
        self.stderr = os.fdopen(stderr, "rb") if stderr >= 0 else None
        self._pid = -1
        self.returncode: int | None = None
        self.forked = threading.Event()
        self._exited = threading.Event()
        self._kill_asked = False
        self._on_exit: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The proc's pid, as soon as ``spawn_procs`` returned (as with ``exec``): waits,
        bounded by ``proc_start_timeout``, for the server to fork it (milliseconds, or
        the server's own start on first use); -1 if that failed."""
        if self._pid <= 0 and self.returncode is None:
            from ...config import config

            self.forked.wait(config.proc_start_timeout)
        return self._pid

    @property
    def known_pid(self) -> int:
        """The pid if the server forked the proc already, else -1 (never waits)."""
        return self._pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"proc pid {self._pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            if self._pid <= 0:
                self._kill_asked = True  # killed as soon as it exists
                return
            pid = self._pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from another thread) once the proc exited."""
        with self._lock:
            if self.returncode is None:
                self._on_exit.append(callback)
                return
        callback()

    # called by the server's reader thread
    def note_forked(self, pid: int) -> None:
        """The server forked the proc: it is ``pid``."""
        with self._lock:
            self._pid = pid
            kill = self._kill_asked
        self.forked.set()
        if kill:
            self.kill()

    def note_exit(self, code: int) -> None:
        """The proc exited with ``code`` (or was never forked): runs the exit callbacks."""
        with self._lock:
            if self.returncode is not None:
                return
            self.returncode = code
            callbacks, self._on_exit = self._on_exit, []
        self._exited.set()
        self.forked.set()
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("exit callback of forked proc %s", self._pid)


class ForkServer:
    """The spawning process's end of its fork server."""

    def __init__(self, preload: list[str]) -> None:
        self.preload = preload
        self.pid = -1
        self.dead = ""  # why it cannot be used ("" while it can)
        self.unsafe = ""
        self._ctl, self._child_ctl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._requests: dict[int, ForkedPopen] = {}
        self._by_pid: dict[int, ForkedPopen] = {}
        self._status: dict[int, queue.SimpleQueue[ServerStatus]] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self._outbox: queue.SimpleQueue[tuple[bytes, list[int]] | None] = queue.SimpleQueue()
        self.ready = threading.Event()
        self._popen: subprocess.Popen[bytes] | None = None
        # Started from a thread that lives as long as this process: the server's
        # parent-death signal follows the thread that started it.
        self._reader = threading.Thread(target=self._run, name="danaus-forkserver", daemon=True)
        self._writer = threading.Thread(
            target=self._write, name="danaus-forkserver-out", daemon=True
        )
        self._reader.start()
        self._writer.start()

    def _run(self) -> None:
        try:
            env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=python_path())
            self._popen = subprocess.Popen(
                [
                    sys.executable,
                    "-c",  # not -m: the package imports this module before running it
                    "from danaus.mesh._procs.forkserver_main import serve_main; serve_main()",
                    "--control-fd",
                    str(self._child_ctl.fileno()),
                    "--parent-pid",
                    str(os.getpid()),
                    "--preload",
                    ",".join(self.preload),
                ],
                stdin=subprocess.PIPE,
                # Not this process's streams: a server holding them would keep the
                # pipes of a proc that spawns procs open after that proc died.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(self._child_ctl.fileno(),),
                env=env,
                close_fds=True,
            )
        except OSError as e:
            self._die(f"it could not start: {e}")
            self._ctl.close()
            return
        finally:
            self._child_ctl.close()
        self.pid = self._popen.pid
        try:
            self._read()
        finally:
            self._ctl.close()
            if self._popen.stdin is not None:
                with contextlib.suppress(OSError):
                    self._popen.stdin.close()

    def _read(self) -> None:
        assert self._popen is not None
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._ctl, _MAX_MSG, 8)
            except OSError as e:
                self._die(f"its control socket failed: {e}")
                return
            for fd in fds:
                os.close(fd)
            if not data:
                code = self._popen.wait()
                self._die(f"it exited ({code})")
                return
            self._dispatch(decode_answer(data))

    def _dispatch(self, msg: Answer | None) -> None:
        if msg is None:
            return
        if msg["op"] == "ready":
            if msg["unsafe"]:
                self._mark_unsafe(msg["unsafe"])
            self.ready.set()
        elif msg["op"] == "forked":
            with self._lock:
                popen = self._requests.pop(msg["id"], None)
                if popen is not None and msg["pid"] > 0:
                    self._by_pid[msg["pid"]] = popen
            if popen is not None:
                if msg["pid"] > 0:
                    popen.note_forked(msg["pid"])
                else:
                    log.error("the fork server could not fork a proc: %s", msg.get("error"))
                    popen.note_exit(1)
        elif msg["op"] == "exit":
            with self._lock:
                popen = self._by_pid.pop(msg["pid"], None)
            if popen is not None:
                popen.note_exit(msg["code"])
        elif msg["op"] == "unsafe":
            self._mark_unsafe(msg["reason"])
        elif msg["op"] == "preload_failed":
            log.info("the fork server did not preload %s", msg["failed"])
        elif msg["op"] == "status":
            box = self._status.pop(msg["id"], None)
            if box is not None:
                box.put(msg)

    def _mark_unsafe(self, reason: str) -> None:
        if not self.unsafe:
            self.unsafe = reason
            log.warning("forking procs is unsafe (%s): new procs start with exec", reason)

    def _die(self, why: str) -> None:
        """The server is gone: its children died with it (parent-death signal)."""
        with self._lock:
            self.dead = why
            orphans = list(self._requests.values()) + list(self._by_pid.values())
            self._requests.clear()
            self._by_pid.clear()
        self.ready.set()
        self._outbox.put(None)
        for popen in orphans:
            _wait_gone(popen.known_pid, 5.0)
            popen.note_exit(-signal.SIGKILL)
        if orphans or "exited" not in why:
            log.warning("the fork server (pid %s) is gone: %s", self.pid, why)

    def _write(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            data, fds = item
            try:
                socket.send_fds(self._ctl, [data], fds)
            except OSError as e:
                log.warning("could not send to the fork server: %s", e)
            finally:
                for fd in fds:
                    os.close(fd)

    def usable(self) -> bool:
        return not self.dead and not self.unsafe

    def fork(
        self,
        addr: str,
        parent: str,
        env: dict[str, str],
        listen_fd: int | None,
        capture: bool,
    ) -> ForkedPopen:
        """Ask for a proc; returns at once (its pid comes when the server forked it)."""
        stdin_r, stdin_w = os.pipe()
        fds = [stdin_r]
        if capture:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            fds += [out_w, err_w]
        else:
            out_r = err_r = -1
            fds += [os.dup(1), os.dup(2)]
        if listen_fd is not None:
            fds.append(os.dup(listen_fd))
        popen = ForkedPopen(self, stdin_w, out_r, err_r)
        with self._lock:
            if self.dead:
                for fd in fds:
                    os.close(fd)
                popen.stdin.close()
                popen.note_exit(1)
                return popen
            self._next_id += 1
            rid = self._next_id
            self._requests[rid] = popen
        msg: ForkRequest = {
            "op": "fork",
            "id": rid,
            "addr": addr,
            "parent": parent,
            "env": env,
            "cwd": os.getcwd(),
        }
        self._outbox.put((_encode(msg), fds))
        return popen

    def settle(self, timeout: float) -> bool:
        """Wait (bounded) until every proc asked for so far has been forked (or failed);
        True if they have."""
        with self._lock:
            pending = list(self._requests.values())
        deadline = time.monotonic() + timeout
        return all(p.forked.wait(max(0.0, deadline - time.monotonic())) for p in pending)

    def add_preload(self, modules: list[str]) -> None:
        """Import these in the server too (for procs forked from now on)."""
        fresh = [m for m in modules if m not in self.preload]
        if fresh and not self.dead:
            self.preload.extend(fresh)
            self._outbox.put((_encode(PreloadRequest(op="preload", modules=fresh)), []))

    def status(self, timeout: float = 30.0) -> ServerStatus:
        """The server's own report: pid, preloaded modules, threads, CUDA, children."""
        box: queue.SimpleQueue[ServerStatus] = queue.SimpleQueue()
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            self._status[rid] = box
        self._outbox.put((_encode(StatusRequest(op="status", id=rid)), []))
        return box.get(timeout=timeout)

    def stop(self, timeout: float) -> None:
        """Stop the server (its children die with it) and wait, up to ``timeout``
        seconds in all, for it and its threads to end."""
        popen = self._popen
        if popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            popen.terminate()
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(max(0.0, deadline - time.monotonic()))
        if popen.poll() is None:
            popen.kill()
        # Its threads end with it (the reader sees the socket close): none is left running
        # while the interpreter finalizes.
        self._outbox.put(None)
        for thread in (self._reader, self._writer):
            thread.join(max(0.1, deadline - time.monotonic()))


def _wait_gone(pid: int, timeout: float) -> None:
    """Wait (bounded) until ``pid`` is gone: killed with the server, it is on its way."""
    if pid <= 0:
        return
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        sel.select(timeout)
        sel.close()
    finally:
        os.close(fd)


def python_path() -> str:
    """What the procs import from: everything this process can (as for ``exec``)."""
    paths = [os.path.abspath(p or os.getcwd()) for p in sys.path]
    return os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))


def fork_server() -> ForkServer | None:
    """This process's fork server, started on first use; None where procs must start with
    ``exec`` (``config.spawn_method``, no fork on this platform, an unsafe server)."""
    from ...config import config

    if config.spawn_method != "fork" or not hasattr(os, "fork"):
        return None
    with process.fork_server_lock:
        if process.fork_server is None or process.fork_server.dead:
            preload = [m for m in SAFE_PRELOAD if m in sys.modules]
            preload += [m for m in config.preload if m not in preload]
            process.fork_server = ForkServer(preload)
        server = process.fork_server
    return server if not server.unsafe else None


def note_actor_module(module: str) -> bool:
    """An actor class of ``module`` is being spawned: procs forked later inherit it.
    Whether it is one to preload (not ``__main__``, danaus or a builtin)."""
    if module == "__main__" or module.startswith("danaus.") or module in sys.builtin_module_names:
        return False
    server = process.fork_server
    if server is not None and server.usable():
        server.add_preload([module])
    return True


def preload_asked(modules: object) -> None:
    """A host agent: a controller asks that procs forked from now on start with these
    modules imported (a model's: see :func:`preload_module`); names that are no
    module's are left out, and one that fails to import is not preloaded (the server
    says so)."""
    if not isinstance(modules, list):
        return
    names = [
        m
        for m in modules
        if isinstance(m, str) and len(m) <= 200 and all(p.isidentifier() for p in m.split("."))
    ]
    server = fork_server() if names else None
    if server is not None:
        server.add_preload(names)


def preload_module(module: str, agents: Iterable[str] = ()) -> None:
    """Procs forked from now on start with ``module`` imported (a model's library, which
    the procs that replace lost ones would otherwise import again each), where it is
    one this process has imported: where this process forks its procs, and on the hosts
    of the host agents ``agents``, told at once (their fork servers import it before
    procs are needed there). Only those: a host agent's fork server serves every
    controller that attaches to it, and an import changes what its procs start with
    (``transformers`` changes how torch's objects are freed)."""
    if module not in sys.modules:
        return
    if note_actor_module(module):
        from .host_agent import agent_ref

        for agent in agents:
            agent_ref(agent).preload.broadcast([module])


def stop_fork_server(timeout: float = 5.0) -> None:
    """Stop this process's fork server (its children die with it)."""
    with process.fork_server_lock:
        server, process.fork_server = process.fork_server, None
    if server is not None:
        server.stop(timeout)
