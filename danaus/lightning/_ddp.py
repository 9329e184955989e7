"""Lightning's own DDP, with every rank a proc of a danaus mesh.

The controller's ``Trainer.fit`` (``validate``, ``test``, ``predict``) is run on every proc
at once, as Lightning's ``ddp_spawn`` runs it in processes it forks: the trainer, the
module and the dataloaders travel pickled (cloudpickle), every rank joins one process
group from the variables torchrun would set (rank 0's host and a free port there), and
rank 0's weights, state, best checkpoint path and logged metrics come back to the
controller's trainer and module when the ranks are done. The weights come back in the
reply, not through a file, so ranks on other hosts return them too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.trainer.call import (
    _call_callbacks_load_state_dict,
    _call_callbacks_state_dict,
    _interrupt,
)
from lightning.pytorch.trainer.states import TrainerFn, TrainerState
from lightning_utilities.core.apply_func import apply_to_collection
from torch.nn.parallel import DistributedDataParallel

from ..spmd.seam import launch_ranks

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from ..mesh import ProcMesh

#: how long the other ranks get to end by themselves once one has failed (its process
#: group is destroyed with it, so their collectives fail rather than wait) before the
#: procs are stopped
GRACE_S = 20.0


class MeshEnvironment(ClusterEnvironment):
    """Ranks as the mesh gives them: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, which ``danaus.spmd`` sets in
    every proc before Lightning starts there. In the controller (before the launch) it is
    rank 0 of a world the size of the mesh."""

    def __init__(self, world: int) -> None:
        super().__init__()
        self._world = world

    @property
    def creates_processes_externally(self) -> bool:
        return False  # the strategy's launcher makes the ranks

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", self._world))

    def set_world_size(self, size: int) -> None:
        pass  # the mesh's, not Lightning's devices x nodes

    def global_rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", "0"))


class DDPOnMesh(DDPStrategy):
    """Lightning's DDP strategy whose ranks are the procs of ``procs``."""

    strategy_name = "danaus"

    def __init__(self, procs: ProcMesh, **ddp_kwargs: Any) -> None:
        super().__init__(
            cluster_environment=MeshEnvironment(len(procs)),
            start_method="spawn",
            **ddp_kwargs,
        )
        self._procs: ProcMesh | None = procs
        #: procs per host: the mesh's last dim, as torchrun's ``--nproc-per-node``
        self.per_host = int(list(procs.sizes.values())[-1]) if procs.sizes else 1

    @property
    def procs(self) -> ProcMesh:
        assert self._procs is not None, "the strategy's procs are the controller's only"
        return self._procs

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_procs"] = None  # a rank needs no handle on its own mesh
        return state

    def _configure_launcher(self) -> None:
        self._launcher = MeshLauncher(self)

    @property
    def root_device(self) -> torch.device:
        if self.parallel_devices and self.parallel_devices[0].type == "cuda":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def set_world_ranks(self) -> None:
        from lightning_utilities.core.rank_zero import rank_zero_only

        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def check_devices(self) -> None:
        """Lightning's ``devices=`` must be the mesh's procs per host (or 1, or all)."""
        n = len(self.parallel_devices or [])
        if n not in (1, self.per_host, len(self.procs)):
            raise ValueError(
                f"Trainer(devices={n}) but the mesh has {self.per_host} procs per host "
                f"({dict(self.procs.sizes)}): give devices={self.per_host}, or leave it out "
                "(the mesh decides how many ranks train)"
            )


@dataclass
class RankZero:
    """What rank 0 sends back to the controller's trainer when the ranks are done."""

    state: TrainerState
    results: Any
    best_model_path: str | None = None
    state_dict: dict[str, torch.Tensor] | None = None
    fit_loop: dict[str, Any] | None = None
    callbacks: dict[str, Any] = field(default_factory=dict)
    callback_metrics: dict[str, torch.Tensor] = field(default_factory=dict)


