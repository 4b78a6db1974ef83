"""Soak a station with hostile clients beside honest pairs; print what it cost and what was lost.

    uv run python scripts/soak_station.py --seconds 60 [--pairs 4] [--rate 50] [--json]

The station runs in its own process (the ``macula-relay`` code path, plus a monitor of its event
loop), on a free loopback port with a fresh data directory, logging at its default level to a
file. For ``--seconds`` the following run at once, every loop bounded in count and in time:

- honest pairs: a publisher and a subscriber (real ``Node``s) per pair, ``--rate`` events a second;
- garbage: connections that send random bytes instead of frames;
- bad signatures: a handshaken connection sending PUBLISH frames signed by the wrong key;
- floods: a publisher sending as fast as it can (to a topic a stopped subscriber holds);
- oversized names: SUBSCRIBE and ADVERTISE with 64 KiB names;
- pre-handshake buffering: connections that send a megabyte without ever finishing a CONNECT;
- many identities: fresh identities that connect and stay;
- a slow consumer: a subscriber process that is stopped (SIGSTOP) while its topic is flooded;
- DHT stuffing: one identity putting records without end, and many identities one each;
- directory stuffing: fresh identities registering in the agent directory.

It prints the station's peak RSS, its largest event-loop stall, the log bytes it wrote, what each
hostile client managed, what the station's own monitoring port (/status) showed (peaks while
soaking, refusal counters at the end), and the honest pairs' loss (must be 0) and latency (p50,
p99). Exit status 1 when an honest event was lost or the station died. Only loopback addresses
are used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from macula.agent.petnames import petname
from macula.client.backoff import Backoff
from macula.clock import now_ms
from macula.errors import MaculaError
from macula.node.node import Node
from macula.quic.transport import FrameProtocol, client_configuration, dial
from macula.services.house_client import HouseClient
from macula.stations import parse_station
from macula.wire.errors import FramingError
from macula.wire.frames import Advertise, Connect, Publish, Subscribe, new_frame_id
from macula.wire.identity import Identity, realm_tag

REALM = realm_tag("org.example.soak")
HONEST_SLACK_S = 10.0  # after the run: how long honest subscribers may take to drain


# --- the station process -----------------------------------------------------------------------


def station_child(data_dir: str) -> None:
    """Run the station as ``macula-relay`` does, plus an event-loop stall monitor; on SIGTERM
    stop it and print one JSON line with the largest stall (ms)."""
    import logging

    from macula.logformat import KeyValueFormatter
    from relay.monitor.figures import Lifecycle
    from relay.monitor.port import Monitor
    from relay.ops.cli import build_parser, config_from_args
    from relay.station.station import Station

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    logging.basicConfig(level="INFO", handlers=[handler])
    logging.getLogger("quic").setLevel(logging.WARNING)
    args = build_parser().parse_args(["--host", "127.0.0.1", "--port", "0", "--data-dir", data_dir])
    config = config_from_args(args)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        worst = 0.0
        tick = 0.01

        async def monitor() -> None:
            nonlocal worst
            while True:
                before = loop.time()
                await asyncio.sleep(tick)
                worst = max(worst, loop.time() - before - tick)

        async with Station(config) as station:
            lifecycle = Lifecycle(ready=1)
            port = Monitor(station, lifecycle)  # the figures the soak reads: its /status
            host, bound = await port.start("127.0.0.1", 0)
            print(station.endpoint, flush=True)
            print(f"{host}:{bound}", flush=True)
            watcher = asyncio.create_task(monitor())
            await stop.wait()
            watcher.cancel()
            lifecycle.draining = 1
            await port.close()
            await station.stop()
        print(json.dumps({"max_stall_ms": round(worst * 1000, 1)}), flush=True)

    asyncio.run(run())


class StationProcess:
    def __init__(self, workdir: Path) -> None:
        self.log_path = workdir / "station.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--station-child", str(workdir / "station")],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.process.stdout is not None
        self.endpoint = self.process.stdout.readline().strip()
        self.monitor = self.process.stdout.readline().strip()
        if not self.endpoint or not self.monitor:
            raise SystemExit(f"the station did not start; see {self.log_path}")
        self.peak_rss_kib = 0
        self.peaks: Counter[str] = Counter()  # the largest of some /status figures seen
        self.last_status: dict[str, Any] = {}

    async def status(self) -> dict[str, Any]:
        """The station's /status (its monitoring port), also noting the peaks."""
        host, _, port = self.monitor.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /status HTTP/1.1\r\nHost: soak\r\n\r\n")
            response = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        document: dict[str, Any] = json.loads(response.partition(b"\r\n\r\n")[2])
        figures = {
            "connections": document["connections"]["total"],
            "clients": document["connections"]["clients"],
            "subscriptions": document["subscriptions"],
            "pending_calls": document["pending_calls"],
            "paused_publishers": document["paused_publishers"],
            "dht_records": document["dht"]["records"],
            "content_bytes": document["stores"]["content_bytes"],
        }
        for name, value in figures.items():
            self.peaks[name] = max(self.peaks[name], value)
        self.last_status = document
        return document

    def monitor_report(self) -> dict[str, Any]:
        """What /status showed: the peaks while soaking and the last document's totals."""
        last = self.last_status
        if not last:
            return {"error": "no /status read"}
        return {
            "peak": dict(sorted(self.peaks.items())),
            "uptime_s": last["uptime_s"],
            "slow_consumers_closed": last["slow_consumers_closed"],
            "publishers_paused_total": last["publishers_paused_total"],
            "history_rows": last["stores"]["history_rows"],
            "record_store_rows": last["stores"]["record_store_rows"],
            "refusals": last["refusals"],
            "counters": last["counters"],
        }

    def sample(self) -> None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith(("VmRSS:", "VmHWM:")):
                    self.peak_rss_kib = max(self.peak_rss_kib, int(line.split()[1]))

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> dict[str, Any]:
        self.sample()
        result: dict[str, Any] = {}
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                out, _ = self.process.communicate(timeout=20)
                result = json.loads(out.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                self.process.kill()
                self.process.wait()
        self._log.close()
        result["log_bytes"] = self.log_path.stat().st_size
        result["peak_rss_mib"] = round(self.peak_rss_kib / 1024, 1)
        return result


# --- raw connections --------------------------------------------------------------------------


class Sink:
    """Receives whatever the station sends and forgets it; notes the connection's end."""

    def __init__(self) -> None:
        self.lost = asyncio.Event()

    def frames_received(self, stream_id: int, frames: list[dict[str, Any]]) -> None:
        pass

    def framing_failed(self, stream_id: int, error: FramingError) -> None:
        pass

    def stream_ended(self, stream_id: int) -> None:
        pass

    def stream_reset(self, stream_id: int) -> None:
        pass

    def connection_lost(self, reason: str) -> None:
        self.lost.set()


def stamp() -> dict[str, Any]:
    now = now_ms()
    return {"frame_id": new_frame_id(now, os.urandom(10)), "sent_at_ms": now}


@contextlib.asynccontextmanager
async def raw(
    endpoint: str, identity: Identity | None
) -> AsyncIterator[tuple[FrameProtocol, Sink]]:
    """A QUIC connection; with ``identity``, CONNECT is sent on stream 0 first."""
    address = parse_station(endpoint)
    async with dial(address.host, address.port, client_configuration(server_name="x")) as quic:
        sink = Sink()
        quic.sink = sink
        if identity is not None:
            connect = Connect(
                **stamp(),
                node_id=identity.node_id,
                station_id=identity.node_id,
                puzzle_evidence=identity.puzzle_evidence,
            )
            quic.send(quic.new_stream(), connect.sign_and_encode(identity))
        yield quic, sink


def fresh() -> Identity:
    return Identity.generate(os.urandom)


# --- the hostile clients ------------------------------------------------------------------------


Attack = Callable[[str, float, Counter[str]], Awaitable[None]]


async def until(deadline: float, work: Callable[[], Awaitable[None]], counts: Counter[str]) -> None:
    """Repeat ``work`` until ``deadline`` (each attempt is bounded in time by itself); failures
    are what hostile clients expect: counted."""
    while time.monotonic() < deadline:
        try:
            await work()
        except (MaculaError, OSError, TimeoutError, ConnectionError) as exc:
            counts[f"failed:{type(exc).__name__}"] += 1
        await asyncio.sleep(0)


async def garbage(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    async def once() -> None:
        async with raw(endpoint, None) as (quic, sink):
            quic.send(0, os.urandom(4096))
            counts["garbage_connections"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sink.lost.wait(), 2)
            counts["garbage_closed_by_station"] += sink.lost.is_set()

    await until(deadline, once, counts)


async def bad_signatures(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    me, other = fresh(), fresh()

    async def once() -> None:
        async with raw(endpoint, me) as (quic, sink):
            for seq in range(2000):
                frame = Publish(
                    **stamp(),
                    topic="soak.bad",
                    realm=REALM,
                    publisher=me.node_id,
                    seq=seq,
                    payload=b"x" * 64,
                    published_at_ms=now_ms(),
                )
                quic.send(0, frame.sign_and_encode(other))  # the wrong key
                counts["bad_signature_frames"] += 1
                if seq % 200 == 0:
                    await asyncio.sleep(0.01)
                if sink.lost.is_set() or time.monotonic() > deadline:
                    break

    await until(deadline, once, counts)


async def oversized_names(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    me = fresh()

    async def once() -> None:
        async with raw(endpoint, me) as (quic, sink):
            await asyncio.sleep(0.05)
            for i in range(200):
                name = f"{i}." + "n" * 65536
                sub = Subscribe(**stamp(), topic=name, realm=REALM, subscriber=me.node_id)
                ad = Advertise(**stamp(), realm=REALM, procedure=name, advertiser=me.node_id)
                quic.send(0, sub.sign_and_encode(me) + ad.sign_and_encode(me))
                counts["oversized_names_sent"] += 2
                await asyncio.sleep(0.005)
                if sink.lost.is_set() or time.monotonic() > deadline:
                    break

    await until(deadline, once, counts)


async def pre_handshake(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    async def once() -> None:
        async with raw(endpoint, None) as (quic, sink):
            # a frame header announcing 16 MiB, then a megabyte of it: never a complete CONNECT
            quic.send(0, (16 * 1024 * 1024).to_bytes(4, "big") + os.urandom(1024 * 1024))
            quic.send(4, os.urandom(64 * 1024))  # and another stream before any CONNECT
            counts["pre_handshake_connections"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sink.lost.wait(), 12)
            counts["pre_handshake_closed_by_station"] += sink.lost.is_set()

    await until(deadline, once, counts)


async def many_identities(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    held: list[contextlib.AsyncExitStack] = []
    try:
        while time.monotonic() < deadline and len(held) < 400:
            stack = contextlib.AsyncExitStack()
            try:
                await stack.enter_async_context(raw(endpoint, fresh()))
                held.append(stack)
                counts["identities_connected"] += 1
            except (OSError, TimeoutError, ConnectionError, MaculaError):
                counts["identities_refused"] += 1
                await stack.aclose()
            await asyncio.sleep(0.02)
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        for stack in held:
            with contextlib.suppress(Exception):
                await stack.aclose()


async def flood(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    async with Node(fresh(), [endpoint], backoff=Backoff(0.1, 1.0)) as node:
        while time.monotonic() < deadline:
            try:
                for _ in range(500):
                    await node.publish(REALM, "soak.flood", b"f" * 512, timeout=2)
                    counts["flood_published"] += 1
            except MaculaError:
                counts["flood_failed"] += 1
            await asyncio.sleep(0)


async def dht_stuffing(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    async with Node(fresh(), [endpoint]) as node:
        station = (await node.session()).station_key
        n = 0
        while time.monotonic() < deadline:
            n += 1
            try:
                await node.dht.announce_procedure(REALM, f"org.example.stuff{n}_v1", station)
                counts["dht_records_put"] += 1
            except MaculaError:
                counts["dht_records_refused"] += 1
            if n % 25 == 0:
                try:  # and a fresh identity now and then
                    async with Node(fresh(), [endpoint]) as other:
                        await other.dht.announce_procedure(REALM, "org.example.many_v1", station)
                        counts["dht_identities_put"] += 1
                except MaculaError:
                    counts["dht_identities_refused"] += 1


async def directory_stuffing(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    while time.monotonic() < deadline:
        try:
            async with Node(fresh(), [endpoint]) as node:
                house = HouseClient(node, node.dht, node.identity)
                entry = {"petname": petname(node.identity.node_id), "operator_name": "x" * 64}
                await house.register_agent(entry)
                counts["directory_registered"] += 1
        except MaculaError as exc:
            counts[f"directory_refused:{str(exc)[:60]}"] += 1


SLOW_CONSUMER = """
import asyncio, os, sys
from macula.node.node import Node
from macula.wire.identity import Identity, realm_tag
async def main():
    async with Node(Identity.generate(os.urandom), [sys.argv[1]]) as node:
        sub = await node.subscribe(realm_tag("org.example.soak"), "soak.flood", buffer=8)
        await node.flush()
        print("ready", flush=True)
        async for _ in sub:
            pass
asyncio.run(main())
"""


async def slow_consumer(endpoint: str, deadline: float, counts: Counter[str]) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SLOW_CONSUMER, endpoint, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        if (await asyncio.wait_for(process.stdout.readline(), 15)).strip() == b"ready":
            os.kill(process.pid, signal.SIGSTOP)  # it stops reading, with the flood still coming
            counts["slow_consumer_stopped"] += 1
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        await process.wait()


ATTACKS: dict[str, Attack] = {
    "garbage": garbage,
    "bad_signatures": bad_signatures,
    "oversized_names": oversized_names,
    "pre_handshake": pre_handshake,
    "many_identities": many_identities,
    "flood": flood,
    "slow_consumer": slow_consumer,
    "dht_stuffing": dht_stuffing,
    "directory_stuffing": directory_stuffing,
}


# --- the honest pairs --------------------------------------------------------------------------


async def honest_pair(
    endpoint: str, index: int, rate: float, deadline: float, latencies: list[float]
) -> tuple[int, int]:
    """Publish ``rate``/s until ``deadline``; returns (sent, received once each)."""
    topic = f"soak.honest.{index}"
    backoff = Backoff(0.1, 1.0)
    async with (
        Node(fresh(), [endpoint], backoff=backoff) as subscriber,
        Node(fresh(), [endpoint], backoff=backoff) as publisher,
    ):
        sub = await subscriber.subscribe(REALM, topic, buffer=100_000)
        await subscriber.flush()
        seen: set[int] = set()

        async def receive() -> None:
            async for delivery in sub:
                body = delivery.payload
                seen.add(body["n"])
                latencies.append((time.time_ns() - body["t"]) / 1e6)

        receiver = asyncio.create_task(receive())
        sent = 0
        interval = 1.0 / rate
        next_at = time.monotonic()
        while time.monotonic() < deadline:
            payload = {"n": sent, "t": time.time_ns()}
            try:
                await publisher.publish(REALM, topic, payload, timeout=10)
                sent += 1
            except MaculaError:
                pass  # a refused publish is not a loss: it never left (the publisher knows)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        with contextlib.suppress(MaculaError):
            await publisher.flush(timeout=HONEST_SLACK_S)
        drain_until = time.monotonic() + HONEST_SLACK_S
        while len(seen) < sent and time.monotonic() < drain_until:
            await asyncio.sleep(0.05)  # polling interval: until every event is in
        receiver.cancel()
        return sent, len(seen)


# --- the run -----------------------------------------------------------------------------------


async def hostile_child(endpoint: str, seconds: float) -> None:
    """Every attack at once until the deadline; one JSON line of what they managed."""
    deadline = time.monotonic() + seconds
    counts: Counter[str] = Counter()
    # attackers abandon connections mid-handshake by design; what the loop reports about them
    # (generators closed while running, futures never retrieved) is counted, not printed
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: counts.update(["attacker_loop_errors"])
    )
    tasks = [asyncio.create_task(work(endpoint, deadline, counts)) for work in ATTACKS.values()]
    _, pending = await asyncio.wait(tasks, timeout=seconds + 30)
    for task in pending:  # an attempt still in a handshake or a close: its own bounds end it
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(dict(sorted(counts.items()))), flush=True)


async def soak(args: argparse.Namespace, station: StationProcess) -> dict[str, Any]:
    """Honest pairs here; hostile clients in a process of their own, so that the honest
    latencies measure the station, not the attackers' share of this process."""
    deadline = time.monotonic() + args.seconds
    latencies: list[float] = []

    async def sampler() -> None:
        turn = 0
        while True:
            station.sample()
            if turn % 8 == 0:  # /status every 2 s: the monitor's cost stays out of the figures
                with contextlib.suppress(OSError, TimeoutError, ValueError, KeyError):
                    await station.status()
            turn += 1
            await asyncio.sleep(0.25)

    watcher = asyncio.create_task(sampler())
    attackers = None
    if not args.no_hostile:
        attackers = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--hostile-child",
            station.endpoint,
            str(args.seconds),
            stdout=asyncio.subprocess.PIPE,
        )
    honest = [
        asyncio.create_task(honest_pair(station.endpoint, i, args.rate, deadline, latencies))
        for i in range(args.pairs)
    ]
    results = await asyncio.gather(*honest, return_exceptions=True)
    hostile: dict[str, Any] = {}
    if attackers is not None:
        try:
            out, _ = await asyncio.wait_for(attackers.communicate(), 60)
            hostile = json.loads(out.decode().strip().splitlines()[-1])
        except (TimeoutError, ValueError, IndexError):
            attackers.kill()
            await attackers.wait()
            hostile = {"error": "the hostile process did not report"}
    watcher.cancel()
    with contextlib.suppress(OSError, TimeoutError, ValueError, KeyError):
        await station.status()  # the figures once everything is done
    sent = sum(r[0] for r in results if isinstance(r, tuple))
    received = sum(r[1] for r in results if isinstance(r, tuple))
    failed_pairs = [repr(r) for r in results if not isinstance(r, tuple)]
    ordered = sorted(latencies)
    return {
        "seconds": args.seconds,
        "honest_sent": sent,
        "honest_received": received,
        "honest_lost": sent - received,
        "honest_pairs_failed": failed_pairs,
        "latency_p50_ms": round(statistics.median(ordered), 2) if ordered else None,
        "latency_p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2)
        if ordered
        else None,
        "hostile": hostile,
        "monitor": station.monitor_report(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the soak runs")
    parser.add_argument("--pairs", type=int, default=4, help="honest publisher/subscriber pairs")
    parser.add_argument("--rate", type=float, default=50.0, help="events/s per honest pair")
    parser.add_argument("--no-hostile", action="store_true", help="honest pairs only (baseline)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("--station-child", help=argparse.SUPPRESS)
    parser.add_argument("--hostile-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.station_child:
        station_child(args.station_child)
        return 0
    if args.hostile_child:
        asyncio.run(hostile_child(args.hostile_child[0], float(args.hostile_child[1])))
        return 0
    if not 1 <= args.seconds <= 3600 or not 0 < args.rate <= 10_000 or not 0 < args.pairs <= 64:
        parser.error("--seconds 1..3600, --rate (0, 10000], --pairs 1..64")
    with tempfile.TemporaryDirectory(prefix="macula-soak-") as workdir:
        station = StationProcess(Path(workdir))
        try:
            report = asyncio.run(soak(args, station))
        finally:
            report_station = station.stop()
        report["station"] = report_station
        report["station_survived"] = int("max_stall_ms" in report_station)
    if args.json:
        print(json.dumps(report))
    else:
        s = report["station"]
        print(f"soak: {report['seconds']:g} s, {args.pairs} honest pairs at {args.rate:g}/s")
        print(
            f"station: peak RSS {s['peak_rss_mib']} MiB, largest loop stall "
            f"{s.get('max_stall_ms')} ms, log {s['log_bytes']} bytes"
        )
        print(
            f"honest: sent {report['honest_sent']}, received {report['honest_received']}, "
            f"lost {report['honest_lost']}, p50 {report['latency_p50_ms']} ms, "
            f"p99 {report['latency_p99_ms']} ms"
        )
        for name, value in report["hostile"].items():
            print(f"  {name}: {value}")
        print("monitor (/status):")
        for name, value in report["monitor"].items():
            print(f"  {name}: {value}")
        for failure in report["honest_pairs_failed"]:
            print(f"  honest pair failed: {failure}")
    ok = report["honest_lost"] == 0 and not report["honest_pairs_failed"]
    return 0 if ok and report["station_survived"] else 1


if __name__ == "__main__":
    sys.exit(main())
