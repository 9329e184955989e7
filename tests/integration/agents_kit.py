"""Host agents for the multi-host tests: real ``danaus host-agent`` processes on this
machine, each on its own address, started and stopped around a test."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence

__all__ = ["Agent", "controller_key", "host_agents"]

#: an agent's listening address, as it printed it, and its process
Agent = tuple[str, "subprocess.Popen[str]"]


@contextlib.contextmanager
def host_agents(
    listens: Sequence[str], envs: Sequence[Mapping[str, str]], *, stderr: int | None = None
) -> Iterator[list[Agent]]:
    """Start one host agent per address of ``listens`` (``tcp://ADDR:0`` picks a port),
    with the environment at the same index of ``envs``; yield each once it listens, then
    terminate them and wait (bounded) for them to exit."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "danaus", "host-agent", "--listen", listen],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=dict(env),
        )
        for listen, env in zip(listens, envs, strict=True)
    ]
    try:
        agents = []
        for listen, p in zip(listens, procs, strict=True):
            assert p.stdout is not None
            line = p.stdout.readline()  # printed once it listens
            scheme = "tcp://" if listen.startswith("tcp://") else "unix:"
            assert f"listening on {scheme}" in line, (
                line,
                p.stderr.read() if p.stderr and p.poll() is not None else "",
            )
            agents.append((line.split()[-1], p))
        yield agents
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()


@contextlib.contextmanager
def controller_key(key: str) -> Iterator[None]:
    """Run this controller with the job key ``key`` (hex), as agents started with it
    expect (the local procs it starts meanwhile get it too); the previous key after."""
    from danaus.actors._process import process
    from danaus.config import config

    old = config.auth_key, process.job_key()
    config.auth_key = key
    process.set_job_key(bytes.fromhex(key))
    try:
        yield
    finally:
        config.auth_key = old[0]
        process.set_job_key(old[1])
