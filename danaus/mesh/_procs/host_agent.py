"""Multi-host: a host agent on each host starts procs there for a controller.

Run ``danaus host-agent --listen tcp://ADDR:PORT`` on every host (with the same
``DANAUS_AUTH_KEY`` or ``--key-file`` as the controller); the controller calls
``attach_to_hosts(["tcp://h1:26600", ...])`` and gets a ``HostMesh`` with dim ``hosts``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import stat
import sys
from collections.abc import Sequence
from concurrent.futures import Future as ThreadFuture
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ...actors.seam import (
    Actor,
    Port,
    Runtime,
    actor_process,
    all_runtimes,
    endpoint,
    ensure_actor,
    install_runtime,
    new_event_loop,
    parse_addr,
    peers,
)
from ...config import config
from ...errors import SupervisionError
from .._gateway import GATEWAY, Gateway
from .forkserver import fork_server, preload_asked
from .handles import ProcHandle, RemoteProcHandle
from .local import start_proc, stop_procs, wait_exited
from .logs import LineSink

if TYPE_CHECKING:
    from .._actor_mesh import ActorMesh

log = logging.getLogger("danaus.host_agent")

#: The wire name of the agent actor in its process.
AGENT = "host_agent"


class AgentInfo(TypedDict):
    """What a host agent says of itself: its host, pid and how many procs it runs."""

    host: str
    pid: int
    procs: int


class HostAgent(Actor):
    """Starts and stops procs on its host for the controllers that attach to it.

    Procs started for a controller are killed when that controller's connection is lost,
    so none outlives it; requests of a controller already lost (they waited in the
    mailbox behind others) are refused, since nobody would be left to stop their procs.
    """

    def __init__(self, host: str, proc_listen: str | None = None) -> None:
        self.host = host
        #: where the procs it starts listen: on its TCP host, or (an agent on a Unix
        #: socket, reached from this machine only) on fresh abstract Unix sockets
        self.proc_listen = proc_listen or f"tcp://{host}:0"
        self.procs: dict[str, ProcHandle] = {}  # by address
        self.owners: dict[str, set[str]] = {}  # controller address -> proc addresses

    def _owner_lost(self, owner: str) -> None:
        for addr in self.owners.pop(owner, set()):
            h = self.procs.pop(addr, None)
            if h is not None:
                log.warning("controller %s is gone: killing its proc %s", owner, addr)
                h.stop_now()

    @endpoint
    async def spawn_procs(
        self,
        owner: str,
        ranks: list[int],
        env: dict[str, str],
        log_port: Port[tuple[int, str, str]] | None = None,
    ) -> list[tuple[str, int]]:
        """Start one proc per rank; return ``(address, pid)`` of each once all are up.

        Their output lines go to ``log_port`` as ``(rank, "out" | "err", line)``.
        """
        from ...actors.seam import current_runtime

        rt = current_runtime()
        rt.watch_lost(self._owner_lost)  # (once: the runtime keeps one of each)
        if rt.why_lost(owner) is not None:
            # Its connection closed while this request waited behind others: procs
            # started now would belong to nobody and run for good.
            raise SupervisionError(
                f"controller {owner} is gone (its connection closed): not starting procs for it"
            )

        def sink_for(rank: int) -> LineSink | None:
            if log_port is None:
                return None
            port = log_port

            def sink(stream: str, line: str) -> None:
                port.send((rank, stream, line))

            return sink

        # Started and registered under their owner in one step of the loop: if the owner
        # is lost from here on, _owner_lost finds them.
        handles = [start_proc(rt, self.proc_listen, r, env, sink_for(r)) for r in ranks]
        for h in handles:
            self.procs[h.addr] = h
            self.owners.setdefault(owner, set()).add(h.addr)
        try:
            async with asyncio.timeout(config.proc_start_timeout):
                await asyncio.gather(*(asyncio.wrap_future(h.ready) for h in handles))
        except BaseException:
            for h in handles:
                h.stop_now()
                self.procs.pop(h.addr, None)
                self.owners.get(owner, set()).discard(h.addr)
            raise
        return [(h.addr, h.pid) for h in handles]

    @endpoint
    async def preload(self, modules: list[str]) -> list[str]:
        """Procs forked from now on start with ``modules`` imported (a model's, for procs
        that replace a trainer's lost ones): asked ahead, so that the fork server
        imports them before procs are needed. The
        modules its fork server has imported, once it has these (none: no fork server,
        its procs start with ``exec``)."""
        preload_asked(modules)
        server = fork_server()
        if server is None:
            return []
        status = await asyncio.to_thread(server.status)
        return list(status["preloaded"])

    @endpoint
    async def stop_procs(self, addrs: list[str]) -> None:
        """Stop these procs (a clean stop, then a kill after ``stop_timeout``) and reap them."""
        from ...actors.seam import current_runtime

        handles = [self.procs.pop(a) for a in addrs if a in self.procs]
        await stop_procs(current_runtime(), handles, config.stop_timeout)
        for owned in self.owners.values():
            owned.difference_update(addrs)
        peers.forget(addrs)

    @endpoint
    async def kill_procs(self, addrs: list[str]) -> None:
        """SIGKILL these procs now and reap them: the controller declared them lost (a
        frozen proc must not come back as a zombie member; it cannot be asked to stop)."""
        handles = [self.procs.pop(a) for a in addrs if a in self.procs]
        for h in handles:
            h.stop_now()  # SIGKILL works on a stopped process too
        await asyncio.gather(*(wait_exited(h, config.stop_timeout) for h in handles))
        for owned in self.owners.values():
            owned.difference_update(addrs)
        peers.forget(addrs)

    @endpoint
    def info(self) -> AgentInfo:
        return {"host": self.host, "pid": os.getpid(), "procs": len(self.procs)}

    @endpoint
    def outlive_parent(self) -> None:
        """Keep running when the process that started this agent ends (a saved job's
        workers serve later controllers): its parent-death signal is cleared. Its procs
        still end with it."""
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG: none

    @endpoint
    def configure(self, settings: dict[str, object]) -> dict[str, object]:
        """Take an attaching controller's :func:`danaus.configure` settings (Monarch's
        config push at attach): this agent's own process runs with them from now on
        (procs get them from the controller with each spawn). Returns every setting
        this agent has had configured."""
        from ...config import configure, get_runtime_config

        configure(**settings)
        return get_runtime_config()


def agent_ref(addr: str) -> ActorMesh[HostAgent]:
    """The host agent listening at ``addr``, as a mesh of one to call."""
    from ...geometry import Shape
    from .._actor_mesh import mesh_ref

    return mesh_ref(AGENT, HostAgent, Shape.from_sizes({}), {0: addr})


async def kill_remote_proc(h: RemoteProcHandle) -> None:
    """Fence a remote proc the controller declared lost: its host agent kills it."""
    if h.addr is None:
        return
    try:
        call = agent_ref(h.agent).kill_procs.call_one([h.addr])
        await asyncio.wait_for(call, config.stop_timeout + 10)
    except Exception as e:  # its agent is gone too: nothing left to fence it with
        log.warning("host agent %s could not kill lost proc %s: %s", h.agent, h.addr, e)
    if not h.exited.done():
        h.exited.set_result(-9)


async def stop_remote_procs(handles: Sequence[RemoteProcHandle]) -> None:
    """The controller's side of ``stop_procs``: ask each host agent to stop (and reap) its
    procs among ``handles``; an agent that cannot is logged, and its procs count as gone."""
    by_agent: dict[str, list[str]] = {}
    for h in handles:
        if h.addr is not None:
            by_agent.setdefault(h.agent, []).append(h.addr)
    calls = []
    for agent_addr, addrs in by_agent.items():
        calls.append(agent_ref(agent_addr).stop_procs.call_one(addrs))
    results = await asyncio.gather(*calls, return_exceptions=True)
    for agent_addr, r in zip(by_agent, results, strict=True):
        if isinstance(r, BaseException):
            log.warning("host agent %s could not stop its procs: %s", agent_addr, r)
    for h in handles:
        if not h.exited.done():
            h.exited.set_result(0)


def read_key_file(path: str) -> bytes:
    """A key file holds the job key as hex (``danaus new-key > key``)."""
    with open(path) as f:
        text = f.read().strip()
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(
            f"key file {path} must hold the key as hex (make one with `danaus new-key`)"
        ) from None


USER_KEY_FILE = "user.key"


def user_key() -> tuple[bytes, Path]:
    """This user's default job key, and its file: ``user.key`` in the runtime directory
    (``config.runtime_dir``, else ``$XDG_RUNTIME_DIR/danaus``, else ``/tmp/danaus-<uid>``),
    made on first use, readable by this user only.

    Host agents and controllers that are given no key use it, so that one user's
    programs on one machine find each other with no setup, and another user (who cannot
    read the file) cannot connect. Across machines, give them the same key
    (``DANAUS_AUTH_KEY`` or a key file): each machine makes its own default.

    Raises:
        PermissionError: the directory or the file is not this user's, or others may
            read or change it (someone else may know the key).
    """
    from .._admin.wire import runtime_dir

    folder = runtime_dir()
    _check_private(folder, 0o077, "directory")
    path = folder / USER_KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:  # first use: write it whole under a temporary name, then move it in place
        os.close(fd)
        tmp = folder / f".{USER_KEY_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.replace(tmp, path)
    _check_private(path, 0o077, "key file")
    key = read_key_file(str(path))
    if len(key) < 16:
        raise PermissionError(f"{path} holds a key of {len(key)} bytes; delete it to make one")
    return key, path


def _check_private(path: Path, forbidden: int, what: str) -> None:
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & forbidden or stat.S_ISLNK(st.st_mode):
        raise PermissionError(
            f"the {what} {path} must belong to this user (uid {os.getuid()}) and be "
            f"private to it (mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): others "
            "may know the default key in it. Fix it, or set DANAUS_AUTH_KEY"
        )


async def serve(listen: str, key: bytes, ready: ThreadFuture[str] | None = None) -> None:
    """Run a host agent on ``listen`` until SIGTERM/SIGINT."""
    listen = agent_address(listen)
    _, where = parse_addr(listen)
    loop = asyncio.get_running_loop()
    actor_process.set_job_key(key)
    rt = Runtime(loop, addr=listen, key=key)
    install_runtime(rt)
    if isinstance(where, tuple):
        agent = HostAgent(where[0])
    else:  # a Unix socket: this machine's controllers only, and so its procs
        agent = HostAgent(socket.gethostname(), "unix:@")
    ensure_actor(rt, AGENT, lambda: agent)
    # controllers that attach(...) to this agent reach their job through it
    ensure_actor(rt, GATEWAY, lambda: Gateway(where[0] if isinstance(where, tuple) else None))
    stop: asyncio.Future[None] = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    log.info("danaus host agent listening on %s (pid %d)", rt.addr, os.getpid())
    # one write, newline included: agents sharing a pipe (PYTHONUNBUFFERED makes print
    # write its text and its newline apart) must not interleave their lines
    sys.stdout.write(f"danaus host agent listening on {rt.addr}\n")
    sys.stdout.flush()
    if ready is not None:
        ready.set_result(rt.addr)
    try:
        await stop
    finally:
        for h in list(agent.procs.values()):
            h.kill()
        await rt.aclose()


def main_host_agent(listen: str, key_file: str | None) -> None:
    if key_file:
        key = read_key_file(key_file)
    elif config.auth_key:
        key = bytes.fromhex(config.auth_key)
    else:
        try:
            key, path = user_key()
        except OSError as e:
            raise SystemExit(
                f"danaus host-agent: no key given (DANAUS_AUTH_KEY, --key-file) and this "
                f"user's default key cannot be used: {e}"
            ) from None
        print(
            f"danaus host agent: using this user's default key ({path}): controllers of "
            "the same user on this machine need no setup; give every machine one key "
            "(DANAUS_AUTH_KEY or --key-file) to reach it from others",
            flush=True,
            file=sys.stderr,
        )
    logging.basicConfig(
        level=config.log_level,
        format="[host-agent %(name)s] %(levelname)s %(message)s",
    )
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(listen, key))
    finally:
        loop.close()


def use_key(key: bytes, agents: Sequence[str] = ()) -> None:
    """Authenticate with ``key`` to the host agents at ``agents`` (and to the procs they
    start for us). Before any runtime exists it becomes the job key; afterwards (local
    procs already run with the job key) it is the key for those peers only."""
    runtimes = all_runtimes()
    if all(rt.key == key for rt in runtimes):
        actor_process.set_job_key(key)
        return
    for addr in agents:
        peers.set_key(addr, key)


def use_agents_key(agents: Sequence[str], key_file: str | None) -> None:
    """The key to authenticate to these host agents with (:func:`use_key`): the one in
    ``key_file``, else ``DANAUS_AUTH_KEY`` (nothing to do), else this user's default."""
    if key_file is not None:
        use_key(read_key_file(key_file), agents)
    elif not config.auth_key:
        use_key(user_key()[0], agents)


