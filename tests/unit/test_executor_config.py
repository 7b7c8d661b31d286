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
