"""Station bounds of issue 11 over real QUIC: a flood of forged frames costs counters and O(1)
log lines, long names are refused, nothing but one stream and 64 KiB before CONNECT, control
frames at most 1 MiB (content streams keep the full size), a per-address connection cap, and
QUIC Retry off loopback. Each hostile case ends with the honest pair still served.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from macula.node.node import Node
from macula.wire.codes import ErrorCode
from macula.wire.frames import Subscribe
from macula.wire.framing import frame_bytes
from macula.wire.identity import Identity
from relay.core.policy import StationPolicy
from relay.station.station import Station
from support.hostilekit import call_frame, honest_pair, ping_works
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.rawclient import raw_client, stamp
from support.waiting import eventually

pytestmark = pytest.mark.anyio


def relay_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("macula")]


@pytest.mark.parametrize("batches", [4, pytest.param(40, marks=pytest.mark.slow)])
async def test_forged_frames_cost_counters_not_log_lines(
    batches: int,
    station: Station,
    make_node: Callable[..., Node],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """500 forged SUBSCRIBEs per batch (20,000 in the slow run)."""
    caplog.set_level(logging.INFO)
    async with honest_pair(make_node) as pair, raw_client(station) as raw:
        forger = Identity.generate(os.urandom)
        before = len(relay_lines(caplog))
        for batch in range(batches):
            data = b"".join(
                Subscribe(**stamp(), topic=f"t{batch}.{n}", realm=REALM, subscriber=raw.node_id)
                .signed_by(forger)
                .encode()
                for n in range(500)
            )
            raw.send_bytes(data)
            await raw.flush(30)  # the station read all of it
        assert station.core.stats["unverified_frame"] == 500 * batches
        await ping_works(raw)
        await pair.check()
        assert len(relay_lines(caplog)) - before <= 2


async def test_long_names_are_refused_and_a_call_is_answered(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with honest_pair(make_node), raw_client(station) as raw:
        long = "x" * 300
        raw.send(Subscribe(**stamp(), topic=long, realm=REALM, subscriber=raw.node_id))
        call = call_frame(raw.node_id, procedure=long, realm=REALM)
        raw.send(call)
        error = await raw.reply_to(call.call_id)
        assert (error["frame_type"], error["code"]) == ("error", ErrorCode.UNKNOWN_ERROR)
        assert error["detail"] == b"bad_request: name too long"
        assert station.core.stats["name_too_long"] == 2
        await ping_works(raw)


async def test_a_second_stream_before_connect_closes_the_connection(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with honest_pair(make_node), raw_client(station, handshake=False) as raw:
        raw.send(call_frame(raw.node_id))  # the control stream: counted, not answered
        raw.send(call_frame(raw.node_id), stream=raw.new_stream())
        await raw.wait_lost()
        assert raw.frames() == []


async def test_more_than_64_kib_before_connect_closes_the_connection(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with honest_pair(make_node), raw_client(station, handshake=False) as raw:
        raw.send_bytes((1 << 20).to_bytes(4, "big") + b"\xa0" * 70_000)  # never a whole frame
        await raw.wait_lost()


async def test_control_frames_are_bounded_and_content_streams_keep_the_full_size(
    station: Station, make_node: Callable[..., Node]
) -> None:
    big = os.urandom(1_500_000)
    async with honest_pair(make_node):
        async with raw_client(station) as raw:
            content = raw.new_stream()
            call = call_frame(raw.node_id, payload={"pad": big})
            raw.send(call, stream=content)
            reply = (await raw.expect(lambda r: r.frame.get("call_id") == call.call_id, 10)).frame
            assert reply["frame_type"] == "result"
            raw.send(call_frame(raw.node_id, payload={"pad": big}))  # the control stream
            await raw.wait_lost(10)
        async with raw_client(station) as raw:
            # a hostile control frame, 1 MiB of nested arrays, is refused as soon as it is read
            chain = b"\x81" * 97 + b"\x00"
            count = ((1 << 20) - 16) // len(chain)
            body = b"\xa1\x61k\x9a" + count.to_bytes(4, "big") + chain * count
            raw.send_bytes(frame_bytes(body))
            await raw.wait_lost(10)
            assert station.core.stats["framing_errors"] == 2


async def test_connections_over_the_per_address_cap_are_refused(tmp_path: Path) -> None:
    policy = StationPolicy(max_connections_per_address=3)
    async with Station(station_config(tmp_path / "station", policy)) as station:

        def make_node() -> Node:
            return Node(new_identity(), [station.endpoint])

        async with honest_pair(make_node), raw_client(station) as first:
            with pytest.raises(ConnectionError, match="too many connections from this address"):
                async with raw_client(station):
                    pass
            await ping_works(first)
            assert station.core.stats["connections_over_address_cap"] >= 1
        # the slots come free when those connections go
        await eventually(lambda: not station.core.caps.by_address, timeout=10)
        async with raw_client(station) as again:
            await ping_works(again)


async def test_quic_retry_is_on_off_loopback_and_honest_clients_pass_it(tmp_path: Path) -> None:
    config = station_config(tmp_path / "station")
    config.host = "0.0.0.0"
    async with Station(config) as station:
        assert station.retry is True
        endpoint = f"{station.node_id.hex()}@127.0.0.1:{station.port}"

        def make_node() -> Node:
            return Node(new_identity(), [endpoint])

        async with honest_pair(make_node):
            pass
    assert not Station(station_config(tmp_path / "other")).retry  # loopback: no Retry
    off = station_config(tmp_path / "off", StationPolicy(quic_retry=False))
    off.host = "0.0.0.0"
    assert not Station(off).retry
