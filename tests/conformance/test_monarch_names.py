"""How many of Monarch's public names the runner serves (``python -m danaus.monarch``),
and that each one it does not serve fails at import with danaus's sentence naming it.

The names are every ``__all__`` of Monarch's public modules (not ``_src``, not its Rust
bindings): read from a Monarch work tree when ``MONARCH_SRC`` names one, otherwise from
``monarch_public_names.json`` here, taken at the Monarch commit it records."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
#: served at least this many (of 151 at the recorded commit); raise it as names land
FLOOR = 140

PROBE = r"""
import importlib, json, sys
import danaus.monarch
danaus.monarch.install()
served, refused = [], {}
for module, names in json.load(sys.stdin).items():
    for name in names:
        try:
            getattr(importlib.import_module(module), name)
            served.append(f"{module}.{name}")
        except Exception as e:  # what a user's import would raise
            refused[f"{module}.{name}"] = f"{type(e).__name__}: {e}"
print(json.dumps({"served": served, "refused": refused}))
"""


def monarch_names() -> tuple[str, dict[str, list[str]]]:
    """(where they came from, module -> its public names)."""
    src = os.environ.get("MONARCH_SRC")
    if not src:
        recorded = json.loads((HERE / "monarch_public_names.json").read_text())
        return f"Monarch {recorded['monarch_commit'][:7]} (recorded)", recorded["modules"]
    root = Path(src) / "python" / "monarch"
    modules: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = rel.with_suffix("").parts
        if any(p.startswith("_") and p != "__init__" for p in parts):
            continue  # _src, _rust_bindings, private modules
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                module = ".".join(p for p in parts if p != "__init__")
                modules[module] = sorted(ast.literal_eval(node.value))
    return f"Monarch at {src}", modules


def test_the_runner_serves_monarchs_public_names_or_says_why_not() -> None:
    where, modules = monarch_names()
    total = sum(len(names) for names in modules.values())
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps(modules),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    served, refused = result["served"], result["refused"]
    print(f"{where}: the runner serves {len(served)} of {total} public names")
    for name, why in sorted(refused.items()):
        print(f"  not served: {name}: {why[:160]}")
    assert len(served) + len(refused) == total
    assert len(served) >= FLOOR
    for name, why in refused.items():
        # danaus's own sentence, naming what is missing (never "not a package" or an
        # AttributeError from deep inside)
        assert why.startswith("ImportError: danaus does not provide"), (name, why)
        parts = name.split(".")
        named = [".".join(parts[:i]) for i in range(2, len(parts) + 1)]  # it, or its module
        assert any(f"{n} " in why or f"{n}:" in why for n in named), (name, why)


MODULES_PROBE = r"""
import danaus.monarch
danaus.monarch.install()
import danaus.tensor_engine as te
from monarch import fetch
from monarch.fetch import call_on_shard_and_fetch, fetch_shard, inspect, show
assert (fetch_shard, inspect, show, call_on_shard_and_fetch) == (
    te.fetch_shard, te.inspect, te.show, te.call_on_shard_and_fetch)
try:
    from monarch.fetch import no_mesh  # Monarch's import, not one of its names
except ImportError as e:
    assert "danaus does not provide monarch.fetch.no_mesh" in str(e), e
else:
    raise AssertionError("monarch.fetch served a name it does not have")
from monarch.tools.network import AddrType, get_ipaddr, get_sockaddr
assert get_ipaddr("127.0.0.1", 80, AddrType.IPv4) == "127.0.0.1"
assert get_sockaddr("127.0.0.1", 8080) == "127.0.0.1:8080"
assert get_ipaddr("::1", 80, AddrType.IPv6) == "::1"
try:
    get_ipaddr("127.0.0.1", 80, AddrType.IPv6)
except RuntimeError as e:
    assert "no IPv6 address" in str(e), e
else:
    raise AssertionError("an IPv4 literal resolved as IPv6")
from monarch.tools.cli import main
main(["context", "ls"])  # the monarch command's verbs are danaus's
print("ok")
"""


def test_monarchs_fetch_network_and_cli_modules_are_served(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", MODULES_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # (the job verbs keep their contexts under the working directory)
        env=dict(os.environ, PYTHONPATH=str(HERE.parents[1])),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok", out.stdout
