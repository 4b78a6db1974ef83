"""CBOR codec cost per typical frame, in CPU time (``time.process_time``), not wall clock.

Run: ``uv run python scripts/bench.py cbor [--rounds 5] [--iterations 2000] [--reference]``.

Frames: every signed frame of ``vectors/frames.json`` (real wire bodies) plus a PUBLISH and an
EVENT with a 128-byte payload built with ``macula.wire.frames``. Per frame: ``cbor.decode`` of
the body, ``cbor.encode`` of the decoded map, and, for comparison, ``parse_frame`` of the
decoded map (typed-frame construction, not CBOR). Figures are the best of ``--rounds`` rounds
(the least disturbed by other processes on a shared machine). ``--reference`` also times the
pure-Python reference codec kept for the differential tests.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_common
from bench_common import cpu_us

from macula.wire import cbor
from macula.wire.frames import Event, Publish, new_frame_id, parse_frame
from macula.wire.identity import Identity, realm_tag

VECTORS = Path(__file__).resolve().parents[1] / "tests" / "vectors"  # = ../shared/vectors


def typical_frames() -> dict[str, bytes]:
    identity = Identity.generate(os.urandom)
    now = 1_760_000_000_000
    common: dict[str, Any] = {
        "sent_at_ms": now,
        "topic": "agents.lobby",
        "realm": realm_tag("org.example.mesh"),
        "publisher": identity.node_id,
        "seq": 17,
        "payload": {"text": "x" * 100, "n": 1, "kind": "chat"},
    }
    publish = Publish(
        frame_id=new_frame_id(now, os.urandom(10)), published_at_ms=now, **common
    ).with_publisher_sig(identity)
    event = Event(
        frame_id=new_frame_id(now, os.urandom(10)),
        publisher_sig=publish.publisher_sig,
        **common,
    )
    return {
        "PUBLISH 128B+psig (built)": publish.sign_and_encode(identity)[4:],
        "EVENT 128B+psig (built)": event.sign_and_encode(identity)[4:],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("cbor", __doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--reference", action="store_true", help="also time the reference codec")
    args = parser.parse_args(argv)
    bodies = typical_frames()
    frames = json.loads((VECTORS / "frames.json").read_text())["frames"]
    for vector in frames:
        bodies[vector["name"]] = bytes.fromhex(vector["cbor_hex"])
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    codecs: list[tuple[str, Any]] = [("cbor", cbor)]
    if args.reference:
        from support import cbor_reference  # test-only module, the pre-optimisation codec

        codecs.append(("reference", cbor_reference))
    print(
        f"{'frame':<36} {'bytes':>5}  "
        + "  ".join(f"{n + ' dec/enc µs':>24}" for n, _ in codecs)
        + f"  {'parse_frame µs':>14}"
    )
    totals = {name: [0.0, 0.0] for name, _ in codecs}
    parse_total = 0.0
    for label, body in bodies.items():
        cells = []
        for name, codec in codecs:
            value = codec.decode(body)
            assert codec.encode(value) == body, label
            dec = cpu_us(lambda c=codec, b=body: c.decode(b), args.iterations, args.rounds)
            enc = cpu_us(lambda c=codec, v=value: c.encode(v), args.iterations, args.rounds)
            totals[name][0] += dec
            totals[name][1] += enc
            cells.append(f"{dec:11.2f} /{enc:11.2f}")
        frame_map = cbor.decode(body)
        parse = cpu_us(lambda m=frame_map: parse_frame(m), args.iterations, args.rounds)
        parse_total += parse
        print(f"{label:<36} {len(body):>5}  " + "  ".join(cells) + f"  {parse:14.2f}")
    count = len(bodies)
    mean = "  ".join(f"{t[0] / count:11.2f} /{t[1] / count:11.2f}" for t in totals.values())
    print(
        f"{'mean over ' + str(count) + ' frames':<36} {'':>5}  {mean}  {parse_total / count:14.2f}"
    )
    vectors = json.loads((VECTORS / "cbor.json").read_text())["vectors"]
    blobs = [bytes.fromhex(v["hex"]) for v in vectors if v["name"] != "map/key_order_mixed_types"]
    for name, codec in codecs:
        values = [codec.decode(b) for b in blobs]

        def decode_all(c: Any = codec) -> None:
            for blob in blobs:
                c.decode(blob)

        def encode_all(c: Any = codec, vs: list[Any] = values) -> None:
            for v in vs:
                c.encode(v)

        dec = cpu_us(decode_all, args.iterations // 10, args.rounds)
        enc = cpu_us(encode_all, args.iterations // 10, args.rounds)
        print(f"{name}: cbor.json vectors ({len(blobs)}): decode {dec:.1f} µs, encode {enc:.1f} µs")


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py cbor
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py cbor ...`")
