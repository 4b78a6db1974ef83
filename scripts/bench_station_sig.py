"""Station CPU per published message, in process (issue 15, docs/perf/perf-sig.md).

Drives the sans-I/O ``RouterCore`` with pre-built, pre-signed PUBLISH frames (fed as the shell
feeds them: through ``FrameDecoder``, so decoding is counted) for 1 and N local subscribers
(and optionally one linked peer station), and prints CPU µs per message (``process_time``) and
the Ed25519 sign/verify calls the station made per message. No sockets, no clock reads in the
core. Run: ``uv run python scripts/bench_station_sig.py [--messages 2000] [--subscribers 1 50]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import nacl.signing

from macula.wire.frames import CAP_STATION, Connect, Publish, Subscribe, new_frame_id
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, puzzle_evidence, realm_tag
from relay.core import RouterCore
from relay.policy import Quotas, StationPolicy

REALM = realm_tag("bench.station-sig")
TOPIC = "bench.topic"
T0 = 1_767_225_600_000


class Counts:
    """Ed25519 calls made through PyNaCl while installed (class attributes patched)."""

    def __init__(self) -> None:
        self.sign = 0
        self.verify = 0
        self._orig: tuple[Any, Any] | None = None

    def install(self) -> None:
        sign, verify = nacl.signing.SigningKey.sign, nacl.signing.VerifyKey.verify
        self._orig = (sign, verify)

        def counted_sign(key: Any, *args: Any, **kw: Any) -> Any:
            self.sign += 1
            return sign(key, *args, **kw)

        def counted_verify(key: Any, *args: Any, **kw: Any) -> Any:
            self.verify += 1
            return verify(key, *args, **kw)

        nacl.signing.SigningKey.sign = counted_sign  # type: ignore[method-assign]
        nacl.signing.VerifyKey.verify = counted_verify  # type: ignore[method-assign]

    def remove(self) -> None:
        assert self._orig is not None
        nacl.signing.SigningKey.sign, nacl.signing.VerifyKey.verify = self._orig  # type: ignore[method-assign]


def wire_frames(*frames: bytes) -> list[dict[str, Any]]:
    return FrameDecoder().feed(b"".join(frames))


def setup(subscribers: int, *, station_peer: bool) -> tuple[RouterCore, Identity, int]:
    quotas = Quotas(publish_rate=1e9, publish_burst=1e9)
    core = RouterCore(
        Identity(os.urandom(32)),
        StationPolicy(quotas=quotas),
        open_stream=lambda conn: 1,
        random_bytes=os.urandom,
    )
    conn = 0

    def join(identity: Identity, capabilities: int = 0, *, subscribe: bool = True) -> int:
        nonlocal conn
        conn += 1
        core.connection_made(conn, T0)
        connect = Connect(
            frame_id=new_frame_id(T0, os.urandom(10)),
            sent_at_ms=T0,
            capabilities=capabilities,
            node_id=identity.node_id,
            station_id=identity.node_id,
            puzzle_evidence=puzzle_evidence(identity.node_id),
        )
        core.frames_received(conn, 0, wire_frames(connect.sign_and_encode(identity)), T0)
        if not subscribe:
            return conn
        sub = Subscribe(
            frame_id=new_frame_id(T0, os.urandom(10)),
            sent_at_ms=T0,
            topic=TOPIC,
            realm=REALM,
            subscriber=identity.node_id,
        )
        core.frames_received(conn, 0, wire_frames(sub.sign_and_encode(identity)), T0)
        return conn

    publisher = Identity(os.urandom(32))
    pub_conn = join(publisher, subscribe=False)
    for _ in range(subscribers):
        join(Identity(os.urandom(32)))
    if station_peer:
        join(Identity(os.urandom(32)), CAP_STATION)
    return core, publisher, pub_conn


def publishes(publisher: Identity, n: int, payload_bytes: int) -> list[bytes]:
    out = []
    for i in range(n):
        publish = Publish(
            frame_id=new_frame_id(T0 + 1 + i, os.urandom(10)),
            sent_at_ms=T0 + 1 + i,
            topic=TOPIC,
            realm=REALM,
            publisher=publisher.node_id,
            seq=i,
            payload=os.urandom(payload_bytes),
            published_at_ms=T0 + 1 + i,
        ).with_publisher_sig(publisher)
        out.append(publish.sign_and_encode(publisher))
    return out


def run(subscribers: int, n: int, payload: int, *, station_peer: bool) -> dict[str, float]:
    core, publisher, pub_conn = setup(subscribers, station_peer=station_peer)
    frames = publishes(publisher, n, payload)
    counts = Counts()
    sent = 0
    feed: Callable[[int, bytes], int]

    def feed(i: int, data: bytes) -> int:
        maps = FrameDecoder().feed(data)  # decoding is part of the station's work
        return len(core.frames_received(pub_conn, 0, maps, T0 + 1 + i))

    feed(0, frames[0])  # warm caches
    counts.install()
    start = time.process_time()
    for i, data in enumerate(frames[1:], 1):
        sent += feed(i, data)
    cpu = time.process_time() - start
    counts.remove()
    m = n - 1
    return {
        "us_per_message": cpu / m * 1e6,
        "signs_per_message": counts.sign / m,
        "verifies_per_message": counts.verify / m,
        "sends_per_message": sent / m,
        "events_delivered": core.stats["events_delivered"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--subscribers", type=int, nargs="*", default=[1, 50])
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    for station_peer in (False, True):
        for subs in args.subscribers:
            best = min(
                (
                    run(subs, args.messages, args.payload, station_peer=station_peer)
                    for _ in range(args.rounds)
                ),
                key=lambda r: r["us_per_message"],
            )
            label = f"{subs} subscriber(s)" + (" + 1 peer station" if station_peer else "")
            print(
                f"{label:<34} {best['us_per_message']:8.1f} µs/msg  "
                f"sign {best['signs_per_message']:.2f}  verify {best['verifies_per_message']:.2f}"
                f"  sends {best['sends_per_message']:.0f}"
            )


if __name__ == "__main__":
    main()
