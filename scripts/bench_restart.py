"""How long a client takes to come back after its station is SIGKILLed and restarted (issue 37).

One ``macula-relay`` process on a fixed loopback port, ``--nodes`` nodes on it, each with a
subscription. Each run SIGKILLs the station (no GOODBYE, no CONNECTION_CLOSE) and at once starts
it again on the same port, key and data dir (``--warm``: a process that had imported everything
before the kill is told to listen). The figures: seconds from the kill, and from the new process
listening, until each node announced "reconnected" (its intent replayed; then ``flush`` answers
and every replayed subscription delivers), p50 and max over runs x nodes; and how many learned
of the restart from a stateless reset (``stateless_resets``; 0 on a build without the counter).

By default the nodes dial the station through a UDP forwarder that drops ICMP, as networks that
filter it (or a busy host rate-limiting it) do: a node then learns nothing while the station is
down, and before stateless resets waited for its pings to go unanswered (10.5 s). ``--icmp``
dials the station directly: on loopback a ping into the dead port meets ICMP "port unreachable"
and the node leaves at once, reset or not. Each run starts once the connections have been up
``--settle`` seconds (default the node's ``settle_s``, 10 s; the nodes get the same value): a
reset after a settled connection is redialled at once.

``--noticed`` (implies ``--icmp``): the nodes learn of the death before the new process starts
(each run waits until no node is connected, then ``--down`` seconds more, then restarts), so
they are in their reconnect wait, dialling a dead port (ICMP "port unreachable") when the
station comes back: what decides is how soon they dial again (``quick_redials`` counts the
short redials of a refused station, 0 on a build without them).

Run: ``uv run python scripts/bench.py restart [--runs N] [--nodes N] [--warm] [--icmp]
[--noticed [--down S]]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import bench_common

from macula.client.station_choice import DEFAULT_SETTLE_S
from macula.node.node import Node
from macula.wire.identity import Identity

REALM = bytes(32)
TOPIC = "bench.restart"
BACK_DEADLINE_S = 60.0
# a station process that imports everything, then waits for a line on stdin before it serves
WAIT_THEN_SERVE = (
    "import sys, relay.ops.cli; sys.stdin.readline(); relay.ops.cli.main(sys.argv[1:])"
)


@dataclass(frozen=True)
class Sample:
    from_kill_s: float
    from_listening_s: float
    by_reset: int  # 0/1: the node learned of the restart from a stateless reset
    redials: int  # short redials of the refused station during this outage


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StationProcess:
    """``macula-relay`` on ``port`` of 127.0.0.1 over ``data_dir``, in a process of its own.
    ``prepare`` starts the interpreter and imports the station, ``go`` makes it listen: a
    "warm" restart prepares the next process before the kill."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir, self.port = data_dir, port
        self.process: asyncio.subprocess.Process | None = None
        self._next: asyncio.subprocess.Process | None = None

    async def prepare(self) -> None:
        arguments = ["--host", "127.0.0.1", "--port", str(self.port), "--dht-port", "0"]
        arguments += ["--data-dir", str(self.data_dir), "--log-level", "warning"]
        self._next = await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", WAIT_THEN_SERVE, *arguments),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )

    async def go(self) -> str:
        """The prepared process listens (prepared now if it was not); its endpoint."""
        if self._next is None:
            await self.prepare()
        process, self._next = self._next, None
        assert process is not None and process.stdin is not None and process.stdout is not None
        self.process = process
        process.stdin.write(b"go\n")
        await process.stdin.drain()
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if b"@" not in line:
            raise bench_common.BenchError(f"the station printed {line!r}")
        return line.decode().strip()

    async def kill_current(self) -> None:
        """SIGKILL the listening process: no GOODBYE, no CONNECTION_CLOSE."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            await process.wait()

    async def kill(self) -> None:
        """SIGKILL: no GOODBYE, no CONNECTION_CLOSE (and the prepared one, if any)."""
        for process in (self.process, self._next):
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                await process.wait()
        self.process = self._next = None


class _Upstream(asyncio.DatagramProtocol):
    """The proxy's socket towards the station for one client: replies go back to that client;
    ICMP errors stop here (``error_received`` ignores them), as a firewall would drop them."""

    def __init__(self, downstream: asyncio.DatagramTransport, client: tuple[str, int]) -> None:
        self.downstream, self.client = downstream, client

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.downstream.sendto(data, self.client)

    def error_received(self, exc: Exception) -> None:
        pass


class IcmpFilteringProxy(asyncio.DatagramProtocol):
    """A UDP forwarder on 127.0.0.1 to ``port``: a client dialling it hears no ICMP "port
    unreachable" while the station is down (as across networks that filter ICMP, or a busy
    host rate-limiting it), only what the station sends."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.transport: asyncio.DatagramTransport | None = None
        self.upstreams: dict[tuple[str, int], asyncio.DatagramTransport] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        client = (str(addr[0]), int(addr[1]))
        upstream = self.upstreams.get(client)
        if upstream is not None:
            upstream.sendto(data)
        else:
            asyncio.get_running_loop().create_task(self._open(client, data))

    async def _open(self, client: tuple[str, int], first: bytes) -> None:
        assert self.transport is not None
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Upstream(self.transport, client),  # type: ignore[arg-type]
            remote_addr=("127.0.0.1", self.port),
        )
        self.upstreams[client] = transport
        transport.sendto(first)

    def close(self) -> None:
        for upstream in self.upstreams.values():
            upstream.close()
        if self.transport is not None:
            self.transport.close()


