"""``ExecutorConfig``: the address an executor gives others must be one they can reach."""

from __future__ import annotations

import pytest

from mangonel.executor.config import ExecutorConfig


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
def test_a_wildcard_bind_needs_an_advertised_address(wildcard: str) -> None:
    with pytest.raises(ValueError, match="--advertise-host"):
        ExecutorConfig(bind_host=wildcard)


def test_the_advertised_address_goes_into_the_flight_address() -> None:
    config = ExecutorConfig(bind_host="0.0.0.0", advertise_host="10.0.0.7")
    assert config.flight_host() == "10.0.0.7"
    assert ExecutorConfig(bind_host="10.0.0.8").flight_host() == "10.0.0.8"
