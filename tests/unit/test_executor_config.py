"""``ExecutorConfig``: the address an executor gives others must be one they can reach."""

from __future__ import annotations

import pytest

from mangonel import defaults
from mangonel.executor.config import ExecutorConfig
from mangonel.executor.main import parse_args


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_a_wildcard_bind_needs_an_advertised_address(wildcard: str) -> None:
    with pytest.raises(ValueError, match="--advertise-host"):
        ExecutorConfig(bind_host=wildcard)


def test_the_advertised_address_goes_into_the_flight_address() -> None:
    config = ExecutorConfig(bind_host="0.0.0.0", advertise_host="10.0.0.7")
    assert config.flight_host() == "10.0.0.7"
    assert ExecutorConfig(bind_host="10.0.0.8").flight_host() == "10.0.0.8"


def test_the_fetch_timeout_is_an_option_with_the_shared_default() -> None:
    assert ExecutorConfig().fetch_timeout_s == defaults.FETCH_TIMEOUT_S
    assert parse_args([]).fetch_timeout_s == defaults.FETCH_TIMEOUT_S
    assert parse_args(["--fetch-timeout", "4.5"]).fetch_timeout_s == 4.5
    with pytest.raises(ValueError, match="fetch_timeout_s"):
        ExecutorConfig(fetch_timeout_s=0)


def test_threads_per_slot_share_the_cores_the_executor_may_use() -> None:
    # ``--cores`` (a container's quota, say) in place of the host's count.
    assert ExecutorConfig(slots=2, cores=8).threads_per_slot == 4
    assert ExecutorConfig(slots=4, cores=2).threads_per_slot == 1  # at least one
    assert ExecutorConfig(slots=2, cores=8, threads=3).threads_per_slot == 3
    assert parse_args(["--cores", "6", "--slots", "3"]).threads_per_slot == 2
    assert ExecutorConfig(slots=2).cores_available >= 1
    with pytest.raises(ValueError, match="cores must be at least 1"):
        ExecutorConfig(cores=0)
