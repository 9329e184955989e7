"""A runtime's listening socket file appears only once it listens."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from danaus.actors._sockets import bind


def test_a_socket_file_appears_listening_and_alone(tmp_path: Path) -> None:
    path = tmp_path / "agent"
    sock = bind(f"unix:{path}")
    try:
        assert os.listdir(tmp_path) == ["agent"]  # no name of its own left behind
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.connect(str(path))  # listening as soon as the file is there
    finally:
        sock.close()


def test_a_socket_file_that_exists_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "agent"
    first = bind(f"unix:{path}")
    try:
        with pytest.raises(OSError, match="exists") as info:
            bind(f"unix:{path}")
        assert info.value.errno == errno.EADDRINUSE
        assert os.listdir(tmp_path) == ["agent"]
    finally:
        first.close()
