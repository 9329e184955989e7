"""Jobs: host meshes on machines a scheduler hands out, with Monarch's ``monarch.job`` shape.

``SlurmJob(meshes={"hosts": 2}).state().hosts`` is a ``HostMesh`` of two SLURM nodes,
each running a danaus host agent; ``job.kill()`` ends the job. ``ProcessJob`` makes
"hosts" of local processes, for multi-host programs on one machine; ``LocalJob`` is this
machine under every mesh name. ``exec_command`` runs a command on a job's hosts, ``shell`` a terminal on one;
``set_current_job`` / ``load_current_job`` keep the job a later program (or ``danaus
exec``) uses, in ``.monarch/`` as Monarch does.
"""

from ._contexts import load_current_job, set_current_job
from ._exec import exec_command
from ._job import DEFAULT_JOB_PATH, JobState, JobTrait, job_load, job_loads
from ._local import LocalJob
from ._port_forward import PortForwarder
from ._process import ProcessJob
from ._services import MeshAdminConfig, TelemetryConfig
from ._shell import shell
from ._slurm import SlurmJob

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshAdminConfig",
    "PortForwarder",
    "ProcessJob",
    "SlurmJob",
    "TelemetryConfig",
    "exec_command",
    "job_load",
    "job_loads",
    "load_current_job",
    "set_current_job",
    "shell",
]
