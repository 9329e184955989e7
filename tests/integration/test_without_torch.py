"""torch is an extra: with no importable torch, the actor, mesh and RDMA layers work, and
the tensor engine says what is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    from danaus import this_host
    from tests.integration.values_actors import NoTorch

    with this_host().spawn_procs(per_host={"procs": 2}) as procs:
        nt = procs.spawn("nt", NoTorch)
        got = nt.double.call(np.arange(100_000)).get(timeout=60)
        assert all((v == np.arange(100_000) * 2).all() for v in got.values())
        buf = nt.slice(procs=1).buffer.call_one(1 << 20).get(timeout=60)
        dst = np.zeros(1 << 20, dtype=np.uint8)
        buf.read_into(dst).get(timeout=60)
        assert (dst == np.arange(1 << 20, dtype=np.uint8)).all()
        assert nt.torch_loaded.call().get(timeout=60).values() == [False, False]
    assert "torch" not in sys.modules
    try:
        import danaus.tensor_engine
    except ImportError as e:
        print("tensor engine:", e)
    else:
        raise AssertionError("the tensor engine imported without torch")
    print("ok")
""")


def test_everything_but_the_tensor_engine_runs_without_torch(tmp_path: Path) -> None:
    # A `torch` that cannot be imported, first on the path of the controller and procs.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        'raise ImportError("torch is not installed here")\n'
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "ok"
    assert "needs torch" in lines[-2] and "danaus[torch]" in lines[-2]
