"""A Lightning module's model trained in a ``danaus.parallel`` layout (pipelines too).

Lightning's loop runs here, in the controller, on one device; each training batch (the
global batch) goes to a ``danaus.parallel.Trainer`` that runs the plan's schedule over
the mesh, the optimizer step included. That is only the step the module's
``training_step`` describes when its loss is the model's: ``self.model(**batch).loss``,
or ``loss_fn(self.model(x), y)`` with the ``loss_fn`` given to the strategy. The first
batch checks it, here, before anything is sent: ``training_step`` runs once on this
process's copy of the model and its loss must be that one; if not, a ``PlanError`` says
why. Validation, test and predict run here on the trained weights, brought back from the
mesh when they are needed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn

from ..parallel import Plan, PlanError, parallelize, plan

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from ..mesh import ProcMesh
    from ..parallel import Trainer

_DIMS = ("dp", "pp", "tp", "microbatches")


def _optimizer(
    cls: type[torch.optim.Optimizer], defaults: dict[str, Any], params: Iterator[nn.Parameter]
) -> torch.optim.Optimizer:
    return cls(params, **defaults)


def _like(opt: torch.optim.Optimizer) -> Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]:
    """A factory of optimizers like ``opt`` (its class and settings) for other parameters:
    the settings its constructor takes, of those it keeps in ``defaults``."""
    takes = inspect.signature(type(opt).__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in takes.values()):
        settings = dict(opt.defaults)
    else:
        settings = {k: v for k, v in opt.defaults.items() if k in takes}
    return functools.partial(_optimizer, type(opt), settings)


@contextlib.contextmanager
def _standing_in(module: nn.Module, attr: str, stand_in: nn.Module) -> Iterator[None]:
    """``module.<attr>`` is ``stand_in`` inside, its own model again after."""
    model = getattr(module, attr)
    setattr(module, attr, stand_in)
    try:
        yield
    finally:
        setattr(module, attr, model)


class _Recorder(nn.Module):
    """Stands in for the model while ``training_step`` is checked: calls it, and keeps
    what it was called with and gave."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.model(*args, **kwargs)
        self.calls.append((args, kwargs, out))
        return out


class _Replay(nn.Module):
    """Stands in for the model while ``training_step`` runs again after a step on the
    mesh, so that its ``self.log`` calls log that step's loss: the model's output, with
    the step's loss as its ``loss`` and nothing else."""

    def __init__(self, output_type: type, loss: torch.Tensor) -> None:
        super().__init__()
        self.output_type, self.loss = output_type, loss

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.output_type(loss=self.loss)


