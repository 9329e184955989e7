"""What a worker shuts when its step fails or it lets go of its piece (a repair in
place): the TCP connections opened while it joined its process groups, and nothing
else; shut for writing, so that whoever waits at the other end fails at once."""

from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("torch")

from danaus.parallel._worker import _opened_since, _shut, _sockets, _tcp_ports


def test_the_connections_opened_since_are_found_and_shut_for_writing() -> None:
    kept = socket.create_server(("127.0.0.1", 0))
    old = socket.create_connection(kept.getsockname())
    before = _sockets()
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    pair = socket.socketpair()  # (a unix socket: danaus's own kind here, never shut)
    try:
        opened = _opened_since(before)
        assert client.fileno() in opened and accepted.fileno() in opened
        assert server.fileno() not in opened  # (listening: nothing waits on it)
        assert old.fileno() not in opened  # (open before: not the groups')
        assert pair[0].fileno() not in opened and pair[1].fileno() not in opened
        _shut({client.fileno(): opened[client.fileno()]})
        accepted.settimeout(10)
        assert accepted.recv(1) == b""  # the other end sees it closed, at once
        with pytest.raises(BrokenPipeError):
            client.sendall(b"x")
        accepted.sendall(b"y")  # (and it can still read: its own loop does not fail)
        client.settimeout(10)
        assert client.recv(1) == b"y"
    finally:
        for s in (kept, old, server, client, accepted, *pair):
            s.close()


def test_a_descriptor_closed_and_reused_is_not_shut() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    first = socket.create_connection(server.getsockname())
    a, _ = server.accept()
    fd = first.fileno()
    stale = {fd: os.fstat(fd).st_ino}
    second = socket.create_connection(server.getsockname())
    b, _ = server.accept()
    os.dup2(second.fileno(), fd)  # (the number now another socket's, as after a reuse)
    try:
        assert os.fstat(fd).st_ino != stale[fd]
        _shut(stale)
        second.sendall(b"z")  # not shut: another socket now
        b.settimeout(10)
        assert b.recv(1) == b"z"
    finally:
        for s in (server, a, first, second, b):
            s.close()


def test_a_port_is_read_from_a_tcp_address_only() -> None:
    assert _tcp_ports(["tcp://127.0.0.2:4242"]) == {4242}
    assert _tcp_ports(["tcp://[::1]:80"]) == {80}
    assert _tcp_ports(["unix:@danaus-abc"]) == set()
    assert _tcp_ports(["tcp://host:nope"]) == set()
