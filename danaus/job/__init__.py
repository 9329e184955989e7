"""Jobs: host meshes on machines a scheduler hands out, with Monarch's ``monarch.job`` shape.

``SlurmJob(meshes={"hosts": 2}).state().hosts`` is a ``HostMesh`` of two SLURM nodes,
each running a danaus host agent; ``job.kill()`` ends the job. ``ProcessJob`` makes
"hosts" of local processes, for multi-host programs on one machine.
"""

from ._job import JobState, JobTrait, job_load, job_loads
from ._process import ProcessJob
from ._slurm import SlurmJob

__all__ = ["JobState", "JobTrait", "ProcessJob", "SlurmJob", "job_load", "job_loads"]
