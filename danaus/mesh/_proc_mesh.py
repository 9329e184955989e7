"""``HostMesh`` and ``ProcMesh``: where actors live."""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import os
import shutil
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future as ThreadFuture
from types import EllipsisType
from typing import Any, TypeVar

from ..actors._api import (
    OK,
    Actor,
    Future,
    Point,
    Port,
    ProcControl,
    current_runtime,
    endpoints_of,
    peer_keys,
    run_on,
    run_task,
)
from ..actors._api import context_state as _context_module
from ..config import config
from ..errors import ClosedError, SupervisionError
from ._admin import maybe_start_admin
from ._bootstrap_cmd import BootstrapCommand, cpu_set, resolve_commands
from ._forkserver import note_actor_module
from ._host_agent import AGENT, HostAgent
from ._logs import LogOptions, printer
from ._proc_group import ProcGroup, live_groups
from ._procs import Proc, RefProcHandle, RemoteProcHandle, SelfProcHandle, start_proc
from ._shape import Shape
from ._shaped import Shaped
from ._supervision import resolved
from ._value_mesh import ValueMesh

__all__ = [
    "HostMesh",
    "ProcMesh",
    "attach_to_hosts",
    "attach_to_workers",
    "hosts_from_config",
    "shutdown_context",
    "this_host",
    "this_proc",
]

A = TypeVar("A", bound=Actor)


