"""Wire-core benchmark: frames/s for encode+sign and decode+verify, bytes/s for MCIDs.

Run: ``uv run python scripts/bench.py wire [--seconds 1.0]``. Prints one line per figure; the
ratios compare our codec with the cost of the Ed25519 step alone, so a regression in our own
code shows up even on a machine of a different speed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import bench_common

from macula.wire import cbor, content
from macula.wire.frames import Call, Frame, Publish, new_frame_id, parse_frame
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag, verify


def rate(label: str, work: Callable[[], object], seconds: float, unit: str = "ops") -> float:
    work()  # warm caches
    count, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            work()
        count += 50
        now = time.perf_counter()
        if now >= deadline:
            break
    per_second = count / (now - start)
    print(f"{label:<44} {per_second:>12,.0f} {unit}/s   ({1e6 / per_second:8.1f} µs each)")
    return per_second


def frames_for(identity: Identity) -> dict[str, Frame]:
    now_ms = int(time.time() * 1000)
    realm = realm_tag("org.example.mesh")
    publish = Publish(
        frame_id=new_frame_id(now_ms, os.urandom(10)),
        sent_at_ms=now_ms,
        topic="agents.lobby",
        realm=realm,
        publisher=identity.node_id,
        seq=1,
        payload={"text": "x" * 100, "n": 1},
        published_at_ms=now_ms,
    )
    assert len(cbor.encode(publish.payload)) >= 100
    call = Call(
        frame_id=new_frame_id(now_ms, os.urandom(10)),
        sent_at_ms=now_ms,
        call_id=os.urandom(16),
        procedure="org.example.echo_v1",
        realm=realm,
        payload={"n": 42, "msg": "hello", "tags": ["a", "b"]},
        deadline_ms=now_ms + 5000,
        caller=identity.node_id,
    )
    return {"PUBLISH (128-byte payload)": publish, "CALL": call}


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("wire", __doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per figure")
    args = parser.parse_args(argv)
    identity = Identity.generate(os.urandom)
    print(f"macula wire benchmark, {args.seconds:.1f} s per figure")
    message = b"m" * 300
    signature = identity.sign(message)
    sign_only = rate("Ed25519 sign alone (300 B)", lambda: identity.sign(message), args.seconds)
    verify_only = rate(
        "Ed25519 verify alone (300 B)",
        lambda: verify(identity.node_id, message, signature),
        args.seconds,
    )
    for label, frame in frames_for(identity).items():
        signed = frame.signed_by(identity)
        wire = signed.encode()
        print(f"-- {label}: {len(wire)} bytes on the wire")

        def encode_sign(frame: Frame = frame) -> bytes:
            return frame.sign_and_encode(identity)

        def decode_verify(wire: bytes = wire) -> None:
            [frame_map] = FrameDecoder().feed(wire)
            parsed = parse_frame(frame_map)
            parsed.require_signed_by(identity.node_id)

        enc = rate(f"{label}: encode+sign", encode_sign, args.seconds, "frames")
        dec = rate(f"{label}: decode+verify", decode_verify, args.seconds, "frames")
        print(f"   ratio encode+sign / sign alone     {enc / sign_only:6.2f}")
        print(f"   ratio decode+verify / verify alone {dec / verify_only:6.2f}")
    data = os.urandom(16 * 1024 * 1024)
    for label, work in (
        ("BLAKE3 of 16 MiB", lambda: content.digest(data)),
        ("MCID (chunks+manifest) of 16 MiB", lambda: content.plan_put(data, "bench", created=0)),
    ):
        start = time.perf_counter()
        runs = 5
        for _ in range(runs):
            work()
        elapsed = (time.perf_counter() - start) / runs
        print(f"{label:<44} {len(data) / elapsed / 2**20:>12,.1f} MiB/s")


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py wire
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py wire ...`")
