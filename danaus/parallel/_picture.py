"""A picture of a plan: one self-contained HTML page (inline SVG and CSS, no script, no
network) drawing the mesh's ranks by their dims, the stages with their blocks, the
pipeline schedule the estimate assumes (each microbatch's forward and backward on each
stage over time, so that the bubble shows), and each proc's estimated memory against its
limit. ``Plan.save_html(path)`` writes it; ``Plan.show()`` and a notebook's rich display
(``Plan._repr_html_``) show it.

The schedule is simulated from the plan's estimates: a stage's microbatch takes its
``estimated_s``, split one third forward and two thirds backward (a backward computes two
gradients for each forward product); 1F1B runs ``pp - stage - 1`` forwards before it
alternates, GPipe every forward first. The figures are the planner's, not measured.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ._layout import runs_fsdp

if TYPE_CHECKING:
    from ._plan import Plan, SimulatedPlan

#: one op of the schedule: (stage, microbatch, "F" or "B", start s, end s)
Op = tuple[int, int, str, float, float]

#: the share of a microbatch's forward + backward that is forward
FORWARD = 1 / 3


def _order(stage: int, pp: int, m: int, schedule: str) -> list[tuple[str, int]]:
    """The ops stage ``stage`` runs, in order: ("F" | "B", microbatch)."""
    if schedule == "gpipe" or pp == 1:
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(pp - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def schedule(plan: Plan | SimulatedPlan) -> list[Op]:
    """Every stage's forwards and backwards over time, as the plan's estimates have them
    (one replica: the others run the same)."""
    pp, m = plan.pp, plan.microbatches
    times = [s.estimated_s for s in plan.stages]
    done: dict[tuple[int, int, str], float] = {}
    free = [0.0] * pp
    todo = [_order(k, pp, m, plan.schedule) for k in range(pp)]
    out: list[Op] = []
    while any(todo):
        moved = False
        for k in range(pp):
            while todo[k]:
                kind, i = todo[k][0]
                # a forward waits for the stage before; a backward for the stage after
                dep = (k - 1, i, "F") if kind == "F" else (k + 1, i, "B")
                if 0 <= dep[0] < pp and dep not in done:
                    break
                start = max(free[k], done.get(dep, 0.0))
                took = times[k] * (FORWARD if kind == "F" else 1 - FORWARD)
                done[(k, i, kind)] = free[k] = start + took
                out.append((k, i, kind, start, start + took))
                todo[k].pop(0)
                moved = True
        if not moved:  # (cannot happen for these orders; a bound against a loop)
            raise RuntimeError("the schedule deadlocked")
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _grid(plan: Plan) -> str:
    """The ranks by their dims: a row per replica, a column per stage, tp ranks in a cell."""
    head = "".join(f"<th>stage {k}<br><small>blocks {s.first}..{s.last}</small></th>"
                   for k, s in enumerate(plan.stages))  # fmt: skip
    rows = []
    for d in range(plan.dp):
        cells = []
        for k in range(plan.pp):
            ranks = [plan.layout.rank(d, k, t) for t in range(plan.tp)]
            cells.append(f'<td class="ranks">{", ".join(f"rank {r}" for r in ranks)}</td>')
        rows.append(f"<tr><th>replica {d}</th>{''.join(cells)}</tr>")
    return f'<table class="grid"><tr><th></th>{head}</tr>{"".join(rows)}</table>'


def _gantt(plan: Plan, ops: list[Op]) -> str:
    """The schedule as SVG: a lane per stage, a box per op, time to the right."""
    end = max((op[4] for op in ops), default=1.0) or 1.0
    lane, left, width = 28, 70, 760
    height = lane * plan.pp + 30
    parts = [
        f'<svg class="schedule" xmlns="http://www.w3.org/2000/svg" width="{left + width + 10}" '
        f'height="{height}" viewBox="0 0 {left + width + 10} {height}">'
    ]
    for k in range(plan.pp):
        y = k * lane + 4
        parts.append(f'<text x="4" y="{y + 17}" class="lane">stage {k}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{width}" height="{lane - 6}" '
                     'class="idle"/>')  # fmt: skip
    for k, i, kind, a, b in ops:
        x, w = left + a / end * width, max(1.0, (b - a) / end * width)
        y = k * lane + 4
        parts.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane - 6}" '
            f'class="op {kind}" data-stage="{k}" data-microbatch="{i}" data-kind="{kind}">'
            f"<title>stage {k}, microbatch {i}, {'forward' if kind == 'F' else 'backward'}: "
            f"{a * 1e3:.2f}-{b * 1e3:.2f} ms</title></rect>"
        )
        if w > 14:
            parts.append(f'<text x="{x + w / 2:.1f}" y="{y + 15}" class="mb">{kind}{i}</text>')
    parts.append(
        f'<text x="{left}" y="{height - 6}" class="axis">0</text>'
        f'<text x="{left + width}" y="{height - 6}" class="axis end">{end * 1e3:.1f} ms</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _memory(plan: Plan) -> str:
    """Each stage's estimated peak per proc against the limit."""
    cap = plan.memory_per_proc or max((s.peak_bytes for s in plan.stages), default=1)
    top = max([cap, *(s.peak_bytes for s in plan.stages)]) or 1
    rows = []
    for k, s in enumerate(plan.stages):
        pct = 100 * s.peak_bytes / top
        over = " over" if plan.memory_per_proc and s.peak_bytes > plan.memory_per_proc else ""
        rows.append(
            f'<tr data-stage="{k}"><th>stage {k}</th><td class="bar"><div class="fill{over}" '
            f'style="width:{pct:.1f}%"></div></td><td class="num">{_mib(s.peak_bytes)}</td></tr>'
        )
    limit = f"limit {_mib(plan.memory_per_proc)} per proc" if plan.memory_per_proc else "no limit"
    return f'<p class="muted">{escape(limit)}</p><table class="memory">{"".join(rows)}</table>'


