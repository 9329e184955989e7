"""The job verbs of the ``danaus`` command, with Monarch's meanings and options:

``danaus apply [module.attr]``  start the job (its spec recorded in ``.monarch/``) and
                                keep it for later programs
``danaus exec [target] cmd...`` run a command on the job's hosts
``danaus shell [target]``       an interactive shell on one of the job's hosts
``danaus info``                 the active context, its spec, and its saved job
``danaus kill [context]``       end the saved job
``danaus context create|use|rm|ls NAME``
                                named jobs, one of them active
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DanausError, a_type
from ..mesh import Shape
from ..mesh.seam import check_per_host
from . import _contexts
from ._contexts import (
    current_context,
    current_spec,
    load_current_job,
    saved_job_file,
    set_current_job,
)
from ._exec import exec_command
from ._job import DEFAULT_JOB_PATH, JobState, JobStatus, JobTrait, job_load
from ._local import LocalJob
from ._shell import shell

if TYPE_CHECKING:
    from ..mesh import HostMesh

__all__ = [
    "DEFAULT_JOB_PATH",
    "MONARCH_DIR",
    "VERBS",
    "apply_job",
    "context_create",
    "context_ls",
    "context_rm",
    "context_use",
    "exec_on_job",
    "load_current_job",
    "main",
    "shell_on_job",
]

#: where jobs and contexts are kept, in the working folder (Monarch's)
MONARCH_DIR = str(Path(DEFAULT_JOB_PATH).parent)

#: the verbs this module serves, for the ``danaus`` command's dispatch
VERBS = ("apply", "exec", "shell", "info", "kill", "context")


def _connect(job: JobTrait) -> JobState:
    """The job's host meshes: the saved job when it can run this spec, else applied now
    (and saved for the next program)."""
    return job.state(cached_path=DEFAULT_JOB_PATH)


def _parse_point(text: str) -> dict[str, int]:
    point: dict[str, int] = {}
    for pair in text.split(","):
        dim, eq, value = pair.partition("=")
        if not eq or not dim.strip():
            raise ValueError(f"a point is DIM=N[,DIM=N...], not {text!r}")
        try:
            point[dim.strip()] = int(value)
        except ValueError:
            raise ValueError(f"{dim.strip()}={value!r} in {text!r} is not a number") from None
    return point


def _parse_env(items: Sequence[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"an environment variable is KEY=VALUE, not {item!r}")
        env[key] = value
    return env


def _hosts_of(job: JobTrait, verb: str | None = None) -> dict[str, HostMesh]:
    """The job's host meshes, applying the job if it does not run; ``verb`` (a command
    that is not ``apply``) says so on stderr when it did."""
    hosts = _connect(job)._hosts  # noqa: SLF001 - this package's own
    if not hosts:
        raise ValueError("the job has no host meshes")
    if verb is not None and job.status is JobStatus.RUNNING and not isinstance(job, LocalJob):
        context = current_context() or "default"
        print(
            f"danaus {verb}: the job of context {context!r} was not running: started it "
            f"({_describe(hosts)}); it keeps running until 'danaus kill'",
            file=sys.stderr,
        )
    return hosts


def _describe(hosts: Mapping[str, HostMesh]) -> str:
    return ", ".join(f"{name} ({_hosts_count(len(mesh))})" for name, mesh in hosts.items())


def _hosts_count(n: int) -> str:
    return f"{n} host{'' if n == 1 else 's'}"


def _check_target(
    job: JobTrait,
    mesh_names: Sequence[str] | None,
    point: Mapping[str, int] | None,
    per_host: Mapping[str, int] | None,
) -> None:
    """Check a command's target against the job's spec before anything starts: the
    meshes named (None: the first), the point (on the first of them) and ``per_host``.

    Raises:
        ValueError: a mesh the job does not have, or a bad point or ``per_host``.
    """
    meshes = job.mesh_sizes()
    if meshes is None:  # the spec does not say: the mesh checks these once it runs
        return
    if not meshes:
        raise ValueError("the job has no host meshes")
    for name in mesh_names or ():
        if name not in meshes:
            raise ValueError(f"no mesh {name!r} in the job; its meshes: {', '.join(meshes)}")
    names = list(mesh_names) if mesh_names else [next(iter(meshes))]
    if point is not None:
        try:
            Shape.from_sizes(meshes[names[0]]).slice(**point)
        except (IndexError, ValueError) as e:
            raise ValueError(f"--point {_show_point(point)}: {e}") from None
    if per_host is not None:
        for name in names:
            check_per_host(per_host, meshes[name])


def _show_point(point: Mapping[str, int]) -> str:
    return ",".join(f"{d}={i}" for d, i in point.items())


def _end(job: JobTrait) -> None:
    """End the active context's job and forget it (the context stays, and active)."""
    job.kill()
    saved_job_file().unlink(missing_ok=True)


