"""Station bounds of issue 11, on the sans-I/O router and the frame transport: names at most
``max_name_bytes``, one stream and a byte budget before CONNECT, connection caps, control-frame
size and item limits, refused frames counted per connection with one log line per interval,
clipped log values and close reasons. Every hostile case ends with an honest client served.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from macula.quic.backend import QuicConfiguration, QuicConnection, events
from macula.quic.transport import MAX_CLOSE_REASON_BYTES, FrameProtocol, StreamLimits
from macula.wire import cbor
from macula.wire.codes import ErrorCode
from macula.wire.errors import FramingError
from macula.wire.frames import Event
from macula.wire.framing import frame_bytes
from relay.core.logbook import MAX_LOGGED_CHARS, clip
from relay.core.policy import StationPolicy
from relay.ops.cli import build_parser, config_from_args
from support.routerkit import (
    ALICE,
    BOB,
    CAROL,
    NOW,
    ZERO_REALM,
    Client,
    Station,
    closed,
    envelope,
    only,
    sent,
    sent_to,
    station_error,
)

LIMIT = StationPolicy().max_name_bytes


def honest_round(station: Station, sender: Client, receiver: Client, now: int = NOW) -> None:
    """``receiver`` hears ``sender``'s event and ``sender``'s built-in call is answered."""
    receiver.send(receiver.subscribe("honest.news", now=now), now=now)
    actions = sender.send(sender.publish("honest.news", b"hi", now=now), now=now)
    assert only(sent_to(actions, receiver), Event).payload == b"hi"
    call = sender.call("_relay.ping", realm=ZERO_REALM, now=now)
    assert [type(a).__name__ for a in sender.send(call, now=now)] == ["RunBuiltin"]


# --- names ------------------------------------------------------------------------------------


def test_names_up_to_the_bound_pass_and_longer_ones_are_refused_and_counted() -> None:
    station = Station()
    mallory, alice, bob = station.join(CAROL), station.join(ALICE), station.join(BOB)
    at_limit, over = "n" * LIMIT, "n" * (LIMIT + 1)
    wide = "é" * (LIMIT // 2 + 1)  # fewer characters than the bound, more UTF-8 bytes
    for name in (over, wide):
        assert mallory.send(mallory.subscribe(name)) == []
        assert mallory.send(mallory.advertise(name)) == []
        assert mallory.send(mallory.publish(name)) == []
    assert station.core.stats["name_too_long"] == 6
    assert station.core.peers[mallory.conn].refusals.counts["name_too_long"] == 6
    assert station.core.subscriptions.count_for(CAROL.node_id) == 0
    assert station.core.adverts.count_for(mallory.conn) == 0
    # a CALL naming a long procedure is answered, not dropped
    error = station_error(mallory.send(mallory.call(over)), mallory)
    assert (error.code, error.detail) == (ErrorCode.UNKNOWN_ERROR, b"bad_request: name too long")
    # a name exactly at the bound is fine
    mallory.send(mallory.subscribe(at_limit))
    assert station.core.subscriptions.count_for(CAROL.node_id) == 1
    mallory.send(mallory.advertise(at_limit))
    assert station.core.adverts.count_for(mallory.conn) == 1
    honest_round(station, alice, bob)


def test_the_name_bound_is_configurable() -> None:
    station = Station(StationPolicy(max_name_bytes=8))
    alice = station.join(ALICE)
    alice.send(alice.subscribe("12345678"))
    alice.send(alice.subscribe("123456789"))
    assert station.core.subscriptions.count_for(ALICE.node_id) == 1


# --- before CONNECT -------------------------------------------------------------------------


def test_a_frame_on_a_second_stream_before_connect_closes_the_connection() -> None:
    station = Station()
    mallory = station.dial(CAROL)
    assert mallory.send(mallory.subscribe("early")) == []  # stream 0: counted, ignored
    actions = mallory.send(mallory.connect(), stream=mallory.new_stream())
    assert mallory.conn in closed(actions) and sent(actions, mallory.conn) == []
    assert mallory.handshake() == []  # nothing it sends is heard any more
    assert station.core.stats["streams_before_connect"] == 1
    alice, bob = station.join(ALICE), station.join(BOB)
    honest_round(station, alice, bob)


def test_the_handshake_timeout_is_ten_seconds() -> None:
    station = Station()
    silent = station.dial(CAROL)
    assert closed(station.core.tick(NOW + 10_000)) == {}
    assert set(closed(station.core.tick(NOW + 10_001))) == {silent.conn}


# --- connection caps --------------------------------------------------------------------------


def test_connections_over_the_per_address_cap_are_closed_at_once() -> None:
    station = Station(StationPolicy(max_connections_per_address=2))
    core = station.core
    assert core.connection_made(1, NOW, "203.0.113.7") == []
    assert core.connection_made(2, NOW, "203.0.113.7") == []
    refused = core.connection_made(3, NOW, "203.0.113.7")
    assert 3 in closed(refused) and 3 not in core.peers
    assert core.stats["connections_over_address_cap"] == 1
    assert core.connection_made(4, NOW, "127.0.0.1") == []  # another address has its own
    core.connection_lost(1, NOW + 1)
    assert core.connection_made(5, NOW + 1, "203.0.113.7") == []  # a slot came free
    # a handshake timeout frees the slot too
    core.tick(NOW + StationPolicy().handshake_timeout_ms + 10)
    assert core.caps.by_address == {}


def test_connections_over_the_global_cap_are_closed_and_summed_up_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="macula.relay")
    station = Station(StationPolicy(max_connections=3))
    alice, bob = station.join(ALICE), station.join(BOB)
    station.dial(CAROL)
    for conn in range(100, 200):
        assert conn in closed(station.core.connection_made(conn, NOW, f"198.51.100.{conn}"))
    assert station.core.stats["connections_over_cap"] == 100
    assert caplog.records == []
    station.core.tick(NOW + 10_000)
    [line] = [r.getMessage() for r in caplog.records]
    assert "refused 100 connection(s)" in line and "connections_over_cap=100" in line
    honest_round(station, alice, bob, now=NOW + 10_000)


# --- logs -------------------------------------------------------------------------------------


def test_twenty_thousand_bad_signatures_cost_counters_not_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="macula.relay")
    station = Station()
    mallory, alice, bob = station.join(CAROL), station.join(ALICE), station.join(BOB)
    forged = mallory.subscribe("t").signed_by(ALICE).to_map()  # signed by the wrong key
    for n in range(20_000):
        now = NOW + n // 4  # 5 s of frames, so ticks come on the way
        assert mallory.send_map({**forged, **envelope(now)}, now=now) == []
        if n % 1000 == 0:
            station.core.tick(now)
    station.core.tick(NOW + 9_999)
    assert caplog.records == []
    station.core.tick(NOW + 10_000)
    [line] = [r.getMessage() for r in caplog.records]
    assert "refused 20000 frame(s)" in line and "unverified_frame=20000" in line
    assert station.core.peers[mallory.conn].refusals.counts["unverified_frame"] == 20_000
    station.core.tick(NOW + 15_000)
    assert len(caplog.records) == 1  # nothing new: no line
    honest_round(station, alice, bob, now=NOW + 15_000)
    # the connection's end sums up what was not reported yet
    mallory.send(mallory.subscribe("late", now=NOW + 15_000), signer=ALICE, now=NOW + 15_000)
    station.core.connection_lost(mallory.conn, NOW + 15_001)
    assert len(caplog.records) == 2 and "refused 1 frame(s)" in caplog.records[1].getMessage()


def test_peer_values_in_log_lines_are_clipped(caplog: pytest.LogCaptureFixture) -> None:
    assert clip("x" * 10_000) == "x" * (MAX_LOGGED_CHARS - 1) + "…"
    assert clip("a\nb\x1b[31m") == "a\\nb\\x1b[31m"
    assert clip(b"\x00" * 1000).startswith("b'\\x00") and len(clip(b"\x00" * 1000)) == 200
    caplog.set_level(logging.DEBUG, logger="macula.relay")
    station = Station()
    mallory = station.join(CAROL)
    mallory.send(mallory.subscribe("s" * 5000), now=NOW)  # the reason names no peer value
    error = FramingError("garbage", "z" * 5000)
    station.core.framing_failed(mallory.conn, 0, error, NOW + 1)
    station.core.connection_lost(mallory.conn, NOW + 2)
    assert caplog.records
    assert all(len(r.getMessage()) < 2 * MAX_LOGGED_CHARS + 100 for r in caplog.records)


# --- the transport: limits per stream, the pre-handshake gate, close reasons ---------------


class Sink:
    def __init__(self) -> None:
        self.frames: list[tuple[int, dict[str, Any]]] = []
        self.failures: list[tuple[int, str]] = []

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        self.frames += [(stream_id, f) for f in frames]

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        self.failures.append((stream_id, error.reason))

    def stream_ended(self, stream_id: int) -> None:
        pass

    def stream_reset(self, stream_id: int) -> None:
        pass

    def connection_lost(self, reason: str) -> None:
        pass


def station_side(pre_open: int | None = 64 * 1024) -> tuple[FrameProtocol, Sink]:
    policy = StationPolicy()
    protocol = FrameProtocol(QuicConnection(configuration=QuicConfiguration(is_client=True)))
    protocol.limits = StreamLimits(policy.max_frame_size, policy.max_stream_frame_items)
    protocol.control_limits = StreamLimits(
        policy.max_control_frame_size, policy.max_control_frame_items
    )
    protocol.pre_open_bytes = pre_open
    sink = Sink()
    protocol.sink = sink
    return protocol, sink


def feed(protocol: FrameProtocol, stream: int, data: bytes) -> None:
    protocol.quic_event_received(
        events.StreamDataReceived(data=data, end_stream=False, stream_id=stream)
    )


SMALL = frame_bytes(cbor.encode({"frame_type": "ping"}))


@pytest.mark.anyio
async def test_before_the_gate_opens_only_the_first_stream_may_carry_data() -> None:
    protocol, sink = station_side()
    feed(protocol, 0, SMALL)
    feed(protocol, 4, SMALL)
    feed(protocol, 0, SMALL)  # after the failure nothing more is read
    assert sink.frames == [(0, {"frame_type": "ping"})]
    assert sink.failures == [(4, "stream_before_handshake")]


@pytest.mark.anyio
async def test_before_the_gate_opens_at_most_the_byte_budget_is_read() -> None:
    protocol, sink = station_side(pre_open=1000)
    feed(protocol, 0, frame_bytes(cbor.encode({"pad": b"x" * 900})))
    feed(protocol, 0, SMALL * 10)
    assert len(sink.frames) == 1
    assert sink.failures == [(0, "handshake_too_large")]


@pytest.mark.anyio
async def test_after_the_gate_opens_any_stream_carries_frames() -> None:
    protocol, sink = station_side()
    feed(protocol, 0, SMALL)
    protocol.open_gate()
    feed(protocol, 4, SMALL)
    feed(protocol, 0, SMALL * 2000)  # far over the pre-handshake budget: fine now
    assert len(sink.frames) == 2002 and sink.failures == []


@pytest.mark.anyio
async def test_the_control_stream_has_the_small_frame_limit_and_others_the_full_one() -> None:
    protocol, sink = station_side(pre_open=None)
    over = (StationPolicy().max_control_frame_size + 1).to_bytes(4, "big")
    feed(protocol, 0, SMALL)  # the first stream: the control stream
    feed(protocol, 4, over + b"\xa0")  # a content stream may announce it
    feed(protocol, 0, over)
    assert sink.failures == [(0, "frame_too_large")]


@pytest.mark.anyio
async def test_a_control_frame_of_many_small_items_is_refused_quickly() -> None:
    # 1 MiB of one-byte arrays nested 97 deep: the slowest shape to decode per byte
    chain = b"\x81" * 97 + b"\x00"
    count = (StationPolicy().max_control_frame_size - 16) // len(chain)
    frame = frame_bytes(b"\xa1\x61k\x9a" + count.to_bytes(4, "big") + chain * count)
    protocol, sink = station_side(pre_open=None)
    calls = 0

    def counted(*_: object) -> None:  # every Python and C call the decode makes, not seconds
        nonlocal calls
        calls += 1

    sys.setprofile(counted)
    try:
        feed(protocol, 0, frame)
    finally:
        sys.setprofile(None)
    assert sink.failures == [(0, "too_many_items")]
    # the decode stops at the 8,192-item budget: 32,671 calls here; decoding the whole frame
    # (about a million items, the budget lifted) makes 6.3 million
    assert calls < 200_000


@pytest.mark.anyio
async def test_close_reasons_are_cut_to_100_bytes_of_utf8(monkeypatch: pytest.MonkeyPatch) -> None:
    protocol, _ = station_side()
    reasons: list[str] = []
    monkeypatch.setattr(protocol, "close", lambda **kw: reasons.append(kw["reason_phrase"]))
    protocol.close_connection("é" * 300)
    protocol.close_connection("short")
    assert reasons == ["é" * 50, "short"]
    assert len(reasons[0].encode()) == MAX_CLOSE_REASON_BYTES


# --- operator flags ---------------------------------------------------------------------------


def test_macula_relay_flags_set_the_bounds(tmp_path: Path) -> None:
    defaults = config_from_args(build_parser().parse_args(["--data-dir", str(tmp_path)])).policy
    assert defaults == StationPolicy()
    args = build_parser().parse_args(
        [
            *("--data-dir", str(tmp_path)),
            *("--max-name-bytes", "64", "--max-control-frame-size", "65536"),
            *("--max-control-frame-items", "100", "--max-stream-frame-items", "1000"),
            *("--max-pre-handshake-bytes", "4096", "--handshake-timeout-ms", "2000"),
            *("--max-connections", "50", "--max-connections-per-address", "5"),
            *("--log-summary-ms", "60000", "--no-quic-retry"),
        ]
    )
    policy = config_from_args(args).policy
    assert (policy.max_name_bytes, policy.max_control_frame_size) == (64, 65536)
    assert (policy.max_control_frame_items, policy.max_stream_frame_items) == (100, 1000)
    assert (policy.max_pre_handshake_bytes, policy.handshake_timeout_ms) == (4096, 2000)
    assert (policy.max_connections, policy.max_connections_per_address) == (50, 5)
    assert (policy.log_summary_ms, policy.quic_retry) == (60000, False)
    with pytest.raises(SystemExit):
        too_big = ["--data-dir", str(tmp_path), "--max-control-frame-size", str(1 << 24)]
        config_from_args(build_parser().parse_args(too_big))
