"""The benchmarks and examples import: a module moved inside danaus must not break
``make bench`` unnoticed (it runs outside the test suite)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "bench")]))


@pytest.mark.parametrize("name", BENCH)
def test_bench_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


def test_the_examples_import() -> None:
    importlib.import_module("examples.inference_server.server")