def apply_job(module_path: str | None = None) -> None:
    """``danaus apply``: record ``module_path`` as the active context's spec (when
    given), start its job unless the saved one serves it, keep it for later programs, and
    return once a command runs on every host of its first mesh (Monarch's
    ``monarch.tools.commands.apply_job``).

    Raises:
        RuntimeError: the hosts did not run the readiness command.
    """
    if module_path is not None:
        set_current_job(module_path)
    started = time.monotonic()
    hosts = _hosts_of(load_current_job())
    rc = exec_command(next(iter(hosts.values())), ["true"]).get(timeout=300)
    if rc != 0:
        raise RuntimeError(f"the job's hosts did not run a command (exit {rc})")
    print(f"Job is ready ({time.monotonic() - started:.1f} s): {_describe(hosts)}")


def exec_on_job(
    cmd: Sequence[str],
    run_all: bool = False,
    mesh_name: str | None = None,
    point_str: str | None = None,
    env: Sequence[str] | None = None,
    workdir: str | None = None,
    kill: bool = False,
    script: str | None = None,
    per_host: Mapping[str, int] | None = None,
) -> int:
    """``danaus exec``: run ``cmd`` on the active context's job and return the highest
    exit status (Monarch's ``exec_on_job``). By default on rank 0 of the first mesh, its
    output printed here; ``point_str`` (``"hosts=1"``) picks another host of it;
    ``mesh_name`` or ``run_all`` run on every host of one or every mesh, the output going
    to ``/tmp/danaus_exec_<id>/<mesh>/<rank>/`` on each host. ``script`` is a bash
    script's file (``-``: standard input); ``env`` holds ``KEY=VALUE`` texts; ``kill``
    ends the job afterwards."""
    command = list(cmd)
    if script is not None:
        text = sys.stdin.read() if script == "-" else Path(script).read_text()
        command = ["bash", "-c", text]
    if not command:
        raise ValueError("no command given (a command, -m MODULE or --script)")
    if run_all and mesh_name is not None:
        raise ValueError("run_all and mesh_name exclude each other")
    point = _parse_point(point_str) if point_str is not None else None
    variables = _parse_env(env)
    job = load_current_job()
    meshes = job.mesh_sizes()
    if run_all and meshes is not None:
        _check_target(job, list(meshes), None, per_host)
    else:
        _check_target(job, None if mesh_name is None else [mesh_name], point, per_host)
    hosts = _hosts_of(job, "exec")
    rank: int | None = None
    output_dir: str | None = None
    if run_all or mesh_name is not None:
        if mesh_name is not None and mesh_name not in hosts:
            raise ValueError(f"no mesh {mesh_name!r} in the job; its meshes: {', '.join(hosts)}")
        targets = list(hosts) if run_all else [str(mesh_name)]
        point = None
        # many runs: their output goes to files on each host, a folder per rank
        output_dir = f"/tmp/danaus_exec_{uuid.uuid4().hex[:8]}"
        print(f"Output -> {output_dir}/<mesh>/<rank>/stdout.txt, stderr.txt on each host")
    else:
        targets = [next(iter(hosts))]
        if point is None:
            rank = 0  # --one, the default
    worst = 0
    for name in targets:
        rc = exec_command(
            hosts[name],
            command,
            env=variables,
            workdir=workdir,
            output_dir=None if output_dir is None else f"{output_dir}/{name}/$SUBDIR",
            rank=rank,
            point=point,
            per_host=per_host,
        ).get()
        worst = max(worst, rc)
    if kill:
        _end(job)
    return worst


