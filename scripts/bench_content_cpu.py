"""CPU time per MiB of a content put + get, per side (client process, station child process).

Run: ``uv run python scripts/bench.py content-cpu [--mib 16] [--rounds 3] [--profile client.prof]``.
The station runs in a child process (``bench.py station --serve-station``); its CPU is read from
``/proc/PID/stat`` before and after each round, the client's from ``time.process_time()``.
Invariants: every round checks the bytes that come back; wall-clock figures are printed but are
noise on a loaded machine (compare the CPU figures); prints one JSON line per round.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_common import child_process, parser, process_cpu_seconds

from macula.node.node import Node
from macula.wire.identity import Identity

MIB = 1024 * 1024
cpu_s = process_cpu_seconds


async def one_round(node: Node, station_pid: int, mib: float) -> dict[str, float]:
    data = os.urandom(int(mib * MIB))
    station0, client0, wall0 = cpu_s(station_pid), time.process_time(), time.perf_counter()
    mcid = await node.put_content(data, name="bench")
    put_wall = time.perf_counter() - wall0
    back = await node.get_content(mcid)
    wall = time.perf_counter() - wall0
    client, station = time.process_time() - client0, cpu_s(station_pid) - station0
    if back != data:
        raise RuntimeError("content came back different")
    both = 2 * mib
    return {
        "client_ms_per_mib": round(1e3 * client / both, 1),
        "station_ms_per_mib": round(1e3 * station / both, 1),
        "mib_s": round(both / wall, 1),
        "put_s": round(put_wall, 3),
        "get_s": round(wall - put_wall, 3),
    }


async def bench(args: argparse.Namespace) -> None:
    profile = cProfile.Profile() if args.profile else None
    async with (
        child_process("serve-station", "1800", ready="endpoint") as child,
        Node(Identity.generate(os.urandom), [child.said], probe_interval_s=0) as node,
    ):
        await node.get_content(await node.put_content(os.urandom(MIB), name="warm-up"))
        for _ in range(args.rounds):
            if profile:
                profile.enable()
            figures = await one_round(node, child.pid, args.mib)
            if profile:
                profile.disable()
            print(json.dumps(figures), flush=True)
    if profile:
        profile.dump_stats(args.profile)


def main(argv: Sequence[str] | None = None) -> None:
    arguments = parser("content-cpu", __doc__)
    arguments.add_argument("--mib", type=float, default=16)
    arguments.add_argument("--rounds", type=int, default=3)
    arguments.add_argument("--profile", default="")
    asyncio.run(bench(arguments.parse_args(argv)))


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py content-cpu
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py content-cpu ...`")