CSS = """
body { font: 14px/1.4 system-ui, sans-serif; color: #1d2228; margin: 16px; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin-top: 18px; }
.muted { color: #5f6670; }
table { border-collapse: collapse; } th, td { padding: 3px 8px; text-align: left; }
.grid td.ranks { background: #e3f2fd; border: 1px solid #fff; font: 12px ui-monospace, monospace; }
svg .idle { fill: #f1f3f5; } svg .op.F { fill: #1565c0; } svg .op.B { fill: #2e7d32; }
svg text { font: 11px system-ui, sans-serif; } svg .mb { fill: #fff; text-anchor: middle; }
svg .axis.end { text-anchor: end; }
.memory td.bar { width: 420px; background: #f1f3f5; }
.memory .fill { height: 14px; background: #1565c0; } .memory .fill.over { background: #d32f2f; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f5f6f8; padding: 8px; white-space: pre-wrap; }
"""


def html(plan: Plan) -> str:
    """The plan's picture: a self-contained HTML page."""
    ops = schedule(plan)
    busy = sum(b - a for _, _, _, a, b in ops)
    span = max((op[4] for op in ops), default=0.0)
    bubble = 1 - busy / (span * plan.pp) if span else 0.0
    title = f"{plan.strategy}, {plan.microbatches} microbatches"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>danaus plan: {escape(title)}</title><style>{CSS}</style></head><body>"
        f'<div class="danaus-plan"><h1>Plan: {escape(title)}</h1>'
        f'<p class="muted">estimated step {plan.estimated_step_s * 1e3:.2f} ms, peak '
        f"{_mib(plan.peak_bytes_per_proc)} per proc; {plan.precision}"
        f"{', compiled' if plan.compile else ''}"
        f"{', ' + plan.schedule + ' schedule' if plan.pp > 1 else ''}</p>"
        f"<h2>Ranks</h2>{_grid(plan)}"
        f"<h2>Pipeline schedule (one replica, estimated)</h2>"
        f'<p class="muted" id="bubble">the stages idle {bubble:.0%} of the '
        f"{span * 1e3:.2f} ms their microbatches take (the bubble); forward in blue, "
        f"backward in green</p>{_gantt(plan, ops)}"
        f"<h2>Memory per proc (estimated)</h2>{_memory(plan)}"
        f"<h2>Why</h2><pre>{escape(plan.why or 'given by hand')}</pre></div></body></html>"
    )