def shell_on_job(
    mesh_name: str | None = None,
    point_str: str | None = None,
    env: Sequence[str] | None = None,
    workdir: str | None = None,
    kill: bool = False,
) -> int:
    """``danaus shell``: an interactive shell on one host of the active context's job
    (rank 0 of the first mesh, or ``point_str`` of ``mesh_name``); its exit status
    (Monarch's ``shell_on_job``)."""
    point = _parse_point(point_str) if point_str is not None else None
    variables = _parse_env(env)
    job = load_current_job()
    _check_target(job, None if mesh_name is None else [mesh_name], point, None)
    hosts = _hosts_of(job, "shell")
    name = mesh_name if mesh_name is not None else next(iter(hosts))
    if name not in hosts:
        raise ValueError(f"no mesh {name!r} in the job; its meshes: {', '.join(hosts)}")
    mesh = hosts[name]
    one = mesh.slice(**point) if point is not None else mesh.flatten("rank").slice(rank=0)
    status = shell(one, env=variables, workdir=workdir)
    if kill:
        _end(job)
    return status


def _apply(ns: argparse.Namespace) -> int:
    apply_job(ns.module_path)
    return 0


def _exec(ns: argparse.Namespace) -> int:
    cmd = list(ns.command)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if ns.module:
        cmd = ["-m", ns.module, *cmd]
    per_host = _parse_point(ns.per_host) if ns.per_host else None
    return exec_on_job(
        cmd, ns.run_all, ns.mesh, ns.point, ns.env, ns.workdir, ns.kill, ns.script, per_host
    )


def _shell(ns: argparse.Namespace) -> int:
    return shell_on_job(ns.mesh, ns.point, ns.env, ns.workdir, ns.kill)


def _info(ns: argparse.Namespace) -> int:
    del ns
    active = current_context()
    print(f"context: {active or '(none)'}")
    try:
        spec = load_current_job()
    except FileNotFoundError:
        print("spec: (none: run 'danaus apply <module.attr>')")
        return 1
    print(f"spec: {current_spec()} ({a_type(spec)})")
    try:
        saved = job_load(DEFAULT_JOB_PATH)
    except FileNotFoundError:
        print("job: not applied")
        return 0
    local = isinstance(saved, LocalJob)  # always there; nothing to reuse
    running = saved.active and (local or saved.can_run(spec))
    print(f"job: {'running' if running else 'ended'} (apply id {saved.apply_id})")
    if running:
        for name, mesh in _connect(spec)._hosts.items():  # noqa: SLF001 - this package's own
            print(f"  {name}: {_hosts_count(len(mesh))}")
    return 0


def _kill(ns: argparse.Namespace) -> int:
    name = ns.name or current_context()
    path = saved_job_file(ns.name)
    if not path.exists():
        print(f"No job to kill{f' in context {name!r}' if name else ''}")
        return 0
    job_load(str(path)).kill()
    path.unlink(missing_ok=True)
    print(f"Killed the job{f' of context {name!r}' if name else ''}")
    return 0


def context_create(name: str) -> None:
    """``danaus context create NAME`` (Monarch's ``context_create``)."""
    _contexts.context_create(name)
    print(f"Created context '{name}'")


def context_use(name: str) -> None:
    """``danaus context use NAME``: the active context from now on."""
    _contexts.context_use(name)
    print(f"Switched to context '{name}'")


