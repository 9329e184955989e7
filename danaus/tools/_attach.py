"""What the tools share to attach to a controller: their ``--attach`` and ``--key-file``
options, and reading a key file."""

from __future__ import annotations

import argparse


def add_attach_options(parser: argparse.ArgumentParser) -> None:
    """``--attach ADDR`` and ``--key-file F``, as every tool takes them."""
    parser.add_argument(
        "--attach",
        metavar="ADDR",
        default=None,
        help="the controller's admin address (unix:@name, unix:/path, tcp://host:port); "
        "default: the newest controller of this user on this host",
    )
    parser.add_argument(
        "--key-file",
        metavar="F",
        default=None,
        help="file holding the job key as hex (default: the controller's admin file, "
        "else $DANAUS_AUTH_KEY)",
    )


def read_key(prog: str, path: str) -> bytes:
    """The job key in the file ``path`` (hex, as ``danaus new-key`` prints it); a clear
    exit, naming ``prog``, where it cannot be read or is not hex."""
    try:
        with open(path) as f:
            return bytes.fromhex(f.read().strip())
    except OSError as e:
        raise SystemExit(f"{prog}: cannot read the key file {path}: {e.strerror}") from None
    except ValueError:
        raise SystemExit(f"{prog}: the key file {path} does not hold a hex key") from None
