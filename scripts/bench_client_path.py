"""The client's own CPU per message: publish, delivery and one RPC round trip (issue 15).

Run: ``uv run python scripts/bench_client_path.py [--n N] [--profile OUT.prof] [--only NAME]``.

Two kinds of figure, both CPU time (``time.process_time``) per operation in this one process,
which a loaded machine disturbs far less than wall-clock rates:

- *client only* (``publish``, ``deliver``): a ``Node`` over a ``Session`` whose QUIC
  connection is a stand-in that keeps what is sent; ``deliver`` feeds pre-built, station-signed
  EVENT bytes through ``FrameDecoder`` → ``Session`` → ``ClientCore`` (publisher_sig verified)
  → ``Node`` → ``Subscription`` → the consumer. No station, no aioquic: the client's share.
- *end to end in process* (``e2e_pubsub``, ``e2e_fanout``, ``e2e_rpc``): a real station and
  real nodes over QUIC on loopback in this process; CPU per message (or per call) of all of it,
  and for RPC the sequential wall-clock p50 as well.

``--profile`` writes a cProfile of the chosen workloads; ``--repeat R`` runs each R times and
reports the smallest figure first (the least disturbed by other processes), then all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from macula.client_core import CoreState
from macula.node import Node
from macula.serving import IncomingCall
from macula.session import Session
from macula.stations import parse_station
from macula.wire.frames import Publish, new_frame_id
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag

REALM = realm_tag("org.example.bench")
TOPIC = "bench.client"
PROCEDURE = "org.example.bench_echo_v1"
PAYLOAD = os.urandom(128)


class _Wire:
    """Stands in for ``FrameProtocol``: keeps the bytes ``send`` is given."""

    lost = False

    def __init__(self) -> None:
        self.sent = 0

    def new_stream(self) -> int:
        return 0

    def send(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        self.sent += len(data)


def _seeded(n: int) -> Identity:
    """The same identity on every run (generating one is a puzzle of random length, which
    would make instruction counts differ from run to run)."""
    return Identity.generate(random.Random(n).randbytes)


def _offline_node() -> tuple[Node, Session]:
    station = parse_station("127.0.0.1:1")
    node = Node(_seeded(1), [station], probe_interval_s=0)
    session = Session(node.identity, station, _Wire(), node)  # type: ignore[arg-type]
    session.core.state = CoreState.ESTABLISHED
    session.core.tls_pinned = True
    node._session = session
    node._connected.set()
    return node, session


async def client_publish(n: int) -> dict[str, float]:
    node, _ = _offline_node()
    for _ in range(50):
        await node.publish(REALM, TOPIC, PAYLOAD)
    start = time.process_time()
    for _ in range(n):
        await node.publish(REALM, TOPIC, PAYLOAD)
    return {"publish_us": (time.process_time() - start) / n * 1e6}


async def client_deliver(n: int) -> dict[str, float]:
    from relay.station_frames import StationFrames  # the station's EVENT signing, reused

    node, session = _offline_node()
    publisher = _seeded(2)
    station = StationFrames(_seeded(3), os.urandom)
    sub = await node.subscribe(REALM, TOPIC, buffer=n + 100)
    now = int(time.time() * 1000)
    frames = []
    for seq in range(1, n + 1):
        publish = Publish(
            frame_id=new_frame_id(now, os.urandom(10)),
            sent_at_ms=now,
            topic=TOPIC,
            realm=REALM,
            publisher=publisher.node_id,
            seq=seq,
            payload=PAYLOAD,
            published_at_ms=now,
        ).with_publisher_sig(publisher)
        frames.append(station.event(publish, now))
    decoder = FrameDecoder()
    start = time.process_time()
    for data in frames:
        session.frames_received(0, decoder.feed(data))
        delivery = await sub.__anext__()
    spent = time.process_time() - start
    assert delivery.seq == n and sub.delivered == n, (sub.delivered, session.dropped)
    return {"deliver_us": spent / n * 1e6}


@contextlib.asynccontextmanager
async def _station() -> AsyncIterator[str]:
    # imported here: the client-only workloads stay light under valgrind
    from relay.policy import Quotas, StationPolicy
    from relay.station import Station, StationConfig

    lifted = Quotas(publish_rate=1e9, publish_burst=1e9, call_rate=1e9, call_burst=1e9)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        policy = StationPolicy(
            quotas=lifted, max_connections=1000, max_connections_per_address=1000
        )
        async with Station(StationConfig(data_dir=Path(tmp), port=0, policy=policy)) as st:
            yield st.endpoint


def _node(endpoint: str) -> Node:
    return Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0)


async def _pubsub(subscribers: int, n: int) -> float:
    async with _station() as endpoint, contextlib.AsyncExitStack() as stack:
        publisher = await stack.enter_async_context(_node(endpoint))
        nodes = [await stack.enter_async_context(_node(endpoint)) for _ in range(subscribers)]
        subs = [await node.subscribe(REALM, TOPIC, buffer=n * 2 + 100) for node in nodes]
        for node in nodes:
            await node.flush()
        await publisher.publish(REALM, TOPIC, b"?")
        for sub in subs:
            await sub.next(10)
        start = time.process_time()

        async def drain(sub: Any) -> None:
            left = n
            async for _ in sub:  # as bench_station's consumers do
                left -= 1
                if not left:
                    return

        async with asyncio.timeout(300), asyncio.TaskGroup() as group:  # bounded if one is lost
            for sub in subs:
                group.create_task(drain(sub))
            for i in range(n):
                await publisher.publish(REALM, TOPIC, PAYLOAD)
                if i % 100 == 99:
                    await asyncio.sleep(0)  # let the subscribers drain every 100 publishes
        return time.process_time() - start


async def e2e_pubsub(n: int) -> dict[str, float]:
    spent = await _pubsub(1, n)
    return {"e2e_pubsub_us_per_msg": spent / n * 1e6}


async def e2e_fanout(n: int) -> dict[str, float]:
    m = max(1, n // 10)
    spent = await _pubsub(50, m)
    return {"e2e_fanout_us_per_delivery": spent / (m * 50) * 1e6}


def _echo(call: IncomingCall) -> Any:
    return call.payload


async def e2e_rpc(n: int) -> dict[str, float]:
    async with _station() as endpoint, _node(endpoint) as server, _node(endpoint) as caller:
        await server.advertise(REALM, PROCEDURE, _echo)
        await server.flush()
        for _ in range(50):
            await caller.call(REALM, PROCEDURE, PAYLOAD)
        samples = []
        turns = _count_turns()
        start = time.process_time()
        for _ in range(n):
            began = time.perf_counter()
            await caller.call(REALM, PROCEDURE, PAYLOAD)
            samples.append(time.perf_counter() - began)
        spent = time.process_time() - start
        turned = turns()
    return {
        "e2e_rpc_cpu_us_per_call": spent / n * 1e6,
        "e2e_rpc_p50_us": statistics.median(samples) * 1e6,
        "e2e_rpc_mean_us": statistics.fmean(samples) * 1e6,
        "e2e_rpc_loop_turns_per_call": turned / n,
    }


def _count_turns() -> Callable[[], int]:
    """Count the event loop's iterations (``_run_once``) from now; the returned function
    gives the count so far and stops counting."""
    loop: Any = asyncio.get_running_loop()
    original = loop._run_once
    count = 0

    def counted() -> None:
        nonlocal count
        count += 1
        original()

    loop._run_once = counted

    def stop() -> int:
        loop._run_once = original
        return count

    return stop


WORKLOADS: dict[str, Callable[[int], Awaitable[dict[str, float]]]] = {
    "publish": client_publish,
    "deliver": client_deliver,
    "e2e_pubsub": e2e_pubsub,
    "e2e_fanout": e2e_fanout,
    "e2e_rpc": e2e_rpc,
}


async def main(args: argparse.Namespace) -> None:
    names = args.only or list(WORKLOADS)
    profiler = cProfile.Profile() if args.profile else None
    for name in names:
        runs: list[dict[str, float]] = []
        for _ in range(args.repeat):
            if profiler:
                profiler.enable()
            runs.append(await WORKLOADS[name](args.n))
            if profiler:
                profiler.disable()
        for key in runs[0]:
            values = sorted(run[key] for run in runs)
            every = " ".join(f"{v:.1f}" for v in values)
            print(f"{key:32s} {values[0]:10.1f}  (min of {len(values)}: {every})", flush=True)
    if profiler:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--profile", metavar="OUT")
    parser.add_argument("--repeat", type=int, default=1, help="report the minimum of R runs")
    parser.add_argument("--only", action="append", choices=list(WORKLOADS))
    asyncio.run(main(parser.parse_args()))
