"""Station benchmark: ours vs nats-server + nats-py vs the amqtt broker, and issue 15's goals.

Run: ``uv run --with nats-py --with amqtt python scripts/bench.py station --station-process``
(``--quick`` for a smoke run, ``--json PATH`` for every figure and goal as one JSON object,
``--idle N`` idle connections for the memory figure, ``--station NODE_ID@HOST:PORT`` for an
external station, ``--no-peers`` to measure ours alone). Without ``--station`` our station
starts on 127.0.0.1:0 with a temporary data dir, in this process or (``--station-process``) in
a child process, so it gets a core of its own as ``nats-server`` and the amqtt broker (always a
child process) do; its per-connection quotas and per-address connection cap are lifted, because
the benchmark measures throughput, not the limiters. A peer whose program or package is missing
is skipped with one line saying what to install (nats-server is a Debian package).

Workloads (module): pub/sub 1:1 and fan-out 1→N of 128-byte payloads, RPC latency and calls/s,
connect time, publish→deliver latency (here; every system through the ``Broker``/``Client``/
``Inbox`` adapter of bench_common); content put+get vs one raw aioquic stream, station memory per
idle connection, ``tools/list`` size of a real ``macula-mcp`` (bench_resources); the peers
(bench_peers); the goals table and JSON (bench_goals).

Every loop is bounded in count and in time, only loopback addresses are used, subscriptions
buffer 100 000 events so slow consumption is measured, not dropped (drops are reported).
Publishers yield to the loop every ``YIELD_EVERY`` messages, subscribers consume with ``async
for``, readiness is probed, never slept for. Our benchmark nodes run without the liveness probe
(``probe_interval_s=0``): on a loaded machine a ping unanswered for 1.5 s made a node fail over
mid-run and lose the messages in flight, which measured the load, not the path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_common
import bench_goals
import bench_peers
import bench_resources
from bench_common import (
    CALL_TIMEOUT,
    FULL,
    IN_FLIGHT,
    PAYLOAD_SIZE,
    PROBE,
    PROCEDURE,
    QUICK,
    SUB_BUFFER,
    YIELD_EVERY,
    BenchError,
    Broker,
    Client,
    Figure,
    Inbox,
    Limits,
    child_process,
    elapsed_since,
    percentile,
    serve_until_stdin_closes,
    show,
)

from macula.node.node import Node
from macula.node.serving import IncomingCall
from macula.node.subscriptions import Subscription
from macula.quic import backend as quic_backend
from macula.quic import event_loop
from macula.wire.identity import Identity, realm_tag
from relay.core.policy import Quotas, StationPolicy
from relay.station.station import Station, StationConfig

REALM = realm_tag("org.example.bench")
LIFTED = Quotas(publish_rate=1e9, publish_burst=1e9, call_rate=1e9, call_burst=1e9)
MAX_CONNECTIONS = 100_000  # the idle-memory workload opens thousands from one address

# -- our client through the adapter ---------------------------------------------------------


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
    # identities ground ahead of a timed connect: an agent's identity comes from its key file,
    # and grinding a new one (the §2 puzzle, several ms) is not part of QUIC + CONNECT/HELLO
    spare: list[Identity] = field(default_factory=list)

    def prepare(self, connects: int) -> None:
        while len(self.spare) < connects:
            self.spare.append(Identity.generate(os.urandom))

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Client]:
        identity = self.spare.pop() if self.spare else Identity.generate(os.urandom)
        node = Node(identity, [self.endpoint], probe_interval_s=0)
        async with node:
            yield MaculaClient(node)


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
    prepare = getattr(broker, "prepare", None)
    if prepare is not None:  # what a system does before it connects is not timed
        prepare(limits.connects)
    deadline = time.perf_counter() + limits.phase_seconds
    for _ in range(limits.connects):
        if time.perf_counter() > deadline:
            break
        began = time.perf_counter()
        async with broker.connect():
            samples.append(elapsed_since(began))
    p99 = percentile(samples, 0.99) * 1e3
    note = f"({len(samples)} connects, p99 {p99:.1f} ms, identity ready)"
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
SELECTIONS = {
    "all": list(WORKLOADS),
    "client": ["RPC", "publish→deliver"],
    "latency": ["RPC", "connect", "publish→deliver"],  # the latency goals alone, for A/B runs
    "pubsub": ["pub/sub 1:1", "fan-out"],  # what the profile in docs/performance.md ran
}


async def run_all(broker: Broker, names: list[str], limits: Limits) -> tuple[list[Figure], bool]:
    """Every selected workload; a failing one is reported with its traceback, the rest run."""
    figures: list[Figure] = []
    ok = True
    for name in names:
        if name == "RPC" and broker.name == "amqtt":
            note = "(not applicable: MQTT has no request/reply)"
            print(f"{broker.name:<8}{'RPC':<38} {'—':>12}  {note}", flush=True)
            continue
        try:
            results = await WORKLOADS[name](broker, limits)
        except Exception as exc:
            ok = False
            print(f"{broker.name:<8}{name:<38} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
            continue
        for figure in results:
            show(broker.name, figure)
        figures.extend(results)
    return figures, ok


async def guarded(
    system: str, what: str, work: Awaitable[list[Figure]]
) -> tuple[list[Figure], bool]:
    """One extra workload: its figures shown, or its failure reported (the others still run)."""
    try:
        results = await work
    except Exception as exc:
        print(f"{system:<8}{what:<38} FAILED: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        return [], False
    for figure in results:
        show(system, figure)
    return results, True


# -- the systems under test -----------------------------------------------------------------


def bench_station_config(data_dir: Path) -> StationConfig:
    policy = StationPolicy(
        quotas=LIFTED,
        max_connections=MAX_CONNECTIONS,
        max_connections_per_address=MAX_CONNECTIONS,
    )
    return StationConfig(data_dir=data_dir, port=0, policy=policy)


@contextlib.asynccontextmanager
async def our_station(args: argparse.Namespace) -> AsyncIterator[tuple[str, Station | None]]:
    if args.station:
        print(f"station: {args.station} (external; its own quotas apply)", flush=True)
        yield args.station, None
    elif args.workers is not None:
        async with relay_workers(args.workers) as endpoint:
            print(f"station: {endpoint} (macula-relay --workers {args.workers})", flush=True)
            yield endpoint, None
    elif args.station_process:
        async with child_process("serve-station", "1800", ready="endpoint") as child:
            print(f"station: {child.said} (child process {child.pid}, limits lifted)", flush=True)
            yield child.said, None
    else:
        with tempfile.TemporaryDirectory(prefix="bench-station-") as tmp:
            async with Station(bench_station_config(Path(tmp))) as station:
                print(f"station: {station.endpoint} (in this process, limits lifted)", flush=True)
                yield station.endpoint, station


@contextlib.asynccontextmanager
async def relay_workers(count: int) -> AsyncIterator[str]:
    """``macula-relay --workers count`` (a parent and its workers, real processes) on
    127.0.0.1:0 with the benchmark's limits lifted as flags; its endpoint."""
    lifted = ["--publish-rate", "1e9", "--call-rate", "1e9", "--station-event-rate", "1e9"]
    lifted += ["--max-connections", str(MAX_CONNECTIONS)]
    lifted += ["--max-connections-per-address", str(MAX_CONNECTIONS)]
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "relay.ops.cli", "--port", "0", "--data-dir", tmp),
            *("--workers", str(count), "--log-level", "warning", *lifted),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 120)
            if b"@" not in line:
                raise RuntimeError(f"macula-relay --workers {count} printed {line!r}")
            yield line.decode().strip()
        finally:
            if process.returncode is None:
                process.terminate()
            await process.wait()


