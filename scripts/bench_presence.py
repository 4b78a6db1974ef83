"""1,000 present agents on one station: the station's CPU, and how long a hello takes to be seen.

Each agent is a ``Node`` as ``macula-mcp`` makes it (its own identity and QUIC connection, the
default liveness probe: a ``_relay.ping`` after each second of silence from the station) that
publishes signed ``agent.hello`` heartbeats (``macula.agent.presence.hello_payload``): one on
arrival, then every ``--interval`` seconds (60, the agents' default, with a random phase).
They run in ``--workers`` processes of their own; ``--listeners`` more, in a process of their
own (so agents arriving do not hold up what they hear), subscribe to ``agent.hello`` as the
roster feed does, before anyone else arrives.

Figures: the station's CPU (% of one core, from /proc) while the agents arrive and over
``--seconds`` of steady presence (heartbeats and probes only); hello → seen (the publisher's
wall clock in the hello, the listener's at delivery: one machine, one clock) p50/p99/max, for
the arrival hellos and for the heartbeats apart; hellos lost (a listener never saw one).

Why only a few listen: with every agent listening each hello goes to all N, N² / interval
deliveries a second (16,700/s for 1,000 agents at 60 s), more than one station delivers on
this machine; the run prints that figure beside the station's measured delivery rate.

Run: ``uv run python scripts/bench.py agent --presence [--agents 1000] [--workers 4]
[--listeners 4] [--interval 60] [--seconds 60] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import bench_common
from bench_common import SCRIPT, child_process, percentile, process_cpu_seconds

from macula.agent.presence import HELLO_TOPIC, Profile, hello_payload
from macula.errors import MaculaError
from macula.node.node import DEFAULT_PROBE_INTERVAL_S, Node
from macula.node.subscriptions import Subscription
from macula.wire.identity import ZERO_REALM, Identity

CONNECT_AT_ONCE = 4  # connections a worker opens at a time
RESULT_LINE_LIMIT = 64 << 20  # a worker's samples are one JSON line: 1,000 agents' pass 64 KiB


def udp_receive_drops() -> int:
    """Datagrams the kernel dropped because a UDP socket's receive buffer was full, machine-wide
    (``RcvbufErrors`` in /proc/net/snmp; on this loopback run, mostly the station's socket)."""
    rows = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()]
    names, values = [row for row in rows if row[0] == "Udp:"][:2]
    return int(values[names.index("RcvbufErrors")])


def hello(node: Node, profile: Profile, beat: int) -> dict[str, Any]:
    payload = hello_payload(node.identity.node_id, profile, int(time.time() * 1000))
    return payload | {"bench_sent_ns": time.time_ns(), "bench_beat": beat}


async def heartbeat(node: Node, profile: Profile, interval: float) -> None:
    await node.publish(ZERO_REALM, HELLO_TOPIC, hello(node, profile, 0))
    await asyncio.sleep(random.uniform(0, interval))  # a random phase, as agents start apart
    beat = 1
    while True:
        await node.publish(ZERO_REALM, HELLO_TOPIC, hello(node, profile, beat))
        beat += 1
        await asyncio.sleep(interval)


async def listen(sub: Subscription, seen: dict[str, list[float]]) -> None:
    async for delivery in sub:
        now = time.time_ns()
        payload = delivery.payload
        if not delivery.authenticated or not isinstance(payload, dict):
            continue
        sent, beat = payload.get("bench_sent_ns"), payload.get("bench_beat")
        if isinstance(sent, int) and isinstance(beat, int):
            seen["arrival" if beat == 0 else "heartbeat"].append((now - sent) / 1e6)


async def join(stack: contextlib.AsyncExitStack, node: Node) -> Node:
    await stack.enter_async_context(node)
    await node.session(30)
    return node


def new_node(identity: Identity, args: argparse.Namespace) -> Node:
    """A node as ``macula-mcp`` makes one, but for ``--probe-interval``."""
    return Node(identity, [args.of], probe_interval_s=args.probe_interval)


