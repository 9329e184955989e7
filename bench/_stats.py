"""Small statistics and table helpers shared by the benchmarks.

Samples are taken in seconds (what `time.perf_counter` differences give) and
reported in microseconds, the unit every latency figure in this project uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Stats", "format_table", "percentile", "summarize"]


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of a set of latency samples, in microseconds.

    Attributes:
        n: Number of samples.
        median_us: The 50th percentile.
        p99_us: The 99th percentile (linear interpolation between order statistics).
        mean_us: The arithmetic mean.
        min_us: The smallest sample.
    """

    n: int
    median_us: float
    p99_us: float
    mean_us: float
    min_us: float

    def __str__(self) -> str:
        return (
            f"n={self.n} median={self.median_us:.1f}us p99={self.p99_us:.1f}us "
            f"mean={self.mean_us:.1f}us min={self.min_us:.1f}us"
        )


def percentile(samples: Iterable[float], q: float) -> float:
    """Returns the `q`-th percentile of `samples`.

    Uses linear interpolation between the two nearest order statistics, the same
    definition as numpy's default (`method="linear"`), so `q=50` is the median.

    Args:
        samples: The values; need not be sorted.
        q: The percentile, between 0 and 100 inclusive.

    Raises:
        ValueError: If `samples` is empty or `q` is outside [0, 100].
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("percentile of an empty sequence")
    return _percentile_sorted(ordered, q)


def _percentile_sorted(ordered: Sequence[float], q: float) -> float:
    rank = (len(ordered) - 1) * (q / 100.0)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    frac = rank - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def summarize(samples_seconds: Sequence[float]) -> Stats:
    """Summarizes latency samples given in seconds.

    Args:
        samples_seconds: One duration per operation, in seconds.

    Returns:
        The summary, in microseconds.

    Raises:
        ValueError: If there are no samples.
    """
    if not samples_seconds:
        raise ValueError("cannot summarize an empty list of samples")
    ordered = sorted(samples_seconds)
    scale = 1e6
    return Stats(
        n=len(ordered),
        median_us=_percentile_sorted(ordered, 50.0) * scale,
        p99_us=_percentile_sorted(ordered, 99.0) * scale,
        mean_us=math.fsum(ordered) / len(ordered) * scale,
        min_us=ordered[0] * scale,
    )


def _cell(value: object) -> str:
    # Floats get a width that suits their size: thousands separators for rates,
    # two decimals for latencies, three significant digits for small ratios.
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        magnitude = abs(value)
        if magnitude >= 1000.0:
            return f"{value:,.0f}"
        if magnitude >= 1.0 or magnitude == 0.0:
            return f"{value:.2f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Formats `rows` as an aligned plain-text table.

    Numbers are right-aligned and everything else left-aligned; a column is treated
    as numeric when all its present values are numbers. A key missing from a row
    leaves its cell empty.

    Args:
        rows: One mapping per row, keyed by column name.
        columns: The columns to show, in order; also the header line.

    Returns:
        The table with a header, a rule under it, and no trailing newline.
    """
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    numeric = [
        all(_is_number(row[col]) for row in rows if row.get(col) is not None)
        and any(row.get(col) is not None for row in rows)
        for col in columns
    ]
    widths = [max([len(col), *(len(line[i]) for line in cells)]) for i, col in enumerate(columns)]

    def render(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    lines = [render(list(columns)), "  ".join("-" * w for w in widths)]
    lines.extend(render(line) for line in cells)
    return "\n".join(lines)


def on_off_table(
    got: Mapping[str, Mapping[str, Sequence[float]]],
    what: str,
    floor: str,
    targets: tuple[str, str],
) -> str:
    """The table of a switch measured on and off in alternating rounds: the median
    ``call_one`` round trip (``got[side]["lat"]``, µs) and 1,000-in-flight throughput
    (``got[side]["tput"]``, calls/s) with ``what`` on, each against its "off" median as
    the floor (column ``floor``), with ``targets`` (latency's, throughput's)."""
    import statistics

    rows = []
    for key, figure, target in (
        ("lat", f"call_one RTT us, sync endpoint, {what} on", targets[0]),
        ("tput", f"calls/s, 1000 in flight, {what} on", targets[1]),
    ):
        on, off = (statistics.median(got[side][key]) for side in ("on", "off"))
        rows.append(
            {"figure": figure, "value": on, floor: off, "ratio": on / off, "target": target}
        )
    return format_table(rows, ["figure", "value", floor, "ratio", "target"])
