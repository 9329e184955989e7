"""monarch.config's configure() / configured() over danaus's settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from danaus.config import (
    Config,
    clear_runtime_config,
    config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    parametrize_config,
    parametrize_config_pointwise,
    runtime_env,
)


def test_configured_applies_for_the_block_then_restores() -> None:
    before = (config.stop_timeout, config.cast_fanout)
    with configured(stop_actor_timeout="1m 30s", cast_fanout=4) as merged:
        assert config.stop_timeout == 90.0 and config.cast_fanout == 4
        assert merged["stop_timeout"] == 90.0 and merged["cast_fanout"] == 4
        assert get_runtime_config() == {"stop_timeout": 90.0, "cast_fanout": 4}
        with configured(stop_timeout=0.5):
            assert config.stop_timeout == 0.5
        assert config.stop_timeout == 90.0
    assert (config.stop_timeout, config.cast_fanout) == before
    assert get_runtime_config() == {}


def test_what_configure_changed_becomes_the_variables_procs_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert runtime_env() == {}
    with configured(stop_timeout=0.1, debug_on_error=True, preload=["numpy", "json"]):
        env = runtime_env()
        assert env == {
            "DANAUS_STOP_TIMEOUT": "0.1",
            "DANAUS_DEBUG_ON_ERROR": "1",
            "DANAUS_PRELOAD": "numpy,json",
        }
        # a proc reading them gets the same settings
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        fresh = Config()
        assert (fresh.stop_timeout, fresh.debug_on_error, fresh.preload) == (
            0.1,
            True,
            ["numpy", "json"],
        )
    assert runtime_env() == {}


def test_configure_and_clear() -> None:
    before = config.spawn_wait
    try:
        configure(actor_spawn_max_idle="250ms")
        assert config.spawn_wait == 0.25
        assert get_global_config()["spawn_wait"] == 0.25
    finally:
        clear_runtime_config()
    assert config.spawn_wait == before


def test_bad_settings_name_what_is_wrong(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match=r"unknown setting 'nope'.*stop_timeout"):
        configure(nope=1)
    with pytest.raises(ValueError, match="'soon' is not a duration"):
        configure(stop_timeout="soon")
    with pytest.raises(ValueError, match="unknown time unit 'fortnights'"):
        configure(stop_timeout="2 fortnights")
    with pytest.raises(ValueError, match="use_uvloop takes True or False"):
        configure(use_uvloop="yes")
    with pytest.raises(ValueError, match="cast_fanout takes an int"):
        configure(cast_fanout="4")
    assert get_runtime_config() == {}  # nothing half-applied
    with configured(enable_log_forwarding=True):  # Monarch's, meaningless here: a warning
        pass
    assert "enable_log_forwarding" in caplog.text


# Monarch's pytest helpers (monarch.config.parametrize_config[_pointwise]), which its own
# RDMA tests use: each run inside configured(...), settings restored after. Each run checks
# itself, whatever order the tests run in.
@pytest.fixture
def left_none_behind() -> Iterator[None]:
    """After the test (and the helper's configured(...) around it): the defaults again."""
    yield
    assert (config.stop_timeout, config.mailbox_limit, config.rdma_disable_ibverbs) == (
        Config().stop_timeout,
        Config().mailbox_limit,
        Config().rdma_disable_ibverbs,
    )
    assert get_runtime_config() == {}


def _runs_of(request: pytest.FixtureRequest) -> list[dict[str, object]]:
    """The settings of every run pytest collected of this test function."""
    name = request.node.originalname
    return [
        item.callspec.params["_config_overrides"]
        for item in request.session.items
        if getattr(item, "originalname", None) == name
    ]


@parametrize_config(stop_timeout={1.0, 2.0}, mailbox_limit={10, 20})
def test_parametrize_config_runs_every_combination(
    tmp_path: object, request: pytest.FixtureRequest, left_none_behind: None
) -> None:
    mine = request.node.callspec.params["_config_overrides"]
    assert (config.stop_timeout, config.mailbox_limit) == (
        mine["stop_timeout"],
        mine["mailbox_limit"],
    )
    assert tmp_path is not None  # fixtures still arrive
    runs = sorted((r["stop_timeout"], r["mailbox_limit"]) for r in _runs_of(request))
    assert runs == [(1.0, 10), (1.0, 20), (2.0, 10), (2.0, 20)]


@parametrize_config_pointwise(stop_timeout=[1.0, 2.0], rdma_disable_ibverbs=[True, False])
async def test_parametrize_config_pointwise_runs_in_lockstep(
    request: pytest.FixtureRequest, left_none_behind: None
) -> None:
    mine = request.node.callspec.params["_config_overrides"]
    assert (config.stop_timeout, config.rdma_disable_ibverbs) == (
        mine["stop_timeout"],
        mine["rdma_disable_ibverbs"],
    )
    runs = sorted((r["stop_timeout"], r["rdma_disable_ibverbs"]) for r in _runs_of(request))
    assert runs == [(1.0, True), (2.0, False)]  # the i-th values together, not crossed


def test_pointwise_needs_as_many_values_for_every_setting() -> None:
    with pytest.raises(ValueError, match="as many values for every setting"):
        parametrize_config_pointwise(stop_timeout=[1], mailbox_limit=[1, 2])
    with pytest.raises(ValueError, match="at least one setting"):
        parametrize_config()


def test_monarchs_names_read_back_as_monarch_gives_them() -> None:
    from danaus.config import Encoding

    before = get_global_config()
    assert before["rdma_runtime_worker_threads"] == 16  # Monarch's default, kept
    assert before["default_encoding"] is Encoding.Multipart
    assert before["stop_actor_timeout"] == "5s"  # danaus's stop_timeout, Monarch's text
    with configured(
        stop_actor_timeout="1m30s",
        message_delivery_timeout="3600s",
        split_max_buffer_age="50ms",
        rdma_ibverbs_target="nic:mlx5_0 \udcff",
        read_log_buffer=16384,
        default_encoding=Encoding.Json,
    ) as merged:
        assert merged["stop_actor_timeout"] == "1m 30s" and config.stop_timeout == 90.0
        assert merged["message_delivery_timeout"] == "1h"
        assert merged["split_max_buffer_age"] == "50ms"
        assert merged["rdma_ibverbs_target"] == "nic:mlx5_0 \udcff"
        assert merged["read_log_buffer"] == 16384 and merged["default_encoding"] is Encoding.Json
        assert get_runtime_config()["read_log_buffer"] == 16384
    assert get_global_config() == before  # all back


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("host_spawn_ready_timeout", 30, "takes a duration as text"),
        ("message_delivery_timeout", "30", "Invalid duration format"),
        ("cleanup_timeout", "abc123", "Invalid duration format"),
        ("tail_log_lines", "10", "takes a int"),
        ("enable_log_forwarding", 1, "takes a bool"),
        ("default_encoding", "Json", "takes a monarch.config.Encoding"),
    ],
)
def test_monarchs_settings_refuse_what_monarch_refuses(
    setting: str, value: object, says: str
) -> None:
    with pytest.raises(TypeError, match=says):
        with configured(**{setting: value}):
            pass
    assert get_runtime_config() == {}


def test_monarchs_kept_settings_reach_procs_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from danaus.config import reread_environment, runtime_env

    with configured(rdma_ibverbs_target="nic:x", mesh_terminate_concurrency=3):
        env = runtime_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        reread_environment()  # as a proc started with that environment reads it
        assert get_global_config()["rdma_ibverbs_target"] == "nic:x"
        assert get_global_config()["mesh_terminate_concurrency"] == 3
    finally:
        monkeypatch.undo()
        reread_environment()
    assert get_global_config()["rdma_ibverbs_target"] == ""
