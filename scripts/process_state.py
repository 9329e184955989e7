"""Module-level mutable state of the actor and mesh layers, by name (``make lint``).

A holder is a module-level name bound to a mutable value (a dict, list, set, deque,
``WeakSet``/``WeakValueDictionary``, ``threading.local``, a ``ContextVar`` or a
``dataclass`` instance made at import) or rebound by a ``global`` statement in a function.
Constants (upper-case names of immutable values, ``__all__``, type aliases, loggers) are
not holders. The aim (issue 43) is one owner object per layer plus constants; until then
the count may not grow past ``CEILING``: ``python scripts/process_state.py`` lists the
holders and exits 1 above it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("danaus/actors", "danaus/mesh")
#: the holders counted when this check began; lower it as they move into owners
CEILING = 2

_MUTABLE_CALLS = {
    "dict",
    "list",
    "set",
    "deque",
    "defaultdict",
    "OrderedDict",
    "Counter",
    "WeakSet",
    "WeakValueDictionary",
    "WeakKeyDictionary",
    "local",
    "ContextVar",
    "Lock",
    "RLock",
    "Event",
    "Condition",
    "count",
}


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
    return ""


def _mutable(value: ast.expr | None) -> bool:
    if value is None:
        return False
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return _call_name(value) in _MUTABLE_CALLS


def holders(path: Path) -> list[str]:
    """The holders of one module: ``name (line)`` each."""
    tree = ast.parse(path.read_text(), str(path))
    out: dict[str, int] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name) and t.id != "__all__" and _mutable(value):
                out.setdefault(t.id, node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                out.setdefault(name, node.lineno)
    return [f"{name} ({line})" for name, line in sorted(out.items(), key=lambda p: p[1])]


def main() -> int:
    total = 0
    modules = 0
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            found = holders(path)
            if found:
                modules += 1
                total += len(found)
                print(f"{path.relative_to(ROOT)}: {', '.join(found)}")
    print(f"{total} module-level holders of mutable state in {modules} modules (ceiling {CEILING})")
    if total > CEILING:
        print(
            f"more than {CEILING}: put new process state in its layer's owner object, "
            "not in a module",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
