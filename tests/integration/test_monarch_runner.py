"""``python -m danaus.monarch prog.py`` runs Monarch-style programs unmodified."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "monarch_programs"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def test_getting_started_runs_unmodified() -> None:
    out = _run("-m", "danaus.monarch", str(PROGRAMS / "getting_started.py"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "values [1, 1]" in lines and "one 1" in lines
    # Each trainer's step incremented both counters (from 1) once, then read both: the
    # sum it saw is 4 (its own increments), 5 or 6 (the other's too); plus its rank.
    steps = next(line for line in lines if line.startswith("steps "))
    values = [int(v) for v in steps.removeprefix("steps ").strip("[]").split(",")]
    assert sorted(v % 10 for v in values) == [0, 1], steps
    assert all(4 <= v // 10 <= 6 for v in values), steps
    assert "async 3" in lines, lines  # both steps done: each counter at 3
    assert lines[-1] == "done"


def test_ping_pong_with_a_monarch_fault_hook() -> None:
    out = _run("-m", "danaus.monarch", str(PROGRAMS / "ping_pong.py"))
    assert out.returncode == 0, out.stderr
    assert "Ping got ping 2 #3" in out.stdout and "Pong got pong 2 #3" in out.stdout
    assert "faults 0" in out.stdout


def test_a_name_danaus_lacks_fails_at_import_naming_it() -> None:
    out = _run("-m", "danaus.monarch", str(PROGRAMS / "missing_name.py"))
    assert out.returncode != 0
    assert "danaus does not provide monarch.mast_reserve" in out.stderr
    assert "MAST" in out.stderr.split("monarch.mast_reserve", 1)[1]  # and why


def test_without_the_runner_monarch_is_not_danaus() -> None:
    out = _run("-c", "import danaus, monarch")
    assert out.returncode != 0 and "No module named 'monarch'" in out.stderr


def test_get_rdma_backend_answers_in_monarchs_words() -> None:
    # Monarch's get_rdma_backend() says "ibverbs", "tcp" (its fallback) or "none";
    # danaus's own names the transport ("shm" here), which Monarch programs never expect.
    prog = (
        "from monarch.rdma import get_rdma_backend, is_ibverbs_available\n"
        "import danaus.rdma\n"
        "print(get_rdma_backend(), danaus.rdma.get_rdma_backend(), is_ibverbs_available())\n"
    )
    out = _run("-c", f"import danaus.monarch as m; m.install(); exec({prog!r})")
    assert out.returncode == 0, out.stderr
    monarch_name, danaus_name, ibverbs = out.stdout.split()
    if ibverbs == "True":
        assert monarch_name == danaus_name == "ibverbs"
    else:
        assert (monarch_name, danaus_name) == ("tcp", "shm")


def test_monarch_job_serves_the_job_family_and_names_what_it_leaves_out() -> None:
    prog = (
        "from monarch.job import DEFAULT_JOB_PATH, LocalJob, exec_command, load_current_job\n"
        "from monarch.job import set_current_job\n"
        "print(DEFAULT_JOB_PATH, exec_command(LocalJob().state().hosts, ['true']).get())\n"
        "try:\n"
        "    from monarch.job.kubernetes import KubernetesJob\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = _run("-c", f"import danaus.monarch as m; m.install(); exec({prog!r})")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == ".monarch/job_state.pkl 0"
    assert "does not provide the module monarch.job.kubernetes" in second
    assert "not a package" not in second and "KubernetesJob is left out" in second


def test_a_missing_program_is_one_line_and_status_2(tmp_path: Path) -> None:
    missing = tmp_path / "nosuch.py"
    out = _run("-m", "danaus.monarch", str(missing))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"python -m danaus.monarch: can't open file '{missing}': "
        "[Errno 2] No such file or directory"
    ]
