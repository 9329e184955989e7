"""``python -m danaus.monarch prog.py [args...]``: run a Monarch program on danaus."""

from __future__ import annotations

import os
import runpy
import sys

from ._hook import install


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: python -m danaus.monarch prog.py [args...]\n"
            "Runs a program written for Monarch (import monarch.actor, monarch.rdma) on "
            "danaus, unmodified."
        )
        sys.exit(0 if args else 2)
    try:  # as `python nosuch.py` answers: one line, status 2
        with open(args[0], "rb"):
            pass
    except IsADirectoryError:
        pass  # a folder with a __main__.py runs as python runs it
    except OSError as e:
        print(
            f"python -m danaus.monarch: can't open file {os.path.abspath(args[0])!r}: "
            f"[Errno {e.errno}] {e.strerror}",
            file=sys.stderr,
        )
        sys.exit(2)
    install()
    sys.argv = list(args)
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