async def open_proxy(port: int) -> tuple[IcmpFilteringProxy, int]:
    proxy = IcmpFilteringProxy(port)
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: proxy, local_addr=("127.0.0.1", 0)
    )
    return proxy, int(transport.get_extra_info("sockname")[1])


def stateless_resets(node: Node) -> int:
    return int(getattr(node.stats, "stateless_resets", 0))


def quick_redials(node: Node) -> int:
    return int(getattr(node.stats, "quick_redials", 0))


async def until(predicate: Callable[[], bool], deadline_s: float, what: str) -> None:
    started = time.perf_counter()
    while not predicate():
        if bench_common.elapsed_since(started) > deadline_s:
            raise bench_common.BenchError(f"{what}: not within {deadline_s:g} s")
        await asyncio.sleep(0.002)  # a benchmark polls; tests wait on conditions


class Watched:
    """A node and when it last announced "reconnected"."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.back_at = 0.0
        node.on_state(self._state)

    def _state(self, state: str) -> None:
        if state == "reconnected":
            self.back_at = time.perf_counter()


async def one_restart(
    watched: list[Watched], station: StationProcess, warm: bool, noticed: float | None
) -> list[Sample]:
    """Kill and restart ``station``; when each node was back, measured from both. With
    ``noticed`` (seconds), the restart waits until no node is connected, then that long."""
    before = [
        (w.node.stats.reconnects, stateless_resets(w.node), quick_redials(w.node)) for w in watched
    ]
    if warm:
        await station.prepare()
    killed = time.perf_counter()
    await station.kill_current()
    if noticed is not None:

        def down() -> bool:
            return not any(w.node.connected for w in watched)

        await until(down, BACK_DEADLINE_S, "noticed")
        await asyncio.sleep(noticed)  # the outage length under test: time is the workload
    await station.go()
    listening = time.perf_counter()
    for w, (reconnects, _, _) in zip(watched, before, strict=True):
        await until(lambda w=w, r=reconnects: w.node.stats.reconnects > r, BACK_DEADLINE_S, "back")
        await w.node.flush()
    return [
        Sample(
            w.back_at - killed,
            w.back_at - listening,
            int(stateless_resets(w.node) > resets),
            quick_redials(w.node) - redials,
        )
        for w, (_, resets, redials) in zip(watched, before, strict=True)
    ]


async def bench(
    runs: int,
    nodes: int,
    settle_s: float,
    warm: bool,
    proxied: bool,
    home: Path,
    noticed: float | None = None,
) -> list[Sample]:
    station = StationProcess(home / "station", free_udp_port())
    samples: list[Sample] = []
    endpoint = await station.go()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if proxied:
                proxy, proxy_port = await open_proxy(station.port)
                stack.callback(proxy.close)
                endpoint = endpoint.replace(f":{station.port}", f":{proxy_port}")
            watched = [
                Watched(await stack.enter_async_context(
                    Node(Identity.generate(os.urandom), endpoint, settle_s=settle_s)
                ))
                for _ in range(nodes)
            ]  # fmt: skip
            subs = [await w.node.subscribe(REALM, f"{TOPIC}.{i}") for i, w in enumerate(watched)]
            for w in watched:
                await w.node.flush()
            for number in range(runs):
                await asyncio.sleep(settle_s)  # the connection has settled: a fresh round
                run = await one_restart(watched, station, warm, noticed)
                for i, sub in enumerate(subs):  # every replayed subscription delivers
                    await watched[i - 1].node.publish(REALM, f"{TOPIC}.{i}", number)
                    delivery = await sub.next(10)
                    if delivery.payload != number:
                        raise bench_common.BenchError(f"got {delivery.payload!r}, not {number}")
                samples += run
                shown = ", ".join(
                    f"{s.from_kill_s:.3f} s ({s.from_listening_s:.3f}; reset {s.by_reset},"
                    f" redials {s.redials})"
                    for s in run
                )
                print(f"  restart {number + 1}: back after the kill (after listening) {shown}")
    finally:
        await station.kill()
    return samples


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_common.parser("restart", __doc__)
    parser.add_argument("--runs", type=int, default=10, help="restarts, one after another")
    parser.add_argument(
        "--warm", action="store_true", help="the next process imported before the kill"
    )
    parser.add_argument(
        "--icmp", action="store_true", help="nodes dial the station directly: ICMP reaches them"
    )
    parser.add_argument(
        "--noticed",
        action="store_true",
        help="restart only once every node noticed the death (implies --icmp)",
    )
    parser.add_argument(
        "--down", type=float, default=0.0, help="with --noticed: seconds down after that"
    )
    parser.add_argument("--nodes", type=int, default=2, help="nodes on the station")
    parser.add_argument(
        "--settle", type=float, default=DEFAULT_SETTLE_S, help="seconds up before each kill"
    )
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="mbr-"))
    try:
        samples = asyncio.run(
            bench(
                max(1, args.runs),
                max(1, args.nodes),
                max(0.0, args.settle),
                args.warm,
                not (args.icmp or args.noticed),
                home,
                max(0.0, args.down) if args.noticed else None,
            )
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for name, values in (
        ("kill", [s.from_kill_s for s in samples]),
        ("listening", [s.from_listening_s for s in samples]),
    ):
        print(
            f"restart: back after the {name} in p50 {statistics.median(values):.3f} s,"
            f" max {max(values):.3f} s over {len(values)} (restarts x nodes)"
        )
    by_reset = sum(s.by_reset for s in samples)
    print(f"restart: {by_reset} of {len(samples)} learned by a stateless reset")
    redials = [s.redials for s in samples]
    print(f"restart: short redials of the refused station per outage: max {max(redials)}")


if __name__ == "__main__":
    main()
