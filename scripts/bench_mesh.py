"""How long three stations take to link, and (``--join``) how soon a joining station is reached.

Station A starts alone, then B and C each naming only A as ``--peer``; the figure is the time
from A's start until all three hold a link with both others (B and C learned of each other
from A's station list, else the DHT), p50 over ``--runs`` runs, each in a fresh data directory,
on loopback in this process. The redial and discovery intervals are the fast ones the
integration tests use.

``--join`` (issue 37): three ``macula-relay`` PROCESSES at their default discovery interval
(30 s). A starts, B joins through A with a subscriber on it; then C is started with ``--peer A``
and a client on C serves a procedure and publishes every 20 ms. Per run: from C's start
(spawned) and from C's first link (its log's ``link up:``, polled every 10 ms) until B's
subscriber has one of C's events, and until B's call reaches the procedure on C.

Run: ``uv run python scripts/bench.py mesh [--runs N] [--join]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import bench_common

from macula.errors import MeshError
from macula.node.node import Node
from macula.wire.identity import Identity, realm_tag
from relay.federation.dht.station import DhtConfig
from relay.federation.links import LinkTarget
from relay.station.station import Station, StationConfig

LINK_DEADLINE_S = 60.0
REPO = Path(__file__).resolve().parents[1]
REALM = realm_tag("org.example.bench_mesh")


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


# --- --join: C joins A's mesh of processes; how soon B hears and reaches C -------------------

JOIN_TOPIC = "bench.join"
JOIN_PROCEDURE = "org.example.bench_join_v1"


@contextlib.asynccontextmanager
async def relay_process(data_dir: Path, *peers: str) -> AsyncIterator[str]:
    """``macula-relay`` on a free loopback port (discovery at its default), joining through
    ``peers``; its endpoint. Ended with SIGTERM on leaving."""
    data_dir.mkdir(parents=True)
    arguments = ["--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir),
                 "--log-file", str(data_dir / "station.log")]  # fmt: skip
    for peer in peers:
        arguments += ["--peer", peer]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay.ops.cli", *arguments, cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = (await asyncio.wait_for(child.stdout.readline(), 30)).decode().strip()
        if "@" not in line:
            raise bench_common.BenchError(f"{data_dir.name} did not start: {line!r}")
        yield line
    finally:
        if child.returncode is None:
            child.terminate()
            await asyncio.wait_for(child.wait(), 10)


def linked_in_log(data_dir: Path) -> bool:
    log = data_dir / "station.log"
    return log.exists() and "link up:" in log.read_text(errors="replace")


async def until(check: Callable[[], Awaitable[bool]], started: float) -> float:
    """Seconds from ``started`` until ``check()`` holds (polled); BenchError past the deadline."""
    while not await check():
        if bench_common.elapsed_since(started) > LINK_DEADLINE_S:
            raise bench_common.BenchError(f"not reached after {LINK_DEADLINE_S:g} s")
    return bench_common.elapsed_since(started)


async def join_run(root: Path) -> dict[str, float]:
    """One run: seconds from C's start and from C's first link until B hears and reaches C."""
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(relay_process(root / "a"))
        b = await stack.enter_async_context(relay_process(root / "b", a))
        while not linked_in_log(root / "b"):
            await asyncio.sleep(0.01)  # a benchmark polls; tests wait on conditions
        at_b = await stack.enter_async_context(Node(Identity.generate(os.urandom), [b]))
        watch = await at_b.subscribe(REALM, JOIN_TOPIC)
        await at_b.flush()
        started = time.perf_counter()
        c = await stack.enter_async_context(relay_process(root / "c", a))
        first_link = 0.0

        async def link_seen() -> None:
            nonlocal first_link
            while not linked_in_log(root / "c"):
                await asyncio.sleep(0.01)  # a benchmark polls the mesh forming
            first_link = bench_common.elapsed_since(started)

        seen = asyncio.create_task(link_seen())
        at_c = await stack.enter_async_context(Node(Identity.generate(os.urandom), [c]))
        await at_c.advertise(REALM, JOIN_PROCEDURE, lambda call: call.payload)
        await at_c.flush()

        async def heard() -> bool:
            await at_c.publish(REALM, JOIN_TOPIC, b"c")
            try:
                await watch.next(0.02)
            except TimeoutError:
                return False
            return True

        async def reached() -> bool:
            try:
                return await at_b.call(REALM, JOIN_PROCEDURE, 1, timeout=0.5) == 1
            except MeshError:
                await asyncio.sleep(0.02)  # a benchmark polls the mesh forming
                return False

        event, call = await asyncio.gather(until(heard, started), until(reached, started))
        await seen
    return {"link": first_link, "event": event, "call": call}


def join_main(runs: int, home: Path) -> None:
    samples = [asyncio.run(join_run(home / str(run))) for run in range(runs)]

    def p50(key: str, since_link: bool = False) -> str:
        values = [s[key] - (s["link"] if since_link else 0.0) for s in samples]
        return (
            f"p50 {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})"
        )

    print(f"join: C started -> C's first link {p50('link')}")
    print(f"join: C started -> B's subscriber has C's event {p50('event')}")
    print(f"join: C started -> B's call reaches C {p50('call')}")
    print(f"join: C's first link -> B has C's event {p50('event', True)}")
    print(f"join: C's first link -> B's call reaches C {p50('call', True)} ({runs} runs)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("mesh", __doc__)
    parser.add_argument("--runs", type=int, default=3, help="meshes started, one after another")
    parser.add_argument("--join", action="store_true", help="processes: C joins, B reaches C")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="mbm-"))
    try:
        if args.join:
            join_main(max(1, args.runs), home)
        else:
            samples = asyncio.run(bench(max(1, args.runs), home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    load = os.getloadavg()[0]
    if args.join:
        print(f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {load:.1f})")
        return
    print(
        f"mesh: three stations linked pairwise after start in p50 {statistics.median(samples):.3f}"
        f" s, min {min(samples):.3f} s, max {max(samples):.3f} s ({len(samples)} runs)"
    )
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {load:.1f})")


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py mesh
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py mesh ...`")
