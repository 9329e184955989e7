"""``HostMesh``: hosts that start procs, this one (``this_host()``) or others through
their host agents (``attach_to_hosts``); ``spawn_procs`` makes a proc mesh on them. It
pickles to a reference: its shape, name, agents (an actor mesh reference) and, for this
host, the host's name, never the proc meshes spawned on it."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import Future as ThreadFuture
from typing import TYPE_CHECKING, cast

from ..actors.seam import (
    OK,
    Actor,
    Future,
    Port,
    Runtime,
    current_runtime,
    listen_address,
    peers,
    run_on,
    run_task,
)
from ..config import config, get_runtime_config, runtime_env
from ..errors import SupervisionError, a_type
from ..geometry import Point, Shape, Shaped
from ._actor_mesh import ActorMesh, mesh_ref
from ._live_meshes import live_meshes
from ._proc_group import ProcGroup
from ._proc_mesh import ProcMesh, group_of, new_proc_mesh
from ._procs.bootstrap_cmd import BootstrapCommand, cpu_set, resolve_commands
from ._procs.handles import Proc, RemoteProcHandle
from ._procs.host_agent import AGENT, HostAgent, agent_ref
from ._procs.local import start_proc
from ._procs.logs import LogOptions, printer
from ._supervision import resolved

if TYPE_CHECKING:
    from ._workspace import Workspace

__all__ = ["HostMesh", "attach_to_hosts", "attach_to_workers", "hosts_from_config", "this_host"]


def check_per_host(per_host: object, host_dims: Collection[str]) -> dict[str, int]:
    """``per_host`` as ``spawn_procs`` takes it (a mapping of new dim names to a positive
    number of procs per host; ``{"procs": 1}`` when None), checked against the host
    mesh's dims.

    Raises:
        TypeError: it is not such a mapping.
        ValueError: a size is not a positive int, or a dim is one of the hosts'.
    """
    if per_host is None:
        return {"procs": 1}
    if not isinstance(per_host, Mapping):
        raise TypeError(
            f"per_host takes a mapping of dim names to procs per host, like "
            f'{{"gpus": 4}}; got {a_type(per_host)}: {per_host!r}'
        )
    for dim, size in per_host.items():
        if not isinstance(dim, str) or not dim:
            raise TypeError(f"per_host's dim names are non-empty strs; got {dim!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"per_host[{dim!r}] must be a positive int, got {size!r}")
        if dim in host_dims:
            raise ValueError(f"dim {dim!r} is already a dim of the host mesh")
    return dict(per_host)


class HostMesh(Shaped):
    """A set of hosts that can start procs.

    ``this_host()`` is the controller's own host (a mesh with no dims);
    ``attach_to_hosts([...])`` gives a mesh with dim ``hosts`` of hosts that each run
    a host agent. A host mesh is a reference: passed to an actor, its ``spawn_procs``
    starts procs on the same hosts (``this_host()``: the same machine, as the actor's
    children); the proc meshes spawned on it stay with the original.
    """

    def __init__(
        self,
        shape: Shape,
        name: str = "local",
        agents: ActorMesh[HostAgent] | None = None,
        spawned: list[ProcGroup] | None = None,
        python: str | None = None,
        origin: str | None = None,
    ) -> None:
        self._shape = shape
        self.name = name
        self._agents = agents
        #: the Python that local procs run (``with_python_executable``); None: this one
        self._python = python
        #: for hosts without agents, unpickled: the name of the host they are (None:
        #: this one, wherever the mesh is used)
        self._origin = origin
        #: the procs of the meshes spawned on these hosts (shared by slices): shutdown()
        #: stops them
        self._spawned: list[ProcGroup] = spawned if spawned is not None else []

    def __repr__(self) -> str:
        return f"HostMesh({self.name}, {self._shape.sizes})"

    def __reduce__(self) -> tuple[object, ...]:
        # A reference: the proc meshes spawned here (their processes) stay with this
        # mesh; procs started through the unpickled one are its receiver's.
        origin = self._origin or (os.uname().nodename if self._agents is None else None)
        return (
            HostMesh,
            (self._shape, self.name, self._agents, None, self._python, origin),
        )

    @property
    def is_fake_in_process(self) -> bool:
        """Monarch's flag for a host mesh whose "procs" are threads of this process (its
        test fixture); danaus's procs are always real processes, so it is ``False``."""
        return False

    def _with_shape(self, shape: Shape) -> HostMesh:
        agents = self._agents
        if agents is not None:
            agents = agents.with_shape(shape)
        return HostMesh(shape, self.name, agents, self._spawned, self._python, self._origin)

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """These hosts, spawning procs that run ``python_executable`` (Monarch's name).

        It must have danaus importable; procs it starts spawn their own procs with it
        too. Such procs start as fresh interpreters (the fork server runs this Python).
        Host agents start procs with their own Python: start the agent with the one
        wanted instead.
        """
        path = shutil.which(python_executable) or python_executable
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ValueError(f"python_executable {python_executable!r} is not an executable file")
        if self._agents is not None:
            raise ValueError(
                "with_python_executable applies to this host's procs; host agents start "
                "procs with their own Python (start the agent with the one wanted)"
            )
        return HostMesh(self._shape, self.name, None, self._spawned, path, self._origin)

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every host is attached (Monarch's ``HostMesh.initialized``): at
        once for this machine; for host agents, once each has taken the controller's
        :func:`danaus.configure` settings (Monarch's config push), or with
        ``SupervisionError`` ("attach failed: config push failed during attach", as
        Monarch's) naming the first that did not within ``config.attach_timeout``."""
        rt = current_runtime()
        agents = self._agents
        if agents is None:
            return run_task(rt, _nothing)
        settings = get_runtime_config()

        async def push(i: int) -> None:
            async with asyncio.timeout(config.attach_timeout):
                await agents.slice(hosts=i).configure.call_one(settings)

        async def reach() -> None:
            ranks = agents.global_ranks()
            got = await asyncio.gather(
                *(push(i) for i in range(len(ranks))), return_exceptions=True
            )
            for rank, outcome in zip(ranks, got, strict=True):
                if isinstance(outcome, BaseException):
                    addr = (agents._addrs or {}).get(rank, "?")  # noqa: SLF001 - its own layer's
                    why = (
                        f"no answer within attach_timeout ({config.attach_timeout:g} s)"
                        if isinstance(outcome, TimeoutError)
                        else str(outcome)
                    )
                    raise SupervisionError(
                        f"host mesh {self.name!r}: attach failed: config push failed during "
                        f"attach: the host agent at {addr} cannot be reached: {why}"
                    ) from outcome

        return run_task(rt, reach)

    def spawned_groups(self) -> list[ProcGroup]:
        """The proc groups spawned on these hosts that still run."""
        return [g for g in self._spawned if not g.stopped]

    def sync_workspace(
        self, workspace: Workspace, conda: bool = False, auto_reload: bool = False
    ) -> Future[None]:
        """Push ``workspace``'s local folders to every host (``$WORKSPACE_DIR/<dst>``
        there), sending only files whose size or time differ, and with ``auto_reload``
        reload the changed modules in the procs running on the hosts (Monarch's
        ``sync_workspace``: edit, sync, run again). Await it, or ``.get()`` it.

        Raises (through the Future):
            RuntimeError: a host has no ``WORKSPACE_DIR``.
            FileNotFoundError: a source folder does not exist.
            NotImplementedError: ``conda=True`` (danaus syncs no environment).
        """
        from ._workspace import sync_workspace

        async def run() -> None:
            await sync_workspace(self, workspace, conda, auto_reload)

        return run_task(current_runtime(), run)

    def stop(self) -> Future[None]:
        """Monarch's ``HostMesh.stop``: stop the proc meshes spawned on these hosts and
        let go of them; the hosts (their host agents) keep running for the next
        controller. Here that is :meth:`shutdown`."""
        return self.shutdown()

    async def __aenter__(self) -> HostMesh:
        """``async with attach_to_hosts(...) as hosts:``: the hosts, once reached; on the
        way out, the proc meshes spawned on them stop (the hosts keep running)."""
        await self.initialized
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh spawned on these hosts (Monarch's ``HostMesh.shutdown``).

        The hosts themselves stay usable: a host agent keeps serving other controllers,
        and ``spawn_procs`` may be called again.
        """
        groups = self.spawned_groups()
        self._spawned[:] = []

        async def stop_all() -> None:
            await asyncio.gather(*(g.stop_all("its host mesh was shut down") for g in groups))

        return run_task(current_runtime(), stop_all)

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        bootstrap: Callable[[], None] | Callable[[], Awaitable[None]] | None = None,
        name: str | None = None,
        proc_bind: Sequence[Mapping[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> ProcMesh:
        """Start procs on every host: ``per_host={"gpus": 4}`` gives a ``{..., "gpus": 4}`` mesh.

        Returns at once; the procs come up in parallel, and messages sent to them
        meanwhile wait (in order) until they do.

        Args:
            per_host: named dims of procs on each host; ``{"procs": 1}`` when omitted.
            bootstrap: as in Monarch, a function (sync or ``async def``) run in each proc
                before any actor is spawned there, with ``current_rank()`` the proc's
                rank: set per-proc environment there, e.g. ``CUDA_VISIBLE_DEVICES`` from
                ``current_rank()["gpus"]``. If it raises, ``await procs.initialized``
                raises ``ActorError``. (It runs on the proc's loop: keep it short.)
            name: the mesh name, used in actor ids and log prefixes; by default
                ``"procs"``, or ``"procs2"``, ``"procs3"``... while meshes of the
                earlier names still run, so that log lines say which mesh they come from.
            proc_bind: as in Monarch, one dict per proc of a host (``{"cpus": "0-3"}``
                or ``"physcpubind"``): each proc is pinned to those CPUs. Local procs only.
            bootstrap_command: as in Monarch, a :class:`BootstrapCommand` (see
                ``default_bootstrap_cmd()``), or a function of each proc's ``Point``
                giving one: its ``program`` runs the proc (a fresh interpreter) and its
                ``env`` is added to the proc's. Local procs only.
            env: extra environment variables for the procs.
        """
        if name is not None and (
            not isinstance(name, str) or not name or "." in name or "[" in name
        ):
            raise ValueError(f"proc mesh name {name!r} must be a non-empty str without '.' or '['")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a function run in each proc, got {bootstrap!r}")
        if (proc_bind is not None or bootstrap_command is not None) and self._agents is not None:
            raise ValueError(
                "proc_bind and bootstrap_command apply to this host's procs; a host agent "
                "starts procs with its own Python (start the agent as wanted instead)"
            )
        reserved = name is None
        if name is None:
            name = live_meshes.default_name()  # (reserved until it is named below)
        try:
            mesh = self._spawn_procs(per_host, name, env, proc_bind, bootstrap_command)
            group = group_of(mesh)
            live_meshes.named(name, group)
        finally:
            if reserved:
                live_meshes.release(name)  # (named by now, or never spawned)
        # Stopped meshes need no shutdown: forget them, so a long-lived host mesh stays small.
        self._spawned[:] = [g for g in self._spawned if not g.stopped]
        self._spawned.append(group)
        if bootstrap is not None:
            group.set_bootstrap(mesh.spawn_mesh("bootstrap", _Bootstrap, bootstrap), bootstrap)
        return mesh

    def _spawn_procs(
        self,
        per_host: Mapping[str, int] | None,
        name: str,
        env: Mapping[str, str] | None,
        proc_bind: Sequence[Mapping[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        here = os.uname().nodename
        if self._agents is None and self._origin is not None and self._origin != here:
            raise RuntimeError(
                f"{self!r} is the host {self._origin!r}, which has no host agent: its procs "
                f"can be started only there, not on {here!r} (run a host agent there and "
                "use attach_to_hosts(...) instead)"
            )
        per_host = check_per_host(per_host, self._shape.sizes)
        host_sizes = self._shape.sizes
        shape = Shape.from_sizes({**host_sizes, **per_host})
        rt = current_runtime()
        env = {**runtime_env(), **(env or {})}  # configure()d settings, as in Monarch
        options = LogOptions()
        if self._agents is None:
            per = len(shape) // len(self._shape)
            if proc_bind is not None and len(proc_bind) != per:
                raise ValueError(
                    f"proc_bind has {len(proc_bind)} entries; it needs one per proc of a "
                    f"host ({per})"
                )
            cpus = [cpu_set(b) for b in proc_bind] if proc_bind is not None else None
            points = [Point(r, shape.sizes) for r in range(len(shape))]
            commands = resolve_commands(bootstrap_command, points)
            # As config.transport says: "unix:@" (the default) is a fresh unguessable name
            # per proc (one another process could predict, a counter, could be bound by it
            # first, failing the spawn), "tcp://host:0" a free port.
            listen = listen_address(proc=True)

            def start(r: int) -> Proc:
                cmd = commands[r]
                proc_env = {**env, **cmd.env} if cmd is not None else env
                python = cmd.program if cmd is not None else self._python
                h = start_proc(rt, listen, r, proc_env, printer(name, r, options), python)
                if cpus is not None:
                    os.sched_setaffinity(h.pid, cpus[r % per])
                return h

            mesh = new_proc_mesh(
                shape, [start(r) for r in range(len(shape))], name, resolved(), options
            )
            group_of(mesh).respawner = start
            return mesh
        return self._spawn_remote(rt, shape, name, env, options)

    def _spawn_remote(
        self, rt: Runtime, shape: Shape, name: str, env: dict[str, str], options: LogOptions
    ) -> ProcMesh:
        agents = self._agents
        assert agents is not None
        per = len(shape) // len(self._shape)
        started: ThreadFuture[None] = ThreadFuture()
        handles: list[Proc] = []
        by_host: list[tuple[str, list[RemoteProcHandle]]] = []
        for h, (_, agent_addr) in enumerate(agents.rank_addrs()):
            group = [RemoteProcHandle(h * per + i, agent_addr) for i in range(per)]
            handles.extend(group)
            by_host.append((agent_addr, group))
        left = [len(by_host)]

        def on_host() -> None:
            left[0] -= 1
            if left[0] == 0:
                started.set_result(None)

        sinks = [printer(name, r, options) for r in range(len(shape))]

        def on_line(rank: int, status: int, value: object) -> bool:
            # a line of a proc's output: (its rank, "out" | "err", the line)
            if status == OK and isinstance(value, tuple | list) and len(value) == 3:
                r, stream, line = value
                sinks[r](stream, line)
            return False  # open for as long as the procs live

        log_port: Port[tuple[int, str, str]] = Port(rt.addr, rt.open_port(on_line))
        for agent_addr, group in by_host:
            _start_on(rt, agent_addr, group, env, log_port, on_host)
        agent_of = {h.rank: h.agent for h in handles if isinstance(h, RemoteProcHandle)}

        def again(r: int) -> Proc:
            h = RemoteProcHandle(r, agent_of[r])
            _start_on(rt, agent_of[r], [h], env, log_port, lambda: None)
            return h

        mesh = new_proc_mesh(shape, handles, name, started, options)
        group_of(mesh).respawner = again
        return mesh


def _start_on(
    rt: Runtime,
    agent_addr: str,
    group: list[RemoteProcHandle],
    env: dict[str, str],
    log_port: Port[tuple[int, str, str]],
    then: Callable[[], None],
) -> None:
    """Ask the host agent at ``agent_addr`` to start the procs ``group`` stands for (their
    output to ``log_port``); each learns its address and pid, or why it did not start;
    then ``then()``."""

    def on_started(fut: Future[object]) -> None:
        # (what HostAgent.spawn_procs returns: each proc's address and pid)
        exc = fut.exception()
        if exc is None:
            key = peers.key_of(agent_addr)
            got = cast("list[tuple[str, int]]", fut.result())
            for handle, (addr, pid) in zip(group, got, strict=True):
                if key is not None:  # its agent's key, not ours: so is the proc's
                    peers.set_key(addr, key)
                rt.new_peer_at(addr)  # (its port may have been a lost proc's)
                handle.started(addr, pid)
        else:
            for handle in group:
                handle.failed(
                    SupervisionError(f"host agent {agent_addr} could not start procs: {exc}")
                )
        then()

    fut = agent_ref(agent_addr).spawn_procs.call_one(
        rt.addr, [g.rank for g in group], env, log_port
    )
    fut.add_done_callback(on_started)


async def _nothing() -> None:
    pass


def attach_to_hosts(
    addrs: Sequence[str], *, key_file: str | None = None, name: str = "hosts"
) -> HostMesh:
    """A mesh of the hosts whose host agents listen at ``addrs`` (``tcp://host:port``).

    Every connection authenticates with the agents' key: set ``DANAUS_AUTH_KEY`` (hex)
    in the controller's environment, or pass ``key_file`` (a file holding the key as hex,
    as ``danaus new-key`` writes it). With neither, it is this user's default key on this
    machine (:func:`~danaus.mesh._procs.host_agent.user_key`), which agents given no key use
    too: one user's agents and controllers on one machine need no setup. A key used
    after local procs already run (with this job's own key) is used for the agents and
    their procs only.

    Raises:
        ValueError: no address, or one that is not ``tcp://``.
        PermissionError: no key given, and the default key's file or folder is not
            private to this user.
    """
    from ._procs.host_agent import agent_addrs, use_agents_key

    addrs = agent_addrs(addrs)
    if not addrs:
        raise ValueError("attach_to_hosts needs at least one host agent address")
    use_agents_key(addrs, key_file)
    shape = Shape.from_sizes({"hosts": len(addrs)})
    rt = current_runtime()
    for addr in addrs:  # an agent there now, whatever was lost at that address before
        run_on(rt, rt.new_peer_at, addr)
    agents = mesh_ref(AGENT, HostAgent, shape, dict(enumerate(addrs)))
    return HostMesh(shape, name, agents)


def attach_to_workers(
    *,
    workers: Sequence[str],
    ca: object = None,
    private_key: object = None,
    name: str | None = None,
    key_file: str | None = None,
) -> HostMesh:
    """Monarch's name for :func:`attach_to_hosts`: a mesh (dim ``hosts``) of the host
    agents at ``workers`` (``tcp://host:port``, each started with
    ``run_worker_loop_forever`` or ``danaus host-agent``).

    Unlike Monarch, connections are always authenticated with the job key
    (``DANAUS_AUTH_KEY`` or ``key_file``, else this user's default key on this machine,
    which workers given no key use too), whatever ``ca`` says; ``ca`` and
    ``private_key`` (Monarch's TLS material) are not used: set ``DANAUS_TLS_*`` for TLS.

    Raises:
        ValueError: no worker, or an address that is not ``tcp://``.
    """
    del ca, private_key
    workers = [w if isinstance(w, str) else str(w.get()) for w in workers]
    return attach_to_hosts(workers, key_file=key_file, name=name or "hosts")


def hosts_from_config(name: str) -> HostMesh:
    """The hosts of the job, as Monarch's ``hosts_from_config``.

    The environment variable ``name`` may list host agents, comma-separated
    (``tcp://10.0.0.2:26600,tcp://10.0.0.3:26600``): then they are attached (with the
    job key from ``DANAUS_AUTH_KEY``). Otherwise, like Monarch's stand-in, two hosts on
    this machine: a mesh ``{"hosts": 2}`` whose procs all run here.
    """
    import os

    listed = [a.strip() for a in os.environ.get(name, "").split(",") if a.strip()]
    if listed:
        return attach_to_hosts(listed, name=name)
    return HostMesh(Shape.from_sizes({"hosts": 2}), name)


#: Set in the environment of procs started with another Python
#: (``with_python_executable``): procs they spawn run it too, the wrapper re-run each time.
PROC_PYTHON_ENV = "DANAUS_PROC_PYTHON"


def this_host() -> HostMesh:
    """The host the controller runs on, as a mesh with no dims. In a proc started with
    ``with_python_executable``, procs spawned on it run that Python too (Monarch's)."""
    return HostMesh(Shape.from_sizes({}), python=os.environ.get(PROC_PYTHON_ENV) or None)


class _Bootstrap(Actor):
    """Runs a ``spawn_procs(bootstrap=...)`` function in its proc, before other actors."""

    def __init__(self, fn: Callable[[], object]) -> None:
        result = fn()
        if inspect.isawaitable(result):
            # __init__ runs on the proc's loop, which must not start another actor
            # before this one is done: run the coroutine to its end on a thread.
            import concurrent.futures

            async def run() -> object:
                return await result

            import contextvars

            ctx = contextvars.copy_context()  # current_rank() works in it too
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(ctx.run, asyncio.run, run()).result()
