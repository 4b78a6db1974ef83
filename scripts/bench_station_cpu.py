"""Station CPU per hot-path frame, in process (issue 15, docs/performance.md §8).

Drives the sans-I/O ``RouterCore`` with pre-built, pre-signed frames fed through
``FrameDecoder`` as the shell feeds them, and prints CPU µs (``process_time``) per operation:
PUBLISH with 1 and 50 local subscribers, and one CALL forwarded plus its RESULT forwarded back,
for clients whose CONNECT names the station (``bound``, as our pinned client's: issue 27) and
clients whose CONNECT does not (``--bound``); ``--count`` adds the Ed25519 signs and verifies
per operation (a separate, uncounted run gives the µs). ``--profile`` prints cProfile's top
self-time functions instead. No sockets, no clock reads in the core.
Run: ``uv run python scripts/bench.py station-cpu [--messages 2000] [--profile] [--count]``.
"""

from __future__ import annotations

import cProfile
import os
import pickle
import pstats
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from macula.wire.frames import Advertise, Call, Connect, Result, new_frame_id
from macula.wire.identity import Identity, puzzle_evidence
from relay.core.policy import Quotas, StationPolicy
from relay.core.router import RouterCore

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common
from bench_station_sig import REALM, T0, Counts, load_frames, setup, wire_frames

PROCEDURE = "bench.echo"
CALLER, PROVIDER = Identity(bytes([1]) * 32), Identity(bytes([2]) * 32)  # fixed: frames kept
CACHE = os.environ.get("BENCH_FRAMES_DIR")  # pre-built frames kept here (callgrind: no signing)


def cached(name: str, build: Callable[[], list[bytes]]) -> list[bytes]:
    """``build()``, or what an earlier run kept under ``$BENCH_FRAMES_DIR/name``."""
    if CACHE is None:
        return build()
    path = os.path.join(CACHE, name)
    if os.path.exists(path):
        with open(path, "rb") as kept:
            return list(pickle.load(kept))
    frames = build()
    with open(path, "wb") as out:
        pickle.dump(frames, out)
    return frames


def pubsub(subscribers: int, n: int, bound: bool = False) -> Callable[[], int]:
    frames = cached(f"publish-{n}", lambda: load_frames(None, n + 1, 128))
    core, _, pub_conn = setup(subscribers, station_peer=False, bound=bound)

    def one(i: int) -> int:
        maps = wire_frames(frames[i])
        return len(core.frames_received(pub_conn, 0, maps, T0 + 1 + i))

    one(0)

    def run() -> int:
        sent = 0
        for i in range(1, n + 1):
            sent += one(i)
        return sent

    return run


def rpc(n: int, bound: bool = False) -> Callable[[], int]:
    quotas = Quotas(call_rate=1e9, call_burst=1e9, max_pending_calls=10**6)
    core = RouterCore(
        Identity(os.urandom(32)),
        StationPolicy(quotas=quotas),
        open_stream=lambda conn: 1,
        random_bytes=os.urandom,
    )
    caller, provider = CALLER, PROVIDER
    for conn, ident in ((1, caller), (2, provider)):
        core.connection_made(conn, T0)
        connect = Connect(
            frame_id=new_frame_id(T0, os.urandom(10)),
            sent_at_ms=T0,
            node_id=ident.node_id,
            station_id=ident.node_id,
            puzzle_evidence=puzzle_evidence(ident.node_id),
            bound_to=core.identity.node_id if bound else None,
        )
        core.frames_received(conn, 0, wire_frames(connect.sign_and_encode(ident)), T0)
    advert = Advertise(
        frame_id=new_frame_id(T0, os.urandom(10)),
        sent_at_ms=T0,
        realm=REALM,
        procedure=PROCEDURE,
        advertiser=provider.node_id,
    )
    core.frames_received(2, 0, wire_frames(advert.sign_and_encode(provider)), T0)

    def build() -> list[bytes]:
        frames = []
        for i in range(n + 1):
            call_id = os.urandom(16)
            at = T0 + 1 + i
            frames.append(
                Call(
                    frame_id=new_frame_id(at, os.urandom(10)),
                    sent_at_ms=at,
                    call_id=call_id,
                    procedure=PROCEDURE,
                    realm=REALM,
                    payload={"text": os.urandom(32).hex(), "n": i},
                    deadline_ms=at + 30_000,
                    caller=caller.node_id,
                ).sign_and_encode(caller)
            )
            frames.append(
                Result(
                    frame_id=new_frame_id(at, os.urandom(10)),
                    sent_at_ms=at,
                    call_id=call_id,
                    payload={"text": os.urandom(32).hex(), "n": i},
                    responded_by=provider.node_id,
                ).sign_and_encode(provider)
            )
        return frames

    built = cached(f"rpc-{n}", build)
    calls, results = built[0::2], built[1::2]

    def one(i: int) -> int:
        at = T0 + 1 + i
        out = core.frames_received(1, 0, wire_frames(calls[i]), at)
        out += core.frames_received(2, 0, wire_frames(results[i]), at)
        return len(out)

    assert one(0) == 2, "the CALL and the RESULT were both forwarded"

    def run() -> int:
        sent = 0
        for i in range(1, n + 1):
            sent += one(i)
        assert sent == 2 * n, sent
        return sent

    return run


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("station-cpu", __doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="best of this many runs")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", choices=("pub1", "pub50", "rpc"))
    parser.add_argument("--bound", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--count", action="store_true", help="Ed25519 signs/verifies per op")
    args = parser.parse_args(argv)
    for bound in {"no": (False,), "yes": (True,), "both": (False, True)}[args.bound]:
        cases(args, bound)


def cases(args: Any, bound: bool) -> None:
    """Every case (or ``--only`` one) with clients ``bound`` or not."""
    n = args.messages
    cases = {
        "pub1": ("PUBLISH, 1 subscriber", lambda: pubsub(1, n, bound)),
        "pub50": ("PUBLISH, 50 subscribers", lambda: pubsub(50, n, bound)),
        "rpc": ("CALL + RESULT forwarded", lambda: rpc(n, bound)),
    }
    for key, (name, make) in cases.items():
        if args.only and key != args.only:
            continue
        label = ("bound, " if bound else "unbound, ") + name
        if args.profile:
            run = make()
            profile = cProfile.Profile()
            profile.enable()
            run()
            profile.disable()
            print(f"== {label}")
            pstats.Stats(profile).sort_stats("tottime").print_stats(22)
            continue
        best = bench_common.best_cpu_seconds(args.rounds, make)
        counted = ""
        if args.count:
            run, counts = make(), Counts()
            counts.install()
            run()
            counts.remove()
            counted = f"  sign {counts.sign / n:.2f}  verify {counts.verify / n:.2f}"
        print(f"{label:<37} {best / n * 1e6:8.1f} µs/op{counted}")


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py station-cpu
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py station-cpu ...`")