class HostMesh(Shaped):
    """A set of hosts that can start procs.

    ``this_host()`` is the controller's own host (a mesh with no dims);
    ``attach_to_hosts([...])`` gives a mesh with dim ``hosts`` of hosts that each run
    a host agent.
    """

    def __init__(
        self,
        shape: Shape,
        name: str = "local",
        agents: ActorMesh[Any] | None = None,
        spawned: list[ProcGroup] | None = None,
        python: str | None = None,
    ) -> None:
        self._shape = shape
        self.name = name
        self._agents = agents
        #: the Python that local procs run (``with_python_executable``); None: this one
        self._python = python
        #: the procs of the meshes spawned on these hosts (shared by slices): shutdown()
        #: stops them
        self._spawned: list[ProcGroup] = spawned if spawned is not None else []

    def __repr__(self) -> str:
        return f"HostMesh({self.name}, {self._shape.sizes})"

    def _with_shape(self, shape: Shape) -> HostMesh:
        agents = self._agents
        if agents is not None:
            agents = agents._with_shape(shape)
        return HostMesh(shape, self.name, agents, self._spawned, self._python)

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
        return HostMesh(self._shape, self.name, None, self._spawned, path)

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh spawned on these hosts (Monarch's ``HostMesh.shutdown``).

        The hosts themselves stay usable: a host agent keeps serving other controllers,
        and ``spawn_procs`` may be called again.
        """
        groups = [g for g in self._spawned if not g.stopped]
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
        if name is None:
            name = _default_name()
        elif not isinstance(name, str) or not name or "." in name or "[" in name:
            raise ValueError(f"proc mesh name {name!r} must be a non-empty str without '.' or '['")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a function run in each proc, got {bootstrap!r}")
        if (proc_bind is not None or bootstrap_command is not None) and self._agents is not None:
            raise ValueError(
                "proc_bind and bootstrap_command apply to this host's procs; a host agent "
                "starts procs with its own Python (start the agent as wanted instead)"
            )
        mesh = self._spawn_procs(per_host, name, env, proc_bind, bootstrap_command)
        group = group_of(mesh)
        _live_names[name] = group
        # Stopped meshes need no shutdown: forget them, so a long-lived host mesh stays small.
        self._spawned[:] = [g for g in self._spawned if not g.stopped]
        self._spawned.append(group)
        if bootstrap is not None:
            group.bootstrap = mesh.spawn("bootstrap", _Bootstrap, bootstrap)
        return mesh

    def _spawn_procs(
        self,
        per_host: Mapping[str, int] | None,
        name: str,
        env: Mapping[str, str] | None,
        proc_bind: Sequence[Mapping[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        per_host = dict(per_host or {"procs": 1})
        for dim, size in per_host.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"per_host[{dim!r}] must be a positive int, got {size!r}")
            if dim in self._shape.sizes:
                raise ValueError(f"dim {dim!r} is already a dim of the host mesh")
        host_sizes = self._shape.sizes
        shape = Shape.from_sizes({**host_sizes, **per_host})
        rt = current_runtime()
        env = dict(env or {})
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
            # "unix:@": a fresh unguessable name per proc; a name another process could
            # predict (a counter) could be bound by it first, failing the spawn.
            handles: list[Proc] = []
            for r, cmd in enumerate(commands):
                proc_env = {**env, **cmd.env} if cmd is not None else env
                python = cmd.program if cmd is not None else self._python
                h = start_proc(rt, "unix:@", r, proc_env, printer(name, r, options), python)
                if cpus is not None:
                    os.sched_setaffinity(h.pid, cpus[r % per])
                handles.append(h)
            return ProcMesh._new(shape, handles, name, resolved(), options)
        return self._spawn_remote(rt, shape, name, env, options)

    def _spawn_remote(
        self, rt: Any, shape: Shape, name: str, env: dict[str, str], options: LogOptions
    ) -> ProcMesh:
        agents = self._agents
        assert agents is not None
        per = len(shape) // len(self._shape)
        started: ThreadFuture[None] = ThreadFuture()
        handles: list[Proc] = []
        by_host: list[tuple[str, list[RemoteProcHandle]]] = []
        for h, (_, agent_addr) in enumerate(agents._targets_list):
            group = [RemoteProcHandle(h * per + i, agent_addr) for i in range(per)]
            handles.extend(group)
            by_host.append((agent_addr, group))
        left = [len(by_host)]

        def on_host(i: int, fut: Any) -> None:
            _, group = by_host[i]
            exc = fut.exception()
            if exc is None:
                key = peer_keys.get(by_host[i][0])
                for handle, (addr, pid) in zip(group, fut.result(), strict=True):
                    if key is not None:  # its agent's key, not ours: so is the proc's
                        peer_keys[addr] = key
                    handle.started(addr, pid)
            else:
                for handle in group:
                    handle.failed(
                        SupervisionError(f"host agent {by_host[i][0]} could not start procs: {exc}")
                    )
            left[0] -= 1
            if left[0] == 0:
                started.set_result(None)

        sinks = [printer(name, r, options) for r in range(len(shape))]

        def on_line(rank: int, status: int, value: Any) -> bool:
            if status == OK:
                r, stream, line = value
                sinks[r](stream, line)
            return False  # open for as long as the procs live

        log_port: Port[tuple[int, str, str]] = Port(rt.addr, rt.open_port(on_line))
        for i, (agent_addr, group) in enumerate(by_host):
            one = mesh_ref(AGENT, HostAgent, Shape.from_sizes({}), {0: agent_addr})
            fut = one.spawn_procs.call_one(rt.addr, [g.rank for g in group], env, log_port)
            fut.add_done_callback(functools.partial(on_host, i))
        return ProcMesh._new(shape, handles, name, started, options)


def attach_to_hosts(
    addrs: Sequence[str], *, key_file: str | None = None, name: str = "hosts"
) -> HostMesh:
    """A mesh of the hosts whose host agents listen at ``addrs`` (``tcp://host:port``).

    Every connection authenticates with the agents' key: set ``DANAUS_AUTH_KEY`` (hex)
    in the controller's environment, or pass ``key_file`` (a file holding the key as hex,
    as ``danaus new-key`` writes it). Given as ``key_file`` after local procs already
    run (with this job's own key), it is used for the agents and their procs only.
    """
    from ._host_agent import agent_addrs, read_key_file, use_key

    addrs = agent_addrs(addrs)
    if not addrs:
        raise ValueError("attach_to_hosts needs at least one host agent address")
    if key_file is not None:
        use_key(read_key_file(key_file), addrs)
    elif not config.auth_key:
        raise ValueError(
            "attach_to_hosts needs the agents' key: set DANAUS_AUTH_KEY (hex) or pass key_file="
        )
    shape = Shape.from_sizes({"hosts": len(addrs)})
    agents = mesh_ref(AGENT, HostAgent, shape, dict(enumerate(addrs)))
    return HostMesh(shape, name, agents)


def attach_to_workers(
    *,
    workers: Sequence[str],
    ca: Any = None,
    private_key: Any = None,
    name: str | None = None,
    key_file: str | None = None,
) -> HostMesh:
    """Monarch's name for :func:`attach_to_hosts`: a mesh (dim ``hosts``) of the host
    agents at ``workers`` (``tcp://host:port``, each started with
    ``run_worker_loop_forever`` or ``danaus host-agent``).

    Unlike Monarch, connections are always authenticated with the job key
    (``DANAUS_AUTH_KEY`` or ``key_file``), whatever ``ca`` says; ``ca`` and
    ``private_key`` (Monarch's TLS material) are not used: set ``DANAUS_TLS_*`` for TLS.

    Raises:
        ValueError: no worker, an address that is not ``tcp://``, or no key.
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


def this_host() -> HostMesh:
    """The host the controller runs on, as a mesh with no dims."""
    return HostMesh(Shape.from_sizes({}))


def this_proc() -> ProcMesh:
    """This process as a mesh of one proc (no dims): ``this_proc().spawn("x", Cls)`` runs
    the actor here, on the current event loop (or danaus's background loop in sync code).

    Its endpoints then share this loop with the caller: a sync endpoint that blocks,
    blocks the caller too. Stopping the mesh stops its actors, not this process.
    """
    rt = current_runtime()
    return ProcMesh._new(Shape.from_sizes({}), [SelfProcHandle(rt.addr)], "this_proc", resolved())


class ProcMesh(Shaped):
    """Processes laid out as a named mesh; ``spawn`` puts one actor in each.

    Use ``async with`` (or ``with`` in sync code), or call :meth:`stop`, so the procs end
    with your program; they are killed when the controller exits in any case.
    """

    def __init__(self, shape: Shape, group: ProcGroup) -> None:
        self._shape = shape
        self._group = group  # its procs, failures and actor meshes, shared by its slices
        self.name = group.name

    @classmethod
    def _new(
        cls,
        shape: Shape,
        handles: Sequence[Proc],
        name: str,
        started: ThreadFuture[None],
        log_options: LogOptions | None = None,
    ) -> ProcMesh:
        """A whole new proc mesh of these procs, owned by whoever spawns it now."""
        mesh = cls(shape, ProcGroup(name, shape, handles, started, log_options or LogOptions()))
        owner = mesh._group.owner
        if owner is not None:
            owner.owned.append(mesh)  # stopped when its owner stops
        maybe_start_admin()
        return mesh

    def __repr__(self) -> str:
        state = "stopped" if self._group.stopped else "running"
        return f"ProcMesh({self.name}, {self._shape.sizes}, {state})"

    def activate(self) -> Any:
        """``with procs.activate():`` torch calls make distributed tensors on these procs.

        Imports the tensor engine (and torch) on first use.
        """
        if activate_hook is None:
            try:
                import danaus.tensor_engine  # noqa: F401 - sets activate_hook
            except ImportError as e:
                raise RuntimeError(
                    f"procs.activate() needs the tensor engine, which needs torch: {e}"
                ) from e
        assert activate_hook is not None
        return activate_hook(self)

    def logging_option(
        self,
        stream_to_client: bool | None = None,
        aggregate_window_sec: float | EllipsisType | None = ...,
        level: int | None = None,
    ) -> Future[None]:
        """Whether the procs' output lines reach the controller, whether identical lines
        are aggregated, and the procs' log level. Settings not given stay as they are.

        As in Monarch it may be awaited (``await procs.logging_option(...)``); it takes
        effect at once either way, for lines and calls that follow.

        Args:
            stream_to_client: print the procs' stdout/stderr here, prefixed
                ``[mesh rank]`` (the default), or drop them.
            aggregate_window_sec: collect lines for this many seconds and print those
                that several ranks printed identically once, as ``[mesh 0-7] line``;
                ``None`` prints every line as it comes (the default).
            level: the procs' root ``logging`` level (e.g. ``logging.INFO``).

        Raises:
            ValueError: ``aggregate_window_sec`` is negative or not a number.
        """
        if aggregate_window_sec is not ...:
            if aggregate_window_sec is not None and (
                isinstance(aggregate_window_sec, bool)
                or not isinstance(aggregate_window_sec, (int, float))
                or aggregate_window_sec < 0
            ):
                raise ValueError(
                    f"aggregate_window_sec must be seconds (>= 0) or None, got "
                    f"{aggregate_window_sec!r}"
                )
            if aggregate_window_sec is None and self._group.log.aggregator is not None:
                self._group.log.aggregator.flush()
            self._group.log.aggregate_window_sec = (
                None if aggregate_window_sec is None else float(aggregate_window_sec)
            )
        if stream_to_client is not None:
            self._group.log.stream_to_client = stream_to_client
        if level is not None:
            self._group.log.level = level
            control = ActorMesh(
                "__proc__",
                "__proc__",
                ProcControl,
                self._shape,
                None,
                self._group.started,
                None,
                self._group,
            )
            control.set_log_level.broadcast(level)
        done: Future[None] = Future(loop=current_runtime().loop)
        done.set_result(None)
        return done

    def stats(self) -> Future[ValueMesh[dict[str, Any]]]:
        """Each proc's record (pid, host, CPU %, RSS, connections, bytes in and out),
        with the records of the actors in it (``"actors"``; see ``ActorMesh.stats``)."""
        from ._inspect import proc_mesh_stats

        return run_task(current_runtime(), lambda: proc_mesh_stats(self._group, self._shape))

    def stacks(self) -> Future[ValueMesh[list[dict[str, Any]]]]:
        """The Python stack of every thread and running async endpoint of each proc."""
        from ._inspect import proc_mesh_stacks

        return run_task(current_runtime(), lambda: proc_mesh_stacks(self._group, self._shape))

    def to_table(self) -> str:
        """A text table of the procs: rank, coordinates, process id and address."""
        rows = [("rank", *self._shape.labels, "pid", "address")]
        for rank, (point, h) in enumerate(zip(self._shape.points(), self._handles(), strict=True)):
            rows.append((str(rank), *(str(c) for c in point.values()), str(h.pid), h.addr or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
        ]
        return "\n".join(line.rstrip() for line in lines)

    @property
    def failed_ranks(self) -> dict[str, str]:
        """Failed procs of this mesh: ``{str(point): reason}``."""
        state = self._group.state
        return {
            str(state.point(r)): why
            for r, why in state.failed.items()
            if r in set(self._shape.global_ranks())
        }

    def _with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(shape, self._group)

    def _handles(self) -> list[Proc]:
        handles = self._group.handles
        return [handles[g] for g in self._shape.global_ranks()]

    @property
    def initialized(self) -> Future[None]:
        """Resolves once every proc is up (raises ``SupervisionError`` if one failed)."""
        rt = current_runtime()
        fut: Future[None] = Future(loop=rt.loop)
        handles = self._handles()

        bootstrap = self._group.bootstrap

        def check() -> None:
            if fut.done():
                return
            for h in handles:
                if not h.ready.done():
                    h.ready.add_done_callback(lambda _: run_on(rt, check))
                    return
                exc = h.ready.exception()
                if exc is not None:
                    fut.set_exception(exc)
                    return
            if bootstrap is not None:  # and the bootstrap function ran in every proc
                boot = bootstrap._init
                if not boot.done():
                    boot.add_done_callback(lambda _: run_on(rt, check))
                    return
                if boot.exception() is not None:
                    fut.set_exception(boot.exception())  # type: ignore[arg-type]
                    return
            fut.set_result(None)

        self._group.started.add_done_callback(lambda _: run_on(rt, check))
        return fut

    @property
    def pids(self) -> list[int]:
        """Process ids of the procs, in rank order (each on its own host; -1 if not started)."""
        return [h.pid for h in self._handles()]

    # actors
    def spawn(self, name: str, cls: type[A], *args: Any, **kwargs: Any) -> ActorMesh[A]:
        """Create one ``cls(*args, **kwargs)`` actor in every proc of this mesh.

        Returns at once. Messages sent to the mesh are handled after ``__init__`` ran.
        ``await mesh.initialized`` (or ``mesh.initialized.get()``) raises ``ActorError``
        naming the rank if an ``__init__`` raised.
        """
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise TypeError(f"spawn needs a subclass of danaus.Actor, got {cls!r}")
        note_actor_module(cls.__module__)  # procs forked later have it imported already
        if not name or "." in name or "[" in name:
            raise ValueError(f"actor mesh name {name!r} must be non-empty, without '.' or '['")
        from ._actor_mesh import ActorMesh

        shadowed = sorted(
            n
            for n in endpoints_of(cls)
            if hasattr(ActorMesh, n) and not isinstance(ActorMesh.__dict__.get(n), _unless_endpoint)
        )
        if shadowed:  # mesh.stop would be the mesh's, never the endpoint: refuse, as Monarch
            raise ValueError(
                f"{cls.__name__} has endpoint(s) named like ActorMesh attributes, which "
                f"mesh.<name> could never reach: {', '.join(shadowed)}; rename them"
            )
        if self._group.stopped:
            raise ClosedError(f"{self!r} was stopped")
        return ActorMesh._spawn(self._group, self._shape, name, cls, args, kwargs)

    # lifecycle
    def stop(self, reason: str = "stopped by its owner") -> Future[None]:
        """Stop every actor and proc of this mesh (the whole mesh, also from a slice).

        Procs get ``config.stop_timeout`` seconds to exit cleanly, then are killed. Later
        calls raise ``SupervisionError`` saying ``reason``.
        """
        group = self._group
        return run_task(current_runtime(), lambda: group.stop_all(reason))

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop().get()


#: set by danaus.tensor_engine when imported (the mesh layer does not import it)
activate_hook: Any = None


def shutdown_context() -> Future[None]:
    """Stop every proc mesh this process spawned and has not stopped (Monarch's
    ``shutdown_context``); idempotent. Also done at interpreter exit, where procs still
    running are killed."""
    groups = live_groups()

    async def stop_all() -> None:
        await asyncio.gather(*(g.stop_all("the controller shut down") for g in groups))

    return run_task(current_runtime(), stop_all)


def live_proc_meshes() -> list[ProcMesh]:
    """Every proc mesh this process spawned and has not stopped, whole."""
    return [ProcMesh(g.shape, g) for g in live_groups()]


def group_of(procs: ProcMesh) -> ProcGroup:
    """The state ``procs`` shares with the rest of its mesh (for the layers above)."""
    return procs._group


def _proc_of_actor(actor: Any) -> ProcMesh:
    """``context().actor_instance.proc``: the actor's own proc as a mesh of one."""
    rt = current_runtime()
    if rt.addr != actor.proc_addr:
        raise RuntimeError(
            f"actor_instance.proc of {actor.actor_id} is only reachable from its own proc "
            f"({actor.proc_addr}), not from {rt.addr}"
        )
    return this_proc()


_context_module.proc_of_actor = _proc_of_actor


def _proc_mesh_of_actor(actor: Any) -> ProcMesh:
    """``context().actor_instance.proc_mesh``: a reference to the actor's proc mesh."""
    addrs = actor.proc_addrs
    if not addrs:
        raise RuntimeError(
            f"actor_instance.proc_mesh: {actor.actor_id} was not spawned on a proc mesh "
            "(it runs in the controller)"
        )
    sizes = actor.rank.sizes
    handles = [RefProcHandle(a, r) for r, a in enumerate(addrs)]
    return ProcMesh._new(Shape.from_sizes(sizes), handles, actor.proc_mesh_name, resolved())


_context_module.proc_mesh_of_actor = _proc_mesh_of_actor

#: the procs of proc meshes spawned here, by mesh name (for default names)
_live_names: weakref.WeakValueDictionary[str, ProcGroup] = weakref.WeakValueDictionary()
_names_lock = threading.Lock()


def _default_name() -> str:
    """``"procs"``, or ``"procsN"`` while a mesh of that name still runs here."""
    with _names_lock:
        for n in itertools.count(1):
            name = "procs" if n == 1 else f"procs{n}"
            group = _live_names.get(name)
            if group is None or group.stopped:
                return name
    raise AssertionError("unreachable")


class _Bootstrap(Actor):
    """Runs a ``spawn_procs(bootstrap=...)`` function in its proc, before other actors."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        result = fn()
        if inspect.isawaitable(result):
            # __init__ runs on the proc's loop, which must not start another actor
            # before this one is done: run the coroutine to its end on a thread.
            import concurrent.futures

            async def run() -> Any:
                return await result

            import contextvars

            ctx = contextvars.copy_context()  # current_rank() works in it too
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(ctx.run, asyncio.run, run()).result()


from ._actor_mesh import ActorMesh, _unless_endpoint, mesh_ref  # noqa: E402
