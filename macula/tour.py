"""``macula-wire-tour``: the wire core working end to end, in one process, with no network.

Two agents and a station exchange real Macula wire v2 bytes through in-memory "streams": a
handshake, a publication fanned out as a station-signed EVENT, a call and its result, a forged
frame refused, a 1 MiB artifact chunked and reassembled by content id, and a signed DHT record.
Every step prints one line; the exit status is 0 only if every check held.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TypedDict

from macula.clock import now_ms
from macula.wire import content
from macula.wire.frames import (
    CAP_STATION,
    Call,
    Connect,
    Event,
    Frame,
    Hello,
    Publish,
    Result,
    event_from_publish,
    new_frame_id,
    parse_frame,
)
from macula.wire.framing import FrameDecoder
from macula.wire.identity import ZERO_REALM, Identity, realm_tag
from macula.wire.records import Record, RecordType, new_record, record_version


class Tour:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, label: str, ok: bool, detail: str = "") -> None:
        mark = "ok  " if ok else "FAIL"
        self.passed += ok
        self.failed += not ok
        print(f"[{mark}] {label}" + (f"  ({detail})" if detail else ""))


class Stamp(TypedDict):
    frame_id: bytes
    sent_at_ms: int


def _header() -> Stamp:
    now = now_ms()
    return {"frame_id": new_frame_id(now, os.urandom(10)), "sent_at_ms": now}


def _through_stream(frame: Frame) -> Frame:
    """Encode, split the bytes in two reads, decode and parse, as a real stream would."""
    wire = frame.encode()
    decoder = FrameDecoder()
    maps = decoder.feed(wire[:7]) + decoder.feed(wire[7:])
    assert len(maps) == 1 and decoder.at_frame_boundary()
    return parse_frame(maps[0])


def run(say: Callable[[str], None] = print) -> int:
    tour = Tour()
    grind = time.perf_counter()
    alice, bob = Identity.generate(os.urandom), Identity.generate(os.urandom)
    station = Identity.generate(os.urandom)
    ms = (time.perf_counter() - grind) * 1000
    say(f"alice   {alice.node_id.hex()[:16]}…  bob {bob.node_id.hex()[:16]}…  (puzzle-hardened)")
    tour.check(
        "three identities ground to puzzle difficulty 8", alice.has_valid_puzzle(), f"{ms:.0f} ms"
    )

    connect = Connect(
        **_header(),
        node_id=alice.node_id,
        station_id=alice.node_id,
        puzzle_evidence=alice.puzzle_evidence,
    ).signed_by(alice)
    received = _through_stream(connect)
    tour.check(
        "station reads CONNECT and verifies it against its node_id",
        isinstance(received, Connect) and received.verifies(received.node_id),
        f"{len(connect.encode())} bytes",
    )
    hello = Hello(
        **_header(),
        capabilities=CAP_STATION,
        node_id=station.node_id,
        station_id=station.node_id,
        accepted=True,
        negotiated_capabilities=CAP_STATION,
    ).signed_by(station)
    got_hello = _through_stream(hello)
    tour.check(
        'alice verifies the HELLO against the pinned station key, accepted == "true"',
        isinstance(got_hello, Hello) and got_hello.accepted and got_hello.verifies(station.node_id),
    )

    realm = realm_tag("org.example.mesh")
    publish = (
        Publish(
            **_header(),
            topic="agents.lobby",
            realm=realm,
            publisher=alice.node_id,
            seq=1,
            payload={"kind": "remark_made", "text": "hello from alice", "urgent": 0},
            published_at_ms=now_ms(),
        )
        .with_publisher_sig(alice)
        .signed_by(alice)
    )
    at_station = _through_stream(publish)
    assert isinstance(at_station, Publish)
    now = now_ms()
    event = event_from_publish(
        at_station, frame_id=new_frame_id(now, os.urandom(10)), sent_at_ms=now
    ).signed_by(station)
    at_bob = _through_stream(event)
    tour.check(
        "bob receives the EVENT: station signature and alice's publisher_sig both verify",
        isinstance(at_bob, Event)
        and at_bob.verifies(station.node_id)
        and at_bob.publisher_sig_valid()
        and at_bob.payload["text"] == "hello from alice",
    )
    forged = Event(
        **_header(),
        topic="agents.lobby",
        realm=realm,
        publisher=alice.node_id,
        seq=2,
        payload={"text": "forged"},
        publisher_sig=at_bob.publisher_sig if isinstance(at_bob, Event) else None,
    ).signed_by(station)
    tour.check(
        "a payload swapped under alice's publisher_sig is detected",
        not forged.publisher_sig_valid(),
    )

    call = Call(
        **_header(),
        call_id=os.urandom(16),
        procedure="org.example.echo_v1",
        realm=realm,
        payload={"msg": "ping"},
        deadline_ms=now_ms() + 5000,
        caller=bob.node_id,
    ).signed_by(bob)
    at_alice = _through_stream(call)
    assert isinstance(at_alice, Call)
    result = Result(
        **_header(),
        call_id=at_alice.call_id,
        payload={"echoed": at_alice.payload},
        responded_by=alice.node_id,
    ).signed_by(alice)
    back = _through_stream(result)
    tour.check(
        "bob's CALL reaches alice verified; her RESULT comes back verified, same call_id",
        at_alice.verifies(bob.node_id)
        and isinstance(back, Result)
        and back.call_id == call.call_id
        and back.verifies(alice.node_id),
    )
    mallory = Identity(os.urandom(32))
    spoofed = Call(
        **_header(),
        call_id=os.urandom(16),
        procedure="org.example.echo_v1",
        realm=realm,
        payload={},
        deadline_ms=now_ms() + 5000,
        caller=bob.node_id,
    ).signed_by(mallory)
    tour.check(
        "a CALL claiming to be bob but signed by someone else is refused",
        not spoofed.verifies(spoofed.expected_signer() or b""),
    )

    data = os.urandom(1024 * 1024 + 123)
    plan = content.plan_put(data, "artifact.bin", created=int(time.time()))
    assert plan.manifest is not None
    manifest = content.Manifest.from_wire(plan.manifest.to_wire())
    manifest.verify(plan.mcid)
    rebuilt = content.assemble(manifest, [bytes(block) for _, block in plan.blocks])
    tour.check(
        "1 MiB artifact: chunked, manifest MCID recomputed, reassembled and verified",
        rebuilt == data,
        f"{len(plan.blocks)} chunks, mcid {plan.mcid.hex()[:20]}…",
    )

    record = new_record(
        alice,
        RecordType.PROCEDURE_ADVERTISEMENT,
        {
            "procedure_uri": "org.example.echo_v1",
            "advertiser_node": alice.node_id,
            "serving_station": station.node_id,
        },
        now_ms=now_ms(),
        version=record_version(now_ms(), os.urandom(10)),
    )
    stored = Record.from_rpc(record.to_rpc())
    stored.verify(now_ms())
    tour.check(
        "alice's procedure advertisement record: signed, parsed, verified, keyed",
        stored == record,
        f"storage key {stored.storage_key().hex()[:16]}…, zero realm {ZERO_REALM.hex()[:8]}…",
    )
    say(f"{tour.passed}/{tour.passed + tour.failed} checks passed")
    return 0 if tour.failed == 0 else 1


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
