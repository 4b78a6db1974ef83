"""A library caller of ``Node`` learns what the station refused without an answer on the wire
(issue 38): over a real station on loopback, a PUBLISH in a realm the station protects and an
ADVERTISE of a procedure another node serves show up in ``Node.refusals`` (its totals, and each
rise told to ``on_refusal`` listeners) once the station answered a ``_relay.ping``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from macula.node.node import Node
from macula.node.stats import Refusal
from macula.services.refusals import ADVERTISE_TAKEN, MEANING, REALM_REFUSED
from macula.wire.identity import Identity, realm_tag
from relay.core.policy import StationPolicy
from relay.realms.gate import ProtectedRealm
from relay.station.config import StationConfig
from relay.station.station import Station
from support.meshkit import echo

pytestmark = pytest.mark.anyio

PROTECTED_NAME = "org.example.guarded"
PROTECTED = realm_tag(PROTECTED_NAME)
OPEN_REALM = realm_tag("org.example.open")
PROCEDURE = "org.example.echo_v1"


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Station]:
    """A station that protects ``PROTECTED`` (its authority nobody here holds the key of)."""
    authority = Identity.generate(os.urandom).node_id
    config = StationConfig(
        data_dir=tmp_path / "guarded", port=0, policy=StationPolicy(), tick_interval_s=0.05
    )
    config.realms = [ProtectedRealm(PROTECTED_NAME, PROTECTED, authority)]
    async with Station(config) as running:
        yield running


async def test_a_publish_in_a_protected_realm_is_a_refusal_the_caller_sees(
    guarded: Station,
) -> None:
    heard: list[Refusal] = []
    async with Node(Identity.generate(os.urandom), [guarded.endpoint]) as node:
        node.refusals.on_refusal(heard.append)
        await node.publish(OPEN_REALM, "news", {"n": 1})
        assert await node.flush() == {}  # a realm it does not protect: nothing refused
        await node.publish(PROTECTED, "news", {"n": 2})
        await node.flush()
        assert heard == [Refusal(REALM_REFUSED, 1)]
        assert node.refusals.total == {REALM_REFUSED: 1}
        assert node.stats.refused == {REALM_REFUSED: 1}  # this connection's counters
        await node.publish_confirmed(PROTECTED, "news", {"n": 3})  # its ping tells too
        assert heard == [Refusal(REALM_REFUSED, 1), Refusal(REALM_REFUSED, 1)]
        assert node.refusals.total == {REALM_REFUSED: 2}
        await node.flush()  # nothing new: told once
        assert len(heard) == 2
        assert REALM_REFUSED in MEANING


async def test_advertising_a_procedure_another_node_serves_is_a_refusal_the_caller_sees(
    make_node: Callable[..., Node],
) -> None:
    async with make_node() as first, make_node() as second:
        await first.advertise(OPEN_REALM, PROCEDURE, echo)
        await first.flush()  # the station holds first's advertisement
        before = node_totals(second)
        heard: list[Refusal] = []
        second.refusals.on_refusal(heard.append)
        await second.advertise(OPEN_REALM, PROCEDURE, echo)
        await second.flush()
        assert heard == [Refusal(ADVERTISE_TAKEN, 1)]
        assert second.refusals.risen(before) == [ADVERTISE_TAKEN]
        assert second.refusals.risen(before, frozenset({REALM_REFUSED})) == []
        assert first.refusals.total == {}  # the refusal is the second node's alone


def node_totals(node: Node) -> dict[str, int]:
    return dict(node.refusals.total)
