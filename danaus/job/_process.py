"""``ProcessJob``: Monarch's job of local "hosts", each a host agent in a process of its own
on this machine, reached over a Unix socket: multi-host programs tested on one machine,
with no scheduler."""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping

from ..config import config
from ._job import JobState, JobTrait

__all__ = ["ProcessJob"]


def _die_with_controller() -> None:
    """In the worker, before it runs: SIGKILL when the controller's thread that started
    it ends (its procs follow: they die with their agent)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ProcessJob(JobTrait):
    """A job whose hosts are host agents in processes of their own on this machine.

    ``ProcessJob({"trainers": 2, "dataloaders": 1}).state()`` starts three workers (each
    runs ``run_worker_loop_forever`` on a Unix socket in a private folder) and gives
    ``state.trainers``, a host mesh of two, and ``state.dataloaders``, of one. Procs
    spawned on them are the workers' children, as on real hosts. They use this user's
    default job key, as the controller does when attaching. ``kill()`` ends the workers
    and their procs; so does the controller's exit, unless the job was saved for later
    controllers (``state(cached_path=...)``, ``danaus apply``): then they run until a
    ``kill()``.

    Each worker's own messages go to ``<folder>/<mesh>_<i>.log`` (``job.log_dir``).

    Args:
        meshes: mesh name -> number of hosts.
        env: extra environment variables for the workers (and so their procs).
    """

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        for name, count in meshes.items():
            if not name.isidentifier() or not isinstance(count, int) or count < 1:
                raise ValueError(
                    f"ProcessJob meshes map a name (an identifier) to a number of hosts "
                    f"(>= 1); got {name!r}: {count!r}"
                )
        self._meshes = dict(meshes)
        self._env = dict(env or {})
        #: the workers this process started, and every worker's pid (kept in a saved job)
        self._workers: dict[str, subprocess.Popen[bytes]] = {}
        self._pids: dict[str, int] = {}
        self._addrs: dict[str, str] = {}
        self._folder: str | None = None

    @property
    def log_dir(self) -> str | None:
        """The job's private folder, with each worker's log (None until applied)."""
        return self._folder

    def __getstate__(self) -> dict[str, object]:
        # saved for a later controller in this session: the workers' pids and addresses
        return {**self.__dict__, "_workers": {}}

    def mesh_sizes(self) -> dict[str, dict[str, int]]:
        return {name: {"hosts": n} for name, n in self._meshes.items()}

    def _create(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="danaus-process-job-")
        env = {**os.environ, **self._env}
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            for mesh, count in self._meshes.items():
                for i in range(count):
                    key = f"{mesh}_{i}"
                    addr = f"unix:{self._folder}/{key}"
                    code = (
                        "from danaus.mesh import run_worker_loop_forever; "
                        f"run_worker_loop_forever(address={addr!r})"
                    )
                    # the worker's own messages go to a log in the job's folder (its
                    # procs' output reaches their controller): a saved job's workers
                    # outlive the terminal or pipe of the program that started them
                    with open(f"{self._folder}/{key}.log", "ab") as log:
                        self._workers[key] = subprocess.Popen(
                            [sys.executable, "-c", code],
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            # a thread's death would fire PDEATHSIG: main thread only
                            preexec_fn=_die_with_controller if main_thread else None,
                        )
                    self._pids[key] = self._workers[key].pid
                    self._addrs[key] = addr
        except BaseException:
            self._kill()
            raise
        _live.add(self)

    def _state(self) -> JobState:
        from ..mesh import attach_to_workers

        # attaching waits (bounded, config.connect_timeout) for each worker's socket
        return JobState(
            {
                mesh: attach_to_workers(
                    workers=[self._addrs[f"{mesh}_{i}"] for i in range(count)], name=mesh
                )
                for mesh, count in self._meshes.items()
            }
        )

    def _kill(self) -> None:
        workers, self._workers = self._workers, {}
        pids, self._pids = self._pids, {}
        for worker in workers.values():
            if worker.poll() is None:
                worker.terminate()
        deadline = time.monotonic() + config.stop_timeout
        for worker in workers.values():
            try:
                worker.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        for key, pid in pids.items():
            if key in workers:
                continue  # (waited for above)
            try:  # a saved job's worker: not a child of this process
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        _live.discard(self)

    def _keep(self) -> None:
        """Saved for later controllers (``state(cached_path=...)``, ``danaus apply``):
        the workers outlive this process, until ``kill()`` (``danaus kill``)."""
        from ..mesh.seam import agent_ref

        for addr in self._addrs.values():
            agent_ref(addr).outlive_parent.call_one().get(timeout=config.connect_timeout)
        _live.discard(self)

    def can_run(self, spec: JobTrait) -> bool:
        if not isinstance(spec, ProcessJob) or spec._meshes != self._meshes:  # noqa: SLF001 - its own class
            return False
        for pid in self._pids.values():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
        return bool(self._pids)


#: jobs with workers running, ended at the controller's exit
_live: set[ProcessJob] = set()


@atexit.register
def _end_all() -> None:
    for job in list(_live):
        job._kill()  # noqa: SLF001 - this module's own