class MeshLauncher(_Launcher):
    """Runs Lightning's ``fit``/``validate``/``test``/``predict`` on every proc of the
    strategy's mesh; rank 0's results come back to the controller's trainer (``predict``
    returns rank 0's predictions, as under Lightning's DDP)."""

    def __init__(self, strategy: DDPOnMesh) -> None:
        self._strategy = strategy
        self._already_fit = False

    @property
    def is_interactive_compatible(self) -> bool:
        return True  # notebooks too: nothing is forked from the controller

    def kill(self, signum: Any) -> None:
        pass  # the ranks are the mesh's procs, stopped with it

    def launch(
        self,
        function: Callable[..., Any],
        *args: Any,
        trainer: pl.Trainer | None = None,
        **kwargs: Any,
    ) -> Any:
        strategy = self._strategy
        strategy.check_devices()
        if self._already_fit and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            raise NotImplementedError(
                "trainer.fit() twice on one Trainer with DanausStrategy: make a new Trainer "
                "and pass fit(ckpt_path=...) to go on from a checkpoint"
            )
        ranks = launch_ranks(
            _rank_main, strategy.procs, (strategy, trainer, function, args, kwargs), GRACE_S
        ).get()
        output = ranks.values()[0]
        if trainer is None:
            return output
        self._already_fit |= trainer.state.fn == TrainerFn.FITTING
        _recover(output, trainer)
        return output.results


def _rank_zero(trainer: pl.Trainer, results: Any) -> RankZero | None:
    """On a rank, after Lightning's entry: what the controller's trainer gets (rank 0)."""
    if trainer.global_rank != 0:
        return None
    out = RankZero(state=trainer.state, results=results)
    cb = trainer.checkpoint_callback
    out.best_model_path = getattr(cb, "best_model_path", None) if cb is not None else None
    out.callback_metrics = apply_to_collection(
        dict(trainer.callback_metrics), torch.Tensor, lambda t: t.detach().cpu()
    )
    if trainer.state.fn == TrainerFn.FITTING:
        module = trainer.lightning_module.state_dict()
        out.state_dict = {k: v.detach().cpu() for k, v in module.items()}
        # the loops' progress (global_step, current_epoch), which ddp_spawn leaves at 0
        out.fit_loop = trainer.fit_loop.state_dict()
        # the callbacks' state: ModelCheckpoint's best score and k best, EarlyStopping's
        out.callbacks = _call_callbacks_state_dict(trainer)
    return out


def _recover(out: RankZero, trainer: pl.Trainer) -> None:
    """In the controller: rank 0's weights, progress, callbacks' state and metrics."""
    cb = trainer.checkpoint_callback
    if cb is not None and hasattr(cb, "best_model_path"):
        cb.best_model_path = out.best_model_path or ""
    if out.state_dict is not None:
        trainer.lightning_module.load_state_dict(out.state_dict, strict=False)
    if out.fit_loop is not None:
        trainer.fit_loop.load_state_dict(out.fit_loop)
    if out.callbacks:
        _call_callbacks_load_state_dict(trainer, {"callbacks": out.callbacks})
    trainer.state = out.state
    trainer.callback_metrics.update(out.callback_metrics)


def _release(trainer: pl.Trainer, e: BaseException) -> None:
    """After ``e`` on this rank: Lightning's own handling (the callbacks' ``on_exception``,
    loggers finalized as "failed", the strategy torn down), and the DDP wrapper's hold on
    the process group let go. An error inside ``training_step`` leaves the wrapper
    referred to (by Lightning's forward redirection) after the teardown: its reducer
    would keep the group's connections open, and every other rank waiting on them in its
    next collective, where closed connections fail those collectives at once."""
    ddp = trainer.strategy.model
    _interrupt(trainer, e)
    trainer._teardown()  # noqa: SLF001 (Lightning's own, as its entry calls it)
    if isinstance(ddp, DistributedDataParallel):
        for name in ("reducer", "logger", "process_group"):
            ddp.__dict__.pop(name, None)


def _rank_main(
    strategy: DDPOnMesh,
    trainer: pl.Trainer | None,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """On a rank: Lightning's entry (``trainer._fit_impl`` ...), then rank 0's results."""
    if "OMP_NUM_THREADS" not in os.environ:  # as Lightning's own launchers share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, strategy.per_host)))
    try:
        results = function(*args, **kwargs)
    except BaseException as e:
        if trainer is not None:
            _release(trainer, e)
        raise
    if trainer is None:
        return results
    return _rank_zero(trainer, results)
