"""How long three stations take to link through the DHT.

Station A starts alone, then B and C each naming only A as ``--peer``; the figure is the time
from A's start until all three hold a link with both others (B and C learned of each other
from the DHT), p50 over ``--runs`` runs, each in a fresh data directory, on loopback in this
process. The redial and discovery intervals are the fast ones the integration tests use.

Run: ``uv run python scripts/bench.py mesh [--runs N]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import bench_common

from relay.federation.dht import DhtConfig
from relay.federation.links import LinkTarget
from relay.station import Station, StationConfig

LINK_DEADLINE_S = 60.0


def config(data_dir: Path, peers: list[LinkTarget]) -> StationConfig:
    return dataclasses.replace(
        StationConfig(data_dir=data_dir, port=0, tick_interval_s=0.05),
        peers=peers,
        discover_interval_s=0.1,
        link_backoff_s=0.05,
        link_backoff_max_s=0.2,
        link_timeout_s=2.0,
        dht=DhtConfig(rpc_timeout_s=0.5),
    )


def linked(station: Station) -> set[bytes]:
    return {p.node_id for p in station.core.peers.values() if p.linked}


async def one_run(root: Path) -> float:
    """Seconds from A's start until A, B and C are linked pairwise."""
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(Station(config(root / "a", [])))
        via_a = [LinkTarget(a.node_id, "127.0.0.1", a.port)]
        b = await stack.enter_async_context(Station(config(root / "b", via_a)))
        c = await stack.enter_async_context(Station(config(root / "c", via_a)))
        stations = (a, b, c)
        while not all(linked(s) == {o.node_id for o in stations} - {s.node_id} for s in stations):
            if bench_common.elapsed_since(started) > LINK_DEADLINE_S:
                raise bench_common.BenchError(f"not linked after {LINK_DEADLINE_S:g} s")
            await asyncio.sleep(0.01)  # a benchmark polls; tests wait on conditions
        return bench_common.elapsed_since(started)


async def bench(runs: int, home: Path) -> list[float]:
    return [await one_run(home / str(run)) for run in range(runs)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("mesh", __doc__)
    parser.add_argument("--runs", type=int, default=3, help="meshes started, one after another")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="mbm-"))
    try:
        samples = asyncio.run(bench(max(1, args.runs), home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(
        f"mesh: three stations linked pairwise after start in p50 {statistics.median(samples):.3f}"
        f" s, min {min(samples):.3f} s, max {max(samples):.3f} s ({len(samples)} runs)"
    )
    load = os.getloadavg()[0]
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {load:.1f})")


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py mesh
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py mesh ...`")
