"""What the admin endpoint and its tools share: the frames, the handshake's session keys,
admin addresses, and the files by which tools on a host find its controllers (see
``_admin`` for the design)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import TypedDict, cast

import msgspec

from ... import _auth as auth
from ...config import config

__all__ = [
    "HELLO",
    "MAX_REPLY",
    "MAX_REQUEST",
    "AdminError",
    "AdminTimeout",
    "ControllerInfo",
    "find_controllers",
    "runtime_dir",
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


def _seal(key: bytes, seq: int, obj: object) -> bytes:
    try:
        payload = msgspec.json.encode(obj, enc_hook=repr)
    except UnicodeEncodeError:  # text with lone surrogates (undecodable argv, file names)
        payload = json.dumps(obj, default=_plain).encode()  # ASCII, with \u escapes
    return len(payload).to_bytes(4, "big") + _mac(key, seq, payload) + payload


def _open(key: bytes, seq: int, mac: bytes, payload: bytes) -> object:
    """The JSON value of a frame (what it is, the reader checks)."""
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


# ------------------------------------------------------------------------ runtime files


class ControllerInfo(TypedDict):
    """A controller's admin file: where its admin endpoint is and who it is."""

    addr: str
    #: the job's key, as hex
    key: str
    pid: int
    host: str
    argv: list[str]
    #: when it started (``time.time()``)
    started: float


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
    find_controllers()  # the files of controllers that died go, so that none pile up
    path = runtime_dir() / f"admin-{os.getpid()}.json"
    body: ControllerInfo = {
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


#: how much later than its admin file's ``started`` a process may have started and still
#: be the controller that wrote it (the kernel counts a process's start in clock ticks
#: from a boot time given in whole seconds)
_START_SLACK = 2.0


def _alive(pid: int, started: float) -> bool:
    """Whether the controller ``pid`` that wrote its admin file at ``started`` still
    runs: not a zombie (a SIGKILLed controller whose parent has not reaped it), and not
    another process that got its pid since (it started after the file was written)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False  # /proc is there, the process is not
    except (OSError, IndexError, ValueError, StopIteration):
        pass
    else:
        if fields[0] in (b"Z", b"X"):  # dead, waiting for its parent to reap it
            return False
        began = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return began <= started + _START_SLACK
    try:  # no /proc: the pid answers or not
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_controllers() -> list[ControllerInfo]:
    """The running controllers of this user on this host (their admin files), newest
    first; files of controllers that died without removing them are removed (and files
    that are not admin files skipped)."""
    found = []
    for path in runtime_dir().glob("admin-*.json"):
        try:
            info = json.loads(path.read_text())
            pid = int(info["pid"])
            started = float(info.get("started", 0.0))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not (isinstance(info.get("addr"), str) and isinstance(info.get("key"), str)):
            continue
        if _alive(pid, started):
            found.append(cast(ControllerInfo, info))
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted(found, key=lambda i: -float(i.get("started", 0)))
