"""Helpers for integration tests: realms, identities, station configs."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from macula.agent.agent import Agent, AgentSettings
from macula.agent.presence import Profile
from macula.node import Node
from macula.store.base import StorePaths
from macula.wire.identity import Identity, realm_tag
from relay.policy import StationPolicy
from relay.station import Station, StationConfig

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


def settings(home: Path, policy: str | None, *, serve_rings: bool = True) -> AgentSettings:
    home.mkdir(parents=True, exist_ok=True)
    policy_file = home / "contact_policy.json"
    if policy is not None:
        policy_file.write_text(json.dumps({"contact_policy": policy}))
    paths = StorePaths(home / "roster.sqlite3", home / "transcript.sqlite3", home / "rings.sqlite3")
    return AgentSettings(
        paths=paths,
        policy_file=policy_file,
        serve_rings=serve_rings,
        profile=Profile(operator_name=home.name, interval_seconds=10),
    )


@asynccontextmanager
async def agent_in(
    station: Station, home: Path, policy: str | None = "ask", **kw: bool
) -> AsyncIterator[Agent]:
    async with (
        Node(new_identity(), [station.endpoint]) as node,
        Agent(node, settings(home, policy, **kw)) as a,
    ):
        yield a
