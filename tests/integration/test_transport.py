"""enable_transport / configure(default_transport=...): how the controller and its
local procs listen (Monarch's ChannelTransport)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from danaus import ChannelTransport
from danaus.config import config, configured, get_global_config, runtime_env

PROGRAM = textwrap.dedent(
    """
    import socket, sys
    from danaus import Actor, ChannelTransport, context, endpoint, enable_transport, this_host
    from danaus.actors.seam import current_runtime

    class Where(Actor):
        @endpoint
        def addr(self) -> str:
            return context().actor_instance.proc_addr

    enable_transport({transport!r})
    procs = this_host().spawn_procs(per_host={{"procs": 2}})
    where = procs.spawn("where", Where)
    print("CONTROLLER", current_runtime().addr)
    for a in where.addr.call().get(timeout=60).values():
        print("PROC", a)
    enable_transport({transport!r})  # the same again: a no-op
    try:
        enable_transport(ChannelTransport.Unix if {transport!r} != "ipc" else "tcp")
    except RuntimeError as e:
        print("REFUSED", e)
    procs.stop().get(timeout=30)
    """
)


def run(transport: str) -> tuple[str, list[str], str]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(transport=transport)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    controller = next(line.split(" ", 1)[1] for line in lines if line.startswith("CONTROLLER"))
    procs = [line.split(" ", 1)[1] for line in lines if line.startswith("PROC")]
    refused = next(line for line in lines if line.startswith("REFUSED"))
    return controller, procs, refused


@pytest.mark.parametrize(
    ("transport", "prefix"),
    [
        ("tcp", "tcp://"),
        (ChannelTransport.TcpWithLocalhost.value, "tcp://127.0.0.1:"),
        ("ipc", "unix:@"),
    ],
)
def test_the_controller_and_its_procs_listen_as_the_transport_says(
    transport: str, prefix: str
) -> None:
    controller, procs, refused = run(transport)
    assert controller.startswith(prefix), controller
    assert len(procs) == 2 and all(p.startswith(prefix) for p in procs), procs
    assert len(set(procs)) == 2
    assert "must come before any other danaus call" in refused


def test_monarchs_default_transport_setting_maps_to_danaus_transport() -> None:
    assert get_global_config()["default_transport"] is ChannelTransport.Unix
    with configured(default_transport=ChannelTransport.TcpWithHostname) as c:
        assert config.transport == "tcp(hostname)"
        assert c["default_transport"] is ChannelTransport.TcpWithHostname
        assert runtime_env()["DANAUS_TRANSPORT"] == "tcp(hostname)"
    with configured(default_transport="tcp://127.0.0.1:8080") as c:
        assert c["default_transport"] == "tcp://127.0.0.1:8080"
        # a proc must not try to take the controller's own port
        assert runtime_env()["DANAUS_TRANSPORT"] == "tcp://127.0.0.1:0"
    assert config.transport == "unix"
    for bad in ("invalid://scheme", "random_string", "tcp://no-port"):
        with pytest.raises(ValueError, match="unknown transport"):
            configure_transport(bad)
    for bad_type in (42, {}, None):
        with pytest.raises(TypeError, match="ChannelTransport or a str"):
            configure_transport(bad_type)
    with pytest.raises(ValueError, match="in-process channels"):
        configure_transport(ChannelTransport.Local)


def configure_transport(value: object) -> None:
    with configured(default_transport=value):
        pass


def test_tls_transports_need_the_certificates() -> None:
    from danaus.actors.seam import listen_address

    with configured(default_transport=ChannelTransport.Tls):
        with pytest.raises(ValueError, match="set tls_cert"):
            listen_address(proc=True)
