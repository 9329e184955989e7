"""The ``danaus`` command: ``danaus host-agent``, ``danaus new-key``, ``danaus run``,
``danaus rdma-bench``, ``danaus top``, ``danaus dashboard``, ``danaus debug``, and the job
verbs ``danaus apply``, ``exec``, ``info``, ``kill`` and ``context``."""

from __future__ import annotations

import argparse
import secrets
import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["run"]:  # torchrun's flags, parsed by the runner
        from .spmd.seam import main_run

        sys.exit(main_run(args[1:]))
    if args[:1] == ["rdma-bench"]:  # its own options, parsed by the benchmark
        from .rdma.bench import main as bench_main

        bench_main(args[1:])
        return
    if args[:1] == ["top"]:  # its own options, parsed by the tool
        from .tools.top import main as top_main

        sys.exit(top_main(args[1:]))
    if args[:1] == ["dashboard"]:  # its own options, parsed by the dashboard
        from .tools.dashboard import main as dashboard_main

        dashboard_main(args[1:])
        return
    if args[:1] == ["debug"]:  # its own options, parsed by the tool
        from .tools.debug import main as debug_main

        sys.exit(debug_main(args[1:]))
    parser = argparse.ArgumentParser(prog="danaus", description="danaus command-line tools")
    sub = parser.add_subparsers(dest="cmd", required=True)
    agent = sub.add_parser("host-agent", help="run a host agent that starts procs on this host")
    agent.add_argument(
        "--listen",
        required=True,
        help="tcp://ADDR:PORT to listen on (or unix:/path, ipc:///path: this machine only)",
    )
    agent.add_argument(
        "--key-file",
        default=None,
        help="file holding the job key as hex (default: $DANAUS_AUTH_KEY)",
    )
    sub.add_parser("new-key", help="print a fresh random job key (hex)")
    sub.add_parser("run", help="run a torchrun-style script on procs (danaus run --help)")
    sub.add_parser("rdma-bench", help="RDMA data-plane microbenchmark (danaus rdma-bench --help)")
    sub.add_parser("top", help="a live terminal view of a running controller (danaus top --help)")
    sub.add_parser("dashboard", help="a live dashboard of a running job (danaus dashboard --help)")
    sub.add_parser("debug", help="drive the actors paused in pdb (danaus debug --help)")
    from .job.cli import add_parsers
    from .job.cli import main as job_main

    add_parsers(sub)
    ns = parser.parse_args(args)
    if getattr(ns, "verb", None) is not None:
        sys.exit(job_main(ns))
    if ns.cmd == "host-agent":
        from .mesh.seam import main_host_agent

        main_host_agent(ns.listen, ns.key_file)
    elif ns.cmd == "new-key":
        print(secrets.token_hex(32))


if __name__ == "__main__":
    main()
