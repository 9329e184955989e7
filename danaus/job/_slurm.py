"""``SlurmJob``: host meshes on a SLURM allocation, with Monarch's ``monarch.job`` shape.

::

    job = SlurmJob(meshes={"trainers": 2}, partition="gpu", time_limit="1:00:00")
    hosts = job.state().trainers             # sbatch, wait for the agents, attach
    procs = hosts.spawn_procs(per_host={"gpus": 8})
    ...
    job.kill()                               # scancel (also done at controller exit)

``apply()`` submits a batch job whose script starts one danaus host agent per node with
``srun`` (``python -m danaus.job._agent``); each agent binds its node's address and
writes it to the job directory, which must be on a file system the nodes share with the
controller (default: ``./.danaus/jobs/<name>-<id>``). The controller attaches with the
job key, which it writes there for the agents (mode 0600).
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._job import JobState, JobStatus, JobTrait
from ._job_dir import Agent, create_job_dir, wait_for_agents
from ._lease import hold_job
from ._squeue import COMMAND_TIMEOUT, TERMINAL, job_status, slurm_command

if TYPE_CHECKING:
    from ..mesh import HostMesh

__all__ = ["SlurmJob"]

log = logging.getLogger("danaus.job.slurm")


class SlurmJob(JobTrait):
    """Host meshes on SLURM nodes: one danaus host agent per node of one allocation.

    Monarch's ``SlurmJob`` arguments, plus ``job_id``, ``idle_timeout`` and ``env``.

    Args:
        meshes: mesh name -> number of nodes; ``job.state().<name>`` is that
            ``HostMesh`` (dim ``hosts``). The allocation has the sum of the nodes.
        python_exe: the interpreter on the nodes (default: this one).
        slurm_args: extra ``sbatch`` options, e.g. ``["--constraint=h100"]``.
        monarch_port: the port every agent listens on; 0 (the default, unlike
            Monarch's fixed 22222): a free port each, reported through the job
            directory.
        job_name: the SLURM job name.
        ntasks_per_node: must be 1 (one agent per node; choose procs per host at
            ``spawn_procs``).
        time_limit: ``sbatch --time``. This and the other ``sbatch`` options below
            (None leaves SLURM's default) become ``#SBATCH`` lines.
        partition: ``--partition``.
        gpus_per_node: ``--gpus-per-node``.
        cpus_per_task: ``--cpus-per-task``.
        mem: ``--mem``.
        account: ``--account``.
        qos: ``--qos``.
        log_dir: where job directories go (each holds the key, the batch script, the
            agents' addresses and the job's output); on a file system the nodes share.
            Default ``./.danaus/jobs``.
        exclusive: ask for whole nodes (``--exclusive``); see also :meth:`share_node`.
        out_of_cluster: this controller runs outside the cluster's network: it reaches
            the job, and is reached, only through the first node's host agent
            (``danaus.attach``, as Monarch's).
        attach_to: that gateway's address instead of the first node's (``tcp://``).
        job_start_timeout: how long ``state()`` waits for the job to leave the queue
            (s); None: as long as it takes. The agents then have
            ``config.proc_start_timeout`` to report.
        job_id: use this existing allocation (``salloc``, or a batch job of yours)
            instead of submitting one: the agents run as a job step there, and
            ``kill()`` ends that step, not the allocation. ``"current"``: the
            allocation this controller runs in (``$SLURM_JOB_ID``).
        idle_timeout: the agents end the job once no controller has held it this long
            (s): a saved job (``state(cached_path=...)``) waits that long for the next
            controller, and a job whose controller died before attaching ends then.
            A job that is not saved ends as soon as its controller's connection is
            lost (even after SIGKILL). None: only ``kill()``/``scancel`` or the time
            limit end it.
        env: extra environment for the agents and their procs.
    """

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str | None = None,
        slurm_args: Sequence[str] = (),
        monarch_port: int = 0,
        job_name: str = "danaus",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
        out_of_cluster: bool = False,
        attach_to: str | None = None,
        *,
        job_id: str | None = None,
        idle_timeout: float | None = 300.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if not meshes:
            raise ValueError("SlurmJob needs at least one mesh: meshes={'hosts': 2}")
        for name, n in meshes.items():
            _check_mesh(name, n)
        if ntasks_per_node != 1:
            raise ValueError(
                f"ntasks_per_node={ntasks_per_node}: danaus runs one host agent per node; "
                "choose the procs per host with spawn_procs(per_host=...)"
            )
        bad = [a for a in slurm_args if not a.startswith("-")]
        if bad:
            raise ValueError(f"slurm_args are sbatch options (--name=value), not {bad}")
        if not 0 <= monarch_port < 65536:
            raise ValueError(f"monarch_port must be 0..65535, not {monarch_port}")
        if job_id == "current":
            job_id = os.environ.get("SLURM_JOB_ID")
            if not job_id:
                raise ValueError('job_id="current" but SLURM_JOB_ID is unset: not in an allocation')
        self._meshes = dict(meshes)
        self._python_exe = python_exe or sys.executable
        self._slurm_args = tuple(slurm_args)
        self._port = monarch_port
        self._job_name = job_name
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = os.path.abspath(log_dir or os.path.join(".danaus", "jobs"))
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._allocation = job_id  # an allocation we were given, not ours to cancel
        #: reach the job through one agent's gateway (``attach``): this one, or the
        #: first node's when only ``out_of_cluster`` is set
        self._out_of_cluster = out_of_cluster
        self._attach_to = attach_to
        self._idle_timeout = idle_timeout
        self._env = dict(env or {})
        # The allocation, once applied (saved with the job).
        self._slurm_job_id: str | None = None  # our batch job, or the given allocation
        self._job_dir: str | None = None
        self._step: str | None = None  # the agents' step, in a given allocation
        self._kept = False  # saved for later controllers: outlives this one
        self._agents: list[Agent] = []
        # This controller's connection to it (not saved).
        self._hosts: dict[str, HostMesh] | None = None
        self._srun: subprocess.Popen[bytes] | None = None
        self._exit_hook = False

    def mesh_sizes(self) -> dict[str, dict[str, int]]:
        return {name: {"hosts": n} for name, n in self._meshes.items()}

    @property
    def nodes(self) -> int:
        """Nodes the job needs: the sum over its meshes."""
        return sum(self._meshes.values())

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Another mesh of ``num_nodes`` nodes, before ``apply()`` (Monarch's)."""
        if self._slurm_job_id is not None:
            raise RuntimeError(
                f"add_mesh({name!r}): the job is submitted already; add meshes before apply()"
            )
        _check_mesh(name, num_nodes)
        self._meshes[name] = num_nodes

    def share_node(self, tasks_per_node: int, gpus_per_task: int, partition: str) -> None:
        """Share nodes with other jobs (Monarch's): not exclusive, and this job's share of a
        node of ``partition`` in CPUs and memory: ``gpus_per_task`` of its GPUs' worth, or
        one ``tasks_per_node``-th on nodes without GPUs (read with ``sinfo``; Monarch asks
        the ``clusterscope`` package the same)."""
        if tasks_per_node < 1 or gpus_per_task < 0:
            raise ValueError(
                f"share_node: tasks_per_node {tasks_per_node} must be at least 1 and "
                f"gpus_per_task {gpus_per_task} at least 0"
            )
        out = slurm_command(["sinfo", "-h", "-p", partition, "-o", "%c|%m|%G"])
        lines = out.stdout.split()
        if out.returncode != 0 or not lines:
            raise ValueError(
                f"share_node: partition {partition!r} is not known to sinfo: "
                f"{out.stderr.strip() or 'no nodes'}"
            )
        cpus, mem_mb, gres = lines[0].split("|", 2)
        # gres like "gpu:8" or "gpu:a100:8(S:0-1)": the count is the last field
        counts = [p.split(":")[-1].split("(")[0] for p in gres.split(",") if p.startswith("gpu")]
        gpus = sum(int(c) for c in counts if c.isdigit())
        share = gpus_per_task / gpus if gpus and gpus_per_task else 1 / tasks_per_node
        self._exclusive = False
        self._partition = partition
        self._cpus_per_task = max(1, int(int(cpus.rstrip("+")) * share))
        self._mem = f"{max(1, int(int(mem_mb.rstrip('+')) * share))}M"

    @property
    def job_id(self) -> str | None:
        """The SLURM job id of the allocation, once applied."""
        running = self._running
        return running._slurm_job_id if isinstance(running, SlurmJob) else None  # noqa: SLF001 - a SlurmJob's own

    @property
    def job_dir(self) -> str | None:
        """The job directory (key, batch script, agents' addresses, output)."""
        running = self._running
        return running._job_dir if isinstance(running, SlurmJob) else None  # noqa: SLF001 - a SlurmJob's own

    @property
    def agents(self) -> list[Agent]:
        """``(address, node, pid, step)`` of each host agent, in node order, once
        ``state()`` has connected."""
        running = self._running
        return list(running._agents) if isinstance(running, SlurmJob) else []  # noqa: SLF001 - a SlurmJob's own

    def __repr__(self) -> str:
        running = self._running
        job_id = running._slurm_job_id if isinstance(running, SlurmJob) else None  # noqa: SLF001 - a SlurmJob's own
        where = f" job {job_id}" if job_id else ""
        if self._allocation is not None:
            where += f" in allocation {self._allocation}"
        return f"<SlurmJob {self._meshes} {self.status.value}{where}>"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_hosts=None, _srun=None, _exit_hook=False)
        return state

    def _spec(self) -> tuple[Any, ...]:
        return (
            self._meshes,
            self._python_exe,
            self._slurm_args,
            self._port,
            self._job_name,
            self._time_limit,
            self._partition,
            self._exclusive,
            self._gpus_per_node,
            self._cpus_per_task,
            self._mem,
            self._account,
            self._qos,
            self._allocation,
            self._env,
            self._out_of_cluster,
            self._attach_to,
        )

    def can_run(self, spec: JobTrait) -> bool:
        """The same request, and the allocation still alive."""
        if not isinstance(spec, SlurmJob) or spec._spec() != self._spec():  # noqa: SLF001 - a SlurmJob's own
            return False
        if self._slurm_job_id is None:
            return False
        status = job_status(self._slurm_job_id)
        return status is not None and status[0] not in TERMINAL

    # ---------------------------------------------------------------- submit

    def batch_script(self, job_dir: str) -> str:
        """The ``sbatch`` script: SLURM options, then ``srun`` of one agent per node."""
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={self._job_name}",
            f"#SBATCH --nodes={self.nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --output={os.path.join(job_dir, 'slurm-%j.out')}",
            f"#SBATCH --chdir={os.getcwd()}",
            # how the meshes share the nodes, in order (monarch.tools.commands.info reads it)
            "#SBATCH --comment=danaus-meshes="
            + ",".join(f"{name}:{n}" for name, n in self._meshes.items()),
        ]
        options = {
            "time": self._time_limit,
            "partition": self._partition,
            "gpus-per-node": self._gpus_per_node,
            "cpus-per-task": self._cpus_per_task,
            "mem": self._mem,
            "account": self._account,
            "qos": self._qos,
        }
        lines += [f"#SBATCH --{k}={v}" for k, v in options.items() if v is not None]
        if self._exclusive:
            lines.append("#SBATCH --exclusive")
        lines += [f"#SBATCH {a}" for a in self._slurm_args]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self._env.items()]
        # The agents are the job: when they end (idle, or one failed), so does the job.
        lines.append("exec " + shlex.join(self._srun_args(job_dir)))
        return "\n".join(lines) + "\n"

    def _srun_args(self, job_dir: str) -> list[str]:
        agent = [self._python_exe, "-m", "danaus.job._agent", "--dir", job_dir]
        agent += ["--port", str(self._port)]
        if self._idle_timeout is not None:
            agent += ["--idle-timeout", str(self._idle_timeout)]
        return [
            "srun",
            f"--nodes={self.nodes}",
            f"--ntasks={self.nodes}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=1",
            *agent,
        ]

    def _create(self) -> None:
        job_dir = create_job_dir(self._log_dir, self._job_name)
        self._job_dir = job_dir
        self._kept = False
        try:
            if self._allocation is not None:
                self._start_step(job_dir)
            else:
                self._submit(job_dir)
        except BaseException:
            shutil.rmtree(job_dir, ignore_errors=True)  # nothing ran: keep no key behind
            self._job_dir = None
            raise
        if not self._exit_hook:
            atexit.register(self._at_exit)
            self._exit_hook = True

    def _submit(self, job_dir: str) -> None:
        script = self.batch_script(job_dir)
        with open(os.path.join(job_dir, "batch.sh"), "w") as f:
            f.write(script)
        out = slurm_command(["sbatch", "--parsable"], input=script)
        if out.returncode != 0:
            raise RuntimeError(
                f"sbatch refused the job (meshes {self._meshes}: {self.nodes} nodes): "
                f"{out.stderr.strip()}"
            )
        self._slurm_job_id = out.stdout.strip().split(";")[0]
        log.info("submitted SLURM job %s (%s)", self._slurm_job_id, job_dir)

    def _start_step(self, job_dir: str) -> None:
        """The agents as a step of a given allocation (``srun --jobid``)."""
        assert self._allocation is not None
        status = job_status(self._allocation)
        if status is None or status[0] in TERMINAL:
            state = status[0] if status else "not in the queue"
            raise ValueError(f"SLURM job {self._allocation} is not running ({state})")
        if len(status[1]) < self.nodes:
            raise ValueError(
                f"meshes {self._meshes} need {self.nodes} nodes; "
                f"allocation {self._allocation} has {len(status[1])}"
            )
        args = self._srun_args(job_dir)
        args[1:1] = [f"--jobid={self._allocation}", "--overlap", f"--job-name={self._job_name}"]
        env = dict(os.environ, **self._env)
        with open(os.path.join(job_dir, f"slurm-{self._allocation}.out"), "ab") as out:
            self._srun = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self._slurm_job_id = self._allocation

    # ---------------------------------------------------------------- connect

    def _state(self) -> JobState:
        if self._hosts is None:
            from ..mesh import attach_to_hosts

            assert self._job_dir is not None
            assert self._slurm_job_id is not None
            agents = wait_for_agents(
                self._job_dir,
                self.nodes,
                self._slurm_job_id,
                srun=self._srun,
                start_timeout=self._job_start_timeout,
                cancel=self._kill,
            )
            if self._allocation is not None:
                self._step = agents[0][3]
            addrs = [a for a, _, _, _ in agents]
            key_file = os.path.join(self._job_dir, "key")
            if self._out_of_cluster or self._attach_to is not None:
                from ..mesh import attach

                attach(self._attach_to or addrs[0], key_file=key_file)
            hosts: dict[str, HostMesh] = {}
            first = 0
            for name, n in self._meshes.items():
                hosts[name] = attach_to_hosts(
                    addrs[first : first + n], key_file=key_file, name=name
                )
                first += n
            self._hold(addrs)
            self._hosts = hosts
            self._agents = agents
        return JobState(self._hosts)

    def _linger(self) -> float | None:
        return self._idle_timeout if self._kept else 0.0

    def _hold(self, addrs: list[str]) -> None:
        """Hold the job from this controller: the agents end it when we are gone."""
        hold_job(addrs, self._linger())

    def _keep(self) -> None:
        """Saved for later controllers: the job outlives this one (``idle_timeout``)."""
        if not self._kept:
            self._kept = True
            if self._hosts is not None:
                self._hold([a for a, _, _, _ in self._agents])

    # ---------------------------------------------------------------- end

    def _kill(self) -> None:
        if self._allocation is not None:
            if self._step:
                slurm_command(["scancel", f"{self._allocation}.{self._step}"])
            if self._srun is not None:
                self._srun.terminate()
                try:
                    self._srun.wait(timeout=COMMAND_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self._srun.kill()
                    self._srun.wait()
        elif self._slurm_job_id is not None:
            out = slurm_command(["scancel", self._slurm_job_id])
            if out.returncode != 0:
                log.warning("scancel %s: %s", self._slurm_job_id, out.stderr.strip())
        if self._job_dir is not None:  # the agents have read it: keep no secret behind
            try:
                os.remove(os.path.join(self._job_dir, "key"))
            except FileNotFoundError:
                pass
        self._hosts = None
        self._srun = None
        self._step = None

    def _at_exit(self) -> None:
        if self._kept or self._status is JobStatus.NOT_RUNNING:
            return
        try:
            self._kill()
        except Exception as e:  # at exit: say so, do not mask the program's own exit
            log.warning("could not cancel SLURM job %s at exit: %s", self._slurm_job_id, e)


def _check_mesh(name: str, n: object) -> None:
    if not name.isidentifier():
        raise ValueError(f"mesh name {name!r} must be an identifier (job.state().{name})")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"mesh {name!r} needs a positive number of nodes, not {n!r}")
