"""Settings: one object, every field also read from a ``DANAUS_*`` environment variable."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = [
    "Config",
    "Encoding",
    "clear_runtime_config",
    "config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
    "runtime_env",
]


def _env(name: str, default: Any) -> Any:
    raw = os.environ.get(f"DANAUS_{name.upper()}")
    if raw is None:
        return default
    if isinstance(default, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, list):
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw


@dataclasses.dataclass
class Config:
    """Process-wide settings.

    Each field ``x`` can be set with the environment variable ``DANAUS_X`` (read when
    ``danaus`` is imported) or by assigning ``danaus.config.x = ...`` before use. A
    boolean's variable means true when it is ``1``, ``true``, ``yes`` or ``on``.

    Procs read the variables of the environment they are started with: the spawner's,
    plus what :func:`configure` changed, plus ``spawn_procs(env=...)``. An assignment
    applies to this process only; :func:`configure` also reaches procs spawned later and,
    at attach, host agents (as Monarch's does).
    """

    #: Largest frame a peer may send, header and parts together (bytes).
    max_frame_bytes: int = 4 << 30
    #: Largest msgspec header of a frame (bytes).
    max_header_bytes: int = 16 << 20
    #: A peer that has not finished the authentication handshake by then is dropped (s).
    #: Also bounds the handshake of RDMA tcp data connections: their owner waits this
    #: long for a reader's proof, the reader twice as long for the owner's answer.
    handshake_timeout: float = 5.0
    #: Connections a proc accepts that have not authenticated yet, at most; more are
    #: closed at once (each costs a few KiB until it authenticates).
    max_unauthenticated: int = 256
    #: Arguments and results over this many bytes travel as out-of-band frame parts.
    oob_threshold: int = 64 << 10
    #: Pending outgoing bytes on one connection after which writes are flushed at once.
    flush_bytes: int = 4096
    #: Socket buffer size for control connections (bytes).
    socket_buffer_bytes: int = 4 << 20
    #: How long dialing a peer keeps retrying while it refuses (it may be starting) (s).
    connect_timeout: float = 30.0
    #: How long an actor holds a sender's message while an earlier one is missing (it
    #: went another way, down a cast tree, and may have been lost with a failed proc) (s).
    seq_gap_timeout: float = 10.0
    #: How long a proc holds messages for an actor whose Spawn has not arrived yet (s).
    spawn_wait: float = 30.0
    #: A connection quiet this long gets a ping (s).
    heartbeat_interval: float = 2.0
    #: A peer that says nothing (not even a pong) this long is declared dead: its
    #: connection closes and calls waiting on it fail (s). Must exceed the longest time
    #: a sync endpoint blocks its proc's loop.
    heartbeat_timeout: float = 30.0
    #: How long a spawned proc may take to come up before its spawn fails (s).
    proc_start_timeout: float = 60.0
    #: How long ``stop()`` waits for procs to exit before killing them (s).
    stop_timeout: float = 5.0
    #: Hex-encoded shared secret for authenticating connections across hosts; when
    #: empty, the controller makes a fresh one per job and hands it to its procs.
    auth_key: str = ""
    #: Fan-out of the tree that casts to a mesh go down (0: the sender sends to every
    #: actor itself). Meshes up to this size are always sent to directly.
    cast_fanout: int = 16
    #: Messages an actor may have waiting before it stops reading from their senders.
    mailbox_limit: int = 10_000
    #: A dropped RDMABuffer's memory is kept alive this long, for one-sided writers that
    #: raced the drop (they are told after their write) (s).
    rdma_drop_grace: float = 2.0
    #: How many threads copy one large shm transfer (8 MiB and up) in parts at once; 0:
    #: as many as the process may run on, at most 4 (one copy alone stays under memory's
    #: bandwidth). 1: one copy, one thread.
    rdma_copy_threads: int = 0
    #: Force one data-plane backend ("ibverbs", "shm" or "tcp"); empty: best available.
    rdma_backend: str = ""
    #: Never use the ibverbs backend, even where an RDMA device is present (it then
    #: reports itself unavailable, and shm or tcp move the bytes).
    rdma_disable_ibverbs: bool = False
    #: The ibverbs device this proc uses (``mlx5_0``, ``rxe0``); empty: the first listed.
    rdma_device: str = ""
    #: Its port that queue pairs use.
    rdma_port: int = 1
    #: The GID table entry addressed on RoCE; -1: chosen from the port's table (RoCE v2
    #: over IPv4 first, as NCCL chooses). Ignored on InfiniBand.
    rdma_gid_index: int = -1
    #: Mutual TLS for TCP control connections (across hosts): this proc's certificate and
    #: key, and the CA that signed every peer's certificate (PEM paths). Empty: no TLS.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    #: Deadline of an RDMA transfer (``read_into``, ``write_from``, ``RDMAAction.submit``)
    #: whose call gives no ``timeout=``: past it the transfer fails with ``TimeoutError``
    #: (its owner frozen, overloaded or unreachable) (s).
    rdma_timeout: float = 60.0
    #: Use uvloop for event loops danaus creates, when it is importable.
    use_uvloop: bool = True
    #: How procs start: "fork" (from a per-host fork server that has imported danaus and
    #: the modules in ``preload``, in milliseconds) or "exec" (a fresh interpreter each).
    #: "fork" falls back to "exec", with a log line saying why, where forking is unsafe.
    spawn_method: str = "fork"
    #: An endpoint running longer than this is reported: the controller (the actor's
    #: spawner) logs a warning naming it, with its stack, and again at 2x, 4x, ... (s; 0:
    #: never). Checked every ``heartbeat_interval`` on the proc's loop.
    stuck_warn_after: float = 60.0
    #: An endpoint that raises stops in pdb at the frame that raised (post-mortem), before
    #: its caller gets the error, until someone attached with ``danaus debug`` continues
    #: it. Read by procs (``DANAUS_DEBUG_ON_ERROR=1`` in the controller's environment).
    debug_on_error: bool = False
    #: The controller's admin endpoint, which ``danaus top``, ``danaus dashboard --attach``
    #: and ``danaus debug`` attach to (the job key required): "auto" (a local abstract
    #: unix socket, started with the first proc mesh), "off", ``unix:@name``,
    #: ``unix:/path``, ``tcp://host:port`` or a port on 127.0.0.1.
    admin: str = "auto"
    #: Where controllers leave their admin files (address, pid, key; readable by the user
    #: only) for tools on the same host to find them. Empty: ``$XDG_RUNTIME_DIR/danaus``,
    #: else ``/tmp/danaus-<uid>``.
    runtime_dir: str = ""
    #: Keep per-actor counters (messages handled per endpoint) and the start time of each
    #: async message running, for ``mesh.stats()``, the tools and stuck-endpoint reports
    #: (which miss async endpoints without it). Off saves a dict update and a clock read
    #: per message; ``make bench`` measures the difference.
    actor_stats: bool = True
    #: How long a tensor engine collective (``reduce``) and its rendezvous wait for every
    #: worker of the mesh before failing (s): the timeout of the rendezvous store and of
    #: the gloo process groups (NCCL groups keep torch's own).
    collective_timeout: float = 300.0
    #: Log level (a ``logging`` level name: "DEBUG", "INFO", ...) of the processes danaus
    #: starts: procs, host agents and job agents. The controller's logging is the
    #: application's to configure.
    log_level: str = "WARNING"
    #: How long ``HostMesh.initialized`` (attach) waits for each host agent to take the
    #: controller's :func:`configure` settings before failing, naming the agent (s).
    attach_timeout: float = 60.0
    #: Modules the fork server imports before it forks procs (``DANAUS_PRELOAD=a,b``),
    #: besides the heavy ones of a safe list that the spawning process has imported.
    preload: list[str] = dataclasses.field(default_factory=list)
    #: Begin every Python log line with the instance that logged it, as Monarch does by
    #: default: ``[actor=procs[0].<app.Trainer trainers{'gpus': 0/2}>] ...`` in an actor,
    #: ``[actor=<root>] ...`` on the controller. Off in danaus (its procs' output already
    #: reaches the controller prefixed with the proc); ``python -m danaus.monarch`` turns
    #: it on, here and in procs, unless the variable says otherwise. Read per record.
    prefix_python_logs_with_actor: bool = False
    #: OpenTelemetry traces and metrics (the ``telemetry`` extra): a span per endpoint
    #: call in the callee, a child of the caller's span across procs, and this process's
    #: providers exporting as the ``OTEL_*`` variables say (``OTLP/HTTP`` by default).
    #: Read per call; procs read ``DANAUS_TELEMETRY`` (``configure(telemetry=True)``
    #: reaches the procs spawned later). Off, a call carries no trace context.
    telemetry: bool = False
    #: How this process's runtime and the procs it starts on this host listen (Monarch's
    #: ``default_transport``, set with ``enable_transport``): "unix" (abstract Unix
    #: sockets, reached from this machine only), "tcp(localhost)", "tcp(hostname)"
    #: (reachable from other machines), "tls" (tcp(hostname) with the ``tls_*``
    #: certificates), or an address for the controller's runtime to listen on
    #: (``tcp://host:port``; its procs then listen on ``host`` too, on ports of their own).
    #: Host agents' procs listen as their agent was told (``--listen``).
    transport: str = "unix"
    #: The loss scale a ``danaus.parallel`` trainer in fp16 starts from (torch's
    #: GradScaler's default): halved at each step whose gradients overflow (the step is
    #: skipped), doubled after 2,000 steps without. Read by the procs at setup.
    fp16_loss_scale: float = 65536.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, _env(f.name, getattr(self, f.name)))


config = Config()


# ---------------------------------------------------------------- Monarch's monarch.config


class Encoding(enum.Enum):
    """Monarch's message encodings (its ``default_encoding`` setting). danaus's frames are
    always msgspec msgpack with large buffers out of band, so ``configure`` accepts the
    setting, with a warning, and changes nothing."""

    Bincode = 0
    Json = 1
    Multipart = 2


class ChannelTransport(enum.Enum):
    """Monarch's channel transports (``monarch.actor.ChannelTransport``), as
    ``configure(default_transport=...)`` and ``enable_transport`` take them. danaus
    serves Unix, the two TCP forms and TLS (TCP with ``config.tls_*``; Meta's TLS forms
    are served as that); ``Local`` (Monarch's in-process channels) is refused: danaus's
    procs are processes."""

    TcpWithLocalhost = "tcp(localhost)"
    TcpWithHostname = "tcp(hostname)"
    MetaTlsWithHostname = "metatls(hostname)"
    MetaTlsWithIpV6 = "metatls(ipv6)"
    Tls = "tls"
    Local = "local"
    Unix = "unix"


#: enable_transport's short names (Monarch's) -> a transport
_TRANSPORT_NAMES = {
    "tcp": "tcp(hostname)",
    "ipc": "unix",
    "metatls": "metatls(ipv6)",
    "metatls-hostname": "metatls(hostname)",
    "tls": "tls",
}
_EXPLICIT = re.compile(r"^(tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}|ipc://.+|unix:.+)$")


def transport_text(value: Any) -> str:
    """The ``transport`` setting for a ``ChannelTransport``, one of its values, one of
    Monarch's short names (``"tcp"``, ``"ipc"``, ...) or an address (``tcp://host:port``,
    ``ipc:///path``, ``unix:...``).

    Raises:
        TypeError: ``value`` is not a ChannelTransport or a str.
        ValueError: it names no transport, or ``Local``.
    """
    if isinstance(value, ChannelTransport):
        text = value.value
    elif isinstance(value, str):
        text = _TRANSPORT_NAMES.get(value, value)
        if text not in {t.value for t in ChannelTransport} and not _EXPLICIT.match(text):
            raise ValueError(
                f"unknown transport {value!r}: use a ChannelTransport, one of "
                f"{sorted(_TRANSPORT_NAMES)} or an address (tcp://host:port, ipc:///path)"
            )
    else:
        raise TypeError(f"a transport is a ChannelTransport or a str, not {value!r}")
    if text == "local":
        raise ValueError(
            "ChannelTransport.Local (in-process channels) is not served: danaus's procs are "
            "processes; use Unix or TCP"
        )
    return text


def _proc_transport(text: str) -> str:
    """The transport a proc inherits: an address of the controller's own becomes the same
    host on a free port (a proc must not try to take the controller's)."""
    if text.startswith("tcp://"):
        return text.rpartition(":")[0] + ":0"
    if text.startswith(("ipc://", "unix:")):
        return "unix"
    return text


def monarch_transport(text: str) -> ChannelTransport | str:
    """The ``transport`` setting as Monarch's ``default_transport`` reads back."""
    try:
        return ChannelTransport(text)
    except ValueError:
        return text


#: Monarch setting names with a danaus equivalent: name -> (danaus field, is a duration).
_MONARCH_NAMES: dict[str, tuple[str, bool]] = {
    "codec_max_frame_length": ("max_frame_bytes", False),
    "stop_actor_timeout": ("stop_timeout", True),
    "host_spawn_ready_timeout": ("proc_start_timeout", True),
    "actor_spawn_max_idle": ("spawn_wait", True),
    "supervision_watchdog_timeout": ("heartbeat_timeout", True),
    "mesh_attach_config_timeout": ("attach_timeout", True),
}
#: Monarch settings that mean nothing here (Hyperactor's own machinery): accepted, with a
#: warning, so a Monarch program that sets them runs; ``get_global_config()`` gives back
#: what was set, else Monarch's default (None where Monarch documents none).
#: name -> (kind, Monarch's default): kinds "duration" (humantime text), "int", "bool",
#: "float", "str", "any".
_MONARCH_IGNORED: dict[str, tuple[str, Any]] = {
    "enable_log_forwarding": ("bool", False),
    "enable_file_capture": ("bool", False),
    "tail_log_lines": ("int", 0),
    "message_delivery_timeout": ("duration", "30s"),
    "process_exit_timeout": ("duration", "10s"),
    "message_ack_time_interval": ("duration", "500ms"),
    "message_ack_every_n_messages": ("int", 1000),
    "message_ttl_default": ("int", 64),
    "split_max_buffer_size": ("int", 5),
    "split_max_buffer_age": ("duration", "50ms"),
    "cleanup_timeout": ("duration", "3s"),
    "default_encoding": ("encoding", "Multipart"),
    "mesh_proc_spawn_max_idle": ("duration", "30s"),
    "channel_net_rx_buffer_full_check_interval": ("duration", "5s"),
    "channel_tcp_congestion": ("any", None),
    "message_latency_sampling_rate": ("float", 0.01),
    "enable_dest_actor_reordering_buffer": ("bool", True),
    "mesh_bootstrap_enable_pdeathsig": ("bool", True),
    # procs end as soon as their spawner does (PR_SET_PDEATHSIG, or their host agent
    # seeing the spawner's connection go): there is no orphan timeout to wait for
    "mesh_orphan_timeout": ("duration", None),
    "mesh_terminate_concurrency": ("int", 16),
    "mesh_terminate_timeout": ("duration", "10s"),
    "small_write_threshold": ("int", 256),
    "max_cast_dimension_size": ("int", 16),
    "remote_alloc_bind_to_inaddr_any": ("bool", None),
    "remote_alloc_bootstrap_addr": ("str", None),
    "remote_alloc_allowed_port_range": ("any", None),
    "read_log_buffer": ("int", 100),
    "force_file_log": ("bool", False),
    "prefix_with_rank": ("bool", True),
    "get_actor_state_max_idle": ("duration", "30s"),
    "proc_stop_max_idle": ("duration", "30s"),
    "get_proc_state_max_idle": ("duration", "1m"),
    "mesh_admin_addr": ("str", "[::]:1729"),
    "rdma_allow_tcp_fallback": ("bool", None),
    "rdma_max_chunk_size_mb": ("int", None),
    "rdma_ibverbs_target": ("str", ""),
    "rdma_peer_device_affinity": ("str", ""),
    "rdma_runtime_worker_threads": ("int", 16),
}
#: the values configure() gave the settings of _MONARCH_IGNORED (in a proc: its spawner's)
_monarch_layer: dict[str, Any] = {}
#: how a proc learns them (JSON, from runtime_env)
_MONARCH_ENV = "DANAUS_MONARCH_SETTINGS"
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
#: What configure() changed since the process started: field -> value before the change.
_runtime_layer: dict[str, Any] = {}


def reread_environment() -> None:
    """Settings as a fresh interpreter with this environment reads them (a forked proc:
    its fork server read its own environment when it imported danaus)."""
    fresh = Config()
    for f in dataclasses.fields(config):
        setattr(config, f.name, getattr(fresh, f.name))
    _monarch_layer.clear()
    _load_monarch_env()


def _load_monarch_env() -> None:
    raw = os.environ.get(_MONARCH_ENV)
    if not raw:
        return
    try:
        values = json.loads(raw)
    except ValueError:
        return  # (not ours to fail on: these settings change nothing)
    for name, value in values.items() if isinstance(values, dict) else ():
        if name in _MONARCH_IGNORED:
            kind = _MONARCH_IGNORED[name][0]
            _monarch_layer[name] = Encoding[value] if kind == "encoding" else value


def _seconds(name: str, value: Any) -> float:
    """A duration: seconds as a number, or Monarch's humantime text ("30s", "1h 30m")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    import re

    text = str(value).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*([a-z]+)|\s", "", text):
        raise ValueError(f"{name}={value!r} is not a duration: use seconds or text like '30s'")
    total = 0.0
    for number, unit in parts:
        if unit not in _DURATION_UNITS:
            raise ValueError(f"{name}={value!r}: unknown time unit {unit!r}")
        total += float(number) * _DURATION_UNITS[unit]
    return total


def _monarch_duration(name: str, value: Any) -> str:
    """Monarch's duration text, checked as Monarch checks it (a ``TypeError``)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} takes a duration as text (like '30s'), not {value!r}")
    try:
        seconds = _seconds(name, value)
        if not any(c.isalpha() for c in value):
            raise ValueError(value)
    except ValueError:
        raise TypeError(
            f"Invalid duration format for {name}: {value!r} (use text like '30s', '1m 30s')"
        ) from None
    return _humantime(seconds)


def _humantime(seconds: float) -> str:
    """Seconds as Monarch prints a duration: ``90`` -> ``"1m 30s"``, ``0.5`` -> ``"500ms"``."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    parts = []
    for unit, size in (
        ("d", 86_400 * 10**9), ("h", 3_600 * 10**9), ("m", 60 * 10**9), ("s", 10**9),
        ("ms", 10**6), ("us", 10**3), ("ns", 1),
    ):  # fmt: skip
        count, ns = divmod(ns, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts)


def _monarch_value(name: str, value: Any) -> Any:
    """A value for a setting of _MONARCH_IGNORED, checked against its kind."""
    kind = _MONARCH_IGNORED[name][0]
    if kind == "duration":
        return _monarch_duration(name, value)
    if kind == "encoding":
        if not isinstance(value, Encoding):
            raise TypeError(f"{name} takes a monarch.config.Encoding, not {value!r}")
        return value
    kinds: dict[str, type | tuple[type, ...]] = {
        "int": int,
        "bool": bool,
        "float": (int, float),
        "str": str,
    }
    expected = kinds.get(kind)
    if expected is not None and (
        not isinstance(value, expected) or (kind != "bool" and isinstance(value, bool))
    ):
        raise TypeError(f"{name} takes a {kind}, not {value!r}")
    return value


def monarch_view() -> dict[str, Any]:
    """Monarch's settings by Monarch's names, as its ``get_global_config()`` gives them:
    those danaus maps, from danaus's settings (durations as Monarch's text), and the
    others as last configured, else Monarch's default."""
    view: dict[str, Any] = {}
    for name, (field, duration) in _MONARCH_NAMES.items():
        value = getattr(config, field)
        view[name] = _humantime(value) if duration else value
    view["default_transport"] = monarch_transport(config.transport)
    for name, (kind, default) in _MONARCH_IGNORED.items():
        if kind == "encoding" and default is not None:
            default = Encoding[default]
        view[name] = _monarch_layer.get(name, default)
    return view


def _resolve(name: str, value: Any) -> tuple[str, Any] | None:
    """``(field, value)`` for a setting, ``None`` for a Monarch one ignored here."""
    fields = {f.name: f for f in dataclasses.fields(Config)}
    if name in fields:
        kind = str(fields[name].type)
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"{name} takes True or False, not {value!r}")
        if kind == "float":
            return name, _seconds(name, value)
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} takes an int, not {value!r}")
        return name, value
    if name in ("default_transport", "transport"):
        return "transport", transport_text(value)
    if name in _MONARCH_NAMES:
        target, duration = _MONARCH_NAMES[name]
        if duration:
            return target, _seconds(name, _monarch_duration(name, value))
        return target, value
    if name in _MONARCH_IGNORED:
        import logging

        _monarch_layer[name] = _monarch_value(name, value)
        logging.getLogger("danaus.config").warning(
            "configure(%s=...): a Monarch setting danaus has no use for; kept, ignored", name
        )
        return None
    raise ValueError(
        f"unknown setting {name!r}; danaus's settings are: "
        f"{', '.join(sorted(fields))} (and Monarch's {', '.join(sorted(_MONARCH_NAMES))})"
    )


