"""The error the planner raises, and the note of a step a user's error rolled back."""

from __future__ import annotations

from ..errors import DanausError


class PlanError(DanausError):
    """Your request's fault: no plan fits the memory given, or the arguments cannot be
    met (forced dims that do not multiply to the mesh size, a batch they do not divide, a
    model whose blocks cannot be found). The message names what to change."""


#: the note on an error after which every rank rolled its call back (the user's loss or
#: ``data`` raising in a step, a checkpoint that could not be written): the worker adds
#: it, and the trainer, seeing it, goes on
ROLLED_BACK = "danaus: this call was rolled back on every rank; the trainer goes on"
