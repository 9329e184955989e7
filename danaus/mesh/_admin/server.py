"""The controller's admin endpoint: what ``danaus top``, ``danaus dashboard --attach`` and
``danaus debug`` talk to.

A controller (not a proc) starts one when it spawns its first proc mesh, on the address
in ``config.admin``: ``"auto"`` (the default) is a local abstract unix socket, ``"off"``
none; ``unix:@name``, ``unix:/path``, ``tcp://host:port`` or a bare port (on 127.0.0.1)
name one. ``danaus.serve_admin(addr)`` starts one explicitly.

Every connection proves it holds the job's key first (HMAC challenge-response, as between
procs; neither side sends the key), and every frame after that carries an HMAC bound to the
connection and its position, so a relay cannot splice or replay frames. So that a local
tool finds the controller, each endpoint is written to a file readable by its user only
(``runtime_dir()``, like Jupyter's connection files): its address, pid, command line and
key. The file goes when the controller exits.

Frames: 4-byte big-endian length, 32-byte HMAC, JSON. Requests ``{"id", "op", "args"}``;
replies ``{"id", "ok": true, "value"}`` or ``{"id", "ok": false, "error"}``. Requests on
one connection run concurrently; ops are the functions registered with :func:`admin_op`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar

from ... import _auth as auth
from ...actors.seam import actor_process, background_runtime, run_task
from ...config import config
from .._process import process
from .client import AdminClient
from .wire import (
    _MAC,
    _NONCE,
    HELLO,
    MAX_REQUEST,
    AdminError,
    AdminTimeout,
    _normalize,
    _open,
    _seal,
    _session_keys,
    _write_runtime_file,
    find_controllers,
    runtime_dir,
)

if TYPE_CHECKING:
    from .records import StackEntry
    from .snapshot import Snapshot

log = logging.getLogger("danaus.admin")

__all__ = [
    "AdminClient",
    "AdminError",
    "AdminServer",
    "AdminTimeout",
    "admin_op",
    "admin_server",
    "find_controllers",
    "maybe_start_admin",
    "runtime_dir",
    "serve_admin",
]

# ----------------------------------------------------------------------------------- ops

#: An admin operation as the server runs it: from a request's arguments (a JSON object)
#: to its result, sent back as JSON.
Op = Callable[[dict[str, object]], Awaitable[object]]
F = TypeVar("F")


def admin_op(name: str) -> Callable[[F], F]:
    """Register an async function as the admin operation ``name``: a request's ``args``
    become its keyword arguments (ones it does not take answer ``TypeError``)."""

    def register(fn: F) -> F:
        process.admin_ops[name] = _by_keywords(name, fn)
        return fn

    return register


def _by_keywords(name: str, fn: object) -> Op:
    """``fn`` called with a request's arguments as keywords. Ops differ in signature, so
    this one call is checked when it is made, as Python binds the arguments."""
    if not callable(fn):
        raise TypeError(f"admin op {name!r} must be an async function, got {fn!r}")

    async def op(args: dict[str, object]) -> object:
        return await fn(**args)

    return op


class Hello(TypedDict):
    """The answer to ``hello``: who the controller is, and the ops it knows."""

    pid: int
    host: str
    argv: list[str]
    ops: list[str]


@admin_op("hello")
async def _hello() -> Hello:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": list(sys.argv),
        "ops": sorted(process.admin_ops),
    }


@admin_op("snapshot")
async def _snapshot() -> Snapshot:
    from .snapshot import snapshot

    return await snapshot()


@admin_op("stacks")
async def _stacks(procs: str, rank: int) -> list[StackEntry]:
    from .snapshot import proc_stacks

    return await proc_stacks(procs, int(rank))


# -------------------------------------------------------------------------------- server


class AdminServer:
    """A running admin endpoint: ``addr`` (with the port chosen), ``close()``."""

    def __init__(self, addr: str, key: bytes) -> None:
        self.addr = addr
        self._key = key
        self._server: asyncio.AbstractServer | None = None
        self._file: Path | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    def __repr__(self) -> str:
        return f"<AdminServer {self.addr}>"

    async def start(self) -> None:
        """Listen on ``addr`` (choosing the port where it says 0) and write the runtime
        file that clients find it by."""
        family_unix = self.addr.startswith("unix:")
        if family_unix:
            rest = self.addr[5:]
            path = "\0" + rest[1:] if rest.startswith("@") else rest
            self._server = await asyncio.start_unix_server(
                self._serve, path=path, limit=MAX_REQUEST + 64
            )
        else:
            host, _, port = self.addr[6:].rpartition(":")
            self._server = await asyncio.start_server(
                self._serve, host.strip("[]"), int(port), limit=MAX_REQUEST + 64
            )
            bound = self._server.sockets[0].getsockname()
            self.addr = f"tcp://{host}:{bound[1]}"
        self._file = _write_runtime_file(self.addr, self._key)

    def close(self) -> None:
        """Stop listening and drop its connections and its file."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.unlink()
            self._file = None
        server, self._server = self._server, None
        if server is None:
            return

        async def stop() -> None:
            server.close()
            for w in list(self._conns):
                w.close()

        with contextlib.suppress(Exception):
            run_task(background_runtime(), stop).result(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            keys = await asyncio.wait_for(self._handshake(reader, writer), config.handshake_timeout)
            if keys is not None:
                await self._requests(reader, writer, *keys)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        except AdminError as e:
            log.warning("admin: dropped a connection: %s", e)
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[bytes, bytes] | None:
        server_nonce = auth.new_nonce()
        writer.write(HELLO + server_nonce)
        got = await reader.readexactly(_NONCE + _MAC)
        client_nonce, mac = got[:_NONCE], got[_NONCE:]
        if not auth.verify(self._key, b"admin client", client_nonce, server_nonce, mac):
            log.warning("admin: a peer failed authentication (wrong or no job key)")
            return None
        writer.write(auth.proof(self._key, b"admin server", server_nonce, client_nonce))
        return _session_keys(self._key, client_nonce, server_nonce)

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        key_in: bytes,
        key_out: bytes,
    ) -> None:
        seq_out = [0]
        tasks: set[asyncio.Task[None]] = set()

        def reply(obj: dict[str, object]) -> None:
            if writer.is_closing():
                return
            writer.write(_seal(key_out, seq_out[0], obj))
            seq_out[0] += 1

        async def run(req: object) -> None:
            rid = req.get("id") if isinstance(req, dict) else None
            try:
                if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                    raise AdminError("a request is {'id', 'op', 'args'}")
                fn = process.admin_ops.get(req["op"])
                if fn is None:
                    raise AdminError(
                        f"unknown op {req['op']!r}; known: {', '.join(sorted(process.admin_ops))}"
                    )
                args = req.get("args") or {}
                if not isinstance(args, dict):
                    raise AdminError("a request's args are an object")
                reply({"id": rid, "ok": True, "value": await fn(args)})
            except Exception as e:
                reply({"id": rid, "ok": False, "error": f"{type(e).__name__}: {e}"})

        seq_in = 0
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                if size > MAX_REQUEST:
                    raise AdminError(f"a request of {size} bytes is over {MAX_REQUEST}")
                mac = await reader.readexactly(_MAC)
                req = _open(key_in, seq_in, mac, await reader.readexactly(size))
                seq_in += 1
                task = asyncio.get_running_loop().create_task(run(req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()


def serve_admin(addr: str = "auto", timeout: float = 10.0) -> AdminServer:
    """Start this controller's admin endpoint on ``addr`` (see the module's docstring)
    and return it; the one already running, if any. Blocks until it listens; do not call
    it from danaus's background loop (a proc mesh starts one there by itself)."""
    with process.admin_server_lock:
        if process.admin_server is not None:
            return process.admin_server
        server = AdminServer(_normalize(addr), actor_process.job_key())
        run_task(background_runtime(), server.start).result(timeout)
        process.admin_server = server
        process.admin_server_ready.set()
        return server


def admin_server(timeout: float = 0.0) -> AdminServer | None:
    """This controller's running admin endpoint, waiting up to ``timeout`` for one that
    is starting; None if there is none."""
    process.admin_server_ready.wait(timeout)
    return process.admin_server


def maybe_start_admin() -> None:
    """Start the admin endpoint of ``config.admin`` without waiting, if this process is a
    controller and has none yet (called when a proc mesh is spawned)."""
    if actor_process.in_proc or process.admin_server is not None or config.admin in ("", "off"):
        return
    threading.Thread(target=_start_quietly, name="danaus-admin-start", daemon=True).start()


def _start_quietly() -> None:
    if not process.admin_starting.acquire(blocking=False):
        return
    try:
        serve_admin(config.admin)
    except Exception as e:
        log.warning("admin endpoint %r did not start: %s", config.admin, e)


@atexit.register
def _close_at_exit() -> None:
    if process.admin_server is not None:
        process.admin_server.close()


def set_dashboard_starter(start: Callable[[int], str]) -> None:
    """How the layers below the tools start this controller's dashboard (a job's
    ``enable_telemetry(include_dashboard=True)``): the tools layer provides it."""
    process.dashboard_starter = start


def start_dashboard(port: int) -> str:
    """Serve this controller's dashboard on ``port`` (0: a free one); its URL.

    Raises:
        RuntimeError: the tools layer is not loaded (``import danaus`` loads it).
    """
    starter = process.dashboard_starter
    if starter is None:
        raise RuntimeError("the dashboard needs danaus.tools (import danaus)")
    return starter(port)
