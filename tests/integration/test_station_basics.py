"""Station over real QUIC: handshake, pinning, pub/sub, RPC routing (PROTOCOL.md §5-§7)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from macula.errors import BrokenError, ClosedError, HandshakeError, MeshError
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.stations import StationAddress
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import OTHER_REALM, REALM
from support.waiting import eventually

pytestmark = pytest.mark.anyio


async def test_handshake_pins_the_station_key(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with make_node() as node:
        assert node.connected
        session = await node.session()
        assert session.station_key == station.node_id
    wrong = StationAddress("127.0.0.1", station.port, bytes(32))
    with pytest.raises(HandshakeError, match="certificate key"):
        async with Node(new_identity(), [wrong]):
            pass


async def test_unreachable_station_is_a_clear_error() -> None:
    from macula.client.backoff import Backoff

    node = Node(
        new_identity(),
        ["127.0.0.1:9"],
        connect_timeout=0.3,
        backoff=Backoff(initial_s=0.01, first_connect_attempts=1),
    )
    with pytest.raises(BrokenError, match="no station reachable"):
        async with node:
            pass


async def test_pubsub_with_realm_isolation_and_self_delivery(
    make_node: Callable[..., Node],
) -> None:
    async with make_node() as alice, make_node() as bob:
        bob_sub = await bob.subscribe(REALM, "news")
        bob_other = await bob.subscribe(OTHER_REALM, "news")
        alice_sub = await alice.subscribe(REALM, "news")
        await bob.flush()
        await alice.flush()
        seq = await alice.publish(REALM, "news", {"n": 1})
        got = await bob_sub.next(2)
        assert (got.payload, got.seq, got.publisher, got.authenticated) == (
            {"n": 1},
            seq,
            alice.identity.node_id,
            True,
        )
        assert (await alice_sub.next(2)).seq == seq  # the publisher receives its own publish
        # an event routed to bob precedes the answer to his ping on his control stream
        await alice.flush()
        await bob.flush()
        assert bob_other.delivered == 0  # same topic, other realm: nothing


async def test_two_hundred_subscriptions_on_one_connection(make_node: Callable[..., Node]) -> None:
    async with make_node() as sub_node, make_node() as pub_node:
        subs = [await sub_node.subscribe(REALM, f"topic.{i}") for i in range(200)]
        await sub_node.flush()
        for i in range(200):
            await pub_node.publish(REALM, f"topic.{i}", i)
        for i, sub in enumerate(subs):
            assert (await sub.next(5)).payload == i


async def test_rpc_forward_no_route_and_handler_error(make_node: Callable[..., Node]) -> None:
    async with make_node() as provider, make_node() as caller:

        def echo(call: IncomingCall) -> object:
            if call.payload == "boom":
                raise ValueError("boom happened")
            return {"echo": call.payload, "caller": call.caller}

        await provider.advertise(REALM, "org.example.echo_v1", echo)
        await provider.flush()
        result = await caller.call(REALM, "org.example.echo_v1", {"m": 1})
        assert result == {"echo": {"m": 1}, "caller": caller.identity.node_id}
        with pytest.raises(MeshError) as error:
            await caller.call(REALM, "org.example.echo_v1", "boom")
        assert (error.value.code, error.value.detail) == (0x0F, "handler_error")  # text stays home
        with pytest.raises(MeshError) as no_route:
            await caller.call(REALM, "org.example.nobody_v1", {})
        assert no_route.value.code == 0x01 and no_route.value.retryable
        with pytest.raises(MeshError):
            await caller.call(OTHER_REALM, "org.example.echo_v1", {})  # realm-scoped


async def test_provider_gone_mid_call_answers_the_caller(make_node: Callable[..., Node]) -> None:
    async with make_node() as caller:
        provider = make_node()
        started = asyncio.Event()

        async def slow(call: IncomingCall) -> object:
            started.set()
            await asyncio.Event().wait()  # never answers; cancelled when the provider closes
            return None

        await provider.__aenter__()
        await provider.advertise(REALM, "org.example.slow_v1", slow)
        await provider.flush()
        pending = asyncio.create_task(caller.call(REALM, "org.example.slow_v1", {}, timeout=10))
        await started.wait()
        await provider.__aexit__(None, None, None)
        with pytest.raises(MeshError) as error:
            await pending
        assert error.value.code == 0x01
        assert "provider disconnected" in (error.value.detail or "")


async def test_same_identity_newest_connection_wins(make_node: Callable[..., Node]) -> None:
    identity = new_identity()
    async with make_node(identity) as first:
        states: list[str] = []
        first.on_state(states.append)
        async with make_node(identity) as second:
            await eventually(lambda: states[-1:] == ["disconnected"])
            assert second.connected
            assert not first.connected
            with pytest.raises(ClosedError, match="connected elsewhere"):
                await first.call(REALM, "x", {})
            assert states[-1] == "disconnected"
