"""The public surface: every name exported once, and imports point down the layers only."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import danaus

ROOT = pathlib.Path(danaus.__file__).parent
LAYERS = ["actors", "mesh", "rdma", "tensor_engine"]  # a layer may import only those before it


@pytest.mark.parametrize(
    "module",
    ["danaus", "danaus.actors", "danaus.mesh", "danaus.job", "danaus.spmd", "danaus.parallel"],
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


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: imports for type checkers only
    (the actor base class names the mesh's types: what ``spawn`` returns is typed as
    the actor class), which add no dependency at run time."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = _type_checking_blocks(tree)
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = path.relative_to(ROOT).parts
            base = list(parts[: len(parts) - node.level])
            out.add(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("danaus."):
            out.add(node.module.removeprefix("danaus."))
    return out


@pytest.mark.parametrize("layer", LAYERS)
def test_layers_import_downwards_only(layer: str) -> None:
    forbidden = LAYERS[LAYERS.index(layer) + 1 :]
    for path in (ROOT / layer).rglob("*.py"):
        for target in _imports(path):
            top = target.split(".")[0]
            assert top not in forbidden, f"{path.relative_to(ROOT)} imports {target}"


def test_whole_model_parallelism_sits_on_top_and_nothing_imports_it() -> None:
    # danaus.parallel builds on actors, mesh, rdma and spmd; nothing of danaus needs it,
    # and it does not reach into the tensor engine, the runner, jobs or the tools
    for path in ROOT.rglob("*.py"):
        inside = path.relative_to(ROOT).parts[0] == "parallel"
        for target in _imports(path):
            top = target.split(".")[0]
            if inside:
                assert top not in ("tensor_engine", "monarch", "job", "tools"), (
                    f"{path} imports {target}"
                )
            else:
                assert top != "parallel", f"{path.relative_to(ROOT)} imports {target}"