def simulated_trace(sim: SimulatedPlan) -> dict[str, object]:
    """:meth:`SimulatedPlan.trace` (see there). The pipeline's ops are :func:`schedule`'s,
    scaled as the step's estimate is (a typical pass, not the fastest); the gradients'
    sync starts where the estimate's critical path ends (after the last backward, or
    later where the estimate waits longer: its worst stage, or procs sharing cores) and
    the copies of each device's state (a trainer that recovers lost procs) and the
    optimizer's step follow it, so that the last event ends at ``step_s``."""
    typical = sim.typical
    ops = schedule(sim)
    us = 1e6
    sync_at, copies_at = sim.pipeline_s, sim.pipeline_s + sim.sync_s
    opt_at = copies_at + sim.copies_s
    events: list[dict[str, object]] = []
    # each device's stage, and the devices that sync their gradients together: one
    # stage's replicas, per tensor-parallel shard (its ranks are in replica-major order,
    # tp shards adjacent)
    stage_of: dict[int, int] = {}
    group_of: dict[int, list[int]] = {}
    for k, st in enumerate(sim.stages):
        for i, r in enumerate(st.ranks):
            stage_of[r] = k
            head = st.ranks[i % sim.tp]  # its shard's device in the first replica
            group_of[r] = group_of[head] if r != head else []  # (one list per group)
            group_of[r].append(r)
    syncs = sim.dp > 1 and sim.sync_s > 0
    fsdp = runs_fsdp(sim.dp, sim.pp, sim.tp, sim.sharded)
    what = "reduce-scatter and gathers" if fsdp else "all-reduce"
    for r in range(sim.hosts * sim.gpus):
        k = stage_of[r]
        st = sim.stages[k]
        host, gpu = divmod(r, sim.gpus)
        name = f"device {r} (host={host}, gpu={gpu}): stage {k}, blocks {st.first}-{st.last}"
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": name}})
        for tid, thread in enumerate(("compute", "comm")):
            events.append(
                {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": thread}}
            )
        for stage, mb, kind, start, end in ops:
            if stage == k:
                events.append(
                    {
                        "ph": "X",
                        "name": f"{'forward' if kind == 'F' else 'backward'} {mb}",
                        "cat": "compute",
                        "pid": r,
                        "tid": 0,
                        "ts": start * typical * us,
                        "dur": (end - start) * typical * us,
                    }
                )
        if syncs:
            events.append(
                {
                    "ph": "X",
                    "name": f"gradients' {what}",
                    "cat": "collective",
                    "pid": r,
                    "tid": 1,
                    "ts": sync_at * us,
                    "dur": sim.sync_s * us,
                }
            )
            # a flow from the group's first device to each other one (Perfetto draws one
            # arrow per flow id, the other device's rank)
            first, *others = group_of[r]
            for m in others if r == first else [r]:
                events.append(
                    {
                        "ph": "s" if r == first else "f",
                        "bp": "e",
                        "id": m,
                        "name": "collective",
                        "cat": "collective",
                        "pid": r,
                        "tid": 1,
                        "ts": sync_at * us,
                    }
                )
        if sim.copies_s:
            events.append(
                {
                    "ph": "X",
                    "name": "state copied",
                    "cat": "copies",
                    "pid": r,
                    "tid": 0,
                    "ts": copies_at * us,
                    "dur": sim.copies_s * us,
                }
            )
        events.append(
            {
                "ph": "X",
                "name": "optimizer step",
                "cat": "compute",
                "pid": r,
                "tid": 0,
                "ts": opt_at * us,
                "dur": sim.optimizer_s * us,
            }
        )
        events.append(
            {"ph": "C", "name": "memory", "pid": r, "ts": 0, "args": {"bytes": st.peak_bytes}}
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
