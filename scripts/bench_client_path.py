"""The client's own CPU per message: publish, delivery and one RPC round trip (issue 15).

Run: ``uv run python scripts/bench.py client-path [--n N] [--profile OUT.prof] [--only NAME]``.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common

from macula.client.core import CoreState
from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.node.session import Session
from macula.stations import parse_station
from macula.wire import verified
from macula.wire.frames import Call, Publish, Result, new_frame_id
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


COUNTS: dict[str, int] = {}
COUNTING = False


def _count_calls() -> None:
    """``--count``: count, per operation of the client-only workloads, the Ed25519 signs and
    verifies and the other per-frame work worth removing (wrappers set once, before any run)."""
    import nacl.bindings

    from macula.wire import cbor, envelope, framing

    def wrap(owner: Any, attr: str, name: str) -> None:
        original = getattr(owner, attr)

        def counted(*args: Any, **kwargs: Any) -> Any:
            COUNTS[name] = COUNTS.get(name, 0) + 1
            return original(*args, **kwargs)

        setattr(owner, attr, counted)

    global COUNTING
    COUNTING = True
    wrap(nacl.bindings, "crypto_sign", "sign")
    wrap(nacl.bindings, "crypto_sign_open", "verify")
    wrap(cbor, "decode", "cbor.decode")
    wrap(cbor, "encode", "cbor.encode")
    wrap(cbor, "encode_pairs", "cbor.encode_pairs")
    wrap(envelope.Frame, "to_map", "Frame.to_map")
    wrap(envelope.Frame, "__post_init__", "Frame.__post_init__")
    wrap(framing, "unsigned_body", "unsigned_body")
    wrap(os, "urandom", "os.urandom")
    wrap(time, "time", "time.time")
    wrap(time, "time_ns", "time.time_ns")
    wrap(time, "monotonic", "time.monotonic")


PROFILER: list[cProfile.Profile] = []  # --profile: the client-only workloads' timed loops


def _start() -> float:
    COUNTS.clear()
    if PROFILER:
        PROFILER[0].enable()
    return time.process_time()


def _counted(prefix: str, n: int) -> dict[str, float]:
    if PROFILER:
        PROFILER[0].disable()
    if not COUNTING:
        return {}
    return {f"{prefix}.{name}/op": count / n for name, count in sorted(COUNTS.items())}


PREBUILT = 600


def _prebuilt(n: int) -> int:
    """Frames built before a timed loop: the same number for every n up to ``PREBUILT``, so
    that callgrind's (Ir(n2) - Ir(n1)) / (n2 - n1) holds the timed loop's work alone."""
    return max(n, PREBUILT)


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
    start = _start()
    for _ in range(n):
        await node.publish(REALM, TOPIC, PAYLOAD)
    return {"publish_us": (time.process_time() - start) / n * 1e6, **_counted("publish", n)}


async def client_deliver(n: int) -> dict[str, float]:
    from relay.core.frames import StationFrames  # the station's EVENT signing, reused

    node, session = _offline_node()
    publisher = _seeded(2)
    station = StationFrames(_seeded(3), os.urandom)
    sub = await node.subscribe(REALM, TOPIC, buffer=n + 100)
    now = int(time.time() * 1000)
    frames = []
    for seq in range(1, _prebuilt(n) + 1):
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
    # the frames are the same from run to run (seeded): a lone subscriber's verify per event,
    # not this process's memory of the last run (macula.wire.verified)
    verified.publications.forget()
    start = _start()
    for data in frames[:n]:
        session.frames_received(0, decoder.feed(data))
        delivery = await sub.__anext__()
    spent = time.process_time() - start
    assert delivery.seq == n and sub.delivered == n, (sub.delivered, session.dropped)
    return {"deliver_us": spent / n * 1e6, **_counted("deliver", n)}


async def client_call(n: int) -> dict[str, float]:
    """The caller alone: ``Node.call`` signs and sends the CALL, a pre-built RESULT (signed by
    the serving identity) is fed back through the decoder, the call returns its payload. The
    coroutine is stepped by hand (no task, no loop turn): only the client's own work."""
    node, session = _offline_node()
    server = _seeded(4)
    now = int(time.time() * 1000)
    ids = [os.urandom(16) for _ in range(_prebuilt(n) + 50)]
    results = [
        Result(
            frame_id=new_frame_id(now, os.urandom(10)),
            sent_at_ms=now,
            call_id=call_id,
            payload=PAYLOAD,
            responded_by=server.node_id,
        ).sign_and_encode(server)
        for call_id in ids
    ]
    queue = list(reversed(ids))
    session.core.random_bytes = lambda k: queue.pop() if k == 16 else os.urandom(k)
    decoder = FrameDecoder()

    def one(result: bytes) -> Any:
        coro = node.call(REALM, PROCEDURE, PAYLOAD)
        coro.send(None)  # up to the wait for the RESULT
        session.frames_received(0, decoder.feed(result))
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        raise AssertionError("the call did not settle")

    for result in results[:50]:
        one(result)
    start = _start()
    for result in results[50 : n + 50]:
        answer = one(result)
    spent = time.process_time() - start
    assert answer == PAYLOAD
    return {"call_us": spent / n * 1e6, **_counted("call", n)}


