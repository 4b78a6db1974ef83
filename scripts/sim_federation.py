"""Simulate a federated mesh: N stations on loopback in this one process, M clients over them.

Each station is a real ``Station`` (QUIC + its DHT over UDP, ports 0, SQLite files in a temp
dir). They are joined only through ``peers`` (``--peer``-style): a chain (station i names
station i-1) or a star (every station names station 0); the DHT's ``stations()`` discovery does
the rest. Clients (``Node``) sit round robin on the stations, each with the next station as its
failover, all subscribed to one topic. Printed (or ``--json``):
- the time for the mesh to settle after start (every station linked to every other);
- peer links per station (min / median / max);
- for E published events: station-to-station copies, relayed events received, deliveries and
  duplicates per event, the largest number of station links an event crossed, and the
  publish -> deliver latency (p50 / p99), all from the stations' ``core.stats`` counters;
- DHT lookups (``station.dht.find`` at one station of a record ``put`` through another):
  p50 / p99 and how many found their record;
- CPU used per station while idle (discovery, DHT upkeep, ticks);
- after station 0 dies (a graceful stop: GOODBYE on its links): the time until the survivors'
  links have re-formed, and until an event published after the death reaches every subscriber
  (the dead station's clients fail over to their second station first);
- the process's CPU time and peak RSS.
Every wait has a deadline (``--deadline`` per phase, ``--total-deadline`` in all): a phase that
does not finish is reported as failed, and the exit code is 1.

``uv run python scripts/sim_federation.py --stations 30 --clients 60 [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from macula.clock import now_ms
from macula.node.node import Node
from macula.node.subscriptions import Subscription
from macula.wire.identity import Identity, realm_tag
from macula.wire.records import Record, new_record, record_version
from relay.federation.links import LinkTarget
from relay.station.station import Station, StationConfig

REALM = realm_tag("org.macula.sim")
TOPIC = "sim.events"
COUNTERS = (
    "events_to_stations",
    "relayed_events_received",
    "events_delivered",
    "duplicate_relayed_event",
    "unwanted_relayed_event",
    "publishes",
)


def new_identity() -> Identity:
    return Identity.generate(os.urandom)


def linked(station: Station) -> set[bytes]:
    return {p.node_id for p in station.core.peers.values() if p.linked}


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process, MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    current = peak
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 1024
    return current, peak


async def until(condition: Callable[[], bool], deadline_s: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until true (True) or ``deadline_s`` passed (False)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)  # polling interval: the stations run in this loop
    return True


@dataclass
class Client:
    node: Node
    home: int  # index of its first station
    arrivals: dict[tuple[str, int], float] = field(default_factory=dict)  # (run, n) -> time

    async def pump(self, sub: Subscription) -> None:
        async for delivery in sub:
            payload = delivery.payload
            if isinstance(payload, dict):
                key = (str(payload.get("run")), int(payload.get("n", -1)))
                self.arrivals.setdefault(key, time.monotonic())


@dataclass
class Sim:
    args: argparse.Namespace
    stations: list[Station] = field(default_factory=list)
    alive: list[Station] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def note(self, key: str, value: Any, line: str) -> None:
        self.figures[key] = value
        if not self.args.json:
            print(line, flush=True)

    def fail(self, what: str) -> None:
        self.failures.append(what)
        if not self.args.json:
            print(f"FAILED: {what}", flush=True)

    def config(self, workdir: Path, index: int) -> StationConfig:
        args = self.args
        peers: list[LinkTarget] = []
        if index > 0:
            anchor = self.stations[index - 1 if args.topology == "chain" else 0]
            peers = [LinkTarget(anchor.node_id, "127.0.0.1", anchor.port)]
        return StationConfig(  # the station's defaults otherwise: what an operator gets
            data_dir=workdir / f"station{index}",
            port=0,
            peers=peers,
            discover_interval_s=args.discover_interval,
        )

    def links_full(self) -> bool:
        want = len(self.alive) - 1
        ids = {s.node_id for s in self.alive}
        return all(len(linked(s) & ids) == want and linked(s) <= ids for s in self.alive)

    def link_counts(self) -> list[int]:
        return [len(linked(s)) for s in self.alive]

    def note_links(self, key: str, label: str) -> None:
        counts = self.link_counts()
        self.note(
            key,
            {"min": min(counts), "median": statistics.median(counts), "max": max(counts)},
            f"{label}: min {min(counts)} / median {statistics.median(counts):g} / "
            f"max {max(counts)} (full mesh: {len(self.alive) - 1})",
        )

    def totals(self) -> dict[str, int]:
        return {c: sum(s.core.stats[c] for s in self.alive) for c in COUNTERS}

    # -- phases --------------------------------------------------------------------------

    async def start(self, stack: AsyncExitStack, workdir: Path) -> None:
        args = self.args
        started = time.monotonic()
        for index in range(args.stations):
            station = Station(self.config(workdir, index))
            await stack.enter_async_context(station)
            self.stations.append(station)
        self.alive = list(self.stations)
        last_started = time.monotonic()
        self.note(
            "start_s",
            round(last_started - started, 2),
            f"{args.stations} stations started ({args.topology} through peers) in "
            f"{last_started - started:.2f} s; discovery every {args.discover_interval:g} s",
        )
        settled = await until(self.links_full, args.deadline, 0.1)
        took = time.monotonic() - last_started
        if settled:
            self.note(
                "settle_s",
                round(took, 2),
                f"mesh settled (every station linked to every other) {took:.2f} s after the "
                f"last start ({time.monotonic() - started:.2f} s after the first)",
            )
        else:
            self.fail(f"the mesh did not settle within {args.deadline:g} s")
        self.note_links("links_per_station", "peer links per station")

    async def connect_clients(self, stack: AsyncExitStack) -> None:
        args, n = self.args, len(self.stations)
        for j in range(args.clients):
            home = j % n
            endpoints = [self.stations[home].endpoint, self.stations[(home + 1) % n].endpoint]
            node = Node(new_identity(), endpoints, settle_s=1.0)
            await stack.enter_async_context(node)
            client = Client(node, home)
            sub = await node.subscribe(REALM, TOPIC, buffer=4096)
            task = asyncio.ensure_future(client.pump(sub))
            stack.callback(task.cancel)
            self.clients.append(client)
        for client in self.clients:
            await client.node.flush()

    def interest_everywhere(self, origin: Station) -> bool:
        """``origin`` holds the interest of every other station that has a subscriber."""
        held = origin.core.subscriptions.subscribers((REALM, TOPIC.encode()))
        wanted = {
            s.node_id
            for s in self.alive
            if s is not origin and s.core.subscriptions.subscribers((REALM, TOPIC.encode()))
        }
        return wanted <= set(held)

    async def events(self, publisher: Node, origin: Station) -> None:
        args = self.args
        if not await until(lambda: self.interest_everywhere(origin), args.deadline):
            self.fail("the subscribers' interest did not reach the publisher's station")
        before = {s.node_id: dict(s.core.stats) for s in self.alive}
        totals = self.totals()
        sent: dict[int, float] = {}
        for n in range(args.events):
            sent[n] = time.monotonic()
            await publisher.publish(REALM, TOPIC, {"run": "events", "n": n})
            await asyncio.sleep(args.event_interval)  # paced: latency, not a burst's queue
        everyone = await until(
            lambda: all(
                all(("events", n) in c.arrivals for n in range(args.events)) for c in self.clients
            ),
            args.deadline,
        )
        await asyncio.sleep(0.2)  # a late duplicate would land now (counted below)
        if not everyone:
            self.fail("not every subscriber received every event")
        delta = {k: v - totals[k] for k, v in self.totals().items()}
        per_event = {k: round(v / args.events, 2) for k, v in delta.items()}
        others = [s for s in self.alive if s is not origin]
        forwarded_onwards = sum(
            s.core.stats["events_to_stations"] - before[s.node_id].get("events_to_stations", 0)
            for s in others
        )
        remote = sum(1 for s in others if s.core.subscriptions.subscribers((REALM, TOPIC.encode())))
        latencies = [
            (c.arrivals[("events", n)] - sent[n]) * 1000
            for c in self.clients
            for n in range(args.events)
            if ("events", n) in c.arrivals
        ]
        self.note(
            "per_event",
            per_event,
            f"per published event ({args.events} events, {len(self.clients)} subscribers on "
            f"{remote} other stations): {per_event['events_to_stations']:g} copies to stations, "
            f"{per_event['relayed_events_received']:g} relayed events received, "
            f"{per_event['events_delivered']:g} deliveries to clients, "
            f"{per_event['duplicate_relayed_event']:g} duplicates, "
            f"{per_event['unwanted_relayed_event']:g} unwanted",
        )
        hops = 1 if remote else 0
        self.note(
            "max_station_hops",
            hops if forwarded_onwards == 0 else None,
            f"station links crossed per delivery: 0 (publisher's own station) or 1; max "
            f"{hops}; copies a receiving station sent on to other stations: {forwarded_onwards}",
        )
        if forwarded_onwards:
            self.fail("a relayed event was forwarded to a third station")
        p50, p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
        self.note(
            "publish_deliver_ms",
            {"p50": round(p50, 2), "p99": round(p99, 2), "n": len(latencies)},
            f"publish -> deliver: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(latencies)} "
            f"deliveries, one event every {args.event_interval * 1000:g} ms)",
        )

    async def lookups(self) -> None:
        args, rng = self.args, random.Random(7)
        records: list[tuple[Record, Station]] = []
        put_ms: list[float] = []
        for _ in range(args.lookups):
            writer = rng.choice(self.alive)
            now = now_ms()
            record = new_record(
                new_identity(),
                0x21,
                {"text": "sim"},
                now_ms=now,
                version=record_version(now, os.urandom(10)),
                subject_id=os.urandom(16),
            )
            started = time.monotonic()
            await asyncio.wait_for(writer.dht.put(record), args.deadline)
            put_ms.append((time.monotonic() - started) * 1000)
            records.append((record, writer))
        find_ms: list[float] = []
        found = 0
        for record, writer in records:
            reader = rng.choice([s for s in self.alive if s is not writer])
            started = time.monotonic()
            got = await asyncio.wait_for(reader.dht.find(record.storage_key()), args.deadline)
            find_ms.append((time.monotonic() - started) * 1000)
            found += record in got
        self.note(
            "dht_lookup_ms",
            {
                "p50": round(quantile(find_ms, 0.5), 2),
                "p99": round(quantile(find_ms, 0.99), 2),
                "found": found,
                "of": len(records),
                "put_p50": round(quantile(put_ms, 0.5), 2),
            },
            f"DHT lookup (find at one station, put through another): p50 "
            f"{quantile(find_ms, 0.5):.1f} ms, p99 {quantile(find_ms, 0.99):.1f} ms, found "
            f"{found}/{len(records)}; put p50 {quantile(put_ms, 0.5):.1f} ms",
        )
        if found < len(records):
            self.fail(f"{len(records) - found} DHT lookups did not find their record")

    async def discovery_round(self) -> None:
        """One ``stations()`` call (what the link manager runs every discovery interval)."""
        station = self.alive[len(self.alive) // 2]
        before, started = cpu_s(), time.monotonic()
        looked_up = station.dht.stats["endpoint_lookup"]
        found = await asyncio.wait_for(station.dht.stations(), self.args.deadline)
        wall, used = time.monotonic() - started, cpu_s() - before
        lookups = 1 + station.dht.stats["endpoint_lookup"] - looked_up  # the set + endpoints
        self.note(
            "discovery_round",
            {
                "wall_ms": round(wall * 1000, 1),
                "cpu_ms": round(used * 1000, 1),
                "found": len(found),
                "lookups": lookups,
            },
            f"one discovery round at one station: {lookups} DHT lookups, found "
            f"{len(found)} stations, {wall * 1000:.0f} ms wall, {used * 1000:.0f} ms CPU "
            f"(the process: the stations answering it included)",
        )
        if len(found) != len(self.alive):
            self.fail(f"discovery found {len(found)} of {len(self.alive)} stations")

    async def idle_cpu(self) -> None:
        seconds = self.args.idle_window
        before, started = cpu_s(), time.monotonic()
        await asyncio.sleep(seconds)  # the measurement window itself
        used = cpu_s() - before
        wall = time.monotonic() - started
        per_station = used / wall / len(self.alive) * 100
        self.note(
            "idle_cpu_percent_per_station",
            round(per_station, 3),
            f"idle CPU: {used / wall * 100:.1f} % of a core for {len(self.alive)} stations and "
            f"{len(self.clients)} clients = {per_station:.2f} % per station "
            f"(over {wall:.1f} s)",
        )

    async def death(self, publisher: Node) -> None:
        args = self.args
        dead = self.stations[0]
        died = time.monotonic()
        await asyncio.wait_for(dead.stop(), args.deadline)
        self.alive = [s for s in self.stations if s is not dead]
        reformed = await until(self.links_full, args.deadline, 0.05)
        took = time.monotonic() - died
        if reformed:
            self.note(
                "relink_after_death_s",
                round(took, 2),
                f"station 0 stopped: the survivors' links re-formed (full mesh of "
                f"{len(self.alive)}) in {took:.2f} s",
            )
        else:
            self.fail(f"the survivors' links did not re-form within {args.deadline:g} s")
        self.note_links("links_per_station_after_death", "peer links per station after it")
        n, reached = 0, False
        deadline = died + args.deadline
        while time.monotonic() < deadline and not reached:
            with contextlib.suppress(Exception):  # the publisher may be moving too
                await publisher.publish(REALM, TOPIC, {"run": "after", "n": n})
            n += 1
            await asyncio.sleep(0.1)  # probe interval
            reached = any(all(("after", k) in c.arrivals for c in self.clients) for k in range(n))
        took = time.monotonic() - died
        moved = sum(1 for c in self.clients if c.home == 0)
        if reached:
            self.note(
                "event_reaches_all_after_death_s",
                round(took, 2),
                f"an event published after the death reached all {len(self.clients)} "
                f"subscribers ({moved} of them failed over) {took:.2f} s after it",
            )
        else:
            self.fail(f"no event after the death reached every subscriber in {args.deadline:g} s")

    def resources(self, started_cpu: float, started: float) -> None:
        current, peak = rss_mib()
        used = cpu_s() - started_cpu
        self.note(
            "process",
            {
                "cpu_s": round(used, 2),
                "wall_s": round(time.monotonic() - started, 2),
                "rss_mib": round(current, 1),
                "peak_rss_mib": round(peak, 1),
                "peak_rss_per_station_mib": round(peak / len(self.stations), 2),
            },
            f"process: CPU {used:.1f} s over {time.monotonic() - started:.1f} s wall; RSS "
            f"{current:.0f} MiB (peak {peak:.0f} MiB, {peak / len(self.stations):.1f} MiB "
            f"per station)",
        )


async def simulate(args: argparse.Namespace) -> Sim:
    sim = Sim(args)
    started, started_cpu = time.monotonic(), cpu_s()
    with tempfile.TemporaryDirectory(prefix="macula-sim-") as tmp:
        stack = AsyncExitStack()
        try:
            await sim.start(stack, Path(tmp))
            await asyncio.wait_for(sim.connect_clients(stack), args.deadline)
            origin = sim.stations[-1]
            publisher = Node(new_identity(), [origin.endpoint])
            await stack.enter_async_context(publisher)
            await sim.events(publisher, origin)
            await sim.lookups()
            await sim.discovery_round()
            await sim.idle_cpu()
            if len(sim.stations) >= 3:
                await sim.death(publisher)
            sim.resources(started_cpu, started)
        except TimeoutError:
            sim.fail("a step ran past its deadline")
        except Exception as exc:  # e.g. a client that reached no station: a failed run
            sim.fail(f"{type(exc).__name__}: {exc}")
        finally:
            try:
                await asyncio.wait_for(stack.aclose(), args.deadline)
            except TimeoutError:
                sim.fail("the stations did not stop within the deadline")
    return sim


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stations", type=int, default=30, help="stations (default 30; at least 2)")
    p.add_argument("--clients", type=int, default=None, help="clients (default 2 per station)")
    p.add_argument("--topology", choices=["chain", "star"], default="chain")
    p.add_argument("--events", type=int, default=20, help="events published (default 20)")
    p.add_argument(
        "--event-interval", type=float, default=0.05, help="seconds between events (0.05)"
    )
    p.add_argument("--lookups", type=int, default=50, help="DHT records put and found")
    p.add_argument(
        "--discover-interval",
        type=float,
        default=StationConfig.discover_interval_s,
        help="seconds between discovery rounds (default: the station's, 30)",
    )
    p.add_argument(
        "--idle-window",
        type=float,
        default=None,
        help="seconds of idle CPU measured (default: one discovery interval)",
    )
    p.add_argument("--deadline", type=float, default=300.0, help="seconds per phase (300)")
    p.add_argument("--total-deadline", type=float, default=1500.0, help="seconds in all (1500)")
    p.add_argument("--log-file", type=Path, help="the stations' logs (INFO) go here")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.stations < 2 or args.events < 1 or args.lookups < 1:
        raise SystemExit("sim_federation: --stations >= 2, --events >= 1, --lookups >= 1")
    if args.idle_window is None:
        args.idle_window = args.discover_interval
    if args.clients is None:
        args.clients = 2 * args.stations
    if args.clients < 1:
        raise SystemExit("sim_federation: --clients >= 1")
    if args.log_file is not None:  # the stations' own logs, for a run that went wrong
        logging.basicConfig(level=logging.INFO, filename=args.log_file)
    else:
        logging.basicConfig(level=logging.CRITICAL)  # they would drown the figures

    async def bounded() -> Sim | None:
        try:
            return await asyncio.wait_for(simulate(args), args.total_deadline)
        except TimeoutError:
            return None

    sim = asyncio.run(bounded())
    if sim is None:
        print(f"FAILED: the simulation ran past --total-deadline {args.total_deadline:g} s")
        sys.exit(1)
    if args.json:
        print(json.dumps({"stations": args.stations, "clients": args.clients,
                          "topology": args.topology, **sim.figures,
                          "failures": sim.failures}))  # fmt: skip
    elif not sim.failures:
        print("all phases passed")
    sys.exit(1 if sim.failures else 0)


if __name__ == "__main__":
    main()
