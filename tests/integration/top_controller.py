"""A controller program for the ``danaus top`` tests, run as a subprocess.

``python -m tests.integration.top_controller [--block]`` spawns 2 procs with an actor
mesh ``busy`` (rank 1 handles more messages than rank 0) and one ``waker``, and prints one line:
``READY {"addr", "key", "pids", "actors"}``. With ``--block``, rank 0 is left running
``Busy.block`` (waiting on an event) with 3 messages queued behind it. It then waits on
its stdin and exits when that closes, releasing the blocked endpoint first.
"""

from __future__ import annotations

import argparse
import json
import sys

from danaus import this_host
from danaus.actors._process import process
from danaus.mesh._admin.server import admin_server

from .obs_actors import Busy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", action="store_true")
    ns = parser.parse_args()
    procs = this_host().spawn_procs(per_host={"procs": 2})
    busy = procs.spawn("busy", Busy)
    waker = procs.spawn("waker", Busy)  # releases rank 0's block: busy's mailbox is full
    first, second = busy.slice(procs=0), busy.slice(procs=1)
    first.ok.call_one().get(timeout=60)
    for _ in range(8):
        second.ok.call_one().get(timeout=60)
    queued = []
    if ns.block:
        queued.append(first.block.call_one())
        queued.extend(first.ok.call_one() for _ in range(3))
    server = admin_server(timeout=30)
    assert server is not None, "the controller started no admin endpoint"
    records = busy.stats().get(timeout=60).values()
    ready = {
        "addr": server.addr,
        "key": process.job_key().hex(),
        "pids": procs.pids,
        "actors": [r["actor"] for r in sorted(records, key=lambda r: r["rank"])],
    }
    print("READY", json.dumps(ready))
    sys.stdout.flush()
    sys.stdin.read()
    if queued:
        waker.slice(procs=0).release.call_one().get(timeout=60)
        for f in queued:
            f.get(timeout=60)
    procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
