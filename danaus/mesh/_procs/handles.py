"""A proc as its spawner holds it: the ``Proc`` protocol and its four kinds (a local
process, this process, another process's proc, a proc a host agent started), and how a
proc's exit status reads. Starting and stopping local procs is ``local``."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from concurrent.futures import Future as ThreadFuture
from typing import Protocol

from .forkserver import ForkedPopen


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


class Proc(Protocol):
    """One proc of a mesh, whoever runs it: a :class:`ProcHandle` (started here), a
    :class:`RemoteProcHandle` (by a host agent), a :class:`SelfProcHandle` (this process)
    or a :class:`RefProcHandle` (another process's)."""

    @property
    def addr(self) -> str | None:
        """Where it listens (None: a remote proc not started yet)."""

    @property
    def rank(self) -> int:
        """Its global rank in its mesh."""

    @property
    def ready(self) -> ThreadFuture[None]:
        """Resolves once it is up (raises if it never came up)."""

    @property
    def exited(self) -> ThreadFuture[int]:
        """Resolves with its exit status."""

    @property
    def pid(self) -> int:
        """Its process id on its host (-1 where not known here)."""

    @property
    def state(self) -> str:
        """What it is doing, in words (``"running"``, ``"killed by SIGKILL"``...)."""

    def is_alive(self) -> bool: ...

    def kill(self) -> None:
        """Kill it, where it is this process's to kill (a no-op otherwise)."""


class ProcHandle:
    """One proc process: its address, ``Popen`` (or the same for a forked proc),
    readiness and exit."""

    def __init__(
        self,
        addr: str,
        rank: int,
        popen: subprocess.Popen[bytes] | ForkedPopen,
        ready: ThreadFuture[None],
    ) -> None:
        self.addr = addr
        self.rank = rank
        self.popen = popen
        #: resolves once it is up: the future ``peers.expect(addr)`` gave its spawner,
        #: which dials to it wait for
        self.ready = ready
        self.exited: ThreadFuture[int] = ThreadFuture()
        #: called (on the spawning loop) with the exit description when the proc exits,
        #: unless danaus stopped the proc itself (see ``stopping``)
        self.exit_callbacks: list[Callable[[str], None]] = []
        #: danaus is stopping this proc itself (a mesh's stop, the exit hook): its exit
        #: is what was asked for, not a failure to report
        self.stopping = False

    def __repr__(self) -> str:
        pid = getattr(self.popen, "known_pid", None) or self.popen.pid  # (never waits)
        return f"<ProcHandle {self.addr} pid={pid} {self.state}>"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def state(self) -> str:
        if self.exited.done():
            why = describe_exit(self.exited.result())
            return f"stopped ({why})" if self.stopping else why
        if self.stopping:
            return "stopping"
        return "running" if self.ready.done() else "starting"

    def exit_reason(self) -> str | None:
        code = self.popen.poll()
        return None if code is None else describe_exit(code)

    def kill(self) -> None:
        """SIGKILL the proc (nothing if it exited already)."""
        if self.popen.poll() is None:
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass

    def expect_exit(self) -> None:
        """danaus is stopping this proc itself: its exit will not be reported as a failure."""
        self.stopping = True

    def stop_now(self) -> None:
        """Kill the proc as danaus's own decision (its exit is not a failure)."""
        self.expect_exit()
        self.kill()


class SelfProcHandle:
    """This very process as a proc (``this_proc()``): actors spawned on it run on the
    current event loop. Stopping its mesh stops those actors, never the process."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.rank = 0
        self.ready: ThreadFuture[None] = ThreadFuture()
        self.ready.set_result(None)
        self.exited: ThreadFuture[int] = ThreadFuture()
        self.exit_callbacks: list[Callable[[str], None]] = []

    def __repr__(self) -> str:
        return f"<SelfProcHandle {self.addr} pid={os.getpid()}>"

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def state(self) -> str:
        return "running"

    def is_alive(self) -> bool:
        return True

    def exit_reason(self) -> str | None:
        return None

    def kill(self) -> None:
        """Not this process: stopping ``this_proc()`` stops only its actors."""


class RefProcHandle:
    """A proc another process spawned and owns, known by its address (the procs of
    ``actor_instance.proc_mesh``): actors may be spawned on it; it is never stopped or
    killed from here."""

    def __init__(self, addr: str, rank: int) -> None:
        self.addr = addr
        self.rank = rank
        self.ready: ThreadFuture[None] = ThreadFuture()
        self.ready.set_result(None)
        self.exited: ThreadFuture[int] = ThreadFuture()
        self.exit_callbacks: list[Callable[[str], None]] = []

    def __repr__(self) -> str:
        return f"<RefProcHandle {self.addr} rank={self.rank}>"

    @property
    def pid(self) -> int:
        return -1  # on its host, known to its spawner

    @property
    def state(self) -> str:
        return "running (owned by its spawner)"

    def is_alive(self) -> bool:
        return True

    def exit_reason(self) -> str | None:
        return None

    def kill(self) -> None:
        """Not ours to kill: stopping a reference mesh stops only its actors."""


class RemoteProcHandle:
    """A proc that a host agent started on another host for us.

    Its address is known once the agent answers; the agent reaps it.
    """

    def __init__(self, rank: int, agent: str) -> None:
        self.addr: str | None = None
        self.rank = rank
        self.agent = agent
        self._pid = -1
        self.ready: ThreadFuture[None] = ThreadFuture()
        self.exited: ThreadFuture[int] = ThreadFuture()
        self.on_started: list[Callable[[RemoteProcHandle], None]] = []

    def __repr__(self) -> str:
        return f"<RemoteProcHandle rank={self.rank} {self.addr or 'starting'} via {self.agent}>"

    @property
    def pid(self) -> int:
        """The proc's pid on its host (-1 until it started)."""
        return self._pid

    def started(self, addr: str, pid: int) -> None:
        self.addr = addr
        self._pid = pid
        for callback in self.on_started:
            callback(self)
        if not self.ready.done():
            self.ready.set_result(None)

    def failed(self, exc: BaseException) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
        if not self.exited.done():
            self.exited.set_result(-1)

    def is_alive(self) -> bool:
        return not self.exited.done()

    @property
    def state(self) -> str:
        if self.exited.done():
            return "stopped"
        return "running" if self.ready.done() else "starting"

    def exit_reason(self) -> str | None:
        return None

    def kill(self) -> None:
        """Killing a remote proc goes through its agent: see ``ProcMesh.stop``."""
