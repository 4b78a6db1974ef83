"""The transport's security bounds hold on either QUIC library (``MACULA_QUIC=aioquic|qh3``).

Every test here runs on the backend this process imported; the last one runs this module again
under qh3 in a subprocess (when qh3 is installed and this run is on aioquic), so one run of this
file checks both. The bounds (docs/performance.md §7):
- a paused stream holds at most one window: aioquic withholds its credit (the sender is
  blocked); qh3 grants credit natively, so past one window the stream fails with
  ``flow_control`` and what it held is dropped;
- a send on a connection the library already closed is refused quietly (qh3 raises its own
  ``QuicConnectionError`` there), never an exception out of ``send``;
- a dial that never connected does not wait for a close that cannot come.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from macula.quic import backend as quic_backend
from macula.quic.transport import ALPN, STREAM_WINDOW, FrameProtocol, client_configuration, dial
from macula.wire import cbor
from macula.wire.errors import FramingError
from macula.wire.frames import Publish
from macula.wire.framing import frame_bytes
from relay.core.policy import Quotas, StationPolicy
from relay.station.station import Station
from relay.station.tls import ensure_certificate
from support.identities import new_identity
from support.meshkit import REALM, station_config
from support.paths import REPO
from support.rawclient import raw_client, stamp
from support.waiting import eventually

pytestmark = pytest.mark.anyio

WINDOW = 64 * 1024
ON_QH3 = quic_backend.BACKEND == "qh3"


class Collect:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.failed: list[FramingError] = []
        self.ended = asyncio.Event()

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        self.frames += frames

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.failed.append(error)

    def stream_ended(self, stream_id: int) -> None:
        self.ended.set()

    def stream_reset(self, stream_id: int) -> None:
        pass

    def connection_lost(self, reason: str) -> None:
        pass


@asynccontextmanager
async def quic_pair(tmp_path: Path) -> AsyncIterator[tuple[FrameProtocol, list[FrameProtocol]]]:
    """A bare QUIC server and a client dialled to it, both with a 64 KiB stream window."""
    identity = new_identity()
    cert, key = ensure_certificate(tmp_path, identity, ["127.0.0.1", "localhost"])
    quic = quic_backend.QuicConfiguration(
        is_client=False, alpn_protocols=[ALPN], max_stream_data=WINDOW
    )
    quic.load_cert_chain(cert, key)
    accepted: list[FrameProtocol] = []

    def protocol(connection: Any, **kwargs: Any) -> FrameProtocol:
        made = FrameProtocol(connection, **kwargs)
        made.credit.window = WINDOW
        made.sink = Collect()
        accepted.append(made)
        return made

    server = await quic_backend.serve("127.0.0.1", 0, configuration=quic, create_protocol=protocol)
    port = server._transport.get_extra_info("sockname")[1] if server._transport else 0
    configuration = client_configuration(server_name="localhost")
    configuration.max_stream_data = WINDOW
    try:
        async with dial("127.0.0.1", port, configuration) as client:
            client.credit.window = WINDOW
            client.sink = Collect()
            yield client, accepted
    finally:
        server.close()


def numbered(n: int) -> bytes:
    return frame_bytes(cbor.encode({"n": n, "pad": b"x" * 1000}))


async def paused_server(client: FrameProtocol, accepted: list[FrameProtocol]) -> FrameProtocol:
    """The server side of the client's first stream, with that stream's reading paused."""
    stream = client.new_stream()
    client.send(stream, numbered(0))
    server = (await eventually(lambda: accepted))[0]
    sink = server.sink
    assert isinstance(sink, Collect)
    await eventually(lambda: sink.frames)
    server.pause_reading(stream)
    return server


@pytest.mark.skipif(ON_QH3, reason="aioquic's rule; qh3 grants credit natively (next test)")
async def test_on_aioquic_a_paused_stream_blocks_its_sender_after_one_window(
    tmp_path: Path,
) -> None:
    async with quic_pair(tmp_path) as (client, accepted):
        server = await paused_server(client, accepted)
        assert server.credit.installed
        stream = 0
        for n in range(1, 1000):  # about 1 MiB: sixteen windows
            client.send(stream, numbered(n))
        client.end_stream(stream)
        await eventually(lambda: client.queued_bytes(stream) > 8 * WINDOW)
        assert server.held_bytes(stream) <= WINDOW
        server.resume_reading(stream)
        sink = server.sink
        assert isinstance(sink, Collect)
        await asyncio.wait_for(sink.ended.wait(), 10)
        assert [f["n"] for f in sink.frames] == list(range(1000))
        assert sink.failed == []


@pytest.mark.skipif(not ON_QH3, reason="qh3's rule; aioquic withholds credit (previous test)")
async def test_on_qh3_a_stream_sent_past_one_window_while_paused_fails_with_flow_control(
    tmp_path: Path,
) -> None:
    async with quic_pair(tmp_path) as (client, accepted):
        server = await paused_server(client, accepted)
        assert not server.credit.installed  # qh3: nothing withholds credit
        sink = server.sink
        assert isinstance(sink, Collect)
        stream = 0
        peak = 0

        def watched() -> bool:
            nonlocal peak
            peak = max(peak, server.held_bytes(stream))
            return bool(sink.failed)

        for n in range(1, 1000):
            client.send(stream, numbered(n))
        await eventually(watched, timeout=10)
        [error] = sink.failed
        assert error.reason == "flow_control"
        assert f"{WINDOW} bytes" in error.detail
        assert peak <= WINDOW
        assert server.held_bytes(stream) == 0  # what it held is dropped
        server.resume_reading(stream)  # a late resume hands nothing over
        client.send(stream, numbered(1000))
        await client.acknowledged(5)
        assert [f["n"] for f in sink.frames] == [0]


@pytest.mark.skipif(not ON_QH3, reason="on aioquic the sender is blocked instead (tests above)")
async def test_on_qh3_a_station_cuts_off_a_client_that_sends_a_window_past_its_pause(
    tmp_path: Path,
) -> None:
    quotas = Quotas(publish_rate=0.01, publish_burst=1.0)  # the second PUBLISH pauses for 100 s
    async with (
        Station(station_config(tmp_path / "station", StationPolicy(quotas=quotas))) as station,
        raw_client(station) as hostile,
    ):
        for seq in (1, 2):
            fields = stamp()
            hostile.send(
                Publish(
                    topic="flood",
                    realm=REALM,
                    publisher=hostile.node_id,
                    seq=seq,
                    payload=seq,
                    published_at_ms=fields["sent_at_ms"],
                    **fields,
                )
            )
        await eventually(lambda: station.core.stats["publishers_paused"] > 0)
        (served,) = station._connections.values()
        assert served.credit.window == STREAM_WINDOW
        served.credit.window = WINDOW  # (the test's smaller window: the same rule, less to send)
        hostile.send_bytes(bytes(2 * WINDOW))  # unread: held while paused
        goodbye = await hostile.expect(lambda r: r.frame_type == "goodbye", timeout=20)
        assert goodbye.frame["reason"] == "protocol_error"
        assert "while its reading was paused" in str(goodbye.frame.get("detail"))
        await asyncio.wait_for(hostile.lost.wait(), 10)
        assert "flow_control" in hostile.lost_reason
        assert station.core.stats["framing_errors"] == 1


async def test_a_send_on_a_connection_closed_locally_is_refused_quietly(tmp_path: Path) -> None:
    async with quic_pair(tmp_path) as (client, accepted):
        stream = client.new_stream()
        client.send(stream, numbered(0))
        server = (await eventually(lambda: accepted))[0]
        await eventually(lambda: isinstance(server.sink, Collect) and server.sink.frames)
        server.close_connection("closing")  # the library's connection is closed from here on
        server.send(stream, numbered(1))  # before the loss was reported: must not raise
        server.end_stream(stream)
        await eventually(lambda: client.lost)


async def test_a_refused_dial_does_not_wait_for_a_close(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    waited: list[FrameProtocol] = []
    real_wait = FrameProtocol.wait_closed

    async def wait_closed(self: FrameProtocol) -> None:
        waited.append(self)
        await real_wait(self)

    monkeypatch.setattr(FrameProtocol, "wait_closed", wait_closed)
    for _ in range(3):
        with pytest.raises(ConnectionRefusedError, match="nothing listens there"):
            async with dial("127.0.0.1", port, client_configuration(server_name="localhost")):
                pass
    assert waited == []  # nothing was connected: there is no close to wait for


BOUND_TESTS = [
    "tests/integration/test_quic_backend_bounds.py",
    "tests/integration/test_station_hostile_bounds.py::test_connections_over_the_per_address_cap_are_refused",
    "tests/integration/test_failover.py::test_with_every_station_down_it_backs_off_and_connects_when_one_comes_back",
]


@pytest.mark.slow
@pytest.mark.skipif(ON_QH3, reason="this run is on qh3 already")
@pytest.mark.skipif(find_spec("qh3") is None, reason="qh3 is not installed (macula-mesh[fast])")
def test_the_bounds_hold_on_qh3_too() -> None:
    root = REPO
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly", *BOUND_TESTS],
        cwd=root,
        env={**os.environ, "MACULA_QUIC": "qh3"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
