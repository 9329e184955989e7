"""Entry point of a proc: ``python -m danaus.actors._proc_main --addr ADDR --parent ADDR``.

The job key arrives as the first line on stdin. stdin stays open afterwards: when the
controller dies, the pipe reaches EOF and the proc exits (and on Linux the kernel's
parent-death signal kills it too), so no proc outlives its controller.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import NoReturn

from .._os import die_with_parent
from ..config import config


async def _main(addr: str, parent: str, key: bytes, listen_fd: int | None) -> bool | None:
    """Serve until told to stop (True: a graceful stop) or the spawner goes (False);
    None: the spawner could not be reached at all (nobody would ever use this proc)."""
    import socket

    from ._loops import install_runtime
    from ._runtime import Runtime

    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=listen_fd) if listen_fd is not None else None
    rt = Runtime(loop, addr=addr, key=key, sock=sock)
    install_runtime(rt)
    from ._handlers import ProcControl, install_actor

    install_actor(rt, "__proc__", ProcControl())
    from ._debugging import hook as _debug

    _debug.install(rt, parent)  # breakpoint() opens a session at the spawner
    to_parent = rt.connection(parent)  # dialing the spawner tells it we are up
    unreachable: asyncio.Future[BaseException | None] = loop.create_future()

    def on_lost(peer: str) -> None:
        if peer == parent and not to_parent.was_open and not unreachable.done():
            unreachable.set_result(to_parent.close_reason)

    rt.on_lost.append(on_lost)
    stdin_closed = loop.create_future()

    def on_stdin() -> None:
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data and not stdin_closed.done():
            loop.remove_reader(0)
            stdin_closed.set_result(None)

    loop.add_reader(0, on_stdin)

    def on_sigterm() -> None:
        if not rt.stop_requested.done():
            rt.stop_requested.set_result(None)

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    # SIGINT (a Ctrl-C reaching the proc's process group) stops it like SIGTERM, so that a
    # KeyboardInterrupt that escapes the loop can only come from an endpoint's own code.
    loop.add_signal_handler(signal.SIGINT, on_sigterm)
    await asyncio.wait(
        [rt.stop_requested, stdin_closed, unreachable], return_when=asyncio.FIRST_COMPLETED
    )
    await rt.aclose()
    if unreachable.done() and not rt.stop_requested.done():
        # its spawner waits for this dial (within proc_start_timeout): say why, and go now
        sys.stderr.write(
            f"danaus proc {addr}: could not reach its spawner at {parent}: {unreachable.result()}\n"
        )
        return None
    return rt.stop_requested.done()


def _run_startup_hooks() -> None:
    """``DANAUS_PROC_STARTUP="pkg.mod:fn,..."``: call each in the proc before anything else
    (an upper layer's setup, e.g. ``danaus.monarch``'s import hook), without this layer
    knowing them."""
    import importlib

    for spec in filter(None, os.environ.get("DANAUS_PROC_STARTUP", "").split(",")):
        module, _, fn = spec.strip().partition(":")
        getattr(importlib.import_module(module), fn)()


def main() -> None:
    parser = argparse.ArgumentParser(description="danaus proc (started by a controller)")
    parser.add_argument("--addr", required=True)
    parser.add_argument("--parent", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument(
        "--listen-fd",
        type=int,
        default=None,
        help="an inherited socket, already bound to --addr and listening",
    )
    ns = parser.parse_args()
    run(ns.addr, ns.parent, ns.parent_pid, ns.listen_fd)


def run(addr: str, parent: str, parent_pid: int, listen_fd: int | None) -> NoReturn:
    """Be a proc until told to stop, then exit the process.

    Entered from ``main`` in a fresh interpreter, or in a child of a fork server (whose
    pid is then ``parent_pid``) with stdin, stdout and stderr already in place.
    """
    die_with_parent(parent_pid)
    from ._process import process

    process.in_proc = True
    import atexit

    # Exit hooks registered before now are the fork server's (or danaus's own imports'),
    # not this proc's: at a graceful stop only the proc's own run (see _finalize).
    atexit._clear()  # noqa: SLF001 - the interpreter's exit hooks
    _run_startup_hooks()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        sys.exit("danaus proc: no job key on stdin")
    key = bytes.fromhex(line.decode().strip())

    # every runtime this proc makes (a thread's, the background one) uses it
    process.set_job_key(key)
    logging.basicConfig(
        level=config.log_level,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from ._loops import new_event_loop

    loop = new_event_loop()
    main_task = loop.create_task(_main(addr, parent, key, listen_fd))
    try:
        while not main_task.done():
            try:
                loop.run_until_complete(main_task)
            except (KeyboardInterrupt, SystemExit):
                # asyncio lets these out of the loop after storing them in the task that
                # raised them: an async endpoint's own code. They fail that actor (the
                # task's done callback runs when the loop resumes), not the proc: its
                # other actors go on serving. The runtime stops a proc through main_task.
                continue
        outcome = (
            main_task.result()
            if not main_task.cancelled() and main_task.exception() is None
            else False
        )
        if outcome:
            _finalize()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(1 if outcome is None else 0)


def _finalize() -> None:
    """At a graceful stop, what the interpreter's own exit does that user code relies
    on (Monarch's procs exit through it): the ``atexit`` hooks registered in the proc
    run, then the globals of the user's modules (those from outside the standard
    library, the installed packages and danaus) are released, so the finalizers
    (``__del__``) of what only they held run. No cyclic collection: in a child of a fork
    server that would touch every object it inherited (32 procs stopping at once on 2
    cores then ran past ``stop_timeout``). The proc
    still ends with ``os._exit``: a fork server's child must not unwind into its code,
    and a finalizer that hangs is cut off after ``config.stop_timeout``."""
    import atexit
    import sysconfig
    import threading

    def cut_off() -> None:
        if not done.wait(config.stop_timeout):
            sys.stderr.write("danaus proc: finalizers still running, exiting without them\n")
            sys.stderr.flush()
            os._exit(0)

    done = threading.Event()
    threading.Thread(target=cut_off, name="danaus finalize deadline", daemon=True).start()
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - what the interpreter's exit runs
        roots = {*sysconfig.get_paths().values(), os.path.dirname(os.path.dirname(__file__))}
        # as written and resolved, so that a module's own path needs no resolving
        skip = tuple({os.path.join(p, "") for r in roots for p in (r, os.path.realpath(r))})
        for module in reversed(list(sys.modules.values())):
            path = getattr(module, "__file__", None)
            if not path or path.startswith(skip):
                continue
            try:
                for key in [k for k in vars(module) if not k.startswith("__")]:
                    vars(module)[key] = None  # as CPython's own finalization does
            except Exception:  # an odd module object: leave it
                continue
    except BaseException:  # a finalizer's error: ours to swallow, as the interpreter does
        pass
    finally:
        done.set()


if __name__ == "__main__":
    main()