def agent_address(addr: str) -> str:
    """A host agent's address as danaus writes it: ``tcp://ADDR:PORT``, or a Unix socket
    for agents on this machine (``unix:/path``; Monarch's ``ipc:///path`` is the same).

    Raises:
        ValueError: anything else (naming what is accepted).
    """
    if addr.startswith("ipc://"):
        addr = "unix:" + addr[len("ipc://") :]
    try:
        parse_addr(addr)
    except ValueError:
        raise ValueError(
            f"a host agent is reached at tcp://ADDR:PORT, or on this machine at "
            f"unix:/path or ipc:///path, not {addr!r}"
        ) from None
    return addr


def agent_addrs(addrs: Sequence[str]) -> list[str]:
    return [agent_address(a) for a in addrs]


def run_worker_loop_forever(
    *,
    address: str,
    ca: object = None,
    private_key: object = None,
    key_file: str | None = None,
) -> None:
    """Monarch's name for running a host agent here (``danaus host-agent``): serve
    ``address`` (``tcp://ADDR:PORT``; ``ipc:///path`` for this machine) until SIGTERM or SIGINT, starting procs for the
    controllers that attach (``attach_to_workers`` / ``attach_to_hosts``).

    Unlike Monarch, connections are always authenticated: the key comes from
    ``key_file`` or ``DANAUS_AUTH_KEY``, else this user's default key on this machine
    (:func:`user_key`), whatever ``ca`` says (``ca`` and ``private_key``, Monarch's TLS
    material, are not used: set ``DANAUS_TLS_*``).

    Raises:
        SystemExit: no key was given and the default key cannot be used.
        ValueError: ``address`` is not ``tcp://ADDR:PORT``, ``unix:/path`` or ``ipc:///path``.
    """
    del ca, private_key
    main_host_agent(address, key_file)
