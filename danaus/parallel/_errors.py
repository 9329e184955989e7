"""The error the planner raises."""

from __future__ import annotations

from ..errors import DanausError


class PlanError(DanausError):
    """Your request's fault: no plan fits the memory given, or the arguments cannot be
    met (forced dims that do not multiply to the mesh size, a batch they do not divide, a
    model whose blocks cannot be found). The message names what to change."""
