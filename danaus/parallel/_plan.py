"""``Plan``: how a model is laid out on a mesh, what the planner expects of it, and why."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._layout import Layout, order_of


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: blocks ``first``..``last`` (inclusive).

    Attributes:
        first, last: block indices, inclusive.
        param_bytes: bytes of the stage's weights (all of them, before tensor parallel).
        estimated_s: estimated forward + backward time of one microbatch on this stage.
        peak_bytes: estimated peak bytes per proc of this stage (weights, grads,
            optimizer state and the activations of the microbatches in flight).
        checkpointing: the stage's blocks recompute their forward in backward
            (activation checkpointing) instead of keeping their activations.
        ranks: the mesh ranks that hold this stage (one per replica and
            tensor-parallel shard), in order.
        limit_bytes: the memory the least of those procs may hold (what
            ``peak_bytes`` was fitted to; 0 where not planned).
    """

    first: int
    last: int
    param_bytes: int
    estimated_s: float
    peak_bytes: int = 0
    checkpointing: bool = False
    ranks: tuple[int, ...] = ()
    limit_bytes: int = 0


@dataclass(frozen=True)
class Plan:
    """A layout of a model on a mesh: ``dp`` replicas of a ``pp``-stage pipeline whose
    blocks are split ``tp`` ways, with ``microbatches`` per replica per step.

    Made by :func:`danaus.parallel.plan` (measured and chosen) or by hand
    (``Plan(dp=..., pp=..., tp=..., microbatches=..., stages=...)``). ``print(plan)`` shows it as a table, with why it was chosen and
    what came second.
    """

    dp: int
    pp: int
    tp: int
    microbatches: int
    stages: tuple[StagePlan, ...]
    estimated_step_s: float = 0.0
    peak_bytes_per_proc: int = 0
    schedule: str = "1f1b"
    sharded: bool = False
    layers: str | None = None
    memory_per_proc: int = 0
    why: str = ""
    runner_up: str = ""
    #: every feasible layout the planner weighed (each a Plan of its own, with its
    #: stages and estimates; this one among them), fastest estimated first: any of them
    #: can be given to ``parallelize``
    candidates: tuple[Plan, ...] = field(default=(), repr=False, compare=False)
    #: seconds ``plan()`` spent measuring (the model, the procs, the links) and searching
    profile_s: float = field(default=0.0, compare=False)
    search_s: float = field(default=0.0, compare=False)
    #: what ``plan()`` measured (the model's costs, the mesh's facts, the batch), so
    #: that a trainer that lost procs plans again for the rest without measuring again
    measured: Any = field(default=None, repr=False, compare=False)
    loss_fn: Any = field(default=None, repr=False, compare=False)
    #: what the forward computes in: "fp32", "bf16" or "fp16" (autocast; weights stay
    #: fp32)
    precision: str = "fp32"
    #: activation checkpointing as asked: True (every block recomputes its forward in
    #: backward instead of keeping its activations), False, or None (the planner chose
    #: per stage: see each stage's ``checkpointing``)
    checkpointing: bool | None = False
    #: every block runs compiled by ``torch.compile`` (measured so)
    compile: bool = False

    @property
    def strategy(self) -> str:
        """``"dp=2 x pp=2"`` style: the dims above 1 (``"single"`` when none)."""
        return strategy_name(self.dp, self.pp, self.tp, self.sharded)

    def simulate(self, hosts: int, gpus: int, *, batch: int | None = None) -> SimulatedPlan:
        """This plan's layout on a mesh of ``hosts`` x ``gpus`` devices, none of which is
        needed: its step time and memory per device, estimated from what ``plan()``
        measured (the blocks' costs at this plan's microbatch size, the links and
        collectives as measured here; each simulated device computes at the measured
        pace, with a core of its own). The pipeline and tensor-parallel degrees are
        kept; the data-parallel degree grows with the devices, and the global batch
        with it (``batch=`` another), so each replica's microbatches stay the size
        measured.

        Raises:
            PlanError: nothing measured is kept on this plan (made by hand), the devices
                are not a multiple of ``pp x tp``, or the batch does not split into
                microbatches of the size measured.
        """
        from ._planning import simulate_plan

        return simulate_plan(self, hosts, gpus, batch)

    @property
    def layout(self) -> Layout:
        return Layout(
            self.dp,
            self.pp,
            self.tp,
            self.microbatches,
            tuple((s.first, s.last) for s in self.stages),
            self.schedule,
            self.sharded,
            self.precision,
            tuple(s.checkpointing for s in self.stages),
            self.compile,
            order_of(self.dp, self.pp, self.tp, [s.ranks for s in self.stages]),
        )

    def html(self) -> str:
        """The plan drawn as one self-contained HTML page (no script, no network): the
        ranks by their dims, the stages with their blocks, the estimated pipeline
        schedule with its bubble, and each stage's memory per proc against the limit."""
        from ._picture import html

        return html(self)

    def save_html(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`html` to ``path`` (open it in any browser)."""
        Path(path).write_text(self.html(), encoding="utf-8")

    def show(self) -> None:
        """Draw the plan in a notebook (Jupyter, VS Code); print it elsewhere."""
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display
        except ImportError:
            print(self)
            return
        if get_ipython() is None:  # (IPython installed, but this is no notebook)
            print(self)
            return
        display(HTML(self.html()))  # type: ignore[no-untyped-call]

    def _repr_html_(self) -> str:
        """A notebook's rich display of a plan (the last value of a cell)."""
        return self.html()

    def _checkpointed(self) -> str:
        return ", ".join(str(i) for i, s in enumerate(self.stages) if s.checkpointing)

    def __str__(self) -> str:
        lines = [
            f"Plan: {self.strategy}, {self.microbatches} microbatch"
            f"{'es' if self.microbatches != 1 else ''} per replica"
            + (f", {self.schedule} schedule" if self.pp > 1 else "")
            + (f", {self.precision} compute" if self.precision != "fp32" else "")
            + (", activation checkpointing" if self.checkpointing else "")
            + (
                f", activation checkpointing on stage(s) {chosen}"
                if self.checkpointing is None and (chosen := self._checkpointed())
                else ""
            )
            + (", compiled" if self.compile else ""),
        ]
        if self.estimated_step_s:
            lines.append(
                f"estimated step {_ms(self.estimated_step_s)}, peak "
                f"{_mib(self.peak_bytes_per_proc)} per proc"
                + (f" (cap {_mib(self.memory_per_proc)})" if self.memory_per_proc else "")
            )
        lines.append(
            f"{'stage':>5}  {'blocks':>9}  {'weights':>11}  {'fwd+bwd/mb':>11}  {'peak/proc':>11}"
        )
        for i, s in enumerate(self.stages):
            lines.append(
                f"{i:>5}  {f'{s.first}..{s.last}':>9}  {_mib(s.param_bytes):>11}  "
                f"{_ms(s.estimated_s):>11}  {_mib(s.peak_bytes):>11}"
            )
        if self.why:
            lines.append(f"why: {self.why}")
        if self.runner_up:
            lines.append(f"runner-up: {self.runner_up}")
        if self.profile_s or self.search_s:
            lines.append(
                f"planned in {self.profile_s + self.search_s:.1f} s: measuring "
                f"{self.profile_s:.1f} s, searching {len(self.candidates)} layouts that fit "
                f"{self.search_s:.2f} s"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class SimulatedPlan:
    """:meth:`Plan.simulate`'s answer: a plan's layout estimated on a mesh of ``hosts`` x
    ``gpus`` devices.

    Attributes:
        hosts, gpus: the simulated mesh.
        dp, pp, tp, microbatches: the layout there.
        batch: the global batch of a step there.
        step_s: the estimated time of one step.
        peak_bytes_per_proc: the estimated peak bytes of the fullest device.
        stages: each stage's blocks, time per microbatch, peak bytes per device and
            the simulated devices (ranks) that hold it.
        schedule, sharded: the pipeline's schedule, and whether replicas shard their
            state (FSDP), as in the plan.
        pipeline_s, sync_s, optimizer_s, copies_s: the parts of ``step_s``: the
            pipeline's critical path, the gradients' sync between replicas, the
            optimizer's step, and (a trainer that recovers lost procs) the copies of
            each proc's state after it.
        typical: how much slower a typical step ran than the fastest pass each part
            was timed at (the stages' ``estimated_s`` are the fastest; ``step_s`` and
            its parts count it).

    :meth:`trace` (and :meth:`write_trace`) gives the simulated step as a timeline in
    Chrome's trace event format, as ``Simulator.trace()`` does for a program.
    """

    hosts: int
    gpus: int
    dp: int
    pp: int
    tp: int
    microbatches: int
    batch: int
    step_s: float
    peak_bytes_per_proc: int
    stages: tuple[StagePlan, ...]
    schedule: str = "1f1b"
    sharded: bool = False
    pipeline_s: float = 0.0
    sync_s: float = 0.0
    optimizer_s: float = 0.0
    typical: float = 1.0
    copies_s: float = 0.0

    def trace(self) -> dict[str, object]:
        """The simulated step in Chrome's trace event format (Perfetto and
        ``chrome://tracing`` open it): a process per simulated device, named by its
        host, gpu and stage; on its ``compute`` thread each microbatch's forward and
        backward of its stage, as the schedule runs them, then the optimizer's step; on
        its ``comm`` thread the gradients' sync, linked by a flow across the devices
        that sync together; a ``memory`` counter with its stage's estimated peak."""
        from ._picture import simulated_trace

        return simulated_trace(self)

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`trace` as JSON at ``path``."""
        Path(path).write_text(json.dumps(self.trace()))

    def __str__(self) -> str:
        return (
            f"simulated on {self.hosts} x {self.gpus} devices: "
            f"{strategy_name(self.dp, self.pp, self.tp, self.sharded)}, {self.batch} samples a "
            f"step in {self.microbatches} microbatches per replica: "
            f"{self.step_s * 1e3:.2f} ms a step, {self.peak_bytes_per_proc / 2**20:.1f} MiB "
            "on the fullest device"
        )


def strategy_name(dp: int, pp: int, tp: int, sharded: bool) -> str:
    """``"fsdp=2 x pp=2"`` style: the dims above 1, sharded replicas as ``fsdp``."""
    dims = [
        f"{'fsdp' if sharded else 'dp'}={dp}" if dp > 1 else "",
        f"pp={pp}" if pp > 1 else "",
        f"tp={tp}" if tp > 1 else "",
    ]
    return " x ".join(d for d in dims if d) or "single"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"
