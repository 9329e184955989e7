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
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from ..actors._api import auth, background_runtime, context_state, run_task
from ..config import config

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

HELLO = b"danaus-admin/1\n"
#: largest request a controller reads, and largest reply a tool reads (bytes)
MAX_REQUEST = 1 << 20
MAX_REPLY = 256 << 20
_NONCE = auth.NONCE_BYTES
_MAC = 32


class AdminError(Exception):
    """The admin endpoint refused a request or could not be reached."""


class AdminTimeout(AdminError, TimeoutError):
    """The admin endpoint did not answer in time (busy, frozen or stalled)."""


# ------------------------------------------------------------------------------- frames


def _mac(key: bytes, seq: int, payload: bytes) -> bytes:
    return hmac.new(key, seq.to_bytes(8, "big") + payload, hashlib.sha256).digest()


def _plain(obj: object) -> object:
    return sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else repr(obj)


def _seal(key: bytes, seq: int, obj: Any) -> bytes:
    try:
        payload = msgspec.json.encode(obj, enc_hook=repr)
    except UnicodeEncodeError:  # text with lone surrogates (undecodable argv, file names)
        payload = json.dumps(obj, default=_plain).encode()  # ASCII, with \u escapes
    return len(payload).to_bytes(4, "big") + _mac(key, seq, payload) + payload


def _open(key: bytes, seq: int, mac: bytes, payload: bytes) -> Any:
    if not hmac.compare_digest(_mac(key, seq, payload), mac):
        raise AdminError("a frame failed its integrity check (tampered, replayed or spliced)")
    try:
        return json.loads(payload)
    except ValueError as e:
        raise AdminError(f"a frame is not JSON: {e}") from None


def _session_keys(key: bytes, client_nonce: bytes, server_nonce: bytes) -> tuple[bytes, bytes]:
    """(client -> server, server -> client) frame keys of one connection."""
    return (
        auth.proof(key, b"admin client->server", client_nonce, server_nonce),
        auth.proof(key, b"admin server->client", client_nonce, server_nonce),
    )


# ----------------------------------------------------------------------------------- ops

#: the admin endpoint's operations, by name: async functions of keyword arguments
OPS: dict[str, Callable[..., Awaitable[Any]]] = {}


def admin_op(name: str) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Register an async function as the admin operation ``name``."""

    def register(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        OPS[name] = fn
        return fn

    return register


@admin_op("hello")
async def _hello() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": list(sys.argv),
        "ops": sorted(OPS),
    }


@admin_op("snapshot")
async def _snapshot() -> dict[str, Any]:
    from ._snapshot import snapshot

    return await snapshot()


@admin_op("stacks")
async def _stacks(procs: str, rank: int) -> list[dict[str, Any]]:
    from ._snapshot import proc_stacks

    return await proc_stacks(procs, int(rank))


# -------------------------------------------------------------------------------- server


def _normalize(addr: str) -> str:
    if addr == "auto":
        return f"unix:@danaus-admin-{os.getpid()}-{secrets.token_hex(4)}"
    if addr.isdigit():
        return f"tcp://127.0.0.1:{addr}"
    if addr.startswith(("unix:", "tcp://")):
        return addr
    raise ValueError(
        f"admin address {addr!r}: use 'auto', 'off', unix:@name, unix:/path, "
        "tcp://host:port or a port"
    )


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

    async def _start(self) -> None:
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

        def reply(obj: dict[str, Any]) -> None:
            if writer.is_closing():
                return
            writer.write(_seal(key_out, seq_out[0], obj))
            seq_out[0] += 1

        async def run(req: Any) -> None:
            rid = req.get("id") if isinstance(req, dict) else None
            try:
                if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                    raise AdminError("a request is {'id', 'op', 'args'}")
                fn = OPS.get(req["op"])
                if fn is None:
                    raise AdminError(f"unknown op {req['op']!r}; known: {', '.join(sorted(OPS))}")
                args = req.get("args") or {}
                if not isinstance(args, dict):
                    raise AdminError("a request's args are an object")
                reply({"id": rid, "ok": True, "value": await fn(**args)})
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


_server: AdminServer | None = None
_server_lock = threading.Lock()
_server_ready = threading.Event()


def serve_admin(addr: str = "auto", timeout: float = 10.0) -> AdminServer:
    """Start this controller's admin endpoint on ``addr`` (see the module's docstring)
    and return it; the one already running, if any. Blocks until it listens; do not call
    it from danaus's background loop (a proc mesh starts one there by itself)."""
    global _server
    with _server_lock:
        if _server is not None:
            return _server
        server = AdminServer(_normalize(addr), auth.job_key())
        run_task(background_runtime(), server._start).result(timeout)
        _server = server
        _server_ready.set()
        return server


def admin_server(timeout: float = 0.0) -> AdminServer | None:
    """This controller's running admin endpoint, waiting up to ``timeout`` for one that
    is starting; None if there is none."""
    _server_ready.wait(timeout)
    return _server


def maybe_start_admin() -> None:
    """Start the admin endpoint of ``config.admin`` without waiting, if this process is a
    controller and has none yet (called when a proc mesh is spawned)."""
    if context_state.in_proc or _server is not None or config.admin in ("", "off"):
        return
    threading.Thread(target=_start_quietly, name="danaus-admin-start", daemon=True).start()


_starting = threading.Lock()


def _start_quietly() -> None:
    if not _starting.acquire(blocking=False):
        return
    try:
        serve_admin(config.admin)
    except Exception as e:
        log.warning("admin endpoint %r did not start: %s", config.admin, e)


