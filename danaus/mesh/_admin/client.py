"""A tool's connection to a controller's admin endpoint (blocking, thread-safe)."""

from __future__ import annotations

import contextlib
import socket
import threading

from ... import _auth as auth
from ...config import config
from .wire import (
    _MAC,
    _NONCE,
    HELLO,
    MAX_REPLY,
    AdminError,
    AdminTimeout,
    _normalize,
    _open,
    _seal,
    _session_keys,
    find_controllers,
    runtime_dir,
)

__all__ = ["AdminClient"]


def _key_for(addr: str) -> bytes:
    for info in find_controllers():
        if info["addr"] == addr:
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
            target: str | tuple[str, int] = "\0" + rest[1:] if rest.startswith("@") else rest
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

    def call(self, op: str, **args: object) -> object:
        """Run the admin operation ``op`` with ``args``; its JSON value.

        Raises:
            AdminError: the controller refused or failed it (its message), or the
                connection failed (then it is closed).
            AdminTimeout: no answer in ``timeout``.
        """
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

    def _reply(self, rid: int) -> dict[str, object]:
        while True:  # replies come in order; one to an abandoned call is skipped
            size = int.from_bytes(self._read(4), "big")
            if size > MAX_REPLY:
                raise AdminError(f"a reply of {size} bytes is over {MAX_REPLY}")
            mac = self._read(_MAC)
            reply = _open(self._keys[1], self._seq[1], mac, self._read(size))
            self._seq[1] += 1
            if not isinstance(reply, dict):
                raise AdminError(f"a reply is {type(reply).__name__}, not an object")
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
