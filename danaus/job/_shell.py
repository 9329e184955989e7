"""``shell``: an interactive shell on one host of a host mesh (Monarch's
``monarch.job.shell``, behind ``danaus shell``), in a pseudo-terminal there, relayed
through a :class:`ShellActor`: keystrokes go to it as calls, its output comes back on a
port (at most ``_WINDOW`` bytes ahead of what this terminal has written: a flood of output
waits in the shell, not in memory), window sizes follow the local terminal."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from ..actors.seam import Actor, Channel, Future, Port, concurrent_endpoint, endpoint
from ._exec import rank_env

if TYPE_CHECKING:
    from ..mesh import HostMesh

__all__ = ["ShellActor", "ShellLost", "shell"]

#: what the shell's output port carries: ("out", bytes) chunks, then ("exit", status)
Output = tuple[str, bytes | int]
#: the most bytes read from the terminal, or written to it, at once
_CHUNK = 64 << 10
#: output sent and not yet written by the caller, at most (then the shell waits)
_WINDOW = 1 << 20
#: the caller acknowledges what it wrote in steps of this many bytes
_ACK_EVERY = 128 << 10


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _size(fd: int) -> tuple[int, int]:
    try:
        rows, cols, _, _ = struct.unpack(
            "HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        )
    except OSError:
        return 24, 80
    return rows or 24, cols or 80


class ShellActor(Actor):
    """A shell in a pseudo-terminal of its proc: ``run`` runs it until it ends (its
    output to a port), while ``write`` types into it, ``resize`` sets its window and
    ``hangup`` ends it. All on the proc's loop: the terminal's output is read when it is
    ready, and input is written without blocking (a shell that stops reading holds its
    input here, not the loop)."""

    def __init__(self) -> None:
        self._master = -1
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = bytearray()
        #: output sent and not yet acknowledged by the caller (flow control)
        self._unacked = 0
        self._paused = False
        self._resume: Callable[[], None] = lambda: None

    @concurrent_endpoint(long_running=True)  # (as long as the shell: never stuck)
    async def run(
        self,
        output: Port[Output],
        env: dict[str, str],
        workdir: str | None,
        client_cwd: str | None,
        rows: int,
        cols: int,
    ) -> int:
        """Run ``$SHELL -i`` (else bash) on a new pseudo-terminal until it ends; its
        output goes to ``output`` as it comes, then ``("exit", status)``. Returns the
        status (128 + the signal's number if one ended it)."""
        if self._process is not None:
            raise RuntimeError("this ShellActor already runs a shell")
        master, slave = os.openpty()
        _set_size(slave, rows, cols)
        os.set_blocking(master, False)
        here = bool(client_cwd) and await asyncio.to_thread(os.path.isdir, client_cwd or "")
        cwd = workdir or (client_cwd if here else None)
        program = os.environ.get("SHELL") or "/bin/bash"
        try:
            # subprocess, not the loop's: its preexec_fn runs after the terminal became
            # the child's stdin, and after setsid (start_new_session)
            self._process = process = subprocess.Popen(  # noqa: ASYNC220 - a fork, brief
                [program, "-i"],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env={**os.environ, **rank_env(), "TERM": "xterm", **env},
                start_new_session=True,  # its own session, with the terminal as its own
                preexec_fn=_take_terminal,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._master = master
        loop = asyncio.get_running_loop()
        drained = loop.create_future()

        def readable() -> None:
            try:
                data = os.read(master, _CHUNK)
            except BlockingIOError:
                return
            except OSError:  # EIO: the shell and everything on its terminal are gone
                data = b""
            if data:
                output.send(("out", data))
                self._unacked += len(data)
                if self._unacked >= _WINDOW:  # the caller is behind: stop reading
                    loop.remove_reader(master)
                    self._paused = True
            elif not drained.done():
                loop.remove_reader(master)
                drained.set_result(None)

        self._resume = lambda: loop.add_reader(master, readable)
        loop.add_reader(master, readable)
        exited = loop.create_future()
        pidfd = os.pidfd_open(process.pid)

        def gone() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, gone)
        try:
            await exited
            status = process.wait()  # it exited: at once
            await drained  # its last output first (ends once nothing holds the terminal)
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._close()
        status = status if status >= 0 else 128 - status
        output.send(("exit", status))
        return status

    @endpoint
    async def write(self, data: bytes) -> None:
        """Type ``data`` into the shell's terminal."""
        if self._master < 0:
            return  # it ended; the caller hears "exit" on its port
        self._pending += data
        self._flush()

    def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending and self._master >= 0:
                n = os.write(self._master, self._pending[:_CHUNK])
                del self._pending[:n]
        except BlockingIOError:
            loop.add_writer(self._master, self._flush)
            return
        except OSError:
            self._pending.clear()
        if self._master >= 0:
            loop.remove_writer(self._master)

    @endpoint
    async def ack(self, n: int) -> None:
        """The caller wrote ``n`` more bytes of the output: read on, if it had to stop."""
        self._unacked = max(0, self._unacked - n)
        if self._paused and self._unacked < _WINDOW and self._master >= 0:
            self._paused = False
            self._resume()

    @endpoint
    async def resize(self, rows: int, cols: int) -> None:
        """The local window changed size: so does the shell's (it gets SIGWINCH)."""
        if self._master >= 0:
            _set_size(self._master, rows, cols)

    @endpoint
    async def hangup(self) -> None:
        """End the shell and what runs on its terminal (SIGHUP to its session)."""
        self._hangup()

    def _hangup(self) -> None:
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGHUP)

    def _close(self) -> None:
        if self._master >= 0:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._master)
            loop.remove_writer(self._master)
            os.close(self._master)
            self._master = -1

    async def __cleanup__(self, exc: BaseException | None) -> None:
        del exc
        self._hangup()


