"""The fork server's own process: it imports, then forks procs on request (see
``forkserver``, the spawner's side, for the design and the wire)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import Literal, NotRequired, TypedDict

import msgspec

log = logging.getLogger("danaus.procs")

#: heavy modules worth preloading whenever the spawning process has imported them
SAFE_PRELOAD = ("numpy", "torch", "scipy", "pandas")
#: modules every proc imports: always preloaded
_BASE = ("danaus", "danaus.actors._proc_main", "danaus.actors._runtime", "danaus.actors._actor")
_MAX_MSG = 1 << 20
_encode = msgspec.msgpack.Encoder().encode
_decode_map = msgspec.msgpack.Decoder(dict[str, object]).decode

# The wire (see ``forkserver``): msgpack maps tagged by ``op``. Requests, to the server:


class ForkRequest(TypedDict):
    """Fork a proc (its stdin, stdout, stderr and listening socket come as fds)."""

    op: Literal["fork"]
    id: int
    addr: str
    parent: str
    env: dict[str, str]
    cwd: str


class PreloadRequest(TypedDict):
    op: Literal["preload"]
    modules: list[str]


class StatusRequest(TypedDict):
    op: Literal["status"]
    id: int


Request = ForkRequest | PreloadRequest | StatusRequest

# Answers, from the server:


class Ready(TypedDict):
    op: Literal["ready"]
    pid: int
    preloaded: list[str]
    unsafe: str


class Forked(TypedDict):
    """The proc of request ``id`` is ``pid``; -1 and ``error`` where the fork failed."""

    op: Literal["forked"]
    id: int
    pid: int
    error: NotRequired[str]


class Exited(TypedDict):
    op: Literal["exit"]
    pid: int
    code: int


class Unsafe(TypedDict):
    """Forking from the server became unsafe (``reason``): procs start with exec."""

    op: Literal["unsafe"]
    reason: str


class PreloadFailed(TypedDict):
    op: Literal["preload_failed"]
    #: module -> why it did not import
    failed: dict[str, str]


class ServerStatus(TypedDict):
    """The server's own report: pid, preloaded modules, threads, CUDA, children."""

    op: Literal["status"]
    id: int
    pid: int
    preloaded: list[str]
    children: list[int]
    python_threads: int
    cuda_initialized: bool
    unsafe: str


Answer = Ready | Forked | Exited | Unsafe | PreloadFailed | ServerStatus


def decode_request(data: bytes) -> Request | None:
    """A request, checked; None for an op this server does not know (ignored).

    Raises:
        msgspec.DecodeError: ``data`` is not a well-formed request.
    """
    msg = _decode_map(data)
    match msg.get("op"):
        case "fork":
            return msgspec.convert(msg, ForkRequest)
        case "preload":
            return msgspec.convert(msg, PreloadRequest)
        case "status":
            return msgspec.convert(msg, StatusRequest)
    return None


def decode_answer(data: bytes) -> Answer | None:
    """An answer, checked; None for an op this spawner does not know (ignored).

    Raises:
        msgspec.DecodeError: ``data`` is not a well-formed answer.
    """
    msg = _decode_map(data)
    match msg.get("op"):
        case "ready":
            return msgspec.convert(msg, Ready)
        case "forked":
            return msgspec.convert(msg, Forked)
        case "exit":
            return msgspec.convert(msg, Exited)
        case "unsafe":
            return msgspec.convert(msg, Unsafe)
        case "preload_failed":
            return msgspec.convert(msg, PreloadFailed)
        case "status":
            return msgspec.convert(msg, ServerStatus)
    return None


