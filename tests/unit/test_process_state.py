"""scripts/process_state.py: which module-level names hold mutable process state."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "process_state.py"


def _load() -> object:
    spec = importlib.util.spec_from_file_location("process_state", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_holders_are_mutable_module_names_and_globals_not_constants(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text(
        "import threading, collections\n"
        "__all__ = ['x']\n"
        "LIMIT = 3\n"
        "NAMES = ('a', 'b')\n"
        "_seen: dict[str, int] = {}\n"
        "_queue = collections.deque()\n"
        "_tls = threading.local()\n"
        "def f():\n"
        "    global _server\n"
        "    _server = 1\n"
    )
    holders = _load().holders(src)  # type: ignore[attr-defined]
    assert holders == ["_seen (5)", "_queue (6)", "_tls (7)", "_server (9)"]


def test_the_layers_stay_within_the_ceiling() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "module-level holders of mutable state" in out.stdout.splitlines()[-1]