def configure(**settings: Any) -> None:
    """Change settings of this process, by danaus's names (``stop_timeout=10``) or, as
    Monarch's ``monarch.config.configure``, Monarch's where danaus has an equivalent
    (``stop_actor_timeout="10s"``; durations take Monarch's text too). Monarch settings
    with no meaning here are accepted with a warning.

    As Monarch's, the settings changed reach procs spawned later (as ``DANAUS_*``
    variables in their environment: :func:`runtime_env`) and the host agents of a host
    mesh when it is attached (``HostMesh.initialized``); assigning ``danaus.config.x``
    changes this process only.

    Raises:
        ValueError: a setting is unknown, or its value has the wrong kind.
        TypeError: a Monarch setting's value has the wrong kind (as Monarch's).
    """
    resolved = [r for name, value in settings.items() if (r := _resolve(name, value)) is not None]
    for field, value in resolved:
        _runtime_layer.setdefault(field, getattr(config, field))
        setattr(config, field, value)


def get_runtime_config() -> dict[str, Any]:
    """The settings :func:`configure` changed, with their current values."""
    return {**{field: getattr(config, field) for field in _runtime_layer}, **_monarch_layer}


def runtime_env() -> dict[str, str]:
    """What :func:`configure` changed, as the ``DANAUS_*`` variables that give a proc
    started now the same settings."""
    env = {}
    for field in _runtime_layer:
        value = getattr(config, field)
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, list):
            text = ",".join(str(v) for v in value)
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        if field == "transport":
            text = _proc_transport(text)
        env[f"DANAUS_{field.upper()}"] = text
    if _monarch_layer:  # Monarch's settings kept (not used), as Monarch's procs see them
        env[_MONARCH_ENV] = json.dumps(
            {k: v.name if isinstance(v, Encoding) else v for k, v in _monarch_layer.items()},
            default=str,
        )
    return env