def _take_terminal() -> None:
    """In the shell, before it runs: make its terminal (its stdin) its controlling one,
    and give it the signals a login terminal's shell has (a proc started from a job
    launched in the background inherits SIGINT and SIGQUIT ignored, and ^C would then
    not stop the commands typed there)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The local terminal in raw mode (keys go through as typed: ^C to the remote shell),
    restored however the block ends; nothing to do when ``fd`` is not a terminal."""
    if not os.isatty(fd):
        yield
        return
    before = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, before)


def shell(
    host_mesh: HostMesh,
    *,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
) -> int:
    """Run an interactive shell on the one host of ``host_mesh`` (slice it to one first)
    and return its exit status (Monarch's ``shell``). This process's terminal is the
    shell's while it runs: raw mode, every key to the remote shell (``exit`` or ^D ends
    it), its window size followed. From a plain thread (it blocks until the shell ends).

    Raises:
        ValueError: the host mesh has more than one host.
    """
    if len(host_mesh) != 1:
        raise ValueError(
            f"shell runs on one host; this host mesh has {len(host_mesh)}: slice it first "
            "(hosts.slice(hosts=0))"
        )
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    procs = host_mesh.spawn_procs(per_host={"procs": 1}, name="shell")
    try:
        remote = procs.spawn("shell", ShellActor)
        port, receiver = Channel[Output].open()
        rows, cols = _size(stdout)
        ran = remote.run.call_one(port, dict(env or {}), workdir, os.getcwd(), rows, cols)

        def ended(f: Future[int]) -> None:
            # its proc lost (or the shell not started): the loop below hears it too
            if not f.cancelled() and f.exception() is not None:
                port.send(("lost", str(f.exception()).encode(errors="backslashreplace")))

        ran.get_loop().call_soon_threadsafe(ran.add_done_callback, ended)
        stop_r, stop_w = os.pipe()

        def pump_input() -> None:
            """Local keys to the remote terminal, until the shell ends (``stop_r``)."""
            while True:
                ready, _, _ = select.select([stdin, stop_r], [], [])
                if stop_r in ready:
                    return
                data = os.read(stdin, _CHUNK)
                remote.write.call_one(data or b"\x04").get(60)  # input ended: as ^D
                if not data:
                    return

        def resized(signum: int, frame: object) -> None:
            del signum, frame
            remote.resize.call_one(*_size(stdout)).get(60)

        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGWINCH, resized) if main else None
        with _raw(stdin):
            feeder = threading.Thread(target=pump_input, name="danaus-shell-input", daemon=True)
            feeder.start()
            try:
                written = 0
                while True:
                    kind, value = receiver.recv().get()
                    if kind == "out" and isinstance(value, bytes):
                        os.write(stdout, value)
                        written += len(value)
                        if written >= _ACK_EVERY:  # (the shell reads on)
                            remote.ack.broadcast(written)
                            written = 0
                    elif kind == "exit" and isinstance(value, int):
                        return value
                    else:  # "lost"
                        raise ShellLost(f"the remote shell was lost: {value!r}")
            finally:
                os.write(stop_w, b"x")
                feeder.join(timeout=5)
                os.close(stop_r)
                os.close(stop_w)
                if main:
                    signal.signal(signal.SIGWINCH, old)
    finally:
        procs.stop().get(timeout=60)


class ShellLost(RuntimeError):
    """The proc running a remote shell died (or the shell could not start)."""
