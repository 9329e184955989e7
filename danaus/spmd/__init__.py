"""SPMD on meshes: torch.distributed in actors, and torchrun-style scripts on every rank.

``setup_torch_elastic_env(procs)`` sets, in every proc of a mesh, the variables torchrun
sets (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...), so
actors then call ``torch.distributed.init_process_group()`` themselves. ``SPMDActor``
runs a torchrun-style script on every rank; ``python -m danaus run`` does it from a
command line, as torchrun does. ``serve([...torchrun command...])`` reserves hosts for a
script and ``job.run_spmd()`` runs it there, again and again (``monarch.job.spmd``).
``launch(fn, procs, *args)`` runs a function on every rank (a Hugging Face ``Trainer``
or an Accelerate loop, from a notebook), as Accelerate's ``notebook_launcher`` does on one
machine.
Monarch's names (``monarch.spmd``).
"""

from __future__ import annotations

from ._actor import SPMDActor, elastic_env
from ._env import setup_torch_elastic_env, setup_torch_elastic_env_async
from ._job import SPMDJob, serve
from ._run import RankFailure, launch, run_spmd

__all__ = [
    "RankFailure",
    "SPMDActor",
    "SPMDJob",
    "elastic_env",
    "launch",
    "run_spmd",
    "serve",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
]