@atexit.register
def _close_at_exit() -> None:
    if _server is not None:
        _server.close()


# ------------------------------------------------------------------------ runtime files


def runtime_dir() -> Path:
    """Where controllers leave their admin files: ``config.runtime_dir``, else
    ``$XDG_RUNTIME_DIR/danaus``, else ``/tmp/danaus-<uid>`` (made private to the user)."""
    base = config.runtime_dir
    if base:
        path = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "danaus"
    else:
        path = Path(f"/tmp/danaus-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _write_runtime_file(addr: str, key: bytes) -> Path:
    path = runtime_dir() / f"admin-{os.getpid()}.json"
    body = {
        "addr": addr,
        "key": key.hex(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "argv": list(sys.argv),
        "started": time.time(),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_controllers() -> list[dict[str, Any]]:
    """The running controllers of this user on this host (their admin files), newest
    first; files of controllers that died without removing them are removed."""
    found = []
    for path in runtime_dir().glob("admin-*.json"):
        try:
            info = json.loads(path.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(pid):
            found.append(info)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted(found, key=lambda i: -float(i.get("started", 0)))


# -------------------------------------------------------------------------------- client


def _key_for(addr: str) -> bytes:
    for info in find_controllers():
        if info.get("addr") == addr:
            return bytes.fromhex(info["key"])
    if config.auth_key:
        return bytes.fromhex(config.auth_key)
    raise AdminError(
        f"no key for the admin endpoint {addr}: give the job's key (--key-file, or "
        "DANAUS_AUTH_KEY as hex)"
    )


class AdminClient:
    """A blocking connection to a controller's admin endpoint (for tools).

    ``AdminClient()`` attaches to the newest controller of this user on this host;
    ``AdminClient(addr, key)`` to a given one. ``call(op, **args)`` returns an op's value
    or raises :class:`AdminError` with the controller's message. Thread-safe.
    """

    def __init__(
        self, addr: str | None = None, key: bytes | None = None, timeout: float = 30.0
    ) -> None:
        if addr is None:
            found = find_controllers()
            if not found:
                raise AdminError(
                    f"no running danaus controller found (no admin file in {runtime_dir()})"
                )
            addr = str(found[0]["addr"])
        addr = _normalize(addr)
        self.addr = addr
        self.timeout = timeout
        key = key if key is not None else _key_for(addr)
        self._lock = threading.Lock()
        self._next_id = 0
        self._sock = self._connect(addr)
        try:
            self._keys = self._handshake(key)
        except BaseException:
            self._sock.close()
            raise
        self._seq = [0, 0]  # out, in

    def _connect(self, addr: str) -> socket.socket:
        if addr.startswith("unix:"):
            rest = addr[5:]
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = "\0" + rest[1:] if rest.startswith("@") else rest
        else:
            host, _, port = addr[6:].rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            target = (host.strip("[]"), int(port))
        sock.settimeout(self.timeout)
        try:
            sock.connect(target)
        except OSError as e:
            sock.close()
            raise AdminError(f"cannot reach the admin endpoint {addr}: {e}") from None
        return sock

    def _read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            try:
                chunk = self._sock.recv(min(left, 1 << 20))
            except TimeoutError:
                raise AdminTimeout(
                    f"the admin endpoint {self.addr} did not answer in {self.timeout:g} s"
                ) from None
            if not chunk:
                raise AdminError(f"the admin endpoint {self.addr} closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _handshake(self, key: bytes) -> tuple[bytes, bytes]:
        hello = self._read(len(HELLO) + _NONCE)
        if hello[: len(HELLO)] != HELLO:
            raise AdminError(f"{self.addr} is not a danaus admin endpoint")
        server_nonce = hello[len(HELLO) :]
        client_nonce = auth.new_nonce()
        self._sock.sendall(
            client_nonce + auth.proof(key, b"admin client", client_nonce, server_nonce)
        )
        try:
            mac = self._read(_MAC)
        except AdminTimeout:
            raise
        except AdminError:  # it closed the connection: it did not accept our proof
            raise AdminError(
                f"the admin endpoint {self.addr} refused this key (not the job's key)"
            ) from None
        if not auth.verify(key, b"admin server", server_nonce, client_nonce, mac):
            raise AdminError(f"the admin endpoint {self.addr} did not prove it holds the key")
        return _session_keys(key, client_nonce, server_nonce)

    def call(self, op: str, **args: Any) -> Any:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self._sock.sendall(
                _seal(self._keys[0], self._seq[0], {"id": rid, "op": op, "args": args})
            )
            self._seq[0] += 1
            try:
                reply = self._reply(rid)
            except AdminError:
                self.close()  # mid-frame or out of step: this connection is done
                raise
        if not reply.get("ok"):
            raise AdminError(str(reply.get("error")))
        return reply.get("value")

    def _reply(self, rid: int) -> Any:
        while True:  # replies come in order; one to an abandoned call is skipped
            size = int.from_bytes(self._read(4), "big")
            if size > MAX_REPLY:
                raise AdminError(f"a reply of {size} bytes is over {MAX_REPLY}")
            mac = self._read(_MAC)
            reply = _open(self._keys[1], self._seq[1], mac, self._read(size))
            self._seq[1] += 1
            if reply.get("id") == rid:
                return reply

    def close(self) -> None:
        """Close the connection (also waking a thread blocked in :meth:`call`)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