def get_global_config() -> dict[str, Any]:
    """Every setting's current value: danaus's, and Monarch's by Monarch's names
    (:func:`monarch_view`)."""
    return {**dataclasses.asdict(config), **monarch_view()}


def clear_runtime_config() -> None:
    """Undo every :func:`configure`: settings return to what they were before it."""
    for field, before in _runtime_layer.items():
        setattr(config, field, before)
    _runtime_layer.clear()
    _monarch_layer.clear()


@contextlib.contextmanager
def configured(**settings: Any) -> Iterator[dict[str, Any]]:
    """``with configured(stop_timeout=1): ...``: :func:`configure` for the block, then
    the previous values back (as Monarch's ``monarch.config.configured``). Yields every
    setting's value inside the block."""
    before = dict(_runtime_layer)
    monarch_before = dict(_monarch_layer)
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    try:
        configure(**settings)
        yield get_global_config()
    finally:
        for name, value in values.items():
            setattr(config, name, value)
        _runtime_layer.clear()
        _runtime_layer.update(before)
        _monarch_layer.clear()
        _monarch_layer.update(monarch_before)


_load_monarch_env()


# ------------------------------------------------------------------ for tests (pytest)


def parametrize_config(**options: Iterable[Any]) -> Callable[[Callable[..., Any]], Any]:
    """A pytest decorator: run the test once for every combination of the given values,
    each run inside ``configured(...)`` with them (Monarch's
    ``monarch.config.parametrize_config``)::

        @parametrize_config(stop_timeout={1, 5}, mailbox_limit={10, 1000})  # 4 runs
        def test_it(): ...
    """
    if not options:
        raise ValueError("parametrize_config needs at least one setting")
    names = list(options)
    combos = list(itertools.product(*(list(v) for v in options.values())))
    return _run_under(names, combos)


