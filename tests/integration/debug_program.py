"""A controller program for the debugger tests, run as a subprocess while the test drives
``danaus debug`` in a terminal beside it.

``python -m tests.integration.debug_program ENDPOINT``: spawns two procs with a
:class:`~tests.integration.debug_actors.Paused` actor each, calls ``ENDPOINT(4)`` on both,
prints ``READY`` (with the admin endpoint up), then ``RESULT [a, b]`` or ``ERROR <type>
<message>`` when the call completes, and ends at the next line (or end) of its stdin.
"""

from __future__ import annotations

import sys

import danaus
from danaus import ActorError, this_host

from .debug_actors import Paused


def main() -> None:
    endpoint = sys.argv[1]
    procs = this_host().spawn_procs(per_host={"procs": 2})
    busy = procs.spawn("busy", Paused)
    danaus.serve_admin()  # (the tools find it through its file, there by now)
    call = getattr(busy, endpoint).call(4)
    print("READY", flush=True)
    try:
        values = call.get(timeout=120)
        print("RESULT", list(values.values()), flush=True)
    except ActorError as e:
        print("ERROR", type(e).__name__, str(e).splitlines()[0], flush=True)
    sys.stdin.readline()  # the test looks at what is left, then lets it end (or kills it)
    procs.stop().get(timeout=30)


if __name__ == "__main__":
    main()
