"""Helpers for integration tests: realms, identities, station configs."""

from __future__ import annotations

import os
from pathlib import Path

from macula.wire.identity import Identity, realm_tag
from relay.policy import StationPolicy
from relay.station import StationConfig

REALM = realm_tag("org.example.integration")
OTHER_REALM = realm_tag("org.example.elsewhere")


def new_identity() -> Identity:
    return Identity.generate(os.urandom)


def station_config(
    data_dir: Path, policy: StationPolicy | None = None, port: int = 0
) -> StationConfig:
    return StationConfig(
        data_dir=data_dir, port=port, policy=policy or StationPolicy(), tick_interval_s=0.05
    )
