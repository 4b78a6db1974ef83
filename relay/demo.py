"""``macula-demo``: the mesh working end to end on an embedded local station.

Starts a station in this process on a free loopback port (temporary data directory), connects
two agents with their own puzzle-hardened identities over real QUIC, and shows: a publication
delivered end-to-end signed, a call answered by the other agent, a streamed answer, an artifact
shared by content id, a signed DHT record resolved, and both agents riding out a station restart
on their own. One line per check; exit 0 only if all held.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from macula.backoff import Backoff
from macula.node import Node
from macula.serving import IncomingCall
from macula.session import StreamChannel
from macula.wire.identity import Identity, realm_tag
from relay.station import Station, StationConfig

REALM = realm_tag("org.macula.demo")


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.total = 0

    def check(self, label: str, ok: bool, detail: str = "") -> None:
        self.total += 1
        self.passed += ok
        print(
            f"[{'ok  ' if ok else 'FAIL'}] {label}" + (f"  ({detail})" if detail else ""),
            flush=True,
        )


async def _count_to(channel: StreamChannel, call: IncomingCall) -> None:
    for i in range(int(call.payload or 3)):
        channel.send(f"line {i}".encode())


async def demo(report: Report, workdir: Path) -> None:
    config = StationConfig(data_dir=workdir / "station", port=0)
    fast = Backoff(initial_s=0.2, max_s=2.0)
    async with Station(config) as station:
        config.port = station.port  # a restart comes back on the same port with the same key
        print(f"station {station.endpoint}", flush=True)
        alice = Node(Identity.generate(os.urandom), [station.endpoint], backoff=fast)
        bob = Node(Identity.generate(os.urandom), [station.endpoint], backoff=fast)
        await alice.__aenter__()
        await bob.__aenter__()
        report.check(
            "alice and bob connected, each pinning the station's key",
            alice.connected and bob.connected,
        )
        news = await bob.subscribe(REALM, "demo.news")
        await alice.advertise(
            REALM, "org.macula.demo.greet_v1", lambda c: f"hello {c.payload}, from alice"
        )
        await alice.advertise_stream(REALM, "org.macula.demo.count_v1", _count_to)
        await bob.flush()  # SUBSCRIBE and ADVERTISE have no ack: the station has them now
        await alice.flush()
        await alice.publish(REALM, "demo.news", {"headline": "alice is here"})
        got = await news.next(5)
        report.check(
            "bob received alice's publication, end-to-end signed",
            got.payload == {"headline": "alice is here"} and got.authenticated,
        )
        started = time.perf_counter()
        answer = await bob.call(REALM, "org.macula.demo.greet_v1", "bob")
        report.check(
            "bob called alice's procedure through the station",
            answer == "hello bob, from alice",
            f"{(time.perf_counter() - started) * 1000:.1f} ms",
        )
        channel = await bob.open_stream(REALM, "org.macula.demo.count_v1", 3)
        lines = [body async for body in channel]
        report.check(
            "bob read a streamed answer (server_stream)", lines == [b"line 0", b"line 1", b"line 2"]
        )
        artifact = os.urandom(1024 * 1024)
        mcid = await alice.put_content(artifact, name="artifact.bin")
        report.check(
            "alice shared 1 MiB by content id; bob fetched and verified it",
            await bob.get_content(mcid) == artifact,
            mcid.hex()[:24] + "…",
        )
        await alice.advertise(REALM, "org.macula.demo.directory_v1", lambda c: "ok", announce=True)
        report.check(
            "bob resolved alice's signed procedure record in the DHT",
            await bob.dht.resolve_realm("org.macula.demo.directory_v1") == REALM,
        )
    async with Station(config):
        for _ in range(100):
            if alice.connected and bob.connected:
                break
            await asyncio.sleep(0.1)  # polling interval: until both are connected
        report.check(
            "both agents reconnected by themselves after a station restart",
            alice.stats.reconnects >= 1 and bob.stats.reconnects >= 1,
        )
        await bob.flush()  # bob's replayed SUBSCRIBE has taken effect
        await alice.publish(REALM, "demo.news", {"headline": "still here"})
        report.check(
            "events flow again with no re-subscribing",
            (await news.next(5)).payload["headline"] == "still here",
        )
        report.check("the artifact survived the restart", await bob.get_content(mcid) == artifact)
        await alice.__aexit__(None, None, None)
        await bob.__aexit__(None, None, None)


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="macula-demo-") as tmp:
        try:
            asyncio.run(demo(report, Path(tmp)))
        except Exception as exc:
            report.check("demo ran to the end", False, f"{type(exc).__name__}: {exc}")
    print(f"{report.passed}/{report.total} checks passed", flush=True)
    sys.exit(0 if report.passed == report.total else 1)


if __name__ == "__main__":
    main()
