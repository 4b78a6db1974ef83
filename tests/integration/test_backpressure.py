"""Backpressure, not loss (issue 11): paused reading pushes back through QUIC flow control, a
publisher over its rate is slowed (every event still delivered), a subscriber that does not
keep up is closed as a slow consumer and learns the gap, and refusals the protocol cannot
answer in-band are readable through ``Node.flush``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import tools.server.server
from macula.node.node import Node
from macula.quic import backend as quic_backend
from macula.quic.transport import ALPN, FrameProtocol, client_configuration, dial
from macula.wire import cbor
from macula.wire.framing import frame_bytes
from relay.core.policy import Quotas, StationPolicy
from relay.station.station import Station
from relay.station.tls import ensure_certificate
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.waiting import eventually
from tools.groups import pubsub
from tools.server import surface

pytestmark = pytest.mark.anyio

WINDOW = 64 * 1024


# --- the transport: a paused stream gets no credit -------------------------------------------


class Collect:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.ended = asyncio.Event()

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        self.frames += frames

    def framing_failed(self, stream_id: int, error: object) -> None:
        raise AssertionError(error)

    def stream_ended(self, stream_id: int) -> None:
        self.ended.set()

    def stream_reset(self, stream_id: int) -> None:
        raise AssertionError("reset")

    def connection_lost(self, reason: str) -> None:
        pass


@asynccontextmanager
async def quic_pair(tmp_path: Path) -> AsyncIterator[tuple[FrameProtocol, list[FrameProtocol]]]:
    """A bare QUIC server and a client dialled to it, both with a 64 KiB stream window."""
    from macula.quic.backend import QuicConfiguration, serve

    identity = new_identity()
    cert, key = ensure_certificate(tmp_path, identity, ["127.0.0.1", "localhost"])
    quic = QuicConfiguration(is_client=False, alpn_protocols=[ALPN], max_stream_data=WINDOW)
    quic.load_cert_chain(cert, key)
    accepted: list[FrameProtocol] = []

    def protocol(connection: Any, **kwargs: Any) -> FrameProtocol:
        made = FrameProtocol(connection, **kwargs)
        made.credit.window = WINDOW
        made.sink = Collect()
        accepted.append(made)
        return made

    server = await serve("127.0.0.1", 0, configuration=quic, create_protocol=protocol)
    port = server._transport.get_extra_info("sockname")[1] if server._transport else 0
    configuration = client_configuration(server_name="localhost")
    configuration.max_stream_data = WINDOW
    try:
        async with dial("127.0.0.1", port, configuration) as client:
            client.credit.window = WINDOW
            yield client, accepted
    finally:
        server.close()


@pytest.mark.skipif(
    quic_backend.BACKEND == "qh3",
    reason="qh3 grants credit natively: its bound is in test_quic_backend_bounds.py",
)
async def test_a_paused_stream_blocks_its_sender_after_one_window_and_loses_nothing(
    tmp_path: Path,
) -> None:
    async with quic_pair(tmp_path) as (client, accepted):
        assert client.credit.installed
        stream = client.new_stream()
        frame = frame_bytes(cbor.encode({"n": 0, "pad": b"x" * 1000}))
        client.send(stream, frame)
        server = (await eventually(lambda: accepted))[0]
        sink = server.sink
        assert isinstance(sink, Collect)
        await eventually(lambda: sink.frames)
        server.pause_reading(stream)
        total = 1000  # about 1 MiB: sixteen windows
        for n in range(1, total):
            client.send(stream, frame_bytes(cbor.encode({"n": n, "pad": b"x" * 1000})))
        client.end_stream(stream)
        # the sender is held back by flow control: most of it waits unsent at the client
        await eventually(lambda: client.queued_bytes(stream) > 8 * WINDOW)
        await eventually(lambda: server.held_bytes(stream) > WINDOW // 2)
        for _ in range(5):
            await asyncio.sleep(0.02)  # (polling) nothing more is granted while paused
            assert server.held_bytes(stream) <= WINDOW
            assert len(sink.frames) == 1
        server.resume_reading(stream)
        await asyncio.wait_for(sink.ended.wait(), 10)
        assert [f["n"] for f in sink.frames] == list(range(total))
        assert client.queued_bytes(stream) == 0


# --- the station -----------------------------------------------------------------------------


@pytest.fixture
async def slow_station(tmp_path: Path) -> AsyncIterator[Station]:
    quotas = Quotas(publish_rate=200.0, publish_burst=100.0, max_outbound_bytes=32 * 1024)
    policy = StationPolicy(quotas=quotas)
    async with Station(station_config(tmp_path / "station", policy)) as running:
        yield running


@pytest.fixture
def node_at(slow_station: Station) -> Callable[[], Node]:
    return lambda: Node(new_identity(), [slow_station.endpoint])


async def test_a_publisher_at_three_times_its_rate_is_slowed_and_nothing_is_lost(
    slow_station: Station, node_at: Callable[[], Node]
) -> None:
    async with node_at() as publisher, node_at() as subscriber, node_at() as honest:
        sub = await subscriber.subscribe(REALM, "fast")
        honest_sub = await subscriber.subscribe(REALM, "calm")
        await subscriber.flush()
        loop = asyncio.get_running_loop()
        started = loop.time()
        total = 600  # 3 s of tokens at 200/s, sent within about one second
        for n in range(total):
            await publisher.publish(REALM, "fast", {"n": n})
            if n % 60 == 59:
                await asyncio.sleep(0.1)  # (pacing the sender) 600/s: three times its rate
        # an honest publisher on the same station is served meanwhile
        await honest.publish(REALM, "calm", {"n": 0})
        assert (await honest_sub.next(5)).payload == {"n": 0}
        got = [(await sub.next(15)).payload["n"] for _ in range(total)]
        assert got == list(range(total))  # every event, in order
        assert loop.time() - started >= 2.0  # slowed to about the rate (burst 100 + 200/s)
        assert sub.missed == 0 and sub.gaps == 0
        stats = slow_station.core.stats
        assert stats["publishers_paused"] > 0
        assert stats["publish_rate_limited"] == 0
        refused = await publisher.flush()
        assert refused.get("publish_slowed", 0) > 0
        assert publisher.stats.refused == refused
        assert await honest.flush() == {}


async def test_a_subscriber_that_does_not_keep_up_is_closed_as_slow_consumer_and_learns_it(
    slow_station: Station, node_at: Callable[[], Node]
) -> None:
    async with node_at() as publisher, node_at() as slow, node_at() as honest:
        slow_sub = await slow.subscribe(REALM, "feed")
        honest_sub = await honest.subscribe(REALM, "feed")
        await slow.flush()
        await honest.flush()
        session = await slow.session()
        transport: Any = session.protocol._transport
        transport.pause_reading()  # the slow client stops reading its socket
        try:
            payload = "x" * 1000
            total = 0
            while slow_station.core.stats["slow_consumers"] == 0:
                assert total < 3000, "the station never found its consumer slow"
                for _ in range(20):
                    await publisher.publish(REALM, "feed", {"n": total, "pad": payload})
                    total += 1
                await publisher.flush()
        finally:
            transport.resume_reading()
        # the honest subscriber got everything
        got = [(await honest_sub.next(10)).payload["n"] for _ in range(total)]
        assert got == list(range(total))
        # the slow one is told, reconnects (not terminal) and knows it missed events
        await eventually(lambda: slow.stats.reconnects >= 1, timeout=15)
        assert slow.stats.slow_consumer == 1
        assert (slow_sub.gaps, slow_sub.slow_consumer_gaps) == (1, 1)
        await slow.flush()
        await publisher.publish(REALM, "feed", {"n": "after"})
        await eventually(lambda: slow_sub.delivered > 0)
        while True:  # what it still had in its buffer, then the event after the reconnect
            delivery = await slow_sub.next(5)
            if delivery.payload["n"] == "after":
                break
        assert honest.stats.slow_consumer == 0 and honest_sub.gaps == 0


async def test_one_large_reply_is_not_a_slow_consumer(
    slow_station: Station, node_at: Callable[[], Node]
) -> None:
    """The bound is on bytes already waiting, not on the size of one frame (32 KiB here)."""
    async with node_at() as provider, node_at() as caller:
        await provider.advertise(REALM, "org.example.big_v1", lambda call: "y" * 256 * 1024)
        await provider.flush()
        for _ in range(3):
            assert len(await caller.call(REALM, "org.example.big_v1", None)) == 256 * 1024
        assert slow_station.core.stats["slow_consumers"] == 0
        assert caller.stats.reconnects == 0


async def test_subscription_quota_refusals_reach_the_client_through_flush(
    tmp_path: Path,
) -> None:
    policy = StationPolicy(quotas=Quotas(max_subscriptions=2))
    async with (
        Station(station_config(tmp_path / "station", policy)) as station,
        Node(new_identity(), [station.endpoint]) as greedy,
        Node(new_identity(), [station.endpoint]) as honest,
    ):
        for topic in ("a", "b", "c", "d"):
            await greedy.subscribe(REALM, topic)
        assert await greedy.flush() == {"subscription_quota": 2}
        assert greedy.stats.refused == {"subscription_quota": 2}
        sub = await honest.subscribe(REALM, "a")
        assert await honest.flush() == {}
        await greedy.publish(REALM, "a", {"n": 1})
        assert (await sub.next(5)).payload == {"n": 1}


# --- what agents see (macula-mcp) --------------------------------------------------------------


async def test_mesh_watch_reports_missed_and_gaps_and_status_the_station_refusals(
    station: Station, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tools.server.server, "GROUPS", (pubsub, surface))
    home = tmp_path / "agent"
    env = {
        "MACULA_HOME": str(home),
        "MACULA_MESH_STATIONS": station.endpoint,
        "MACULA_MCP_IDENTITY": str(home / "id.key"),
    }
    app = tools.server.server.build_server(env)
    async with Client(app) as client, Node(new_identity(), [station.endpoint]) as publisher:
        watch = asyncio.ensure_future(
            client.call_tool("mesh_watch", {"topic": "news", "duration_seconds": 10, "count": 1})
        )
        n = 0
        while not watch.done():  # the watch subscribes when it starts: publish until it hears
            await publisher.publish(bytes(32), "news", {"n": n})
            n += 1
            await asyncio.wait([watch], timeout=0.05)
        result = (await watch).structured_content
        assert result is not None and result["count"] == 1
        assert (result["missed"], result["gaps"]) == (0, 0)
        status = json.loads((await client.read_resource("mesh://status")).contents[0].text)  # type: ignore[union-attr]
        assert status["station_refused"] == {} and status["slow_consumer_closes"] == 0
