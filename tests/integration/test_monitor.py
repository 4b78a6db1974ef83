"""The monitoring port against a real station (real QUIC on loopback, clients on it)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from macula.node.node import Node
from relay.core.policy import Quotas, StationPolicy
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, echo, fast, station_config, target
from support.monitorkit import exchange, get, get_json, monitor_on, split
from support.waiting import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
async def station(tmp_path: Path) -> AsyncIterator[Station]:
    policy = StationPolicy(quotas=Quotas(max_subscriptions=2))  # a third is refused (counted)
    async with Station(station_config(tmp_path / "station", policy)) as running:
        yield running


async def test_healthz_follows_the_lifecycle(station: Station) -> None:
    async with monitor_on(station) as monitor:
        status, headers, body = await get(monitor.address, "/healthz")
        assert (status, body) == (200, b"ok\n")
        assert headers["connection"] == "close"
        monitor.lifecycle.draining = 1
        assert (await get(monitor.address, "/healthz"))[:3:2] == (503, b"draining\n")
        monitor.lifecycle.draining, monitor.lifecycle.ready = 0, 0
        assert (await get(monitor.address, "/healthz"))[:3:2] == (503, b"not ready\n")


async def test_status_figures_move_with_clients(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with monitor_on(station) as monitor:
        before = await get_json(monitor.address, "/status")
        assert before["node_id"] == station.node_id.hex()
        assert before["connections"]["clients"] == 0
        assert before["subscriptions"] == 0 and before["advertisements"] == 0
        assert before["ready"] == 1 and before["draining"] == 0
        async with make_node() as alice, make_node() as bob:
            for topic in ("a", "b", "c"):  # the third is over the quota of 2
                await alice.subscribe(REALM, topic)
            await bob.advertise(REALM, "org.example.echo_v1", echo)
            await alice.flush()
            await bob.flush()
            during = await get_json(monitor.address, "/status")
            assert during["connections"]["clients"] == 2
            assert during["subscriptions"] == 2
            assert during["advertisements"] == 1
            assert during["refusals"]["subscription_quota"] == 1
            assert during["uptime_s"] >= before["uptime_s"]
            assert set(during["stores"]) >= {"content_bytes", "history_rows", "record_store_rows"}
            assert set(during["dht"]) >= {"records", "bytes"}
            for key in ("pending_calls", "paused_publishers", "slow_consumers_closed"):
                assert during[key] == 0
        after = await eventually(
            lambda: _clients_gone(monitor.address), message="clients still counted"
        )
        assert after["subscriptions"] == 0 and after["refusals"]["subscription_quota"] == 1


async def _clients_gone(address: tuple[str, int]) -> object:
    document = await get_json(address, "/status")
    return document if document["connections"]["total"] == 0 else None


async def test_connections_are_paged_with_their_figures(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with monitor_on(station) as monitor, make_node() as alice, make_node() as bob:
        await alice.subscribe(REALM, "news")
        await alice.flush()
        await bob.flush()
        first = await get_json(monitor.address, "/connections?limit=1")
        assert (first["total"], first["next_offset"], len(first["connections"])) == (2, 1, 1)
        second = await get_json(monitor.address, "/connections?offset=1&limit=1")
        assert second["next_offset"] is None
        rows = {r["node_id"]: r for r in first["connections"] + second["connections"]}
        assert set(rows) == {alice.identity.node_id.hex(), bob.identity.node_id.hex()}
        mine = rows[alice.identity.node_id.hex()]
        assert mine["subscriptions"] == 1 and mine["address"] == "127.0.0.1"
        assert mine["bytes_in"] > 0 and mine["bytes_out"] > 0
        assert mine["state"] == "connected" and mine["station"] == 0
        assert isinstance(mine["since_ms"], int) and mine["refusals"] == {}


async def test_links_show_a_linked_station(station: Station, tmp_path: Path) -> None:
    config = fast(station_config(tmp_path / "other"), [target(station)])
    async with Station(config) as other, monitor_on(other) as monitor:
        row = await eventually(
            lambda: _linked_row(monitor.address, station.node_id.hex()), message="no link"
        )
        assert row["dialled"] == 1 and row["state"] == "connected"
        status = await get_json(monitor.address, "/status")
        assert status["links"]["up"] == 1 and status["connections"]["clients"] == 0
        assert status["links"]["stations"] == [
            {key: row[key] for key in ("node_id", "address", "state", "linked", "dialled")}
        ]


async def _linked_row(address: tuple[str, int], node_id: str) -> object:
    rows = (await get_json(address, "/links"))["links"]
    return next((r for r in rows if r["node_id"] == node_id and r["linked"] == 1), None)


async def test_metrics_parse_with_prometheus_own_parser(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with monitor_on(station) as monitor, make_node() as alice:
        for topic in ("a", "b", "c"):
            await alice.subscribe(REALM, topic)
        await alice.flush()
        status, headers, body = await get(monitor.address, "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        value = {f.name: f.samples[0].value for f in families.values() if len(f.samples) == 1}
        assert value["macula_clients"] == 1
        assert value["macula_subscriptions"] == 2
        assert value["macula_ready"] == 1
        refused = {s.labels["reason"]: s.value for s in families["macula_refusals"].samples}
        assert refused["subscription_quota"] == 1
        info = families["macula_station_info"].samples[0]
        assert info.labels["node_id"] == station.node_id.hex()
        assert all(name.startswith("macula_") for name in families)


async def test_status_page_names_the_station(station: Station) -> None:
    async with monitor_on(station) as monitor:
        status, headers, body = await get(monitor.address, "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert station.node_id.hex().encode() in body
        assert b'http-equiv="refresh"' in body
        # HEAD has the headers of a GET, no body. The page holds live figures (uptime, DHT bytes)
        # that may change between two requests, so a GET and the HEAD right after it are asked
        # again until they describe the same page; a HEAD that is always off never agrees.
        for _ in range(20):
            head_status, head_headers, head_body = await get(monitor.address, "/", "HEAD")
            assert (head_status, head_body) == (200, b"")
            if int(head_headers["content-length"]) == len(body):
                break
            body = (await get(monitor.address, "/"))[2]
        assert int(head_headers["content-length"]) == len(body)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"POST /status HTTP/1.1\r\n\r\n", 405),
        (b"GET /status HTTP/2\r\n\r\n", 505),
        (b"GET status HTTP/1.1\r\n\r\n", 400),
        (b"GET /status HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 413),
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /status HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /status HTTP/1.1\n\n", 400),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", 404),
    ],
)
async def test_bad_requests_get_a_clear_status(station: Station, raw: bytes, code: int) -> None:
    async with monitor_on(station) as monitor:
        status, headers, _ = split(await exchange(monitor.address, raw))
        assert status == code and headers["connection"] == "close"
        assert (await get(monitor.address, "/healthz"))[0] == 200  # the monitor still serves


async def test_a_silent_monitor_client_does_not_stall_routing(
    station: Station, make_node: Callable[..., Node]
) -> None:
    async with monitor_on(station, read_timeout_s=0.5, max_clients=2) as monitor:
        reader, writer = await asyncio.open_connection(*monitor.address)
        writer.write(b"GET /sta")  # half a request line, then nothing
        await writer.drain()
        async with make_node() as alice, make_node() as bob:
            inbox = await bob.subscribe(REALM, "news")
            await bob.flush()
            for n in range(20):
                await alice.publish(REALM, "news", {"n": n})
            got = [(await inbox.next(5)).payload["n"] for _ in range(20)]
            assert got == list(range(20))  # routed while the monitor client hangs
        assert (await get(monitor.address, "/healthz"))[0] == 200  # others are still served
        answer = await asyncio.wait_for(reader.read(), 5)  # then it is timed out
        writer.close()
        assert split(answer)[0] == 408
        assert monitor.server.stats["timed_out"] == 1


async def test_monitor_clients_over_the_cap_are_refused(station: Station) -> None:
    async with monitor_on(station, read_timeout_s=5, max_clients=1) as monitor:
        _, holder = await asyncio.open_connection(*monitor.address)
        await eventually(lambda: monitor.server.clients == 1, message="holder not seen")
        status, _, body = await get(monitor.address, "/status")
        assert (status, body) == (503, b"monitor busy\n")
        holder.close()
        await eventually(lambda: monitor.server.clients == 0, message="holder not released")
        assert (await get(monitor.address, "/healthz"))[0] == 200


async def test_status_counts_a_paused_publisher(tmp_path: Path) -> None:
    quotas = Quotas(publish_rate=20.0, publish_burst=20.0)
    policy = dataclasses.replace(StationPolicy(), quotas=quotas)
    async with (
        Station(station_config(tmp_path / "s", policy)) as station,
        monitor_on(station) as monitor,
        Node(new_identity(), [station.endpoint]) as alice,
    ):
        for n in range(60):  # three times the burst: the station pauses the publisher
            await alice.publish(REALM, "news", {"n": n})
        status = await eventually(
            lambda: _paused(monitor.address), message="publisher never paused"
        )
        assert status["publishers_paused_total"] >= 1
        assert status["counters"]["publishers_paused"] >= 1


async def _paused(address: tuple[str, int]) -> object:
    document = await get_json(address, "/status")
    return document if document["publishers_paused_total"] >= 1 else None
