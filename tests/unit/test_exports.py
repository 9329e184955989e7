"""The public surface: every name exported once. Which layer may import which, and
through which seams, are import-linter contracts (pyproject.toml, run by ``make lint``);
here, what importing a layer loads at run time."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

import danaus


@pytest.mark.parametrize(
    "module",
    [
        "danaus",
        "danaus.geometry",
        "danaus.actors",
        "danaus.actors.seam",
        "danaus.mesh",
        "danaus.mesh.seam",
        "danaus.job",
        "danaus.spmd",
        "danaus.spmd.seam",
        "danaus.parallel",
    ],
)
def test_all_names_exist_once(module: str) -> None:
    mod = importlib.import_module(module)
    names = mod.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(mod, name), f"{module}.__all__ names {name} but it is missing"


def test_monarch_names_are_exported() -> None:
    for name in [
        "Actor",
        "endpoint",
        "this_host",
        "context",
        "current_rank",
        "current_size",
        "Channel",
        "Port",
        "Future",
        "ValueMesh",
        "ActorError",
        "SupervisionError",
    ]:
        assert name in danaus.__all__


def test_the_layers_below_the_tensor_engine_load_neither_it_nor_torch() -> None:
    # At run time, where the contracts cannot see: nothing below the tensor engine imports
    # it (or torch) when imported itself; procs.activate() imports it on first use.
    program = textwrap.dedent("""
        import importlib, sys
        for name in ["danaus", "danaus.actors", "danaus.mesh", "danaus.rdma", "danaus.job",
                     "danaus.spmd", "danaus.tools.top", "danaus.tools.debug", "danaus.monarch"]:
            importlib.import_module(name)
            loaded = [m for m in ("danaus.tensor_engine", "torch") if m in sys.modules]
            assert not loaded, f"importing {name} loads {loaded}"
        print("ok")
    """)
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _imported_from(seam: str, outside: str) -> set[str]:
    """The names that modules outside package ``outside`` import from module ``seam``
    (absolutely or relatively, at the top or inside functions)."""
    import ast
    from pathlib import Path

    root = Path(danaus.__file__).parent
    names: set[str] = set()
    for path in root.rglob("*.py"):
        mod = ".".join(("danaus", *path.relative_to(root).with_suffix("").parts))
        mod = mod.removesuffix(".__init__")
        if mod == outside or mod.startswith(outside + "."):
            continue
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == seam:
                names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize(
    ("seam", "package"),
    [
        ("danaus.actors.seam", "danaus.actors"),
        ("danaus.mesh.seam", "danaus.mesh"),
        ("danaus.spmd.seam", "danaus.spmd"),
    ],
)
def test_a_seam_exports_only_what_the_layers_above_use(seam: str, package: str) -> None:
    exported = set(importlib.import_module(seam).__all__)
    used = _imported_from(seam, package)
    assert used <= exported, f"imported from {seam} but not in its __all__: {used - exported}"
    assert exported <= used, f"{seam} exports what nothing above uses: {exported - used}"


# The actor layer's seam to the layers above, in names: issue 43's target, 45 (no wire
# message type among them); it may only shrink.
ACTOR_SEAM_CEILING = 45


def test_the_actor_layers_seam_does_not_grow() -> None:
    names = importlib.import_module("danaus.actors.seam").__all__
    assert len(names) <= ACTOR_SEAM_CEILING, (
        f"danaus.actors.seam exports {len(names)} names, above its ceiling of"
        f" {ACTOR_SEAM_CEILING}: offer an operation instead of another part"
    )
