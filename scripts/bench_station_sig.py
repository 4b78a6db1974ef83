"""Station CPU per published message, in process (issue 15, docs/performance.md §2).

Drives the sans-I/O ``RouterCore`` with pre-built, pre-signed PUBLISH frames (fed as the shell
feeds them: through ``FrameDecoder``, so decoding is counted) for 1 and N local subscribers
(and optionally one linked peer station), and prints CPU µs per message (``process_time``) and
the Ed25519 sign/verify calls the station made per message. No sockets, no clock reads in the
core. Run: ``uv run python scripts/bench.py station-sig [--messages 2000] [--subscribers 1 50]``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import bench_common
import nacl.bindings

from macula.wire import cbor
from macula.wire.frames import CAP_STATION, Connect, Publish, Subscribe, new_frame_id
from macula.wire.framing import FrameDecoder, frame_bytes
from macula.wire.identity import Identity, puzzle_evidence, realm_tag
from relay.core.policy import Quotas, StationPolicy
from relay.core.router import RouterCore

REALM = realm_tag("bench.station-sig")
TOPIC = "bench.topic"
T0 = 1_767_225_600_000
PUBLISHER = Identity(bytes(range(32)))  # fixed, so pre-built frames can be kept (``--frames``)


class Counts:
    """Ed25519 calls made through libsodium while installed: PyNaCl's bindings are patched,
    which ``macula.wire.identity`` and PyNaCl's key classes both call (patching the key
    classes alone counted nothing once ``Identity`` called the bindings directly)."""

    def __init__(self) -> None:
        self.sign = 0
        self.verify = 0
        self._orig: tuple[Any, Any] | None = None

    def install(self) -> None:
        sign, verify = nacl.bindings.crypto_sign, nacl.bindings.crypto_sign_open
        self._orig = (sign, verify)

        def counted_sign(key: Any, *args: Any, **kw: Any) -> Any:
            self.sign += 1
            return sign(key, *args, **kw)

        def counted_verify(key: Any, *args: Any, **kw: Any) -> Any:
            self.verify += 1
            return verify(key, *args, **kw)

        nacl.bindings.crypto_sign = counted_sign
        nacl.bindings.crypto_sign_open = counted_verify

    def remove(self) -> None:
        assert self._orig is not None
        nacl.bindings.crypto_sign, nacl.bindings.crypto_sign_open = self._orig


def wire_frames(*frames: bytes) -> list[dict[str, Any]]:
    return FrameDecoder().feed(b"".join(frames))


def setup(
    subscribers: int, *, station_peer: bool, bound: bool = False
) -> tuple[RouterCore, Identity, int]:
    """A core with a publisher, ``subscribers`` and maybe a peer station; ``bound``: the
    clients' CONNECTs name the station (``bound_to``, as our pinned client's do: issue 27)."""
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
            bound_to=core.identity.node_id if bound and not capabilities else None,
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

    publisher = PUBLISHER
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


def load_frames(path: str | None, n: int, payload: int) -> list[bytes]:
    """``n`` signed PUBLISH frames by ``PUBLISHER``, from ``path`` if it holds enough."""
    if path is not None and os.path.exists(path):
        frames = FrameDecoder().feed(open(path, "rb").read())  # noqa: SIM115
        kept = [frame_bytes(cbor.encode(m)) for m in frames]
        if len(kept) >= n:
            return kept[:n]
    built = publishes(PUBLISHER, n, payload)
    if path is not None:
        with open(path, "wb") as out:
            out.write(b"".join(built))
    return built


def run(
    subscribers: int,
    frames: list[bytes],
    *,
    station_peer: bool,
    count: bool = True,
    bound: bool = False,
) -> dict[str, float]:
    n = len(frames)
    core, _, pub_conn = setup(subscribers, station_peer=station_peer, bound=bound)
    counts = Counts()
    sent = 0

    def feed(i: int, data: bytes) -> int:
        maps = FrameDecoder().feed(data)  # decoding is part of the station's work
        return len(core.frames_received(pub_conn, 0, maps, T0 + 1 + i))

    feed(0, frames[0])  # warm caches
    if count:
        counts.install()
    start = time.process_time()
    for i, data in enumerate(frames[1:], 1):
        sent += feed(i, data)
    cpu = time.process_time() - start
    if count:
        counts.remove()
    m = n - 1
    return {
        "us_per_message": cpu / m * 1e6,
        "signs_per_message": counts.sign / m,
        "verifies_per_message": counts.verify / m,
        "sends_per_message": sent / m,
        "events_delivered": core.stats["events_delivered"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("station-sig", __doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--subscribers", type=int, nargs="*", default=[1, 50])
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs")
    parser.add_argument("--frames", help="keep the pre-built PUBLISH frames in this file")
    parser.add_argument("--peer", choices=("no", "yes", "both"), default="both")
    parser.add_argument(
        "--bound",
        choices=("no", "yes", "both"),
        default="both",
        help="clients' CONNECTs name the station (issue 27: our pinned client's do)",
    )
    parser.add_argument(
        "--no-count", action="store_true", help="no PyNaCl patching (for callgrind diffs)"
    )
    args = parser.parse_args(argv)
    frames = load_frames(args.frames, args.messages, args.payload)
    choices = {"no": (False,), "yes": (True,), "both": (False, True)}
    for bound in choices[args.bound]:
        for station_peer in choices[args.peer]:
            for subs in args.subscribers:
                report(args, frames, subs, station_peer=station_peer, bound=bound)


def report(args: Any, frames: list[bytes], subs: int, *, station_peer: bool, bound: bool) -> None:
    """One line: the best of ``args.rounds`` runs of one case."""
    best = min(
        (
            run(subs, frames, station_peer=station_peer, count=not args.no_count, bound=bound)
            for _ in range(args.rounds)
        ),
        key=lambda r: r["us_per_message"],
    )
    label = ("bound, " if bound else "unbound, ") + f"{subs} subscriber(s)"
    label += " + 1 peer station" if station_peer else ""
    print(
        f"{label:<42} {best['us_per_message']:8.1f} µs/msg  "
        f"sign {best['signs_per_message']:.2f}  verify {best['verifies_per_message']:.2f}"
        f"  sends {best['sends_per_message']:.0f}"
    )


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py station-sig
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py station-sig ...`")
