"""What a peer station is held to, over real QUIC on loopback: a raw connection with the
station capability bit plays the peer (honest or hostile), a real Station is checked.

- the replay window of a link is kept per signer: interleaved frames of many clients, their
  clocks apart, all pass, and a replayed one is still refused;
- a link's EVENTs are paced by a token bucket: a flooding peer is slowed (its control stream
  paused), an honest client of the station is not starved, and nothing is lost;
- links other stations open count toward ``max_inbound_links``: one over is refused with a
  clear reason; a client never counts, a linked station relinking is not refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.wire.codes import ErrorCode
from macula.wire.frames import Call, Event, publication_signable
from macula.wire.identity import Identity
from relay.core.policy import Quotas, StationPolicy
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.rawclient import link_in, raw_client, stamp
from support.waiting import eventually

pytestmark = pytest.mark.anyio

COUNT = "org.example.count_v1"


@asynccontextmanager
async def station_with(tmp_path: Path, policy: StationPolicy) -> AsyncIterator[Station]:
    async with Station(station_config(tmp_path / "station", policy)) as station:
        yield station


def call_by(client: Identity, n: int, skew_ms: int) -> Call:
    stamped = stamp(skew_ms)
    return Call(
        **stamped,
        call_id=os.urandom(16),
        procedure=COUNT,
        realm=REALM,
        payload=n,
        deadline_ms=time.time_ns() // 1_000_000 + 20_000,
        caller=client.node_id,
    )


# --- the replay window of a link ----------------------------------------------------------


async def test_interleaved_calls_of_many_clients_over_a_link_all_pass_and_a_replay_does_not(
    tmp_path: Path,
) -> None:
    # windows of 20 ids: a per-connection window would refuse the late clients' frames. The
    # serving node's own window holds its 50 RESULTs: a handler answered inline sends them
    # within one millisecond, and a window that forgets an id makes its sent_at_ms a floor that
    # every later frame of the same millisecond would be refused at (honest, but indistinguishable)
    policy = dataclasses.replace(
        StationPolicy(), replay_cache_per_link=20, replay_cache_per_node=64
    )
    async with (
        station_with(tmp_path, policy) as station,
        Node(new_identity(), [station.endpoint]) as server,
        raw_client(station, handshake=False) as peer,
    ):
        served: list[int] = []

        def count(call: IncomingCall) -> int:
            served.append(call.payload)
            return int(call.payload)

        await server.advertise(REALM, COUNT, count)
        await server.flush()
        assert (await link_in(peer))["accepted"] == "true"
        clients = [new_identity() for _ in range(10)]
        sent: list[tuple[Call, bytes]] = []
        for n in range(5):  # round robin; client i's clock runs i seconds behind
            for i, client in enumerate(clients):
                call = call_by(client, n * 10 + i, skew_ms=-1_000 * i + n)
                sent.append((call, peer.send(call, signer=client)))
        replies = [await peer.reply_to(call.call_id) for call, _ in sent]
        assert [r["frame_type"] for r in replies] == ["result"] * 50
        assert sorted(served) == sorted(call.payload for call, _ in sent)
        assert station.core.stats["unverified_frame"] == 0

        replayed, data = sent[-1]  # the very same bytes again, over the link
        peer.send_bytes(data)
        refused = await peer.expect(
            lambda r: r.frame_type == "error" and r.frame.get("call_id") == replayed.call_id
        )
        assert refused.frame["code"] == ErrorCode.SIGNATURE_INVALID
        assert b"replayed" in refused.frame["detail"]
        first, data = sent[0]  # long forgotten from a window of 20: its signer's floor holds
        peer.send_bytes(data)
        await peer.expect(
            lambda r: r.frame_type == "error" and r.frame.get("call_id") == first.call_id
        )
        await peer.flush()
        assert len(served) == 50 and station.core.stats["unverified_frame"] == 2


# --- a flooding peer station ----------------------------------------------------------------


def signed_event(station: Identity, publisher: Identity, topic: str, seq: int) -> Event:
    payload = {"n": seq}
    return Event(
        **stamp(),
        topic=topic,
        realm=REALM,
        publisher=publisher.node_id,
        seq=seq,
        payload=payload,
        publisher_sig=publisher.sign(
            publication_signable(topic, REALM, publisher.node_id, seq, payload)
        ),
    ).signed_by(station)


async def test_a_flooding_peer_station_is_slowed_and_cannot_starve_an_honest_client(
    tmp_path: Path,
) -> None:
    # well under what a loaded machine relays (300-640 EVENTs/s measured at load 10, on either
    # QUIC backend): at 300/s the flood sometimes never outran the link's rate, nothing paused
    rate = 100.0
    quotas = dataclasses.replace(Quotas(), station_event_rate=rate, station_event_burst=rate)
    policy = dataclasses.replace(StationPolicy(), quotas=quotas)
    flood = 400  # four seconds' worth at the link's rate
    async with (
        station_with(tmp_path, policy) as station,
        Node(new_identity(), [station.endpoint]) as subscriber,
        Node(new_identity(), [station.endpoint]) as honest,
        raw_client(station, handshake=False) as hostile,
    ):
        flooded = await subscriber.subscribe(REALM, "flooded", buffer=4 * flood)
        mine = await subscriber.subscribe(REALM, "honest")
        await subscriber.flush()
        assert (await link_in(hostile))["accepted"] == "true"
        publisher = new_identity()
        data = b"".join(
            signed_event(hostile.identity, publisher, "flooded", seq).encode()
            for seq in range(1, flood + 1)
        )
        started = time.monotonic()
        hostile.send_bytes(data)
        await eventually(lambda: station.core.stats["links_paused"] > 0, timeout=10)
        # while the link waits, the honest client is served: its event is through while the
        # flood is still being paced (not behind all of it)
        await honest.flush()
        await honest.publish(REALM, "honest", "still here")
        assert (await mine.next(10)).payload == "still here"
        assert station.core.stats["relayed_events_received"] < flood  # the flood is paced
        # backpressure, not loss: every EVENT arrives, at about the link's rate
        got = [(await flooded.next(10)).payload["n"] for _ in range(flood)]
        took = time.monotonic() - started
        assert got == list(range(1, flood + 1))
        assert took >= (flood - rate) / rate * 0.8, f"{flood} EVENTs in {took:.2f} s"
        print(f"flood: {flood} EVENTs paced over {took:.2f} s")


# --- inbound links ---------------------------------------------------------------------------


async def test_an_inbound_link_over_the_bound_is_refused_with_a_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = dataclasses.replace(StationPolicy(), max_inbound_links=2)
    async with (
        station_with(tmp_path, policy) as station,
        raw_client(station, handshake=False) as first,
        raw_client(station, handshake=False) as second,
        raw_client(station, handshake=False) as third,
        raw_client(station) as client,  # a client is no link: it never counts
    ):
        assert (await link_in(first))["accepted"] == "true"
        assert (await link_in(second))["accepted"] == "true"
        with caplog.at_level("INFO", logger="macula.relay"):
            refused = await link_in(third)
        assert refused["accepted"] == "false"
        assert refused["refusal_code"] == ErrorCode.UPSTREAM_CONGESTION
        assert "too many inbound links (max_inbound_links 2)" in caplog.text
        await asyncio.wait_for(third.lost.wait(), 5)
        assert station.core.stats["inbound_links_refused"] == 1
        await client.flush()
        # the first one relinking (a newer handshake of a linked station) is not refused
        async with raw_client(station, handshake=False) as again:
            again.identity = first.identity
            assert (await link_in(again))["accepted"] == "true"
        second.protocol.close_connection("gone")
        await eventually(lambda: len(station.core.linked_stations()) <= 1)
        async with raw_client(station, handshake=False) as later:
            assert (await link_in(later))["accepted"] == "true"  # room again
