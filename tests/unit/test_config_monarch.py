"""monarch.config's configure() / configured() over danaus's settings."""

from __future__ import annotations

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
# RDMA tests use: each run inside configured(...), settings restored after.
_seen: list[tuple[object, ...]] = []


@parametrize_config(stop_timeout={1.0, 2.0}, mailbox_limit={10, 20})
def test_parametrize_config_runs_every_combination(tmp_path: object) -> None:
    _seen.append(("cross", config.stop_timeout, config.mailbox_limit))
    assert tmp_path is not None  # fixtures still arrive


@parametrize_config_pointwise(stop_timeout=[1.0, 2.0], rdma_disable_ibverbs=[True, False])
async def test_parametrize_config_pointwise_runs_in_lockstep() -> None:
    _seen.append(("zip", config.stop_timeout, config.rdma_disable_ibverbs))


def test_the_parametrized_runs_saw_their_settings_and_left_none_behind() -> None:
    assert sorted(s for s in _seen if s[0] == "cross") == [
        ("cross", 1.0, 10),
        ("cross", 1.0, 20),
        ("cross", 2.0, 10),
        ("cross", 2.0, 20),
    ]
    assert [s for s in _seen if s[0] == "zip"] == [("zip", 1.0, True), ("zip", 2.0, False)]
    assert config.stop_timeout == Config().stop_timeout


def test_pointwise_needs_as_many_values_for_every_setting() -> None:
    with pytest.raises(ValueError, match="as many values for every setting"):
        parametrize_config_pointwise(stop_timeout=[1], mailbox_limit=[1, 2])
    with pytest.raises(ValueError, match="at least one setting"):
        parametrize_config()
