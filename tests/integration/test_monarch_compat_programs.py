"""Monarch programs run the way Monarch runs them: in a fresh interpreter or through the
runner (``python -m danaus.monarch``), and against workers and host agents in other
processes (run_worker_loop_forever, attach_to_workers, attach_to_hosts). Actors and
endpoints: test_monarch_compat.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_activate_imports_the_tensor_engine_on_demand() -> None:
    # A fresh interpreter: nothing imported danaus.tensor_engine before activate().
    program = textwrap.dedent("""
        import sys
        import torch
        from danaus import this_host
        assert "danaus.tensor_engine" not in sys.modules
        with this_host().spawn_procs(per_host={"procs": 1}) as procs:
            with procs.activate():
                x = torch.ones(3) * 2
            from danaus.tensor_engine import inspect
            print(inspect(x).tolist())
    """)
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[2.0, 2.0, 2.0]"


def test_a_program_using_more_monarch_names_runs_through_the_runner() -> None:
    program = Path(__file__).parent / "monarch_programs" / "more_names.py"
    out = subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "extent {hosts: 2, gpus: 2} True" in lines
    assert "joined [1, 2, 3, 4]" in lines
    assert "where [\"{'a': 0} of {'a': 2}\", \"{'a': 1} of {'a': 2}\"]" in lines
    assert (
        "ranked [(0, \"{'hosts': 0} of {'hosts': 2}\"), (1, \"{'hosts': 1} of {'hosts': 2}\")]"
        in lines
    )
    assert "helpers ['helper 0', 'helper 1', 'helper 2', 'helper 3']" in lines
    assert "concurrent_endpoint concurrent_endpoint" in lines  # monarch.actor.concurrent
    assert lines[-1] == "done"


def test_run_worker_loop_forever_and_attach_to_workers() -> None:
    key = os.urandom(32).hex()
    env = dict(os.environ, DANAUS_AUTH_KEY=key, PYTHONPATH=str(ROOT))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from danaus import run_worker_loop_forever; "
            "run_worker_loop_forever(address='tcp://127.0.0.2:0', ca='trust_all_connections')",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert "listening on tcp://" in line, line
        program = textwrap.dedent(f"""
            from danaus import attach_to_workers
            from tests.integration.compat_actors import Ranks
            hosts = attach_to_workers(workers=["{line.split()[-1]}"], ca="trust_all_connections")
            with hosts.spawn_procs(per_host={{"gpus": 2}}) as procs:
                ranks = procs.spawn("ranks", Ranks)
                print([w["own"] for w in ranks.who.call().get(timeout=60).values()])
        """)
        out = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == (
            "[{'hosts': 0, 'gpus': 0}, {'hosts': 0, 'gpus': 1}]"
        )
    finally:
        worker.terminate()
        worker.wait(30)
        if worker.stdout is not None:
            worker.stdout.close()


def _run_program(name: str) -> subprocess.CompletedProcess[str]:
    program = Path(__file__).parent / "monarch_programs" / name
    return subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_crawler_pattern_runs_through_the_runner() -> None:
    out = _run_program("crawler.py")
    assert out.returncode == 0, out.stderr
    # Pages 0..39 are within depth 3 of page 0 (1 + 3 + 9 + 27); each is crawled once.
    assert "Finished - Found 40 (seen 40)." in out.stdout
    lines = out.stdout.splitlines()
    assert lines[-5] == "ValueMesh({procs: 4}):"
    assert sum(int(line.rsplit(": ", 1)[1]) for line in lines[-4:]) == 40
    found = {line.split("found page ")[1].split()[0] for line in lines if "found page" in line}
    assert found == {str(p) for p in range(40)}
    # The crawlers' last get() timed out and failed later, at stop: nobody is told twice.
    assert "never retrieved" not in out.stderr, out.stderr


@pytest.mark.slow
def test_the_grpo_pattern_runs_through_the_runner() -> None:
    out = _run_program("grpo.py")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    losses = [line for line in lines if line.startswith("[Step ")]
    assert [line[:9] for line in losses] == [f"[Step {i:02d}]" for i in range(5)]
    assert all(math.isfinite(float(line.split("loss=")[1])) for line in losses)
    assert "weights in sync True" in lines  # pulled from the learner over RDMA
    assert "scored 12" in lines  # 2 generators x (1 + 5 steps)
    assert lines[-1] == "Training complete"


def test_attach_to_hosts_after_local_procs_already_run(tmp_path: Path) -> None:
    agent_key = os.urandom(32).hex()
    key_file = tmp_path / "key"
    key_file.write_text(agent_key)
    agent_env = dict(os.environ, DANAUS_AUTH_KEY=agent_key, PYTHONPATH=str(ROOT))
    agent = subprocess.Popen(
        [sys.executable, "-m", "danaus", "host-agent", "--listen", "tcp://127.0.0.2:0"],
        stdout=subprocess.PIPE,
        text=True,
        env=agent_env,
    )
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert "listening on tcp://" in line, line
        program = textwrap.dedent(f"""
            import asyncio
            import numpy as np
            from danaus import attach_to_hosts, this_host
            from tests.integration.compat_actors import Client, Ranks
            from tests.conformance.test_rdma import Owner, _expected

            async def main():
                async with this_host().spawn_procs(per_host={{"procs": 1}}) as local:
                    mine = await local.spawn("mine", Ranks)  # runs with this job's own key
                    hosts = attach_to_hosts(["{line.split()[-1]}"], key_file="{key_file}")
                    async with hosts.spawn_procs(per_host={{"gpus": 2}}) as remote:
                        ranks = await remote.spawn("ranks", Ranks)
                        print([w["own"] for w in (await ranks.who.call()).values()])
                        owner = await remote.slice(gpus=1).spawn("owner", Owner)
                        buf = await owner.make.call_one("b", 1000)
                        dst = np.empty(1000, np.uint8)
                        await buf.read_into(dst)
                        print("rdma over tcp", dst.tobytes() == _expected(1000))
                        clients = await remote.spawn("clients", Client)
                        got = (await clients.register_async.call()).values()
                        print("singleton", sorted(got))
                    print("local", (await mine.who.call_one())["own"])

            asyncio.run(main())
        """)
        env = dict(os.environ, PYTHONPATH=str(ROOT), DANAUS_RDMA_BACKEND="tcp")
        env.pop("DANAUS_AUTH_KEY", None)
        out = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines()[-4:] == [
            "[{'hosts': 0, 'gpus': 0}, {'hosts': 0, 'gpus': 1}]",
            "rdma over tcp True",
            "singleton [101, 102]",  # get_or_spawn_controller from the agents' procs
            "local {'procs': 0}",
        ]
    finally:
        agent.terminate()
        agent.wait(30)
        if agent.stdout is not None:
            agent.stdout.close()


def test_a_program_using_monarch_spmd_runs_through_the_runner() -> None:
    program = Path(__file__).parent / "monarch_programs" / "spmd_env.py"
    out = subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["all_reduce [3.0, 3.0]", "done"]


@pytest.mark.slow
def test_the_distributed_tensors_pattern_runs_through_the_runner() -> None:
    program = Path(__file__).parent / "monarch_programs" / "distributed_tensors.py"
    out = subprocess.run(
        [sys.executable, "-m", "danaus.monarch", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for line in [
        "inspect (3, 4)",
        "obj (3, 3)",
        "failed as expected: RemoteException",
        "RECOVERED!",
        "reduce ok True",
        "2d {'dp': 2, 'tp': 2}",
        "3d {'dp': 1, 'pp': 2, 'tp': 2}",
        "pipeline (3, 4)",
        "trained True",
        "simulated 4 ['comms', 'main'] 4",
        "overlap helps True",
    ]:
        assert line in lines, (line, out.stdout)
    assert lines[-1] == "done"
