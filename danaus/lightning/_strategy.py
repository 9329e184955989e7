"""``DanausStrategy``: which of the two ways a Lightning module trains on a mesh."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._ddp import DDPOnMesh

if TYPE_CHECKING:
    from ..mesh import ProcMesh

_DIMS = ("dp", "pp", "tp", "microbatches")


class DanausStrategy(DDPOnMesh):
    """A Lightning strategy whose ranks are the procs of a danaus mesh.

    ``DanausStrategy(procs)``: Lightning's own DDP with every proc a rank (each a
    ``DistributedSampler`` shard, gradients averaged); ``fit``, ``validate``, ``test``
    and ``predict`` run on every proc, and the controller's module and trainer get rank
    0's weights, state and logged metrics back, as Lightning's ``ddp_spawn`` does.

    Args:
        procs: the proc mesh to train on (one host or many).
        plan: ``None`` for DDP as above; or ``"auto"``, or a ``danaus.parallel.Plan``,
            or dims as keywords (``dp=2, pp=2``): the module's model is trained in that
            layout by ``danaus.parallel`` (see the docs' Lightning page).
        **kwargs: with no plan, Lightning's ``DDPStrategy`` keywords
            (``find_unused_parameters``, ``process_group_backend``, ``timeout``...).
    """

    #: the ``danaus.parallel.Plan`` the model is trained in (given, or chosen at the first
    #: batch); ``None`` for Lightning's DDP
    plan: Any = None

    def __new__(cls, procs: ProcMesh | None = None, plan: Any = None, **kwargs: Any) -> Any:
        if procs is None or (plan is None and not any(k in kwargs for k in _DIMS)):
            return super().__new__(cls)
        from ._planned import PlannedStrategy

        return PlannedStrategy(procs, plan, **kwargs)

    def __init__(self, procs: ProcMesh, plan: Any = None, **kwargs: Any) -> None:
        super().__init__(procs, **kwargs)
