"""Station benchmark: pub/sub, fan-out, RPC, connect and publish→deliver latency over real QUIC.

Run: ``uv run python scripts/bench_station.py [--quick] [--station NODE_ID@HOST:PORT]``.
Without ``--station`` a station starts on 127.0.0.1:0 with a temporary data dir, in this process
(or in a child process with ``--station-process``, so it gets a core of its own as
``nats-server`` does); its per-connection publish and call quotas are lifted, because the
benchmark measures throughput, not the rate limiter. When ``nats-server`` is on PATH and
``nats`` (nats-py) is importable, the same workloads run through a local ``nats-server`` and the
ratios ours/theirs are printed: ``uv run --with nats-py python scripts/bench_station.py``.

Prints one line per figure. Every loop is bounded in count and in time, only loopback addresses
are used, and subscriptions buffer 100 000 events so slow consumption is measured, not dropped
(drops are reported). Both systems run through the same adapter (``Broker``/``Client``/
``Inbox``): publishers yield to the loop every ``YIELD_EVERY`` messages, subscribers consume
with ``async for``, readiness is probed, never slept for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from macula.node import Node
from macula.serving import IncomingCall
from macula.subscriptions import Subscription
from macula.wire.identity import Identity, realm_tag
from relay.policy import Quotas, StationPolicy
from relay.station import Station, StationConfig

REALM = realm_tag("org.example.bench")
PROCEDURE = "org.example.bench_echo_v1"
PAYLOAD_SIZE = 128
PROBE = b"?"  # readiness probes; every measured payload is PAYLOAD_SIZE bytes long
YIELD_EVERY = 100
SUB_BUFFER = 100_000
IN_FLIGHT = 50
CALL_TIMEOUT = 10.0
LIFTED = Quotas(publish_rate=1e9, publish_burst=1e9, call_rate=1e9, call_burst=1e9)


class BenchError(Exception):
    """A workload could not be set up (subscriptions or procedure never became active)."""


@dataclass(frozen=True)
class Limits:
    messages: int  # pub/sub 1:1
    fanout_subscribers: int
    fanout_messages: int  # per subscriber
    calls: int  # sequential, 1 in flight
    parallel_calls: int  # IN_FLIGHT in flight
    connects: int
    latency_samples: int
    phase_seconds: float  # upper bound on each measured phase


FULL = Limits(20_000, 50, 2_000, 2_000, 10_000, 50, 2_000, 60.0)
QUICK = Limits(2_000, 10, 100, 200, 1_000, 5, 200, 15.0)

# -- the adapter both systems are driven through --------------------------------------------


class Inbox(Protocol):
    @property
    def dropped(self) -> int: ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def next(self, timeout: float) -> bytes: ...


class Client(Protocol):
    async def publish(self, topic: str, payload: bytes) -> None: ...

    async def subscribe(self, topic: str) -> Inbox: ...

    async def call(self, payload: bytes, timeout: float) -> bytes: ...

    async def serve(self) -> None: ...


class Broker(Protocol):
    name: str

    def connect(self) -> contextlib.AbstractAsyncContextManager[Client]: ...


class MaculaInbox:
    def __init__(self, sub: Subscription) -> None:
        self.sub = sub

    @property
    def dropped(self) -> int:
        return self.sub.dropped

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for delivery in self.sub:
            yield delivery.payload if isinstance(delivery.payload, bytes) else b""

    async def next(self, timeout: float) -> bytes:
        payload = (await self.sub.next(timeout)).payload
        return payload if isinstance(payload, bytes) else b""


def _echo(call: IncomingCall) -> Any:
    return call.payload


class MaculaClient:
    def __init__(self, node: Node) -> None:
        self.node = node

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.node.publish(REALM, topic, payload)

    async def subscribe(self, topic: str) -> Inbox:
        return MaculaInbox(await self.node.subscribe(REALM, topic, buffer=SUB_BUFFER))

    async def call(self, payload: bytes, timeout: float) -> bytes:
        result = await self.node.call(REALM, PROCEDURE, payload, timeout=timeout)
        return result if isinstance(result, bytes) else b""

    async def serve(self) -> None:
        await self.node.advertise(REALM, PROCEDURE, _echo)


@dataclass
class MaculaBroker:
    endpoint: str
    name: str = "macula"

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Client]:
        async with Node(Identity.generate(os.urandom), [self.endpoint]) as node:
            yield MaculaClient(node)


class NatsInbox:
    def __init__(self, sub: Any, slow: Counter[str]) -> None:
        self.sub = sub
        self.slow = slow

    @property
    def dropped(self) -> int:
        return self.slow["slow_consumer"]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for msg in self.sub.messages:
            yield bytes(msg.data)

    async def next(self, timeout: float) -> bytes:
        return bytes((await self.sub.next_msg(timeout=timeout)).data)


class NatsClient:
    def __init__(self, nc: Any, slow: Counter[str]) -> None:
        self.nc = nc
        self.slow = slow

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.nc.publish(topic, payload)

    async def subscribe(self, topic: str) -> Inbox:
        sub = await self.nc.subscribe(topic, pending_msgs_limit=SUB_BUFFER)
        await self.nc.flush()
        return NatsInbox(sub, self.slow)

    async def call(self, payload: bytes, timeout: float) -> bytes:
        return bytes((await self.nc.request(PROCEDURE, payload, timeout=timeout)).data)

    async def serve(self) -> None:
        async def respond(msg: Any) -> None:
            await msg.respond(msg.data)

        await self.nc.subscribe(PROCEDURE, cb=respond)
        await self.nc.flush()


@dataclass
class NatsBroker:
    url: str
    name: str = "nats"

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Client]:
        import nats  # type: ignore[import-not-found,unused-ignore]

        slow: Counter[str] = Counter()

        async def on_error(exc: Exception) -> None:
            slow["slow_consumer" if type(exc).__name__ == "SlowConsumerError" else "other"] += 1

        nc = await nats.connect(self.url, error_cb=on_error, allow_reconnect=False)
        try:
            yield NatsClient(nc, slow)
        finally:
            await nc.close()


# -- figures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    key: str  # same key for both systems: the ratio pairs them up
    label: str
    value: float
    unit: str  # a rate ("…/s") is better higher, a time better lower
    note: str = ""


def show(system: str, figure: Figure) -> None:
    value = f"{figure.value:>12,.1f}" if figure.value < 100 else f"{figure.value:>12,.0f}"
    print(f"{system:<7}{figure.label:<38} {value} {figure.unit:<13} {figure.note}", flush=True)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def elapsed_since(start: float) -> float:
    return time.perf_counter() - start


# -- workloads (each bounded in count and in time) ------------------------------------------


@dataclass
class Flow:
    expected: int
    received: int = 0
    last: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def hit(self) -> None:
        self.received += 1
        self.last = time.perf_counter()
        if self.received >= self.expected:
            self.done.set()


async def consume(inbox: Inbox, flow: Flow) -> None:
    async for payload in inbox:
        if len(payload) == PAYLOAD_SIZE:
            flow.hit()


async def wait_subscribed(
    publisher: Client, inboxes: list[Inbox], topic: str, seconds: float
) -> None:
    """Publish probes until every inbox has seen one (SUBSCRIBE has no ack)."""
    deadline = time.perf_counter() + seconds
    pending = list(inboxes)

    async def heard(inbox: Inbox) -> bool:
        with contextlib.suppress(TimeoutError):
            await inbox.next(0.05)
            return True
        return False

    while pending:
        if time.perf_counter() > deadline:
            raise BenchError(f"{len(pending)} subscriptions not active after {seconds:g} s")
        await publisher.publish(topic, PROBE)
        answers = await asyncio.gather(*(heard(inbox) for inbox in pending))
        pending = [inbox for inbox, ok in zip(pending, answers, strict=True) if not ok]


async def publish_many(publisher: Client, topic: str, count: int, deadline: float) -> int:
    payload = os.urandom(PAYLOAD_SIZE)
    for i in range(count):
        await publisher.publish(topic, payload)
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)
            if time.perf_counter() > deadline:
                return i + 1
    return count


async def pubsub(broker: Broker, subscribers: int, messages: int, seconds: float) -> list[Figure]:
    """One publisher, ``subscribers`` subscriber clients: deliveries per second, all counted."""
    topic = f"bench.pubsub.{subscribers}"
    async with contextlib.AsyncExitStack() as stack:
        publisher = await stack.enter_async_context(broker.connect())
        clients = [await stack.enter_async_context(broker.connect()) for _ in range(subscribers)]
        inboxes = [await client.subscribe(topic) for client in clients]
        await wait_subscribed(publisher, inboxes, topic, 10.0)
        flow = Flow(expected=subscribers * messages)
        async with asyncio.TaskGroup() as group:
            consumers = [group.create_task(consume(inbox, flow)) for inbox in inboxes]
            start = time.perf_counter()
            deadline = start + seconds
            sent = await publish_many(publisher, topic, messages, deadline)
            flow.expected = subscribers * sent
            if flow.received >= flow.expected:
                flow.done.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(flow.done.wait(), max(0.0, deadline - time.perf_counter()))
            for task in consumers:
                task.cancel()
        dropped = sum(inbox.dropped for inbox in inboxes)
    elapsed = flow.last - start if flow.received else float("inf")
    note = f"({flow.received:,}/{subscribers * messages:,} delivered, {dropped:,} dropped"
    note += f", {elapsed:.2f} s)" if flow.received else ", nothing arrived)"
    rate = flow.received / elapsed
    if subscribers == 1:
        return [Figure("pubsub", f"pub/sub 1:1 ({messages:,} msgs)", rate, "msgs/s", note)]
    label = f"fan-out 1→{subscribers} ({messages:,} msgs each)"
    return [Figure("fanout", label, rate, "deliveries/s", note)]


async def wait_served(caller: Client, seconds: float) -> None:
    """Call until the procedure answers (ADVERTISE has no ack)."""
    deadline = time.perf_counter() + seconds
    while True:
        try:
            await caller.call(PROBE, 1.0)
            return
        except Exception as exc:
            if time.perf_counter() > deadline:
                raise BenchError(f"procedure not served after {seconds:g} s: {exc!r}") from exc
            await asyncio.sleep(0.02)


def describe(errors: Counter[str]) -> str:
    if not errors:
        return "0 errors"
    common = "; ".join(f"{n} x {e}" for e, n in errors.most_common(3))
    return f"{errors.total():,} errors: {common}"


async def in_flight(
    caller: Client, total: int, width: int, deadline: float
) -> tuple[int, float, Counter[str], list[float]]:
    """``total`` calls with ``width`` in flight: (answered, seconds, errors, latencies)."""
    issued = answered = 0
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    payload = os.urandom(PAYLOAD_SIZE)

    async def worker() -> None:
        nonlocal issued, answered
        while issued < total and time.perf_counter() < deadline:
            issued += 1
            began = time.perf_counter()
            try:
                await caller.call(payload, CALL_TIMEOUT)
            except Exception as exc:
                errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
                continue
            latencies.append(time.perf_counter() - began)
            answered += 1

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(width):
            group.create_task(worker())
    return answered, elapsed_since(start), errors, latencies


async def rpc(broker: Broker, limits: Limits) -> list[Figure]:
    async with broker.connect() as provider, broker.connect() as caller:
        await provider.serve()
        await wait_served(caller, 10.0)
        deadline = time.perf_counter() + limits.phase_seconds
        answered, seconds, errors, latencies = await in_flight(caller, limits.calls, 1, deadline)
        note = f"({answered:,} calls, {describe(errors)})"
        p50, p99 = percentile(latencies, 0.5) * 1e6, percentile(latencies, 0.99) * 1e6
        figures = [
            Figure("rpc_p50", "RPC latency p50 (sequential)", p50, "µs", note),
            Figure("rpc_p99", "RPC latency p99 (sequential)", p99, "µs"),
            Figure("rpc_1", "RPC calls/s, 1 in flight", answered / seconds, "calls/s"),
        ]
        deadline = time.perf_counter() + limits.phase_seconds
        total = limits.parallel_calls
        answered, seconds, errors, latencies = await in_flight(caller, total, IN_FLIGHT, deadline)
        p50_ms = percentile(latencies, 0.5) * 1e3
        note = f"({answered:,} calls, {describe(errors)}, p50 {p50_ms:.1f} ms)"
        label = f"RPC calls/s, {IN_FLIGHT} in flight"
        figures.append(Figure(f"rpc_{IN_FLIGHT}", label, answered / seconds, "calls/s", note))
    return figures


async def connect_times(broker: Broker, limits: Limits) -> list[Figure]:
    samples: list[float] = []
    deadline = time.perf_counter() + limits.phase_seconds
    for _ in range(limits.connects):
        if time.perf_counter() > deadline:
            break
        began = time.perf_counter()
        async with broker.connect():
            samples.append(elapsed_since(began))
    note = f"({len(samples)} connects, p99 {percentile(samples, 0.99) * 1e3:.1f} ms)"
    return [Figure("connect_p50", "connect p50", percentile(samples, 0.5) * 1e3, "ms", note)]


async def latency(broker: Broker, limits: Limits) -> list[Figure]:
    """Publish one stamped message, wait for it, repeat: publish→deliver latency, unloaded."""
    topic = "bench.latency"
    samples: list[float] = []
    lost = 0
    async with broker.connect() as publisher, broker.connect() as subscriber:
        inbox = await subscriber.subscribe(topic)
        await wait_subscribed(publisher, [inbox], topic, 10.0)
        deadline = time.perf_counter() + limits.phase_seconds
        pad = bytes(PAYLOAD_SIZE - 8)
        for _ in range(limits.latency_samples):
            if time.perf_counter() > deadline:
                break
            await publisher.publish(topic, time.perf_counter_ns().to_bytes(8, "big") + pad)
            try:
                payload = b""
                while len(payload) != PAYLOAD_SIZE:
                    payload = await inbox.next(2.0)
            except TimeoutError:
                lost += 1
                continue
            samples.append((time.perf_counter_ns() - int.from_bytes(payload[:8], "big")) / 1e3)
        dropped = inbox.dropped
    note = f"({len(samples):,} samples, {lost} lost, {dropped} dropped)"
    return [
        Figure("e2e_p50", "publish→deliver p50", percentile(samples, 0.5), "µs", note),
        Figure("e2e_p99", "publish→deliver p99", percentile(samples, 0.99), "µs"),
    ]


Workload = Callable[[Broker, Limits], Awaitable[list[Figure]]]


WORKLOADS: dict[str, Workload] = {
    "pub/sub 1:1": lambda broker, limits: pubsub(broker, 1, limits.messages, limits.phase_seconds),
    "fan-out": lambda broker, limits: pubsub(
        broker, limits.fanout_subscribers, limits.fanout_messages, limits.phase_seconds
    ),
    "RPC": rpc,
    "connect": connect_times,
    "publish→deliver": latency,
}
SELECTIONS = {"all": list(WORKLOADS), "client": ["RPC", "publish→deliver"]}


async def run_all(broker: Broker, names: list[str], limits: Limits) -> tuple[list[Figure], bool]:
    """Every selected workload; a failing one is reported with its traceback, the rest run."""
    figures: list[Figure] = []
    ok = True
    for name in names:
        try:
            results = await WORKLOADS[name](broker, limits)
        except Exception as exc:
            ok = False
            print(f"{broker.name:<7}{name:<38} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            continue
        for figure in results:
            show(broker.name, figure)
        figures.extend(results)
    return figures, ok


# -- the systems under test -----------------------------------------------------------------


def bench_station_config(data_dir: Path) -> StationConfig:
    return StationConfig(data_dir=data_dir, port=0, policy=StationPolicy(quotas=LIFTED))


@contextlib.asynccontextmanager
async def our_station(args: argparse.Namespace) -> AsyncIterator[tuple[str, Station | None]]:
    if args.station:
        print(f"station: {args.station} (external; its own quotas apply)", flush=True)
        yield args.station, None
    elif args.station_process:
        async with station_process() as endpoint:
            print(f"station: {endpoint} (child process, quotas lifted)", flush=True)
            yield endpoint, None
    else:
        with tempfile.TemporaryDirectory(prefix="bench-station-") as tmp:
            async with Station(bench_station_config(Path(tmp))) as station:
                print(f"station: {station.endpoint} (in this process, quotas lifted)", flush=True)
                yield station.endpoint, station


@contextlib.asynccontextmanager
async def station_process() -> AsyncIterator[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve-station",
        "1800",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30.0)
        if not line.startswith(b"endpoint "):
            raise BenchError(f"station process said {line!r}")
        yield line.split()[1].decode()
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def serve_station(seconds: float) -> None:
    """Child-process mode: serve until stdin closes or ``seconds`` pass."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    with tempfile.TemporaryDirectory(prefix="bench-station-") as tmp:
        async with Station(bench_station_config(Path(tmp))) as station:
            print(f"endpoint {station.endpoint}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(), seconds)


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def nats_server(executable: str) -> AsyncIterator[str]:
    port = free_tcp_port()
    proc = await asyncio.create_subprocess_exec(
        executable,
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = time.perf_counter() + 10.0
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if time.perf_counter() > deadline or proc.returncode is not None:
                    raise BenchError("nats-server did not start listening within 10 s") from None
                await asyncio.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def nats_missing() -> str | None:
    missing = []
    if shutil.which("nats-server") is None:
        missing.append("nats-server (apt-get install nats-server)")
    if importlib.util.find_spec("nats") is None:
        missing.append("nats-py (uv run --with nats-py python scripts/bench_station.py)")
    return ", ".join(missing) or None


def print_ratios(ours: list[Figure], theirs: list[Figure]) -> None:
    peer = {figure.key: figure for figure in theirs}
    print("ratios ours/nats (throughput: >1 means we are faster; latency: >1 means we are slower)")
    for figure in ours:
        other = peer.get(figure.key)
        if other is None or not other.value:
            continue
        print(f"ratio  {figure.label:<38} {figure.value / other.value:>12.3f}", flush=True)


def station_counters(station: Station) -> None:
    stats = station.core.stats
    shown = ", ".join(f"{name}={count:,}" for name, count in sorted(stats.items()))
    print(f"station counters: {shown}", flush=True)


async def run(args: argparse.Namespace) -> int:
    limits = QUICK if args.quick else FULL
    names = SELECTIONS[args.only]
    print(
        f"macula station benchmark ({'quick' if args.quick else 'full'}), "
        f"{PAYLOAD_SIZE}-byte payloads, {os.cpu_count()} CPUs",
        flush=True,
    )
    async with our_station(args) as (endpoint, station):
        ours, ok = await run_all(MaculaBroker(endpoint), names, limits)
        if station is not None:
            station_counters(station)
    if args.no_nats:
        return 0 if ok else 1
    missing = nats_missing()
    executable = shutil.which("nats-server")
    if missing is not None or executable is None:
        print(f"NATS comparison not run: missing {missing}", flush=True)
        return 0 if ok else 1
    async with nats_server(executable) as url:
        print(f"nats-server: {url} (child process, plain TCP without TLS)", flush=True)
        theirs, nats_ok = await run_all(NatsBroker(url), names, limits)
    print_ratios(ours, theirs)
    return 0 if ok and nats_ok else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--station", help="benchmark this station (node_id@host:port) instead")
    parser.add_argument(
        "--station-process", action="store_true", help="run our station in a child process"
    )
    parser.add_argument("--only", choices=sorted(SELECTIONS), default="all")
    parser.add_argument("--no-nats", action="store_true", help="skip the NATS comparison")
    parser.add_argument("--serve-station", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.serve_station is not None:
        asyncio.run(serve_station(args.serve_station))
        return
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