async def serve_station(seconds: float) -> None:
    """Child-process mode: serve until stdin closes or ``seconds`` pass."""
    with tempfile.TemporaryDirectory(prefix="bench-station-") as tmp:
        async with Station(bench_station_config(Path(tmp))) as station:
            print(f"endpoint {station.endpoint}", flush=True)
            await serve_until_stdin_closes(seconds)


def station_counters(station: Station) -> None:
    stats = station.core.stats
    shown = ", ".join(f"{name}={count:,}" for name, count in sorted(stats.items()))
    print(f"station counters: {shown}", flush=True)


@dataclass
class Run:
    figures: dict[str, dict[str, Figure]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    ok: bool = True

    def add(self, system: str, results: tuple[list[Figure], bool]) -> None:
        figures, ok = results
        self.figures.setdefault(system, {}).update({f.key: f for f in figures})
        self.ok = self.ok and ok

    def skip(self, system: str, reason: str) -> None:
        self.skipped[system] = reason
        print(f"{system:<8}skipped: {reason}", flush=True)


async def run_ours(args: argparse.Namespace, limits: Limits, names: list[str], run: Run) -> None:
    async with our_station(args) as (endpoint, station):
        run.add("macula", await run_all(MaculaBroker(endpoint), names, limits))
        if args.only == "all":
            content = bench_resources.content(endpoint, limits)
            run.add("macula", await guarded("macula", "content", content))
            tools = bench_resources.tools_list(endpoint)
            run.add("macula", await guarded("macula", "tools/list", tools))
        if station is not None:
            station_counters(station)
    if args.only == "all":
        idle = bench_resources.idle_memory(limits)
        run.add("macula", await guarded("macula", "idle connections", idle))
        raw = bench_resources.raw_quic(limits)
        run.add("aioquic", await guarded("aioquic", "raw stream", raw))


async def run_peers(args: argparse.Namespace, limits: Limits, names: list[str], run: Run) -> None:
    missing = bench_peers.missing_nats()
    executable = shutil.which("nats-server")
    if missing is not None or executable is None:
        run.skip("nats", f"NATS comparison not run: missing {missing}")
    else:
        async with bench_peers.nats_server(executable) as url:
            print(f"nats-server: {url} (child process, plain TCP without TLS)", flush=True)
            run.add("nats", await run_all(bench_peers.NatsBroker(url), names, limits))
    missing = bench_peers.missing_amqtt()
    if missing is not None:
        run.skip("amqtt", f"amqtt comparison not run: missing {missing}")
        return
    async with bench_peers.amqtt_broker() as port:
        print(f"amqtt broker: 127.0.0.1:{port} (child process, QoS 0, plain TCP)", flush=True)
        run.add("amqtt", await run_all(bench_peers.AmqttBroker(port), names, limits))


def print_ratios(run: Run) -> None:
    ours = run.figures.get("macula", {})
    for peer in ("nats", "amqtt", "aioquic"):
        theirs = run.figures.get(peer, {})
        pairs = [(f, theirs[k]) for k, f in ours.items() if k in theirs and theirs[k].value]
        if not pairs:
            continue
        print(f"ratios ours/{peer} (rates: >1 means we are faster; times: >1 means slower)")
        for mine, other in pairs:
            print(f"ratio   {mine.label:<38} {mine.value / other.value:>12.3f}", flush=True)


async def run(args: argparse.Namespace) -> int:
    limits = QUICK if args.quick else FULL
    if args.idle is not None:
        limits = replace(limits, idle_connections=args.idle)
    names = SELECTIONS[args.only]
    started = bench_goals.machine()
    print(
        f"macula station benchmark ({'quick' if args.quick else 'full'}), "
        f"{PAYLOAD_SIZE}-byte payloads, {os.cpu_count()} CPUs, {started['uptime']}",
        flush=True,
    )
    quic = quic_backend.describe()  # MACULA_QUIC / MACULA_LOOP; child processes inherit both
    print(f"ours on {quic['quic']} {quic['version']}, {event_loop.loop_name()} loop", flush=True)
    result = Run()
    await run_ours(args, limits, names, result)
    if args.no_peers:
        for peer in ("nats", "amqtt"):
            result.skip(peer, "--no-peers")
    else:
        await run_peers(args, limits, names, result)
    print_ratios(result)
    verdicts = bench_goals.judge(result.figures)
    if args.only == "all":
        bench_goals.print_table(verdicts, args.quick)
    if args.json is not None:
        mode = "quick" if args.quick else "full"
        bench_goals.write_json(args.json, mode, result.figures, result.skipped, verdicts, started)
    return 0 if result.ok else 1


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("station", __doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--station", help="benchmark this station (node_id@host:port) instead")
    parser.add_argument(
        "--station-process", action="store_true", help="run our station in a child process"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="run our station as macula-relay --workers N (real processes) instead",
    )
    parser.add_argument("--only", choices=sorted(SELECTIONS), default="all")
    parser.add_argument("--no-peers", "--no-nats", action="store_true", help="skip NATS and amqtt")
    parser.add_argument("--idle", type=int, help="idle connections for the memory figure")
    parser.add_argument("--json", type=Path, help="write every figure and goal to this file")
    parser.add_argument("--serve-station", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--serve-amqtt", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-raw-quic", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.idle is not None and args.idle < 1:
        parser.error("--idle must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.serve_station is not None:
        event_loop.run(serve_station(args.serve_station))
        return
    if args.serve_amqtt is not None:
        asyncio.run(bench_peers.serve_amqtt(args.serve_amqtt, 1800.0))
        return
    if args.serve_raw_quic is not None:
        asyncio.run(bench_resources.serve_raw_quic(args.serve_raw_quic))
        return
    sys.exit(event_loop.run(run(args)))


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py station
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py station ...`")
