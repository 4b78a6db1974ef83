"""Workloads beyond messaging: content throughput vs raw aioquic, idle memory, ``tools/list`` size.

Invariants: the raw aioquic server runs in its own process with our transport's flow-control
windows and the same kind of certificate, so the content ratio compares our protocol (framing,
CBOR, digests, Merkle root, signatures, the station's store) with one bare QUIC stream moving
as many bytes each way; station memory is read from /proc on a station process started for
that measurement alone (a station that has served other workloads holds their caches), after a
warm-up, so the figure is what N more idle connections add; every loop is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import serve
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from bench_common import (
    MIB,
    BenchError,
    Figure,
    Limits,
    child_process,
    elapsed_since,
    rss_kib,
    serve_until_stdin_closes,
)

from macula.node.node import Node
from macula.quic.transport import CONNECTION_WINDOW, LOOPBACK_DATAGRAM_SIZE, STREAM_WINDOW
from macula.wire.identity import Identity
from relay.station.tls import ensure_certificate

RAW_ALPN = "bench-raw"
CONNECT_WIDTH = 16  # idle connections being set up at once
WARM_UP = 5  # connections made and closed before the "before" reading


# -- content: ours (Node.put_content/get_content) -------------------------------------------


async def content(endpoint: str, limits: Limits) -> list[Figure]:
    data = os.urandom(limits.content_bytes)
    async with Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0) as node:
        began = time.perf_counter()
        mcid = await asyncio.wait_for(node.put_content(data, name="bench"), limits.phase_seconds)
        put_s = elapsed_since(began)
        began = time.perf_counter()
        back = await asyncio.wait_for(node.get_content(mcid), limits.phase_seconds)
        get_s = elapsed_since(began)
    if back != data:
        raise BenchError("content came back different")
    mib = limits.content_bytes / MIB
    note = f"(put {mib / put_s:.1f} MiB/s, get {mib / get_s:.1f} MiB/s, {mib:g} MiB each way)"
    label = f"content put+get {mib:g} MiB"
    return [Figure("content", label, 2 * mib / (put_s + get_s), "MiB/s", note)]


# -- content: raw aioquic, one stream up and one back ---------------------------------------


class BulkServer(QuicConnectionProtocol):
    """Counts what a stream brings; at its end, sends as many bytes back and ends the stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: dict[int, int] = {}

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            total = self.counts.get(event.stream_id, 0) + len(event.data)
            self.counts[event.stream_id] = total
            if event.end_stream:
                self._quic.send_stream_data(event.stream_id, bytes(total), end_stream=True)
                self.transmit()


class BulkClient(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received = 0
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            self.received += len(event.data)
            if event.end_stream and not self.done.done():
                self.done.set_result(self.received)


def raw_configuration(is_client: bool) -> QuicConfiguration:
    return QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[RAW_ALPN],
        max_data=CONNECTION_WINDOW,
        max_stream_data=STREAM_WINDOW,
        max_datagram_size=LOOPBACK_DATAGRAM_SIZE,  # as ours on loopback: a like-for-like peer
    )


async def serve_raw_quic(seconds: float) -> None:
    """Child-process mode: the bulk server on 127.0.0.1, an Ed25519 certificate as ours has."""
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as tmp:
        cert, key = ensure_certificate(Path(tmp), Identity.generate(os.urandom), ["127.0.0.1"])
        configuration = raw_configuration(is_client=False)
        configuration.load_cert_chain(cert, key)
        server = await serve(
            "127.0.0.1", 0, configuration=configuration, create_protocol=BulkServer
        )
        assert server._transport is not None
        port = server._transport.get_extra_info("sockname")[1]
        print(f"listening 127.0.0.1:{port}", flush=True)
        try:
            await serve_until_stdin_closes(seconds)
        finally:
            server.close()


