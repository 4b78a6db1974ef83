"""Helpers for integration tests: realms, station configs, stations linked in one process
(``three_stations``, ``start_mesh``), agents."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from macula.agent.agent import Agent, AgentSettings
from macula.agent.presence import Profile
from macula.client.backoff import Backoff
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.store.base import StorePaths
from macula.wire.identity import Identity, realm_tag
from relay.core.policy import StationPolicy
from relay.federation.dht.station import DhtConfig
from relay.federation.links import LinkTarget
from relay.station.station import Station, StationConfig

from .identities import new_identity
from .waiting import eventually

REALM = realm_tag("org.example.integration")
OTHER_REALM = realm_tag("org.example.elsewhere")


def station_config(
    data_dir: Path, policy: StationPolicy | None = None, port: int = 0
) -> StationConfig:
    return StationConfig(
        data_dir=data_dir, port=port, policy=policy or StationPolicy(), tick_interval_s=0.05
    )


def echo(call: IncomingCall) -> object:
    """A served procedure's handler: the payload back."""
    return call.payload


# --- federation: stations linked in one process ---------------------------------------------


def target(station: Station) -> LinkTarget:
    """``station`` as a ``--peer`` entry (loopback)."""
    return LinkTarget(station.node_id, "127.0.0.1", station.port)


def linked(station: Station) -> set[bytes]:
    """The stations ``station`` holds a link with."""
    return {p.node_id for p in station.core.peers.values() if p.linked}


def fast(config: StationConfig, peers: list[LinkTarget]) -> StationConfig:
    """``config`` joining through ``peers``, redialling fast (tests)."""
    return dataclasses.replace(
        config, peers=peers, link_backoff_s=0.05, link_backoff_max_s=0.2, link_timeout_s=2.0
    )


@asynccontextmanager
async def three_stations(
    root: Path, *, c_dials_b: bool = True
) -> AsyncIterator[tuple[Station, Station, Station]]:
    """Stations a, b, c under ``root``: b joins through a, c through a (and b, unless
    ``c_dials_b`` is 0, as the README starts them); yielded once their links are up."""
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(Station(fast(station_config(root / "a"), [])))
        b = await stack.enter_async_context(Station(fast(station_config(root / "b"), [target(a)])))
        peers_of_c = [target(a), target(b)] if c_dials_b else [target(a)]
        c = await stack.enter_async_context(Station(fast(station_config(root / "c"), peers_of_c)))

        def ready() -> bool:
            if c_dials_b:
                return all(len(linked(s)) == 2 for s in (a, b, c))
            return a.node_id in linked(b) and a.node_id in linked(c)

        await eventually(ready, message="mesh not formed")
        yield a, b, c


def interest_at(station: Station, holder: Station, topic: str) -> bool:
    """``station`` holds ``holder``'s subscription to ``topic`` (interest has propagated)."""
    return holder.node_id in station.core.subscriptions.subscribers((REALM, topic.encode()))


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


# --- agents that reconnect: a quick redial, or none until woken --------------------------------

QUICK_REDIAL = Backoff(initial_s=0.05, max_s=0.2, jitter=0.1)
HELD_OFF = Backoff(initial_s=120, max_s=120, jitter=0.0)  # reconnects only when woken


@asynccontextmanager
async def member(
    station: Station, identity: Identity, home: Path, backoff: Backoff = QUICK_REDIAL
) -> AsyncIterator[Agent]:
    """An open-policy agent of ``identity`` at ``station``, said hello."""
    async with (
        Node(identity, [station.endpoint], backoff=backoff) as node,
        Agent(node, settings(home, "open")) as agent,
    ):
        await agent.hello()
        yield agent


def hex_of(agent: Agent) -> str:
    """``agent``'s node id in hex."""
    return agent.node.identity.node_id.hex()


def mesh_config(data_dir: Path, peers: list[LinkTarget]) -> StationConfig:
    return dataclasses.replace(
        station_config(data_dir),
        peers=peers,
        discover_interval_s=0.1,
        link_backoff_s=0.05,
        link_backoff_max_s=0.2,
        link_timeout_s=2.0,
        dht=DhtConfig(rpc_timeout_s=0.5),
    )


async def start_mesh(stack: AsyncExitStack, tmp_path: Path) -> tuple[Station, Station, Station]:
    """A alone, then B and C naming only A; returns once all three are linked pairwise."""
    a = await stack.enter_async_context(Station(mesh_config(tmp_path / "a", [])))
    b = await stack.enter_async_context(Station(mesh_config(tmp_path / "b", [target(a)])))
    c = await stack.enter_async_context(Station(mesh_config(tmp_path / "c", [target(a)])))
    await eventually(
        lambda: (
            linked(a) == {b.node_id, c.node_id}
            and linked(b) == {a.node_id, c.node_id}
            and linked(c) == {a.node_id, b.node_id}
        ),
        timeout=15,
        message="B and C did not link through what the DHT told them",
    )
    return a, b, c


def crash(agent: Agent) -> None:
    """Leave as a killed process would: no goodbye, no participant_left."""

    async def no_goodbye(**_: object) -> dict[str, object]:
        return {}

    agent.goodbye = no_goodbye  # type: ignore[method-assign]


async def conversation(alice: Agent, bob: Agent, purpose: str) -> str:
    """alice opens a room for ``purpose``, bob joins it, alice has heard him join; its topic."""
    opened = await alice.rooms.open(purpose)
    await bob.rooms.join(opened.room_topic)
    joined = await alice.rooms.wait(opened.room_topic, 5, after_ms=0, kinds={"participant_joined"})
    assert joined is not None
    return opened.room_topic
