"""``serve`` and ``SPMDJob`` (Monarch's ``monarch.job.spmd``): reserve hosts for a
torchrun command once, then ``job.run_spmd()`` runs the script on them as torchrun would,
as often as wanted (edit, sync, run again).

Monarch schedules through TorchX; danaus through its own jobs: ``scheduler="local_cwd"``
(or ``"local"``) reserves "hosts" of this machine (a :class:`~danaus.job.ProcessJob`), ``"slurm"`` a
:class:`~danaus.job.SlurmJob` whose keyword arguments come from ``scheduler_cfg``. A TorchX ``AppDef``
is read for its one role's command and ``num_replicas`` (TorchX need not be installed
for a command list).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..job import JobState, JobTrait, ProcessJob, SlurmJob
from ._run import run_spmd

__all__ = ["SPMDJob", "serve"]

_TORCHRUN = ("torchrun", "torch.distributed.run")
_PYTHON = ("python", "python3")


class _Role(Protocol):
    entrypoint: str
    args: list[str]
    num_replicas: int


class _AppDef(Protocol):
    roles: list[_Role]


def _torchrun_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun", add_help=False)
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument("--no-python", "--no_python", action="store_true")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def parse_torchrun(command: Sequence[str]) -> tuple[list[str], int, int]:
    """``(script args, procs per node, nodes)`` of a torchrun command: ``torchrun ...``,
    ``python -m torch.distributed.run ...``, or a plain ``python train.py ...`` (one
    proc on one node).

    Raises:
        ValueError: a command of another kind, or a torchrun option danaus cannot read.
    """
    words = list(command)
    if not words:
        raise ValueError("the command is empty")
    head = words[0].rsplit("/", 1)[-1]
    if head in _TORCHRUN:
        rest = words[1:]
    elif head in _PYTHON:
        if len(words) >= 3 and words[1] == "-m" and words[2] in _TORCHRUN:
            rest = words[3:]
        else:
            return words[1:], 1, 1
    else:
        raise ValueError(
            f"an SPMD command starts with torchrun, python -m torch.distributed.run or "
            f"python, not {words[0]!r}"
        )
    ns, unknown = _torchrun_parser().parse_known_args(rest)
    if unknown:
        raise ValueError(f"torchrun options danaus does not read: {' '.join(unknown)}")
    if ns.no_python:
        raise ValueError("torchrun --no-python is not supported (a Python script is run)")
    try:
        nproc = int(ns.nproc_per_node)
        nnodes = int(str(ns.nnodes).split(":")[-1])
    except ValueError:
        raise ValueError(
            f"--nproc-per-node {ns.nproc_per_node!r} / --nnodes {ns.nnodes!r}: danaus needs "
            "numbers (not 'gpu' or 'auto')"
        ) from None
    script = ["-m", ns.training_script] if ns.module else [ns.training_script]
    return [*script, *ns.training_script_args], nproc, nnodes


class SPMDJob(JobTrait):
    """Hosts reserved for a torchrun command (from :func:`serve`); ``run_spmd()`` runs
    it on them. Its state's one mesh is ``workers``."""

    def __init__(self, job: JobTrait, script: list[str], nproc_per_node: int) -> None:
        super().__init__()
        self._job = job
        self._script = script
        self._nproc = nproc_per_node

    @property
    def script(self) -> list[str]:
        """The script and its arguments (``["train.py", ...]`` or ``["-m", "pkg", ...]``)."""
        return list(self._script)

    def mesh_sizes(self) -> dict[str, dict[str, int]] | None:
        inner = self._job.mesh_sizes()
        return None if inner is None or "workers" not in inner else {"workers": inner["workers"]}

    def _create(self) -> None:
        self._job.apply()

    def _state(self) -> JobState:
        return JobState({"workers": self._job.state().workers})

    def _keep(self) -> None:
        self._job._keep()  # noqa: SLF001 - the job it wraps

    def _kill(self) -> None:
        self._job.kill()

    def can_run(self, spec: JobTrait) -> bool:
        return (
            isinstance(spec, SPMDJob)
            and spec._script == self._script  # noqa: SLF001 - its own class
            and spec._nproc == self._nproc  # noqa: SLF001 - its own class
            and self._job.can_run(spec._job)  # noqa: SLF001 - its own class
        )

    def run_spmd(self) -> None:
        """Run the script on every proc (``nproc_per_node`` a host), with torchrun's
        environment; returns when every rank has ended.

        Raises:
            RankFailure: a rank raised or exited non-zero (the others were stopped).
        """
        workers = self.state().workers
        procs = workers.spawn_procs(per_host={"gpus": self._nproc}, name="spmd")
        try:
            run_spmd(procs, self._script).get()
        finally:
            procs.stop().get(timeout=60)


def serve(
    appdef: Sequence[str] | _AppDef,
    scheduler: str = "local_cwd",
    scheduler_cfg: Mapping[str, object] | None = None,
) -> SPMDJob:
    """Reserve hosts for a torchrun command and return the applied :class:`SPMDJob`
    (Monarch's ``serve``); ``job.run_spmd()`` runs it. A command list runs on one node
    (``--nnodes`` above 1 is refused, as in Monarch); an ``AppDef`` on ``num_replicas``
    nodes. The hosts live until ``job.kill()`` or the end of the program, or, saved
    (``job.state(cached_path=...)``), until ``kill()``.

    Args:
        appdef: ``["torchrun", "--nproc-per-node=4", "--standalone", "train.py"]``, or
            a TorchX ``AppDef`` with one role.
        scheduler: ``"local_cwd"`` / ``"local"`` (this machine) or ``"slurm"``.
        scheduler_cfg: ``SlurmJob``'s keyword arguments (``partition``, ...) for slurm.

    Raises:
        ValueError: an unknown scheduler, a multi-node command list, an AppDef of several
            roles, or a command that is not torchrun's.
    """
    if isinstance(appdef, str):
        raise ValueError(f"serve() takes a command as a list of words, not the text {appdef!r}")
    if isinstance(appdef, Sequence):
        command = list(appdef)
        script, nproc, nnodes = parse_torchrun(command)
        if nnodes > 1:
            raise ValueError(
                f"serve() with a command list runs on one node; got --nnodes={nnodes} "
                "(give an AppDef with num_replicas for several)"
            )
    else:
        roles = list(appdef.roles)
        if len(roles) != 1:
            raise ValueError(f"an SPMD AppDef has one role, not {len(roles)}")
        role = roles[0]
        entry = role.entrypoint.rsplit("/", 1)[-1]
        words = [role.entrypoint, *role.args] if entry in (*_TORCHRUN, *_PYTHON) else role.args
        script, nproc, _ = parse_torchrun(words)
        nnodes = int(role.num_replicas)
    cfg = dict(scheduler_cfg or {})
    job: JobTrait
    if scheduler in ("local_cwd", "local"):
        if cfg:
            raise ValueError(f"scheduler {scheduler!r} takes no scheduler_cfg, got {cfg}")
        job = ProcessJob({"workers": nnodes})
    elif scheduler == "slurm":
        job = SlurmJob(meshes={"workers": nnodes}, **cfg)  # type: ignore[arg-type]
    else:
        raise ValueError(
            f"scheduler {scheduler!r}: danaus serves local_cwd (or local) and slurm "
            "(Monarch's other schedulers come from TorchX and Meta's clusters)"
        )
    spmd = SPMDJob(job, script, nproc)
    spmd.apply()
    return spmd
