"""``macula-relay --workers 2``: two real station processes behind one UDP port, as one
station to its clients (one endpoint, one node id). Clients land on either worker (Linux hashes
each connection's 4-tuple); which one holds a client is read from that worker's monitor. A
client on one worker sees the events and calls of a client on the other (the workers are
linked); a worker killed without a word is started again and its clients come back; the
station stops on SIGTERM with exit code 0 and tells systemd READY once, after both workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from macula.client.backoff import Backoff
from macula.errors import CallTimeout, MeshError
from macula.node.node import Node
from macula.stations import parse_station
from support.identities import new_identity
from support.meshkit import REALM
from support.waiting import eventually
from support.workerkit import WorkerStation, worker_station

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
FAST = Backoff(initial_s=0.05, max_s=0.3, jitter=0.1)
PROCEDURE = "org.example.workers_echo"


@contextlib.asynccontextmanager
async def on_both_workers(
    station: WorkerStation, most: int = 16
) -> AsyncIterator[tuple[Node, Node]]:
    """A client held by worker 0 and one held by worker 1 (connecting clients until both
    workers hold one: their source ports hash to one worker or the other)."""
    async with contextlib.AsyncExitStack() as stack:
        held: dict[int, Node] = {}
        for _ in range(most):
            node = Node(
                new_identity(),
                station.endpoint,
                backoff=FAST,
                probe_interval_s=0.3,
                probe_timeout_s=0.5,
            )
            await stack.enter_async_context(node)
            await node.flush()
            me = node.identity.node_id.hex()
            for worker in (0, 1):
                if me in await station.clients(worker):
                    held.setdefault(worker, node)
            if len(held) == 2:
                break
        assert len(held) == 2, f"{most} clients, all on worker {list(held)}"
        yield held[0], held[1]


async def _answer(caller: Node, payload: Any) -> Any:
    try:
        return await caller.call(REALM, PROCEDURE, payload, timeout=1)
    except (MeshError, CallTimeout):
        return None


async def _heard(publisher: Node, subscription: Any, topic: str, payload: str) -> bool:
    await publisher.publish(REALM, topic, payload)
    try:
        event = await subscription.next(0.5)
    except TimeoutError:
        return False
    return bool(event.payload == payload)


async def _both_linked(station: WorkerStation) -> bool:
    return await station.linked(0) == 1 and await station.linked(1) == 1


async def _events_and_calls_cross(first: Node, second: Node, topic: str) -> None:
    """``second`` reaches ``first``'s subscription and procedure (on another worker)."""
    subscription = await first.subscribe(REALM, topic)
    await first.advertise(REALM, PROCEDURE, lambda call: {"echo": call.payload})
    await first.flush()
    # the interest and the advertisement cross the link to the other worker
    assert await eventually(lambda: _heard(second, subscription, topic, "hi"), timeout=10)
    assert await eventually(lambda: _answer(second, 7), timeout=10) == {"echo": 7}


async def test_two_workers_are_one_station_to_clients_on_either(tmp_path: Path) -> None:
    """One endpoint and node id, READY once both workers listen, the endpoint file written
    then, events and calls across the workers, SIGTERM: STOPPING, exit 0, file removed."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        env = {**os.environ, "NOTIFY_SOCKET": str(path)}
        endpoint_file = tmp_path / "endpoint"
        extra = ("--endpoint-file", str(endpoint_file))
        async with worker_station(tmp_path / "station", *extra, env=env) as station:
            message = (await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)).decode()
            assert "READY=1" in message and f"MAINPID={station.process.pid}" in message
            assert station.pids.keys() == {0, 1}  # both workers listened before READY
            assert endpoint_file.read_text() == f"{station.endpoint}\n"
            assert (endpoint_file.stat().st_mode & 0o777) == 0o600
            address = parse_station(station.endpoint)
            await eventually(lambda: _both_linked(station), timeout=20)
            async with on_both_workers(station) as (first, second):
                for node in (first, second):  # one node id to every client, either worker
                    info = node.station_info
                    assert info is not None and info.node_id == address.node_id
                await _events_and_calls_cross(first, second, "workers.news")
                await _events_and_calls_cross(second, first, "workers.back")
        stopping = (await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)).decode()
        assert "STOPPING=1" in stopping
        assert not endpoint_file.exists()  # removed on the clean exit


async def test_a_killed_worker_is_started_again_and_its_clients_come_back(
    tmp_path: Path,
) -> None:
    async with worker_station(tmp_path / "station") as station:
        await eventually(lambda: _both_linked(station), timeout=20)
        async with on_both_workers(station) as (first, second):
            subscription = await first.subscribe(REALM, "workers.after")
            await first.flush()
            killed = station.pids[1]
            os.kill(killed, signal.SIGKILL)  # no GOODBYE, no CONNECTION_CLOSE
            await station.until(lambda: station.pids[1] != killed)
            assert any("worker 1 exited with code -9" in line for line in station.lines)
            # the client of the killed worker is back (on whichever worker now), its
            # subscription replayed: an event from it reaches the other client again
            await eventually(lambda: second.stats.reconnects >= 1, timeout=20)
            # the lower worker leaves the dead link after 3 unanswered pings, then dials again
            await eventually(lambda: _both_linked(station), timeout=40)
            assert await eventually(
                lambda: _heard(second, subscription, "workers.after", "again"), timeout=20
            )
        # the restarted worker serves and is linked: new clients on both workers meet
        async with on_both_workers(station) as (first, second):
            await _events_and_calls_cross(first, second, "workers.new")
