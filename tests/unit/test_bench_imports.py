"""The benchmarks and examples import: a module moved inside danaus must not break
``make bench`` unnoticed (it runs outside the test suite)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
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


def _imports_from_danaus(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` of every ``from danaus... import name`` in ``path``, also
    those inside functions (which importing the module does not run)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "danaus" or node.module.startswith("danaus."):
                out += [(node.lineno, node.module, a.name) for a in node.names]
    return out


@pytest.mark.parametrize(
    "path",
    sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_names_bench_and_examples_take_from_danaus_exist(path: Path) -> None:
    missing = [
        f"{path.name}:{line}: {module}.{name}"
        for line, module, name in _imports_from_danaus(path)
        if not hasattr(importlib.import_module(module), name)
        and importlib.util.find_spec(f"{module}.{name}") is None
    ]
    assert not missing, f"names that danaus no longer has: {missing}"
