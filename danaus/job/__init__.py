"""Jobs: host meshes on machines a scheduler hands out, with Monarch's ``monarch.job`` shape.

``SlurmJob(meshes={"hosts": 2}).state().hosts`` is a ``HostMesh`` of two SLURM nodes,
each running a danaus host agent; ``job.kill()`` ends the job.
"""

from ._job import JobState, JobTrait, job_load, job_loads
from ._slurm import SlurmJob

__all__ = ["JobState", "JobTrait", "SlurmJob", "job_load", "job_loads"]
