"""Pipeline parallelism on the tensor engine: Monarch's ``monarch.parallel``.

:class:`PipelineParallelism` runs a model split into stages, each stage on a proc mesh
(stage ``i`` on ``meshes[i % len(meshes)]``), over microbatches, in the order of a
pipeline schedule::

    procs = this_host().spawn_procs(per_host={"pp": 2})
    meshes = [procs.slice(pp=0), procs.slice(pp=1)]
    pipe = PipelineParallelism(meshes, stages, Stream("compute"), Stream("p2p"),
                               schedule="dora-dfs", batch_size=8, microbatch_size=2,
                               loss_fn=nn.MSELoss())
    pipe.initialize()             # each stage's parameters and buffers onto its mesh
    loss = pipe.run(x, y)         # forward and backward of every microbatch
    print(inspect(loss))          # the batch's loss; .grad of every stage parameter is set

A schedule is a list of :class:`Action` per pipeline rank: ``F`` (a stage's forward of
one microbatch), ``B`` (its backward to the stage's input, which the previous stage
needs), ``W`` (its backward to the stage's parameters, accumulated into their ``.grad``),
and ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` where consecutive stages sit on different
ranks (an activation, or its gradient, moved with ``to_mesh``). Schedules:

- ``"dora-dfs"`` (Monarch's): depth-first interleaved, stages round-robin over the ranks;
  microbatches go in rounds through a rank's stages, and the backward is split, each
  ``W`` deferred to a step where the rank would otherwise wait (the zero-bubble idea).
- ``"gpipe"`` and ``"1f1b"``: danaus's additions, not in Monarch. GPipe runs every
  forward, then every backward; 1F1B alternates them after a warm-up. Both run each
  ``W`` right after its ``B``.

Autograd runs on the controller, over the DTensors of ``nn.Module`` stages. ``B`` is
``torch.autograd.grad(outputs, input, grad_outputs, retain_graph=True)``; ``W`` is
``torch.autograd.backward(outputs, grad_outputs, inputs=parameters)``, a second walk of
the graph ``B`` kept (torch has no public way to split one walk): a stage's backward
costs about twice a plain one. ``to_mesh`` has no autograd, so each activation starts a
new graph on its stage's mesh and ``SEND_B`` carries the input's gradient back by hand.

A stage may also be an ``OpaqueRef`` to a module living on the workers: its forward,
backward and weight gradients then run there (as Monarch's ``run_forward_udf``), and, as
in Monarch, its output must have its input's shape.

Differences from Monarch: streams are accepted and not used (work runs on the default
stream; moves go over the data plane, not a stream); a stage is called positionally,
``stage(x)`` (Monarch calls ``stage(input_tensor=x)``); ``loss_fn=None`` means the mean
of the last stage's output; more stages than meshes are placed round-robin.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import a_type
from ..mesh import ProcMesh
from . import fetch_shard, remote
from ._client import activate, client_for
from ._dtensor import DTensor, Stream
from .opaque_ref import OpaqueRef

__all__ = ["PipelineParallelism", "get_parameter_udf"]

#: the schedules :meth:`PipelineParallelism.generate_pipeline_ir_schedule` knows
SCHEDULES = ("dora-dfs", "gpipe", "1f1b")


class ActionType(enum.Enum):
    """What one step of a rank's schedule does."""

    F = "F"  # forward of a microbatch through a stage
    B = "B"  # backward to the stage's input
    W = "W"  # backward to the stage's parameters, accumulated into .grad
    SEND_F = "SEND_F"  # the stage's output to the next stage's rank
    RECV_F = "RECV_F"  # the stage's input from the previous stage's rank
    SEND_B = "SEND_B"  # the gradient of the stage's input to the previous stage's rank
    RECV_B = "RECV_B"  # the gradient of the stage's output from the next stage's rank


class Action(NamedTuple):
    """One step of a rank's schedule (Monarch's ``_Action``, with its field names)."""

    stage_index: int
    computation_type: ActionType
    microbatch_index: int

    def __str__(self) -> str:
        """Monarch's notation: ``1F0`` is stage 1's forward of microbatch 0."""
        return f"{self.stage_index}{self.computation_type.value}{self.microbatch_index}"