async def raw_quic(limits: Limits) -> list[Figure]:
    async with child_process("serve-raw-quic", "1800", ready="listening") as child:
        port = int(child.said.rsplit(":", 1)[1])
        configuration = raw_configuration(is_client=True)
        configuration.verify_mode = ssl.CERT_NONE  # loopback, our own child: nothing to pin
        data = bytes(limits.content_bytes)
        async with connect(
            "127.0.0.1", port, configuration=configuration, create_protocol=BulkClient
        ) as client:
            assert isinstance(client, BulkClient)
            began = time.perf_counter()
            stream_id = client._quic.get_next_available_stream_id()
            client._quic.send_stream_data(stream_id, data, end_stream=True)
            client.transmit()
            received = await asyncio.wait_for(client.done, limits.phase_seconds)
            seconds = elapsed_since(began)
    if received != limits.content_bytes:
        raise BenchError(f"raw stream brought back {received} of {limits.content_bytes} bytes")
    mib = limits.content_bytes / MIB
    label = f"raw aioquic 1 stream {mib:g} MiB"
    note = f"({mib:g} MiB each way, {seconds:.2f} s)"
    return [Figure("content", label, 2 * mib / seconds, "MiB/s", note)]


# -- station memory per idle connection -----------------------------------------------------


def raise_open_files(wanted: int) -> str:
    """Lift the soft RLIMIT_NOFILE towards ``wanted`` (each client connection is a UDP socket)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return f"open files: soft {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, hard {hard}"


async def idle_memory(limits: Limits) -> list[Figure]:
    """RSS of a fresh station process before and after ``idle_connections`` idle clients."""
    count = limits.idle_connections
    print(raise_open_files(count * 2 + 256), flush=True)
    async with child_process("serve-station", "1800", ready="endpoint") as station:
        endpoint = station.said
        for _ in range(WARM_UP):
            async with Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0) as n:
                await n.flush()
        before = rss_kib(station.pid)
        gate = asyncio.Semaphore(CONNECT_WIDTH)
        release = asyncio.Event()
        connected: list[int] = []
        failures: list[str] = []
        all_in = asyncio.Event()

        async def hold() -> None:
            try:
                async with gate:
                    node = Node(Identity.generate(os.urandom), [endpoint], probe_interval_s=0)
                    await node.__aenter__()
                try:
                    await node.flush(limits.phase_seconds)
                    connected.append(1)
                    if len(connected) + len(failures) >= count:
                        all_in.set()
                    await release.wait()
                finally:
                    await node.__aexit__(None, None, None)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                if len(connected) + len(failures) >= count:
                    all_in.set()

        began = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(count):
                group.create_task(hold())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_in.wait(), max(limits.phase_seconds, count * 0.2))
            setup_s = elapsed_since(began)
            after = rss_kib(station.pid)
            release.set()
    if not connected:
        raise BenchError(f"no idle connection was made: {failures[:3]}")
    per = (after - before) / len(connected)
    note = f"({len(connected):,} connected in {setup_s:.1f} s, {len(failures)} failed"
    note += f", RSS {before / 1024:.1f} → {after / 1024:.1f} MiB)"
    if failures:
        note += f" first failure: {failures[0][:80]}"
    return [Figure("idle_kib", f"station memory per idle connection ({count:,})", per, "KiB", note)]


# -- tools/list through the official MCP SDK client against a real macula-mcp ---------------


async def tools_list(endpoint: str) -> list[Figure]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mcp_surface  # the official SDK client over stdio; imports the SDK (about 1 s)

    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        for terse in (False, True):
            home = Path(tmp) / ("terse" if terse else "full")
            _, tools, size = await mcp_surface.measure(endpoint, home, terse)
            which = "terse" if terse else "full"
            label = f"tools/list JSON ({which})"
            note = f"({tools} tools, MACULA_MCP_TERSE_TOOLS={int(terse)})"
            figures.append(Figure(f"tools_list_{which}", label, size, "bytes", note))
    return figures
