"""``make bench``: every benchmark, each printing ratios against floors from the same run."""

from __future__ import annotations

from . import bench_runtime


def main() -> None:
    print("== actor runtime (issue 2) ==")
    bench_runtime.main()


if __name__ == "__main__":
    main()