async def worker(args: argparse.Namespace) -> None:
    """A worker process: ``--count`` agents (``--listen`` of them listening), ``READY`` once
    every one has said its first hello, its samples as one JSON line when stdin closes."""
    logging.getLogger("macula").setLevel(logging.ERROR)  # failovers are counted, not logged
    profile = Profile(session_name="bench", interval_seconds=max(10, int(args.interval)))
    seen: dict[str, list[float]] = {"arrival": [], "heartbeat": []}
    async with contextlib.AsyncExitStack() as stack:
        listeners, listener_nodes, arrived = [], [], []
        for _ in range(args.listen):
            node = await stack.enter_async_context(new_node(Identity.generate(os.urandom), args))
            listener_nodes.append(node)
            listeners.append(await node.subscribe(ZERO_REALM, HELLO_TOPIC, buffer=100_000))
            await node.flush()
        tasks = [asyncio.create_task(listen(sub, seen)) for sub in listeners]
        identities = [Identity.generate(os.urandom) for _ in range(args.count)]  # ground now
        print("LISTENING", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the parent: everyone listens now
        gate = asyncio.Semaphore(CONNECT_AT_ONCE)

        failed: list[str] = []

        async def arrive(identity: Identity) -> None:
            async with gate:
                try:  # one that cannot connect in time is counted, not waited for
                    node = await asyncio.wait_for(join(stack, new_node(identity, args)), 30)
                except (TimeoutError, MaculaError) as exc:
                    failed.append(type(exc).__name__)
                    return
                arrived.append(node)
            tasks.append(asyncio.create_task(heartbeat(node, profile, args.interval)))

        await asyncio.gather(*(arrive(identity) for identity in identities))
        print("READY", flush=True)
        await bench_common.serve_until_stdin_closes(3600)
        nodes = [*listener_nodes, *arrived]
        reconnects = sum(node.stats.reconnects for node in nodes)
        probes = sum(node.stats.probes_acknowledged for node in nodes)
        figures = {"seen": seen, "reconnects": reconnects, "probes": probes, "failed": len(failed)}
        print(json.dumps(figures), flush=True)
        os._exit(0)  # the parent has its figures: closing hundreds of connections one by one
        # would only hold it up (the station forgets them when they go quiet)


@contextlib.asynccontextmanager
async def workers(args: argparse.Namespace, endpoint: str) -> AsyncIterator[list[Any]]:
    talkers = args.agents - args.listeners
    share = [talkers // args.workers + (i < talkers % args.workers) for i in range(args.workers)]
    command = [sys.executable, str(SCRIPT), "agent", "--presence", "--worker-of", endpoint]
    procs = []
    for count, listen in [(0, args.listeners), *((n, 0) for n in share)]:  # listeners alone
        options = ["--count", str(count), "--listen", str(listen), "--interval", str(args.interval),
                   "--probe-interval", str(args.probe_interval)]  # fmt: skip
        procs.append(
            await asyncio.create_subprocess_exec(
                *command,
                *options,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=RESULT_LINE_LIMIT,
            )
        )
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


async def said(proc: Any, word: str, timeout: float) -> None:
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    if line.strip() != word.encode():
        raise bench_common.BenchError(f"a presence worker said {line!r}, not {word}")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    async with (
        child_process("serve-station", "3600", ready="endpoint") as station,
        workers(args, station.said) as procs,
    ):
        for proc in procs:
            await said(proc, "LISTENING", 120)
        cpu0, wall0 = process_cpu_seconds(station.pid), time.perf_counter()
        drops0, load0 = udp_receive_drops(), os.getloadavg()[0]
        for proc in procs:
            proc.stdin.write(b"go\n")
        for proc in procs:
            await said(proc, "READY", 1800)
        arrival_s = time.perf_counter() - wall0
        arrival_cpu = process_cpu_seconds(station.pid) - cpu0
        drops1 = udp_receive_drops()
        print(f"{args.agents:,} agents present after {arrival_s:.1f} s", flush=True)
        cpu1, wall1 = process_cpu_seconds(station.pid), time.perf_counter()
        await asyncio.sleep(args.seconds)  # steady presence: what is measured is its cost
        steady_s = time.perf_counter() - wall1
        steady_cpu = process_cpu_seconds(station.pid) - cpu1
        machine = {
            "udp_receive_drops_arrival": drops1 - drops0,
            "udp_receive_drops_steady": udp_receive_drops() - drops1,
            "load_average_1min": [round(load0, 1), round(os.getloadavg()[0], 1)],
        }
        results = []
        for proc in procs:
            proc.stdin.close()
            results.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)))
    out = report(args, results, arrival_s, arrival_cpu, steady_s, steady_cpu)
    print(
        f"UDP datagrams dropped, receive buffer full (machine-wide): "
        f"{machine['udp_receive_drops_arrival']:,} arriving, "
        f"{machine['udp_receive_drops_steady']:,} steady; load average "
        f"{machine['load_average_1min'][0]} → {machine['load_average_1min'][1]}",
        flush=True,
    )
    return out | machine


