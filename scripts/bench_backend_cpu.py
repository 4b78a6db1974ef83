"""CPU time per operation on the selected QUIC library and event loop (``MACULA_QUIC``,
``MACULA_LOOP``), for comparing backends on a loaded machine where wall-clock rates are noise.

Run: ``MACULA_QUIC=qh3 MACULA_LOOP=uvloop uv run --extra fast python scripts/bench.py backend-cpu``.
One process holds the station, a publisher and a subscriber (or one content client), so
``time.process_time()`` counts every side of a message: client publish, station relay, client
delivery. Invariants: pub/sub goes in windows of ``--window`` messages, each fully received
before the next is published (no drops, nothing left in flight outside the measured span); the
content round trip checks the bytes that come back; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bench_common
from bench_station import REALM, bench_station_config

from macula.node.node import Node
from macula.quic import backend as quic_backend
from macula.quic import event_loop
from macula.wire.identity import Identity
from relay.station.station import Station

MIB = 1024 * 1024


async def pubsub(endpoint: str, count: int, window: int, size: int) -> dict[str, float]:
    async with (
        Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0) as publisher,
        Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0) as subscriber,
    ):
        sub = await subscriber.subscribe(REALM, "cpu", buffer=window * 2)
        await subscriber.flush()
        while True:  # until the subscription is live at the station
            await publisher.publish(REALM, "cpu", b"probe")
            try:
                await sub.next(0.5)
                break
            except TimeoutError:
                continue
        payload = bytes(size)
        sent = 0
        began_cpu, began = time.process_time(), time.perf_counter()
        while sent < count:
            batch = min(window, count - sent)
            for _ in range(batch):
                await publisher.publish(REALM, "cpu", payload)
            for _ in range(batch):
                delivery = await sub.next(30.0)
                if delivery.payload != payload:
                    raise RuntimeError("a delivery came back different")
            sent += batch
        cpu, wall = time.process_time() - began_cpu, time.perf_counter() - began
        if sub.dropped:
            raise RuntimeError(f"{sub.dropped} deliveries dropped")
    return {"messages": count, "cpu_us_per_msg": 1e6 * cpu / count, "wall_s": wall}


async def content(endpoint: str, mib: float) -> dict[str, float]:
    data = os.urandom(int(mib * MIB))
    async with Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0) as node:
        await node.get_content(await node.put_content(os.urandom(MIB), name="warm-up"))
        began_cpu, began = time.process_time(), time.perf_counter()
        mcid = await node.put_content(data, name="bench")
        back = await node.get_content(mcid)
        cpu, wall = time.process_time() - began_cpu, time.perf_counter() - began
    if back != data:
        raise RuntimeError("content came back different")
    return {
        "mib_each_way": mib,
        "cpu_s": cpu,
        "cpu_ms_per_mib": 1e3 * cpu / (2 * mib),
        "wall_s": wall,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {**quic_backend.describe(), "loop": event_loop.loop_name()}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        async with Station(bench_station_config(Path(tmp))) as station:
            if args.messages:
                result["pubsub"] = await pubsub(
                    station.endpoint, args.messages, args.window, args.size
                )
            if args.content_mib:
                result["content"] = await content(station.endpoint, args.content_mib)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("backend-cpu", __doc__)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--content-mib", type=float, default=16.0)
    print(json.dumps(event_loop.run(bench(parser.parse_args(argv)))), flush=True)


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py backend-cpu
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py backend-cpu ...`")
