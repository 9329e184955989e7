"""The accuracy bench's own arithmetic (``python -m bench.bench_plan_accuracy``): the rank
correlation it reports, and the spread of a layout's measured step between recorded runs,
which bounds how close any estimate can be shown to be."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.bench_plan_accuracy import spearman, spread


def test_spearman_ranks_with_ties() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # a tie shares its mean rank: ranks (0, 1.5, 1.5, 3) against (0, 1, 2, 3)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


def _record(path: Path, steps: dict[tuple[int, int, int, int, bool], float]) -> str:
    rows = [(layout, (8,), 0.5, 1, s, 1) for layout, s in steps.items()]
    path.write_bytes(pickle.dumps({"GPT-2": {"rows": rows}}))
    return str(path)


def test_spread_names_the_layout_that_moved_most_between_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = (4, 1, 1, 1, True), (1, 4, 1, 4, False)
    runs = [
        _record(tmp_path / "1.pkl", {a: 0.700, b: 0.400}),
        _record(tmp_path / "2.pkl", {a: 0.950, b: 0.420}),
        _record(tmp_path / "3.pkl", {a: 0.800, b: 0.410}),
    ]
    spread(runs)
    out = capsys.readouterr().out
    # a: 0.95 / 0.70 - 1 = 36%; b: 5%; their median 20%
    assert "GPT-2: 2 layouts measured in 3 runs" in out
    assert "differed by 20% at the median, at most 36%" in out
    assert "fsdp=4 x pp=1 x tp=1, 1 microbatches: 700, 950, 800 ms" in out
    # a layout missing from a run is left out, and none left is said
    spread([runs[0], _record(tmp_path / "4.pkl", {})])
    assert "no layout measured in every run" in capsys.readouterr().out