async def client_serve(n: int) -> dict[str, float]:
    """The serving node alone: pre-built CALLs (signed by the caller) fed through the decoder,
    the plain handler runs, its RESULT is signed and handed to the connection."""
    node, session = _offline_node()
    await node.advertise(REALM, PROCEDURE, _echo)
    caller = _seeded(5)
    now = int(time.time() * 1000)
    calls = [
        Call(
            frame_id=new_frame_id(now, os.urandom(10)),
            sent_at_ms=now,
            call_id=os.urandom(16),
            procedure=PROCEDURE,
            realm=REALM,
            payload=PAYLOAD,
            deadline_ms=now + 60_000,
            caller=caller.node_id,
        ).sign_and_encode(caller)
        for _ in range(_prebuilt(n) + 50)
    ]
    wire: Any = session.protocol
    decoder = FrameDecoder()
    for data in calls[:50]:
        session.frames_received(0, decoder.feed(data))
    sent = wire.sent
    start = _start()
    for data in calls[50 : n + 50]:
        session.frames_received(0, decoder.feed(data))
    spent = time.process_time() - start
    assert node.stats.calls_served == n + 50 and wire.sent > sent, session.dropped
    return {"serve_us": spent / n * 1e6, **_counted("serve", n)}


@contextlib.asynccontextmanager
async def _station() -> AsyncIterator[str]:
    # imported here: the client-only workloads stay light under valgrind
    from relay.core.policy import Quotas, StationPolicy
    from relay.station.station import Station, StationConfig

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
    "call": client_call,
    "serve": client_serve,
    "e2e_pubsub": e2e_pubsub,
    "e2e_fanout": e2e_fanout,
    "e2e_rpc": e2e_rpc,
}


CLIENT_ONLY = ("publish", "deliver", "call", "serve")


async def bench(args: argparse.Namespace) -> None:
    names = args.only or list(WORKLOADS)
    profiler = cProfile.Profile() if args.profile else None
    for name in names:
        runs: list[dict[str, float]] = []
        for _ in range(args.repeat):
            timed_only = name in CLIENT_ONLY  # these profile their timed loop alone
            if profiler and timed_only:
                PROFILER[:] = [profiler]
            if profiler and not timed_only:
                profiler.enable()
            runs.append(await WORKLOADS[name](args.n))
            PROFILER.clear()
            if profiler and not timed_only:
                profiler.disable()
        for key in runs[0]:
            values = sorted(run[key] for run in runs)
            every = " ".join(f"{v:.1f}" for v in values)
            if "/op" in key:
                print(f"{key:32s} {values[0]:10.2f}", flush=True)
            else:
                print(f"{key:32s} {values[0]:10.1f}  (min of {len(values)}: {every})", flush=True)
    if profiler:
        profiler.dump_stats(args.profile)


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("client-path", __doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--profile", metavar="OUT")
    parser.add_argument("--repeat", type=int, default=1, help="report the minimum of R runs")
    parser.add_argument("--only", action="append", choices=list(WORKLOADS))
    parser.add_argument("--count", action="store_true", help="count signs, verifies, encodes")
    arguments = parser.parse_args(argv)
    if arguments.count:
        _count_calls()
    asyncio.run(bench(arguments))


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py client-path
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py client-path ...`")
