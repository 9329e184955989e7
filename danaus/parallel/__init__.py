"""Whole-model parallelism (in progress)."""
from ._errors import PlanError
from ._plan import Plan, StagePlan
from ._trainer import Trainer, parallelize
