"""A controller program on a SLURM job, run as a subprocess by the SLURM tests.

``python -m tests.integration.slurm_controller LOG_DIR [--cached PATH] [--wait]``
applies a 2-node job, spawns a proc per node, calls them, and prints one JSON line:
the job id, the agents' pids and the procs' pids. With ``--wait`` it then waits for its
stdin to close (the test SIGKILLs it there); with ``--cached`` it keeps the job in PATH
for the next controller.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from danaus.job import SlurmJob

from .slurm_actors import Node


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log_dir")
    parser.add_argument("--cached", default=None)
    parser.add_argument("--wait", action="store_true")
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--out-of-cluster", action="store_true")
    ns = parser.parse_args()
    job = SlurmJob(
        meshes={"hosts": 1},
        out_of_cluster=ns.out_of_cluster,
        exclusive=False,
        log_dir=ns.log_dir,
        job_start_timeout=30,
        idle_timeout=60,
        env={"PYTHONPATH": os.getcwd()},
    )
    job.add_mesh("others", 1)  # (Monarch's add_mesh: the same two nodes as {"hosts": 2})
    state = job.state(cached_path=ns.cached)
    hosts = state.hosts
    others = state.others
    where = []
    for mesh in (hosts, others):
        procs = mesh.spawn_procs(per_host={"procs": 1})
        where += procs.spawn("node", Node).where.call().get(timeout=30).values()
    gateway = {}
    if ns.out_of_cluster:
        from danaus.actors.seam import current_runtime
        from danaus.mesh import Shape
        from danaus.mesh._gateway import GATEWAY, Gateway
        from danaus.mesh.seam import mesh_ref

        first = job.agents[0][0]
        counts = mesh_ref(GATEWAY, Gateway, Shape.from_sizes({}), {0: first}).counts
        gateway = {"counts": counts.call_one().get(timeout=30), "addr": current_runtime().addr}
    print(
        json.dumps(
            {
                "job": job.job_id,
                "agents": [pid for _, _, pid, _ in job.agents],
                "nodes": [w["node"] for w in where],
                "procs": [w["pid"] for w in where],
                "agent_addrs": [a for a, _, _, _ in job.agents],
                "gateway": gateway,
            }
        ),
        flush=True,
    )
    if ns.wait:
        sys.stdin.read()
    if ns.kill:
        job.kill()


if __name__ == "__main__":
    main()