def context_rm(name: str) -> None:
    """``danaus context rm NAME``: end its job and remove it."""
    _contexts.context_rm(name)
    print(f"Removed context '{name}'")


def context_ls() -> None:
    """``danaus context ls``: every context, ``*`` marking the active one."""
    contexts = _contexts.context_ls()
    if not contexts:
        print("No contexts.")
    for name, active in contexts:
        print(f"{'* ' if active else '  '}{name}")


def _context(ns: argparse.Namespace) -> int:
    if ns.context_cmd == "ls":
        context_ls()
    else:
        {"create": context_create, "use": context_use, "rm": context_rm}[ns.context_cmd](ns.name)
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The job verbs, added to the ``danaus`` command's subcommands."""
    p = sub.add_parser("apply", help="start a job (module.attr) and keep it for later programs")
    p.add_argument(
        "module_path",
        nargs="?",
        default=None,
        help="dotted path of a job object (myjob.job); default: the active context's spec",
    )
    p.set_defaults(verb=_apply)

    p = sub.add_parser("exec", help="run a command on the job's hosts")
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--all", action="store_true", dest="run_all", help="every mesh, every rank (to files)"
    )
    target.add_argument("--mesh", metavar="NAME", help="every rank of mesh NAME (to files)")
    target.add_argument("--one", action="store_true", help="rank 0 of the first mesh (default)")
    target.add_argument(
        "--point", metavar="DIM=N,...", help="the host at a point of the first mesh"
    )
    p.add_argument(
        "--per-host", metavar="DIM=N", help="N runs per host, each with MONARCH_RANK_DIM"
    )
    p.add_argument("-e", "--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    p.add_argument("--workdir", help="folder to run in on the hosts")
    p.add_argument("--kill", action="store_true", help="end the job afterwards")
    p.add_argument("--script", metavar="FILE", help="a bash script to run ('-': standard input)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a Python module")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    p.set_defaults(verb=_exec)

    p = sub.add_parser("shell", help="an interactive shell on one of the job's hosts")
    p.add_argument("--mesh", metavar="NAME", help="a host of mesh NAME (default: the first)")
    p.add_argument("--point", metavar="DIM=N,...", help="the host at a point (default: rank 0)")
    p.add_argument("-e", "--env", action="append", default=[], help="KEY=VALUE (repeatable)")
    p.add_argument("--workdir", help="folder to start in on the host")
    p.add_argument("--kill", action="store_true", help="end the job when the shell exits")
    p.set_defaults(verb=_shell)

    p = sub.add_parser("info", help="the active context, its spec and its job")
    p.set_defaults(verb=_info)

    p = sub.add_parser("kill", help="end the saved job (of the active context, or NAME's)")
    p.add_argument("name", nargs="?", default=None, help="a context's name")
    p.set_defaults(verb=_kill)

    p = sub.add_parser("context", help="named jobs: create, use, rm, ls")
    contexts = p.add_subparsers(dest="context_cmd", required=True)
    for verb, text in (
        ("create", "a new context"),
        ("use", "make it the active one"),
        ("rm", "remove it, ending its job"),
    ):
        contexts.add_parser(verb, help=text).add_argument("name")
    contexts.add_parser("ls", help="list them, * marks the active one")
    p.set_defaults(verb=_context)


def main(ns: argparse.Namespace) -> int:
    """Run the verb ``ns`` was parsed for; errors a user made end with their text."""
    try:
        code: int = ns.verb(ns)
    except (
        FileNotFoundError,
        ValueError,
        TypeError,
        AttributeError,
        ImportError,
        IndexError,
    ) as e:
        print(f"danaus {ns.cmd}: {e}", file=sys.stderr)
        return 2
    except (DanausError, RuntimeError) as e:  # a host or proc lost; hosts not ready
        print(f"danaus {ns.cmd}: {e}", file=sys.stderr)
        return 1
    return code