def parametrize_config_pointwise(**options: Sequence[Any]) -> Callable[[Callable[..., Any]], Any]:
    """Like :func:`parametrize_config`, but the i-th run takes the i-th value of every
    setting (``zip``, not every combination); every setting needs as many values
    (Monarch's ``monarch.config.parametrize_config_pointwise``)."""
    if not options:
        raise ValueError("parametrize_config_pointwise needs at least one setting")
    lengths = {name: len(list(values)) for name, values in options.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"parametrize_config_pointwise needs as many values for every setting: {lengths}"
        )
    names = list(options)
    return _run_under(names, list(zip(*(list(v) for v in options.values()), strict=True)))


def _run_under(
    names: list[str], combos: list[tuple[Any, ...]]
) -> Callable[[Callable[..., Any]], Any]:
    import pytest

    settings = [dict(zip(names, combo, strict=True)) for combo in combos]
    ids = ["-".join(f"{k}={v}" for k, v in s.items()) for s in settings]

    def decorate(fn: Callable[..., Any]) -> Any:
        sig = inspect.signature(fn)
        extra = inspect.Parameter("_config_overrides", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if inspect.iscoroutinefunction(fn):

            async def run_async(_config_overrides: dict[str, Any], *a: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return await fn(*a, **kw)

            wrapper: Callable[..., Any] = run_async
        else:

            def run_sync(_config_overrides: dict[str, Any], *a: Any, **kw: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*a, **kw)

            wrapper = run_sync
        functools.update_wrapper(wrapper, fn)
        # pytest reads the signature for fixtures: the settings come first
        wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[extra, *sig.parameters.values()]
        )
        return pytest.mark.parametrize("_config_overrides", settings, ids=ids)(wrapper)

    return decorate
