"""The ``danaus`` command: ``danaus host-agent``, ``danaus new-key``, ``danaus rdma-bench``."""

from __future__ import annotations

import argparse
import secrets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="danaus", description="danaus command-line tools")
    sub = parser.add_subparsers(dest="cmd", required=True)
    agent = sub.add_parser("host-agent", help="run a host agent that starts procs on this host")
    agent.add_argument("--listen", required=True, help="tcp://ADDR:PORT to listen on")
    agent.add_argument("--key-file", default=None,
                       help="file holding the job key as hex (default: $DANAUS_AUTH_KEY)")
    sub.add_parser("new-key", help="print a fresh random job key (hex)")
    bench = sub.add_parser("rdma-bench", help="RDMA data-plane microbenchmark (see --help)",
                           add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.cmd == "host-agent":
        from .mesh._host_agent import main_host_agent

        main_host_agent(ns.listen, ns.key_file)
    elif ns.cmd == "new-key":
        print(secrets.token_hex(32))
    elif ns.cmd == "rdma-bench":
        from .rdma.bench import main as bench_main

        bench_main(ns.rest)


if __name__ == "__main__":
    main()