class _Server:
    def __init__(self, ctl: socket.socket, parent_pid: int) -> None:
        self.ctl = ctl
        self.parent_pid = parent_pid
        self.children: set[int] = set()
        self.unsafe = ""
        self.preloaded: list[str] = []
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def send(self, msg: Answer) -> None:
        try:
            self.ctl.send(_encode(msg))
        except OSError:
            pass  # the spawner is gone: the loop notices the closed socket

    def preload(self, modules: list[str]) -> None:
        failed = {}
        for name in modules:
            if name in self.preloaded:
                continue
            try:
                importlib.import_module(name)
            except BaseException as e:  # a module that fails to import is not preloaded
                failed[name] = f"{type(e).__name__}: {e}"
                continue
            self.preloaded.append(name)
            why = _unsafe_state()
            if why and not self.unsafe:
                self.unsafe = f"importing {name} {why}"
                self.send({"op": "unsafe", "reason": self.unsafe})
        if failed:
            self.send({"op": "preload_failed", "failed": failed})

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.ctl, selectors.EVENT_READ, "ctl")
        self.sel.register(0, selectors.EVENT_READ, "lifeline")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "signal")
        self.reap()
        while True:
            for key, _ in self.sel.select():
                if key.data == "signal":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 512)
                    self.reap()
                elif key.data == "lifeline":
                    if not os.read(0, 512):
                        return
                else:
                    try:
                        data, fds, _, _ = socket.recv_fds(self.ctl, _MAX_MSG, 8)
                    except OSError:
                        return
                    if not data:
                        return
                    self.handle(decode_request(data), fds)

    def handle(self, msg: Request | None, fds: list[int]) -> None:
        if msg is None:
            pass
        elif msg["op"] == "fork":
            self.fork(msg, fds)
        elif msg["op"] == "preload":
            self.preload(list(msg["modules"]))
        elif msg["op"] == "status":
            self.send(
                {
                    "op": "status",
                    "id": msg["id"],
                    "pid": os.getpid(),
                    "preloaded": self.preloaded,
                    "children": sorted(self.children),
                    "python_threads": threading.active_count(),
                    "cuda_initialized": _cuda_initialized(),
                    "unsafe": self.unsafe,
                }
            )
        for fd in fds:
            os.close(fd)

    def fork(self, msg: ForkRequest, fds: list[int]) -> None:
        try:
            pid = os.fork()
        except OSError as e:
            self.send({"op": "forked", "id": msg["id"], "pid": -1, "error": str(e)})
            return
        if pid == 0:
            self._child(msg, fds)  # never returns
        self.children.add(pid)
        self.send({"op": "forked", "id": msg["id"], "pid": pid})

    def _child(self, msg: ForkRequest, fds: list[int]) -> None:
        try:
            self.sel.close()
            self.ctl.close()
            signal.set_wakeup_fd(-1)
            os.close(self.wake_r)
            os.close(self.wake_w)
            # As a fresh interpreter has them (Python ignores SIGPIPE: EPIPE is an error).
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            stdin, out, err = fds[:3]
            for fd, target in ((stdin, 0), (out, 1), (err, 2)):
                os.dup2(fd, target)
            listen_fd = None
            if len(fds) > 3:
                listen_fd = os.dup(fds[3])
                os.set_inheritable(listen_fd, False)
            for fd in fds:
                os.close(fd)
            _become(msg["env"], msg["cwd"])
            from ...actors.seam import run_proc

            run_proc(msg["addr"], msg["parent"], os.getppid(), listen_fd)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def kill_children(self) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _unsafe_state() -> str:
    """What would make forking from this process unsafe now ("" if nothing)."""
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        return f"started Python threads {names}"
    if _cuda_initialized():
        return "initialised CUDA"
    return ""


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _become(env: dict[str, str], cwd: str) -> None:
    """In a freshly forked child: take the proc's environment as ``exec`` would give it."""
    os.environ.clear()
    os.environ.update(env)
    _reread_config()
    os.chdir(cwd)
    sys.path[0] = cwd
    for path in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if path and path not in sys.path:
            sys.path.insert(1, path)
    importlib.invalidate_caches()  # modules written after the server started
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # from the OS: every child draws differently, as if started fresh
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))


def _reread_config() -> None:
    """Settings as a fresh interpreter with this environment would read them: the
    server read its own environment when it imported danaus."""
    from ...config import reread_environment

    reread_environment()


def serve_main() -> None:
    parser = argparse.ArgumentParser(description="danaus fork server (started by a spawner)")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--preload", default="")
    ns = parser.parse_args()
    from ..._os import die_with_parent  # (danaus is imported here, not at the top)

    die_with_parent(ns.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the controller's to handle
    ctl = socket.socket(fileno=ns.control_fd)
    os.set_inheritable(ctl.fileno(), False)
    server = _Server(ctl, ns.parent_pid)

    def on_sigterm(*_: object) -> None:
        server.kill_children()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    server.preload([*_BASE, *filter(None, ns.preload.split(","))])
    server.send(
        {"op": "ready", "pid": os.getpid(), "preloaded": server.preloaded, "unsafe": server.unsafe}
    )
    try:
        server.serve()
    finally:
        server.kill_children()
        os._exit(0)
