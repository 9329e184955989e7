"""What the tools share to attach to a controller: reading a key file."""

from __future__ import annotations


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
