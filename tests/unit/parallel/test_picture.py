"""A plan's picture: the schedule it draws and the page it writes."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from danaus.parallel import Plan, StagePlan
from danaus.parallel._picture import schedule


def _plan(pp: int, m: int, kind: str = "1f1b", times: list[float] | None = None) -> Plan:
    times = times or [0.01] * pp
    stages = tuple(
        StagePlan(2 * k, 2 * k + 1, 2**20, t, (k + 1) * 2**20, ranks=(k,))
        for k, t in enumerate(times)
    )
    return Plan(
        dp=1, pp=pp, tp=1, microbatches=m, stages=stages, schedule=kind,
        estimated_step_s=0.05, peak_bytes_per_proc=pp * 2**20, memory_per_proc=3 * 2**20,
        why="<script>alert(1)</script> & more",
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("pp", "m"), [(1, 1), (2, 2), (4, 4), (4, 8), (3, 1)])
def test_equal_stages_take_microbatches_plus_stages_minus_one_turns(
    kind: str, pp: int, m: int
) -> None:
    """The bubble the estimate counts, (m + pp - 1) x a stage's microbatch, is the one
    the simulated schedule shows."""
    ops = schedule(_plan(pp, m, kind))
    assert len(ops) == 2 * pp * m
    assert sorted((k, i, f) for k, i, f, _, _ in ops) == sorted(
        (k, i, f) for k in range(pp) for i in range(m) for f in "FB"
    )
    span = max(end for *_, end in ops)
    assert math.isclose(span, (m + pp - 1) * 0.01, rel_tol=1e-9)
    # no stage runs two ops at once; a forward follows the stage before's, a backward
    # the stage after's
    end = {(k, i, f): b for k, i, f, _, b in ops}
    for k, i, f, a, _ in ops:
        dep = (k - 1, i, "F") if f == "F" else (k + 1, i, "B")
        if dep in end:
            assert a >= end[dep] - 1e-12
    for k in range(pp):
        lane = sorted((a, b) for kk, _, _, a, b in ops if kk == k)
        assert all(b1 <= a2 + 1e-12 for (_, b1), (a2, _) in itertools.pairwise(lane))


def test_1f1b_keeps_fewer_microbatches_in_flight_than_gpipe() -> None:
    def most_in_flight(kind: str) -> int:
        ops = schedule(_plan(4, 8, kind))
        first = [(a, 1) for k, _, f, a, _ in ops if k == 0 and f == "F"]
        done = [(b, -1) for k, _, f, _, b in ops if k == 0 and f == "B"]
        live = most = 0
        for _, d in sorted(first + done, key=lambda e: (e[0], e[1])):
            live += d
            most = max(most, live)
        return most

    assert most_in_flight("1f1b") == 4 and most_in_flight("gpipe") == 8


def test_the_page_draws_every_op_escapes_text_and_is_self_contained(tmp_path: Path) -> None:
    p = _plan(2, 4, times=[0.01, 0.03])
    page = p.html()
    assert page == p._repr_html_()
    assert len(re.findall(r'class="op [FB]"', page)) == 2 * 2 * 4
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "rank 0" in page and "rank 1" in page and "blocks 2..3" in page
    # the slow second stage leaves the first idle: the bubble is named
    bubble = re.search(r"the stages idle (\d+)% of the", page)
    assert bubble and int(bubble.group(1)) > 20
    path = tmp_path / "plan.html"
    p.save_html(path)
    assert path.read_text(encoding="utf-8") == page