F, B, W = ActionType.F, ActionType.B, ActionType.W
SEND_F, RECV_F = ActionType.SEND_F, ActionType.RECV_F
SEND_B, RECV_B = ActionType.SEND_B, ActionType.RECV_B


# ------------------------------------------------------------------ schedules


def _rounds(n: int, pp: int) -> list[range]:
    """Microbatches in rounds, as Monarch's DFS schedule takes them: ``n // pp`` rounds
    (at least one) of nearly equal size."""
    rounds = max(n // pp, 1)
    size, extra = divmod(n, rounds)
    out, start = [], 0
    for i in range(rounds):
        end = start + size + (1 if i < extra else 0)
        out.append(range(start, end))
        start = end
    return out


def _compute_orders(name: str, num_stages: int, pp: int, n: int) -> dict[int, list[Action]]:
    """Each rank's forwards and input backwards, in order (no ``W`` yet)."""
    v = num_stages // pp  # stages per rank
    total = v * n
    orders: dict[int, list[Action]] = {}
    for r in range(pp):
        chunks = [j * pp + r for j in range(v)]
        if name == "dora-dfs":
            groups = _rounds(n, pp)
            fwd = [(s, m) for g in groups for s in chunks for m in g]
            bwd = [(s, m) for g in groups for s in reversed(chunks) for m in g]
            warmup = (v - 1) * len(groups[0]) + 2 * (pp - r - 1)
        else:
            fwd = [(s, m) for s in chunks for m in range(n)]
            bwd = [(s, m) for s in reversed(chunks) for m in range(n)]
            warmup = total if name == "gpipe" else (v - 1) * n + pp - r - 1
        warmup = min(warmup, total)
        seq = [Action(s, F, m) for s, m in fwd[:warmup]]
        for (fs, fm), (bs, bm) in zip(fwd[warmup:], bwd, strict=False):
            seq += [Action(fs, F, fm), Action(bs, B, bm)]
        seq.extend(Action(s, B, m) for s, m in bwd[total - warmup :])
        orders[r] = seq
    return orders


def _compute_deps(a: Action, num_stages: int) -> list[Action]:
    """The compute actions ``a`` needs the results of."""
    s, kind, m = a
    if kind is F:
        return [Action(s - 1, F, m)] if s > 0 else []
    if kind is B:
        return [Action(s, F, m)] + ([Action(s + 1, B, m)] if s < num_stages - 1 else [])
    return [Action(s, B, m)]


def _place_weights(
    orders: dict[int, list[Action]], fill: bool, num_stages: int
) -> dict[int, list[Action]]:
    """Add each ``B``'s ``W`` by running the schedule in unit steps: right after the
    ``B``, or (``fill``) in a step where the rank's next forward or backward waits on
    another rank, else at the end. Raises ``RuntimeError`` if the orders deadlock."""
    done: dict[Action, int] = {}
    heads = dict.fromkeys(orders, 0)
    pending: dict[int, deque[Action]] = {r: deque() for r in orders}
    queues = {r: list(seq) for r, seq in orders.items()}
    out: dict[int, list[Action]] = {r: [] for r in orders}
    step = 0
    while any(heads[r] < len(queues[r]) or pending[r] for r in queues):
        ran = False
        for r, queue in queues.items():
            nxt = queue[heads[r]] if heads[r] < len(queue) else None
            if nxt is not None and all(
                done.get(d, step) < step for d in _compute_deps(nxt, num_stages)
            ):
                act = nxt
                heads[r] += 1
                if act.computation_type is B:
                    w = Action(act.stage_index, W, act.microbatch_index)
                    if fill:
                        pending[r].append(w)
                    else:
                        queue.insert(heads[r], w)
            elif pending[r]:
                act = pending[r].popleft()
            else:
                continue
            done[act] = step
            out[r].append(act)
            ran = True
        if not ran:
            raise RuntimeError(f"pipeline schedule deadlocks at step {step}: {queues}")
        step += 1
    return out


def _with_comms(
    orders: dict[int, list[Action]], num_stages: int, pp: int
) -> dict[int, list[Action]]:
    """The sends after the action that makes the data, the receives before its user,
    where consecutive stages sit on different ranks."""
    out: dict[int, list[Action]] = {}
    for r, seq in orders.items():
        steps: list[Action] = []
        for a in seq:
            s, kind, m = a
            if kind is F and s > 0 and (s - 1) % pp != r:
                steps.append(Action(s, RECV_F, m))
            if kind is B and s < num_stages - 1 and (s + 1) % pp != r:
                steps.append(Action(s, RECV_B, m))
            steps.append(a)
            if kind is F and s < num_stages - 1 and (s + 1) % pp != r:
                steps.append(Action(s, SEND_F, m))
            if kind is B and s > 0 and (s - 1) % pp != r:
                steps.append(Action(s, SEND_B, m))
        out[r] = steps
    return out


def _needs(a: Action, num_stages: int, pp: int) -> list[Action]:
    """The actions (on any rank) that must have run before ``a``."""
    s, kind, m = a
    match kind:
        case ActionType.F:
            if s == 0:
                return []
            return [Action(s - 1, F, m) if (s - 1) % pp == s % pp else Action(s, RECV_F, m)]
        case ActionType.B:
            if s == num_stages - 1:
                return [Action(s, F, m)]
            after = Action(s + 1, B, m) if (s + 1) % pp == s % pp else Action(s, RECV_B, m)
            return [Action(s, F, m), after]
        case ActionType.W:
            return [Action(s, B, m)]
        case ActionType.SEND_F:
            return [Action(s, F, m)]
        case ActionType.RECV_F:
            return [Action(s - 1, SEND_F, m)]
        case ActionType.SEND_B:
            return [Action(s, B, m)]
        case ActionType.RECV_B:
            return [Action(s + 1, SEND_B, m)]
    raise AssertionError(kind)  # pragma: no cover - the match is exhaustive


def _format(orders: dict[int, list[Action]]) -> str:
    return "\n".join(f"rank {r}: {' '.join(map(str, seq))}" for r, seq in sorted(orders.items()))


# ------------------------------------------------------------------ worker side


def _is_opaque(obj: object) -> bool:
    return isinstance(obj, OpaqueRef)


def _value(obj: Any) -> Any:
    """On a worker: the object an ``OpaqueRef`` stands for, else ``obj`` itself."""
    return obj.value if _is_opaque(obj) else obj


def _get_parameter(module_or_ref: Any, param_name: str, param_shape: Sequence[int]) -> torch.Tensor:
    """The parameter (or buffer) ``param_name`` of a module (or of the module an
    ``OpaqueRef`` stands for), without autograd history, sharing its storage."""
    module = _value(module_or_ref)
    found: torch.Tensor | None = dict(chain(module.named_parameters(), module.named_buffers())).get(
        param_name
    )
    if found is None:
        raise AttributeError(f"{type(module).__name__} has no parameter {param_name!r}")
    if tuple(found.shape) != tuple(param_shape):
        raise ValueError(
            f"parameter {param_name!r} has shape {tuple(found.shape)}, not {tuple(param_shape)}"
        )
    return found.detach()


_get_parameter_remote = remote(
    _get_parameter, propagate=lambda module, name, shape: torch.empty(tuple(shape))
)


def _worker_forward(stage: Any, x: torch.Tensor, needs_grad: bool) -> tuple[torch.Tensor, ...]:
    """An ``OpaqueRef`` stage's forward, on a worker: its output and its input as the
    leaf of the graph (kept on the worker for ``B``)."""
    leaf = x.detach().requires_grad_(needs_grad and x.is_floating_point())
    with torch.enable_grad():
        return _value(stage)(leaf), leaf


def _worker_loss(out: torch.Tensor, y: Any, loss_fn: Any, n: int) -> torch.Tensor:
    """A microbatch's loss on the last stage's worker (an ``OpaqueRef`` stage)."""
    fn = _value(loss_fn)
    with torch.enable_grad():
        return (fn(out, y) if fn is not None else out).mean() / n


def _worker_backward_input(root: torch.Tensor, leaf: torch.Tensor, grad: Any) -> torch.Tensor:
    """``B`` of an ``OpaqueRef`` stage, on a worker: the gradient of its input."""
    got = None
    if leaf.requires_grad and root.requires_grad:
        (got,) = torch.autograd.grad(root, [leaf], grad, retain_graph=True, allow_unused=True)
    return got if got is not None else torch.zeros_like(leaf)


def _worker_backward_weight(stage: Any, root: torch.Tensor, grad: Any) -> None:
    """``W`` of an ``OpaqueRef`` stage, on a worker: into its parameters' ``.grad``."""
    params = [p for p in _value(stage).parameters() if p.requires_grad]
    if params and root.requires_grad:
        torch.autograd.backward(root, grad, inputs=params)


def _worker_append(loss_list: Any, loss: torch.Tensor) -> None:
    _value(loss_list).append(loss.detach())


def _worker_take_total(loss_list: Any) -> torch.Tensor:
    """Monarch's end of a batch on the worker's list: the sum of its losses, which the
    list is left without."""
    losses = _value(loss_list)
    total = torch.stack(list(losses)).sum()
    losses.clear()
    return total


_forward_udf = remote(
    _worker_forward, propagate=lambda stage, x, needs: (torch.empty_like(x), torch.empty_like(x))
)
_loss_udf = remote(_worker_loss, propagate=lambda out, y, fn, n: torch.empty(()))
_backward_input_udf = remote(
    _worker_backward_input, propagate=lambda root, leaf, grad: torch.empty_like(leaf)
)
_backward_weight_udf = remote(_worker_backward_weight, propagate=lambda stage, root, grad: None)
_append_udf = remote(_worker_append, propagate=lambda losses, loss: None)
_take_total_udf = remote(_worker_take_total, propagate=lambda losses: torch.empty(()))


def get_parameter_udf(module_or_ref: Any, param_name: str, param_shape: Sequence[int]) -> Any:
    """The parameter ``param_name`` of a stage module, as a tensor on the mesh: Monarch's
    ``get_parameter_udf``.

    For an ``OpaqueRef`` (a module on the workers), or a module whose parameters are
    local, a remote function returns each worker's parameter (a DTensor of
    ``param_shape``; call it inside ``mesh.activate()``); for an ``nn.Module`` whose
    parameters are DTensors, that parameter itself (without autograd history).
    Fetching the result raises ``AttributeError`` where the module has no such
    parameter, ``ValueError`` where its shape is not ``param_shape``.
    """
    if isinstance(module_or_ref, nn.Module) and any(
        isinstance(t, DTensor) for t in chain(module_or_ref.parameters(), module_or_ref.buffers())
    ):
        return _get_parameter(module_or_ref, param_name, param_shape)
    return _get_parameter_remote(module_or_ref, param_name, tuple(param_shape))


# ------------------------------------------------------------------ the runtime


@dataclass
class _Batch:
    """One ``run()``'s microbatches and what its actions pass to one another, by
    (stage, microbatch)."""

    ys: list[Any]
    losses: list[Any]
    inputs: dict[tuple[int, int], Any] = field(default_factory=dict)  # waiting for F
    leaves: dict[tuple[int, int], Any] = field(default_factory=dict)  # F's input, for B
    roots: dict[tuple[int, int], Any] = field(default_factory=dict)  # output (last: loss)
    grads: dict[tuple[int, int], Any] = field(default_factory=dict)  # of the output, for B, W
    input_grads: dict[tuple[int, int], Any] = field(default_factory=dict)  # B's, to send


class PipelineParallelism:
    """A model's stages on proc meshes, run microbatch by microbatch in the order of a
    pipeline schedule (Monarch's ``monarch.parallel.PipelineParallelism``).

    Args:
        meshes: one proc mesh per pipeline rank, all of one shard layout (e.g. the
            ``pp`` slices of one mesh); stage ``i`` runs on ``meshes[i % len(meshes)]``.
        stages: the model's stages in order, each an ``nn.Module``, an ``OpaqueRef`` to
            a module on the workers, or (Monarch's form) a list of one of them. Their
            number must be a multiple of ``len(meshes)``.
        compute_stream: accepted for Monarch's signature; danaus runs on the default
            stream.
        p2p_stream: likewise (moves go over the data plane, not a stream).
        schedule: ``"dora-dfs"`` (Monarch's), ``"gpipe"`` or ``"1f1b"``.
        batch_size: the batch ``run`` takes (dim 0 of ``x`` and ``y``).
        microbatch_size: the batch is split into ``batch_size // microbatch_size``
            microbatches of this size.
        loss_fn: ``loss_fn(output, y)``, on the last stage's mesh, of each microbatch;
            its mean over the microbatch, divided by their number, is the microbatch's
            loss (so the gradients are the whole batch's). None: the mean of the output.
        loss_list: where each microbatch's loss goes (a list, or an ``OpaqueRef`` to
            a list on the workers); ``run`` returns their sum and leaves it empty, as
            Monarch does. None: a list of this object's own.

    Raises:
        ValueError: the stages do not divide over the meshes, the batch not into
            microbatches, or the schedule is unknown.
        TypeError: a stage is neither a module nor an ``OpaqueRef``.
    """

    def __init__(
        self,
        meshes: Sequence[ProcMesh],
        stages: Sequence[Any],
        compute_stream: Stream | None = None,
        p2p_stream: Stream | None = None,
        schedule: str = "dora-dfs",
        batch_size: int = 4,
        microbatch_size: int = 1,
        loss_fn: Callable[..., Any] | None = None,
        loss_list: Any = None,
    ) -> None:
        if not meshes:
            raise ValueError("PipelineParallelism needs at least one mesh")
        if not stages or len(stages) % len(meshes):
            raise ValueError(
                f"{len(stages)} stages do not divide over {len(meshes)} meshes: give a "
                "multiple of the number of meshes (stage i runs on meshes[i % len(meshes)])"
            )
        self.meshes = list(meshes)
        self.stages = list(stages)
        self._modules = [_stage_module(s, i) for i, s in enumerate(self.stages)]
        self.schedule = schedule
        self.batch_size = batch_size
        self.microbatch_size = microbatch_size
        self.compute_stream = compute_stream
        self.p2p_stream = p2p_stream or Stream("p2p_stream")
        self.loss_fn = loss_fn
        self.loss_list = loss_list
        if _is_opaque(loss_fn) and not _is_opaque(self._modules[-1]):
            raise TypeError(
                "an OpaqueRef loss_fn runs on the workers: the last stage must be an "
                "OpaqueRef too (an nn.Module stage's loss runs in the controller's autograd)"
            )
        self.num_model_chunks = len(self.stages)
        self.pipeline_parallel_size = len(self.meshes)
        self.all_rank_actions, self.stage_to_rank_map = self.generate_pipeline_ir_schedule(
            schedule, len(self.stages), len(self.meshes), batch_size, microbatch_size
        )
        self.num_microbatches = batch_size // microbatch_size

    def __repr__(self) -> str:
        return (
            f"PipelineParallelism({self.schedule!r}, stages={len(self.stages)}, "
            f"ranks={len(self.meshes)}, microbatches={self.num_microbatches}"
            f"x{self.microbatch_size})"
        )

    def stage_to_rank(self, stage_idx: int) -> int:
        """The pipeline rank (index into ``meshes``) stage ``stage_idx`` runs on."""
        return self.stage_to_rank_map[stage_idx]

    @staticmethod
    def generate_pipeline_ir_schedule(
        schedule_name: str,
        total_num_model_chunks: int,
        pipeline_parallel_size: int,
        batch_size: int,
        microbatch_size: int,
    ) -> tuple[dict[int, list[Action]], dict[int, int]]:
        """Each pipeline rank's actions in order, and the rank of each stage.

        Args:
            schedule_name: ``"dora-dfs"``, ``"gpipe"`` or ``"1f1b"``.
            total_num_model_chunks: the number of stages (a multiple of the ranks).
            pipeline_parallel_size: the number of ranks; stage ``i`` is on rank
                ``i % pipeline_parallel_size``.
            batch_size: the batch, split into ``batch_size // microbatch_size``
                microbatches.
            microbatch_size: the size of a microbatch.

        Raises:
            ValueError: an unknown schedule, or sizes that do not divide.
        """
        if schedule_name not in SCHEDULES:
            raise ValueError(
                f"unknown pipeline schedule {schedule_name!r}: danaus supports "
                + ", ".join(repr(s) for s in SCHEDULES)
            )
        if pipeline_parallel_size < 1 or total_num_model_chunks < 1:
            raise ValueError("a pipeline needs at least one rank and one stage")
        if total_num_model_chunks % pipeline_parallel_size:
            raise ValueError(
                f"{total_num_model_chunks} stages do not divide over "
                f"{pipeline_parallel_size} pipeline ranks"
            )
        if microbatch_size < 1 or batch_size < 1 or batch_size % microbatch_size:
            raise ValueError(
                f"batch_size {batch_size} is not a positive multiple of microbatch_size "
                f"{microbatch_size}"
            )
        n = batch_size // microbatch_size
        num_stages, pp = total_num_model_chunks, pipeline_parallel_size
        orders = _compute_orders(schedule_name, num_stages, pp, n)
        orders = _place_weights(orders, schedule_name == "dora-dfs", num_stages)
        return _with_comms(orders, num_stages, pp), {s: s % pp for s in range(num_stages)}

    # -------------------------------------------------------------- set-up

    def initialize(self) -> None:
        """Move each ``nn.Module`` stage's parameters and buffers onto its mesh (local
        tensors are copied to every proc; DTensors move with ``to_mesh``). Build
        optimizers after this: the parameters are new tensors."""
        for i, module in enumerate(self._modules):
            if _is_opaque(module):
                continue  # it lives on the workers already
            mesh = self._mesh_of(i)
            state = module.state_dict(keep_vars=True)
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    state[k] = _on_mesh(v.detach(), mesh)
            module.load_state_dict(state, assign=True)

    def configure_optimizers(self, config: Any, config_fn: Callable[..., Any]) -> list[Any]:
        """An optimizer per stage, as Monarch's: ``config_fn(config.weight_decay,
        config.learning_rate, (config.beta1, config.beta2), config.device_type,
        config.optimizer, params)`` with the stage's parameters."""
        optimizers = []
        for i, module in enumerate(self._modules):
            if _is_opaque(module):
                raise TypeError(
                    f"stage {i} is an OpaqueRef: its parameters live on the workers; build "
                    "its optimizer there (a remote function)"
                )
            optimizers.append(
                config_fn(
                    config.weight_decay,
                    config.learning_rate,
                    (config.beta1, config.beta2),
                    config.device_type,
                    config.optimizer,
                    list(module.parameters()),
                )
            )
        return optimizers

    def copy_params_to_new_model(self, ref_model: Sequence[nn.Module]) -> None:
        """Copy each stage's parameters (rank 0's shard of its mesh) into the matching
        module of ``ref_model`` (one per stage), keeping each of its tensors where it
        is: a local tensor stays local, a DTensor gets the value on its own mesh."""
        if len(ref_model) != len(self.stages):
            raise ValueError(
                f"ref_model has {len(ref_model)} modules for {len(self.stages)} stages"
            )
        for i, (module, ref) in enumerate(zip(self._modules, ref_model, strict=True)):
            state = ref.state_dict()
            for name, old in state.items():
                with activate(self._mesh_of(i)):
                    param = get_parameter_udf(module, name, tuple(old.shape))
                value = fetch_shard(param).get() if isinstance(param, DTensor) else param
                value = value.detach().to(old.dtype)
                state[name] = _on_mesh(value, old.mesh) if isinstance(old, DTensor) else value
            ref.load_state_dict(state, assign=True)

    # -------------------------------------------------------------- running

    def run(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Forward and backward of the batch ``(x, y)``, microbatch by microbatch, in the
        schedule's order; the stages' parameters' ``.grad`` accumulate the batch's
        gradients. Returns the batch's loss (a DTensor on the last stage's mesh: the sum
        of the microbatches' losses, each already divided by their number).

        ``x`` and ``y`` are local tensors (copied to the first and last stage's procs)
        or DTensors (moved there). Sync code only: moving activations waits for them.

        Raises:
            ValueError: ``x`` or ``y`` has a batch dim other than ``batch_size``; no
                ``y`` for a ``loss_fn``.
            RuntimeError: ``initialize()`` was not called.
        """
        for name, t in (("x", x), ("y", y)):
            if t is not None and (t.dim() == 0 or t.shape[0] != self.batch_size):
                got = tuple(t.shape)
                raise ValueError(
                    f"{name} has shape {got}: its dim 0 must be the batch_size, {self.batch_size}"
                )
        if y is None and self.loss_fn is not None:
            raise ValueError("run(x) without y: the loss_fn takes the targets, run(x, y)")
        self._check_initialized()
        n = self.num_microbatches
        first, last = self._mesh_of(0), self._mesh_of(len(self.stages) - 1)
        with activate(first):
            xs = _on_mesh(x.detach(), first).tensor_split(n)
        ys: list[Any] = [None] * n
        if y is not None:
            with activate(last):
                ys = list(_on_mesh(y.detach(), last).tensor_split(n))
        losses = self.loss_list if self.loss_list is not None else []
        batch = _Batch(ys=ys, losses=losses)
        for m, xm in enumerate(xs):
            batch.inputs[0, m] = xm
        with torch.enable_grad():
            self._dispatch(batch)
        with activate(last):
            if _is_opaque(losses):
                return _take_total_udf(losses)  # type: ignore[no-any-return]
            total = torch.stack(list(losses)).sum()
        losses.clear()
        losses.append(total)  # Monarch leaves the sum there, then takes it out
        out: torch.Tensor = losses[0]
        losses.clear()
        return out

    def _dispatch(self, batch: _Batch) -> None:
        """Run the ranks' actions, one per rank in turn, each once what it needs ran."""
        num_stages, pp = len(self.stages), len(self.meshes)
        queues = {r: deque(seq) for r, seq in self.all_rank_actions.items()}
        done: set[Action] = set()
        while any(queues.values()):
            ran = False
            for queue in queues.values():
                if queue and all(d in done for d in _needs(queue[0], num_stages, pp)):
                    action = queue.popleft()
                    self._run_action(action, batch)
                    done.add(action)
                    ran = True
            if not ran:
                heads = {r: str(q[0]) for r, q in queues.items() if q}
                raise RuntimeError(
                    f"the pipeline schedule is stuck: every rank's next action waits "
                    f"({heads})\n{_format(self.all_rank_actions)}"
                )

    def _run_action(self, action: Action, batch: _Batch) -> None:
        s, kind, m = action
        key = (s, m)
        match kind:
            case ActionType.F:
                self._forward(s, m, batch)
            case ActionType.B:
                self._backward_input(s, m, batch)
            case ActionType.W:
                self._backward_weight(s, m, batch)
            case ActionType.SEND_F:
                out = batch.roots[key].detach()
                batch.inputs[s + 1, m] = out.to_mesh(self._mesh_of(s + 1))
            case ActionType.SEND_B:
                g = batch.input_grads.pop(key)
                batch.grads[s - 1, m] = None if g is None else g.to_mesh(self._mesh_of(s - 1))
            case ActionType.RECV_F | ActionType.RECV_B:
                # The move ran at the send (to_mesh pulls into the receiving mesh).
                if key not in (batch.inputs if kind is RECV_F else batch.grads):
                    raise RuntimeError(f"{action}: nothing was sent to stage {s}")

    def _forward(self, s: int, m: int, batch: _Batch) -> None:
        module, mesh = self._modules[s], self._mesh_of(s)
        last = s == len(self.stages) - 1
        x = batch.inputs.pop((s, m))
        with activate(mesh):
            if _is_opaque(module):
                out, leaf = _forward_udf(module, x, s > 0)
                if last:
                    out = _loss_udf(out, batch.ys[m], self.loss_fn, self.num_microbatches)
            else:
                leaf = x.requires_grad_() if s > 0 and x.is_floating_point() else x
                out = module(leaf)
                if last:
                    out = self._loss(out, batch.ys[m])
        batch.leaves[s, m] = leaf
        batch.roots[s, m] = out
        if last:
            if _is_opaque(batch.losses):
                with activate(mesh):
                    _append_udf(batch.losses, out)
            else:
                batch.losses.append(out.detach())
        elif self.stage_to_rank(s + 1) == self.stage_to_rank(s):
            batch.inputs[s + 1, m] = out.detach()  # the same mesh: no move

    def _loss(self, out: torch.Tensor, y: Any) -> torch.Tensor:
        value = self.loss_fn(out, y) if self.loss_fn is not None else out
        return value.mean() / self.num_microbatches

    def _backward_input(self, s: int, m: int, batch: _Batch) -> None:
        """``B``: the gradient of the stage's input (stage 0's input needs none)."""
        if s == 0:
            return
        module, root, leaf = self._modules[s], batch.roots[s, m], batch.leaves[s, m]
        grad = batch.grads.get((s, m))
        got = None
        if grad is not None or s == len(self.stages) - 1:
            with activate(self._mesh_of(s)):
                if _is_opaque(module):
                    got = _backward_input_udf(root, leaf, grad)
                elif leaf.requires_grad and root.requires_grad:
                    (got,) = torch.autograd.grad(
                        root, [leaf], grad, retain_graph=True, allow_unused=True
                    )
                    if got is None:
                        got = torch.zeros_like(leaf)
        if self.stage_to_rank(s - 1) == self.stage_to_rank(s):
            batch.grads[s - 1, m] = got
        else:
            batch.input_grads[s, m] = got

    def _backward_weight(self, s: int, m: int, batch: _Batch) -> None:
        """``W``: the stage's parameters' gradients, accumulated into ``.grad``; the
        microbatch's graph on this stage is freed."""
        module, root = self._modules[s], batch.roots.pop((s, m))
        grad = batch.grads.pop((s, m), None)
        batch.leaves.pop((s, m), None)
        if grad is None and s != len(self.stages) - 1:
            return  # nothing flows back into this stage (a non-float activation)
        with activate(self._mesh_of(s)):
            if _is_opaque(module):
                _backward_weight_udf(module, root, grad)
                return
            params = [p for p in module.parameters() if p.requires_grad]
            if params and root.requires_grad:
                torch.autograd.backward(root, grad, inputs=params)

    # -------------------------------------------------------------- helpers

    def _mesh_of(self, stage: int) -> ProcMesh:
        return self.meshes[self.stage_to_rank(stage)]

    def _check_initialized(self) -> None:
        for i, module in enumerate(self._modules):
            if _is_opaque(module):
                continue
            client = client_for(self._mesh_of(i))
            for name, t in chain(module.named_parameters(), module.named_buffers()):
                if not isinstance(t, DTensor) or t.client is not client:
                    raise RuntimeError(
                        f"stage {i}'s {name} is not on its mesh {self._mesh_of(i)}: call "
                        "initialize() before run()"
                    )


def _stage_module(stage: Any, i: int) -> Any:
    """The module (or ``OpaqueRef``) of a stage given as one, or as a list of one."""
    if isinstance(stage, (list, tuple)):
        if len(stage) != 1:
            raise ValueError(
                f"stage {i} is a list of {len(stage)} modules: give one module per stage "
                "(nn.Sequential chains several)"
            )
        stage = stage[0]
    if not isinstance(stage, nn.Module) and not _is_opaque(stage):
        raise TypeError(f"stage {i} is {a_type(stage)}: give an nn.Module or an OpaqueRef")
    return stage


def _on_mesh(t: torch.Tensor, mesh: ProcMesh) -> torch.Tensor:
    """``t`` on ``mesh``: a DTensor there as is, another DTensor moved, a local tensor
    copied to every proc."""
    if isinstance(t, DTensor):
        return t if t.client is client_for(mesh) else t.to_mesh(mesh)
    with activate(mesh):
        return t.clone()
