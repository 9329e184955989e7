"""The error the planner raises, and the note of a step a user's error rolled back."""

from __future__ import annotations

from ..errors import DanausError


class PlanError(DanausError):
    """Your request's fault: no plan fits the memory given, or the arguments cannot be
    met (forced dims that do not multiply to the mesh size, a batch they do not divide, a
    model whose blocks cannot be found). The message names what to change."""


#: the note on a user's error (in the loss, in ``data``) after which every rank rolled
#: the step back: the worker adds it, and the trainer, seeing it, goes on
ROLLED_BACK = "danaus: the step was rolled back on every rank; the trainer goes on"
