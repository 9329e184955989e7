"""Whole-model parallelism: hand danaus a model and a mesh, it chooses and runs the split.

::

    p = await plan(model, procs, sample=batch)          # measured on the procs, then chosen
    print(p)                                             # the layout, and why
    trainer = parallelize(model, procs, p, optimizer=lambda ps: torch.optim.AdamW(ps))
    loss = await trainer.step(batch)

The same model runs data parallel (DDP or FSDP2), pipeline parallel
(``torch.distributed.pipelining``), tensor parallel (``parallelize_module``, by a
Hugging Face config's own ``base_model_tp_plan``, or GPT-2's) or a mix, by changing
``dp=``, ``pp=``, ``tp=`` or letting the planner choose.
Importing this package imports torch.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as e:  # torch is an extra: the actor, mesh and RDMA layers run without it
    raise ImportError(
        f"danaus.parallel needs torch ({e}): install it, e.g. `pip install 'danaus[torch]'`"
    ) from e

from ._checkpoint import load_state_dict
from ._errors import PlanError
from ._plan import Plan, StagePlan
from ._planning import plan
from ._trainer import Trainer, parallelize

__all__ = [
    "Plan",
    "PlanError",
    "StagePlan",
    "Trainer",
    "load_state_dict",
    "parallelize",
    "plan",
]