class PlannedStrategy(SingleDeviceStrategy):
    """Lightning's loop here; each training step by ``danaus.parallel`` on the mesh."""

    strategy_name = "danaus_planned"

    def __init__(
        self,
        procs: ProcMesh,
        plan: Plan | str | None = None,
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        model: str | None = None,
        **plan_kwargs: Any,
    ) -> None:
        super().__init__(device=torch.device("cpu"))
        if plan is not None and plan != "auto" and not isinstance(plan, Plan):
            raise TypeError(
                f"plan= must be a danaus.parallel.Plan, 'auto' or None (with dims as "
                f"keywords: dp=2, pp=2), not {plan!r}"
            )
        if isinstance(plan, Plan) and any(k in plan_kwargs for k in _DIMS):
            raise TypeError("give a Plan or dims (dp=, pp=, tp=, microbatches=), not both")
        self.procs = procs
        self._plan_arg = plan
        self._loss_fn = loss_fn
        self._model_attr = model
        self._plan_kwargs = plan_kwargs
        #: the trainer on the mesh (made at the first training batch of a fit), and
        #: whether the weights here are behind the mesh's
        self.trainer_on_mesh: Trainer | None = None
        #: the plan the model is trained in (the one given, or chosen at the first batch)
        self.plan: Plan | None = plan if isinstance(plan, Plan) else None
        self._behind = False
        self._replay_type: type | None = None  # the model's output type (its own loss)
        self._replay_failed = False

    # --- the model, and the checks before anything is sent ----------------------------

    def _module(self) -> pl.LightningModule:
        module = self.lightning_module
        assert module is not None, "the strategy has no LightningModule yet"
        return module

    def _attr(self, module: pl.LightningModule) -> str:
        if self._model_attr is not None:
            if not isinstance(getattr(module, self._model_attr, None), nn.Module):
                raise PlanError(
                    f"DanausStrategy(model={self._model_attr!r}): "
                    f"{type(module).__name__}.{self._model_attr} is not an nn.Module"
                )
            return self._model_attr
        children = [name for name, _ in module.named_children()]
        if len(children) == 1:
            return children[0]
        if "model" in children:
            return "model"
        raise PlanError(
            f"{type(module).__name__} has {len(children)} submodules ({', '.join(children)}): "
            "say which is the model to lay out with DanausStrategy(..., model='name')"
        )

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != "fit":
            return
        why = []
        if len(self.optimizers) != 1:
            why.append(f"configure_optimizers gives {len(self.optimizers)} optimizers, not one")
        elif len(self.optimizers[0].param_groups) != 1:
            why.append("the optimizer has several parameter groups")
        if self.lr_scheduler_configs:
            why.append("a learning-rate scheduler is not carried to the mesh's optimizers")
        if trainer.accumulate_grad_batches != 1:
            why.append("accumulate_grad_batches: each batch is one optimizer step")
        if trainer.gradient_clip_val:
            why.append("gradient_clip_val: gradients are not clipped on the mesh")
        if why:
            raise PlanError(
                "DanausStrategy with a plan trains the model with one optimizer of one "
                "parameter group, a step per batch: " + "; ".join(why)
            )
        self._attr(self._module())  # (the model is found, or PlanError now)

    def _loss_of(self, returned: Any) -> torch.Tensor:
        loss = returned.get("loss") if isinstance(returned, dict) else returned
        if not isinstance(loss, torch.Tensor):
            raise PlanError(
                f"training_step returned {type(returned).__name__}, not a loss tensor (or a "
                "dict with 'loss')"
            )
        return loss

    def _check(self, module: pl.LightningModule, batch: Any, idx: int) -> None:
        """Run ``training_step`` on this process's model once, and check that its loss
        is the model's own (or ``loss_fn``'s of its output), for the batch as given."""
        attr = self._attr(module)
        recorder = _Recorder(getattr(module, attr))
        module.__dict__["log"] = module.__dict__["log_dict"] = lambda *a, **k: None
        try:
            with _standing_in(module, attr, recorder), torch.no_grad():
                loss = self._loss_of(module.training_step(batch, idx))
        finally:
            module.__dict__.pop("log", None)
            module.__dict__.pop("log_dict", None)
        how = f"self.{attr}(**batch).loss" if self._loss_fn is None else "loss_fn(out, y)"
        cant = f"training_step cannot be run as the plan's schedule (its loss must be {how})"
        if len(recorder.calls) != 1:
            raise PlanError(f"{cant}: it calls self.{attr} {len(recorder.calls)} times")
        args, kwargs, out = recorder.calls[0]
        if self._loss_fn is None:
            if not isinstance(batch, dict):
                raise PlanError(
                    f"{cant}: a batch that is not a dict needs the loss_fn: "
                    "DanausStrategy(..., loss_fn=fn(output, target))"
                )
            if (
                args
                or kwargs.keys() != batch.keys()
                or any(
                    kwargs[k] is not v and not torch.equal(kwargs[k], v) for k, v in batch.items()
                )
            ):
                raise PlanError(f"{cant}: self.{attr} is not called with the batch as **kwargs")
            want = getattr(out, "loss", None)
            self._replay_type = type(out)
        else:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise PlanError(f"{cant}: with loss_fn the batch must be (inputs, target)")
            x, y = batch
            if kwargs or len(args) != 1 or not (args[0] is x or torch.equal(args[0], x)):
                raise PlanError(f"{cant}: self.{attr} is not called with the batch's inputs")
            with torch.no_grad():
                want = self._loss_fn(out, y)
        if not isinstance(want, torch.Tensor) or not torch.allclose(
            loss.float(), want.float(), rtol=1e-5, atol=1e-7
        ):
            raise PlanError(
                f"{cant}: it returned {float(loss):.6g}, the model's loss is "
                f"{want if not isinstance(want, torch.Tensor) else float(want):.6g}"
            )

    # --- the steps -----------------------------------------------------------------

    def _start(self, batch: Any) -> Trainer:
        module = self._module()
        model = getattr(module, self._attr(module))
        make = _like(self.optimizers[0])
        chosen = self._plan_arg
        if not isinstance(chosen, Plan):
            chosen = plan(
                model, self.procs, sample=batch, loss_fn=self._loss_fn, optimizer=make,
                **self._plan_kwargs,
            ).get()  # fmt: skip
        self.plan = chosen
        return parallelize(model, self.procs, chosen, optimizer=make, loss_fn=self._loss_fn)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        batch, idx = args[0], args[1] if len(args) > 1 else 0
        module = self._module()
        if self.trainer_on_mesh is None:
            self._check(module, batch, idx)
            self.trainer_on_mesh = self._start(batch)
        loss = torch.tensor(self.trainer_on_mesh.step(batch).get())
        self._behind = True
        return self._log_step(module, batch, idx, loss)

    def _log_step(self, module: pl.LightningModule, batch: Any, idx: int, loss: Any) -> Any:
        """The module's own ``self.log`` calls, with the step's loss (the model's own);
        with a ``loss_fn``, or where they use more of the output, ``train_loss``."""
        if self._replay_type is not None and not self._replay_failed:
            try:
                with _standing_in(module, self._attr(module), _Replay(self._replay_type, loss)):
                    return module.training_step(batch, idx)
            except Exception as e:
                self._replay_failed = True
                warnings.warn(
                    f"training_step uses more of the model's output than its loss ({e!r}); "
                    "with DanausStrategy's plan it is not run again per step: the step's "
                    "loss is logged as train_loss",
                    stacklevel=2,
                )
        module.log("train_loss", loss, prog_bar=True)
        return loss

    def backward(self, closure_loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return closure_loss  # the mesh did the backward pass

    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any], *args: Any, **kw: Any
    ) -> Any:
        return closure()  # the step on the mesh, its optimizer step with it

    # --- the weights, back here when they are read ------------------------------------

    def _pull(self) -> None:
        if self.trainer_on_mesh is None or not self._behind:
            return
        module = self._module()
        model = getattr(module, self._attr(module))
        model.load_state_dict(self.trainer_on_mesh.state_dict().get())
        self._behind = False

    def on_validation_start(self) -> None:
        self._pull()

    def on_test_start(self) -> None:
        self._pull()

    def on_predict_start(self) -> None:
        self._pull()

    def on_train_end(self) -> None:
        self._pull()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        self._pull()  # (ModelCheckpoint saves what the mesh trained)
        return super().lightning_module_state_dict()

    def teardown(self) -> None:
        if self.trainer_on_mesh is not None:
            self._pull()
            self.trainer_on_mesh.stop().get()
            self.trainer_on_mesh = None
        super().teardown()