def latency(name: str, samples: list[float]) -> dict[str, float]:
    if not samples:
        print(f"hello → seen, {name:<10} no samples", flush=True)
        return {}
    figures = {
        "p50": statistics.median(samples),
        "p99": percentile(samples, 0.99),
        "max": max(samples),
        "samples": len(samples),
    }
    print(
        f"hello → seen, {name:<10} p50 {figures['p50']:8.2f}  p99 {figures['p99']:8.2f}  "
        f"max {figures['max']:8.2f} ms  ({len(samples):,} deliveries)",
        flush=True,
    )
    return figures


def report(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    arrival_s: float,
    arrival_cpu: float,
    steady_s: float,
    steady_cpu: float,
) -> dict[str, Any]:
    """Print the figures; the figures (the caller adds the machine's)."""
    seen = {k: [x for r in results for x in r["seen"][k]] for k in ("arrival", "heartbeat")}
    failed = sum(r["failed"] for r in results)
    arrivals_expected = args.agents - args.listeners - failed  # a listener says no hello
    out: dict[str, Any] = {
        "agents": args.agents,
        "listeners": args.listeners,
        "interval_s": args.interval,
        "arrival_s": round(arrival_s, 1),
        "station_cpu_percent_arrival": round(100 * arrival_cpu / arrival_s, 1),
        "station_cpu_percent_steady": round(100 * steady_cpu / steady_s, 1),
        "hello_to_seen_arrival_ms": latency("arrival", seen["arrival"]),
        "hello_to_seen_heartbeat_ms": latency("heartbeat", seen["heartbeat"]),
        "arrival_hellos_lost": arrivals_expected * args.listeners - len(seen["arrival"]),
        "reconnects": sum(r["reconnects"] for r in results),
        "could_not_connect": failed,
        "probes_acknowledged": sum(r["probes"] for r in results),
        "probe_interval_s": args.probe_interval,
        "all_listening_deliveries_per_s": round(args.agents**2 / args.interval),
    }
    print(
        f"station CPU: {out['station_cpu_percent_arrival']}% of a core while they arrived, "
        f"{out['station_cpu_percent_steady']}% over {steady_s:.0f} s of steady presence",
        flush=True,
    )
    print(
        f"could not connect in 30 s: {out['could_not_connect']}; "
        f"arrival hellos lost: {out['arrival_hellos_lost']}; reconnects (a probe unanswered in "
        f"time): {out['reconnects']}; probes answered: {out['probes_acknowledged']:,}",
        flush=True,
    )
    print(
        f"with every agent listening the "
        f"station would deliver {out['all_listening_deliveries_per_s']:,} hellos/s",
        flush=True,
    )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    arguments = bench_common.parser("agent --presence", __doc__)
    arguments.add_argument("--agents", type=int, default=1000)
    arguments.add_argument("--workers", type=int, default=4)
    arguments.add_argument("--listeners", type=int, default=4)
    arguments.add_argument("--interval", type=float, default=60.0)
    arguments.add_argument("--seconds", type=float, default=60.0)
    arguments.add_argument(
        "--probe-interval",
        type=float,
        default=DEFAULT_PROBE_INTERVAL_S,
        help="each node's liveness probe: a ping after this much silence (0: none)",
    )
    arguments.add_argument("--quick", action="store_true", help="20 agents, 5 s: a smoke run")
    arguments.add_argument("--json", type=Path)
    arguments.add_argument("--worker-of", dest="of", help=argparse.SUPPRESS)
    arguments.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    arguments.add_argument("--listen", type=int, default=0, help=argparse.SUPPRESS)
    args = arguments.parse_args(argv)
    if args.of:
        asyncio.run(worker(args))
        return
    if args.quick:
        args.agents, args.workers, args.listeners, args.seconds = 20, 2, 2, 5.0
        args.interval = 10.0
    if not 0 < args.listeners < args.agents or args.workers < 1:
        arguments.error("need 0 < --listeners < --agents and --workers >= 1")
    result = asyncio.run(bench(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":  # run through the one entry point: python scripts/bench.py agent
    raise SystemExit(f"{__file__}: run it as `python scripts/bench.py agent --presence ...`")
