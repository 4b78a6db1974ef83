"""A client fails over between stations: two (or three) independent stations in one process.

The stations are not federated here: an event or a call reaches a node only on the station it
is connected to, so each check is made by a second node on the station the first one moved to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from macula.agent.agent import Agent
from macula.client.backoff import Backoff
from macula.client.station_choice import StationInfo
from macula.errors import CallTimeout, ConfigError, MaculaError, MeshError
from macula.known_stations import KnownStations
from macula.node.node import Node
from macula.node.subscriptions import Subscription
from relay.station.station import Station
from support.identities import new_identity
from support.meshkit import REALM, agent_in, settings, station_config
from support.processkit import free_udp_port
from support.waiting import eventually
from tools.server.runtime import preflight

pytestmark = pytest.mark.anyio
FAST = Backoff(initial_s=0.05, max_s=0.2, jitter=0.1)
# the backoff alone: stopped stations are refused by ICMP, which would redial them every
# 0.25-0.5 s instead (tests/integration/test_restart_noticed.py)
BACKOFF_ONLY = Backoff(initial_s=0.05, max_s=0.2, jitter=0.1, redial_window_s=0.0)
PROCEDURE = "org.example.failover_echo"
log = logging.getLogger("tests.failover")


@contextlib.asynccontextmanager
async def stations(tmp_path: Path, count: int) -> AsyncIterator[list[Station]]:
    async with contextlib.AsyncExitStack() as stack:
        running = [
            await stack.enter_async_context(Station(station_config(tmp_path / f"station{i}")))
            for i in range(count)
        ]
        yield running


async def reachable(caller: Node, payload: Any) -> Any:
    """The answer of ``PROCEDURE`` through ``caller``'s station, or None while nobody there
    serves it yet."""
    try:
        return await caller.call(REALM, PROCEDURE, payload, timeout=1)
    except (MeshError, CallTimeout):
        return None


async def test_a_node_fails_over_replays_its_intent_and_is_reachable_within_5_s(
    tmp_path: Path,
) -> None:
    async with stations(tmp_path, 2) as (a, b):
        moves: list[StationInfo] = []
        states: list[str] = []
        node = Node(new_identity(), [a.endpoint, b.endpoint], backoff=FAST)
        async with node, Node(new_identity(), b.endpoint) as other:
            node.on_station(moves.append)
            node.on_state(states.append)
            sub = await node.subscribe(REALM, "failover.news")
            await node.advertise(REALM, PROCEDURE, lambda call: {"echo": call.payload})
            await node.flush()
            info = node.station_info
            assert info is not None and (info.node_id, info.index) == (a.node_id, 0)
            assert info.endpoint == a.endpoint
            assert await reachable(other, 1) is None  # not on B yet: nobody serves it there

            loop = asyncio.get_running_loop()
            moved_at: list[float] = []
            node.on_station(lambda _: moved_at.append(loop.time()))
            started = loop.time()
            stopping = asyncio.create_task(a.stop())  # GOODBYE operator_stop, then closes
            assert await eventually(lambda: reachable(other, 2), timeout=5) == {"echo": 2}
            elapsed = loop.time() - started
            await stopping
            print(
                f"failover: station stopping -> on the next one in {moved_at[0] - started:.3f} s,"
                f" its procedure answered there after {elapsed:.3f} s"
            )

            info = node.station_info
            assert info is not None and (info.node_id, info.index) == (b.node_id, 1)
            assert node.station is not None and node.station.port == b.port
            assert [m.node_id for m in moves] == [b.node_id]  # hooked after the first connect
            assert states[-2:] == ["disconnected", "reconnected"]
            assert node.stats.reconnects == 1
            await node.flush()  # the replayed SUBSCRIBE has taken effect at B
            await other.publish(REALM, "failover.news", "on b")
            assert (await sub.next(3)).payload == "on b"


@contextlib.asynccontextmanager
async def station_process(data_dir: Path) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """A ``macula-relay`` of its own process (so it can die without a word): its endpoint."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "relay.ops.cli", "--port", "0", "--data-dir", str(data_dir)),
        *("--log-level", "warning"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert b"@" in line, f"the station printed {line!r}"
        yield line.decode().strip(), process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def test_a_station_that_dies_without_a_word_is_left_within_5_s(tmp_path: Path) -> None:
    async with (
        station_process(tmp_path / "crashing") as (endpoint, process),
        Station(station_config(tmp_path / "b")) as b,
    ):
        node = Node(new_identity(), [endpoint, b.endpoint], backoff=FAST)
        async with node, Node(new_identity(), [b.endpoint]) as other:
            await node.advertise(REALM, PROCEDURE, lambda call: {"echo": call.payload})
            await node.flush()
            assert node.station_info is not None and node.station_info.index == 0
            loop = asyncio.get_running_loop()
            started = loop.time()
            process.send_signal(signal.SIGKILL)  # no GOODBYE, no CONNECTION_CLOSE
            assert await eventually(lambda: reachable(other, 3), timeout=5) == {"echo": 3}
            elapsed = loop.time() - started
            print(f"failover: station killed -> answered on the next one in {elapsed:.3f} s")
            assert node.station_info is not None and node.station_info.node_id == b.node_id


async def test_nothing_is_lost_for_a_subscriber_on_b_while_the_publisher_moves(
    tmp_path: Path,
) -> None:
    async with stations(tmp_path, 2) as (a, b):
        publisher = Node(new_identity(), [a.endpoint, b.endpoint], backoff=FAST)
        async with publisher, Node(new_identity(), [b.endpoint]) as subscriber:
            sub = await subscriber.subscribe(REALM, "failover.stream")
            await subscriber.flush()
            received: list[int] = []

            async def collect(source: Subscription) -> None:
                async for delivery in source:
                    received.append(delivery.payload)

            confirmed: dict[int, bytes] = {}  # seq number -> the station that confirmed it
            unconfirmed: set[int] = set()  # sent, but the flush broke: fate unknown

            async def publish_until_twenty_on_b() -> None:
                number = 0
                while sum(1 for at in confirmed.values() if at == b.node_id) < 20:
                    session = await publisher.session(5)
                    # nothing runs in between: the publish goes on this very session
                    await publisher.publish(REALM, "failover.stream", number, timeout=5)
                    try:  # the flush of this session, not of whichever comes next
                        await session.builtin("_relay.ping", None, 5)
                    except MaculaError:
                        unconfirmed.add(number)
                    else:
                        confirmed[number] = session.station_key
                    number += 1

            async with asyncio.TaskGroup() as group:
                collector = group.create_task(collect(sub))
                publishing = group.create_task(publish_until_twenty_on_b())
                await eventually(lambda: len(confirmed) >= 5)  # some went to A
                await a.stop()
                await asyncio.wait_for(publishing, 10)
                on_b = {n for n, at in confirmed.items() if at == b.node_id}
                await subscriber.flush()  # every event B routed to it has been delivered
                await eventually(lambda: on_b <= set(received), message=f"{on_b - set(received)}")
                collector.cancel()
            on_a = {n for n, at in confirmed.items() if at == a.node_id}
            assert len(on_a) >= 5 and len(on_b) == 20
            assert len(received) == len(set(received)), "an event arrived twice"
            assert received == sorted(received)
            assert set(received) <= on_b | unconfirmed  # nothing that A confirmed leaked


def test_a_bad_entry_in_mesh_stations_is_named(tmp_path: Path) -> None:
    key = str(tmp_path / "agent.key")
    pin = "ab" * 32
    cases = {
        "127.0.0.1:1, zz@127.0.0.1:2": r"MACULA_MESH_STATIONS: 'zz@127\.0\.0\.1:2': node id is not",
        "127.0.0.1:1,127.0.0.1:99999": r"'127\.0\.0\.1:99999': port must be 1\.\.65535",
        f"127.0.0.1:1,{pin[:10]}@h:2": r"node id must be 64 hex",
        "127.0.0.1:1,,127.0.0.1:2": r"MACULA_MESH_STATIONS: empty entry",
        f"h:1, h:2, {pin}@H:1": r"entry 3 \(.*@H:1\) names the same station as entry 1",
    }
    for value, message in cases.items():
        env = {"MACULA_MESH_STATIONS": value, "MACULA_MCP_IDENTITY": key}
        with pytest.raises(ConfigError, match=message):
            Node.from_env(env)
        with pytest.raises(ConfigError, match=message):  # macula-mcp refuses it before MCP
            preflight(env | {"MACULA_HOME": str(tmp_path / "home")})
    node = Node.from_env({"MACULA_MESH_STATIONS": "h:1, h:2", "MACULA_MCP_IDENTITY": key})
    assert [s.port for s in node.stations] == [1, 2]


@pytest.mark.parametrize("pinning", ["node_id", "known_stations"])
async def test_a_key_mismatch_on_the_next_station_is_refused_and_the_node_goes_on(
    tmp_path: Path, pinning: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="macula.node.node")
    impostor = new_identity().node_id.hex()
    async with stations(tmp_path, 3) as (a, b, c):
        known = KnownStations(tmp_path / "home" / "known_stations")
        if pinning == "node_id":
            second = f"{impostor}@127.0.0.1:{b.port}"
        else:  # pinned on first use, to a key that is not B's
            (tmp_path / "home").mkdir(mode=0o700)
            known.path.write_text(f"127.0.0.1:{b.port} {impostor}\n")
            known.path.chmod(0o600)
            second = f"127.0.0.1:{b.port}"
        node = Node(
            new_identity(), [a.endpoint, second, c.endpoint], backoff=FAST, known_stations=known
        )
        async with node:
            assert node.station_info is not None and node.station_info.node_id == a.node_id
            await a.stop()
            await eventually(
                lambda: node.station_info is not None and node.station_info.node_id == c.node_id,
                timeout=5,
            )
            refusals = [r.getMessage() for r in caplog.records if str(b.port) in r.getMessage()]
            assert refusals and all("unavailable" in r for r in refusals)
            expected = "expected " + impostor if pinning == "node_id" else "not the one recorded"
            assert expected in refusals[0]
            if pinning == "known_stations":  # the recorded key stands
                assert known.load()[f"127.0.0.1:{b.port}"] == bytes.fromhex(impostor)


async def test_with_every_station_down_it_backs_off_and_connects_when_one_comes_back(
    tmp_path: Path,
) -> None:
    configs = [station_config(tmp_path / f"s{i}", port=free_udp_port()) for i in range(2)]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(seconds)  # the node's injected sleep: recorded, then really waited

    a, b = Station(configs[0]), Station(configs[1])
    await a.__aenter__()
    await b.__aenter__()
    try:
        node = Node(new_identity(), [a.endpoint, b.endpoint], backoff=BACKOFF_ONLY, sleep=sleep)
        async with node:
            sub = await node.subscribe(REALM, "failover.back")
            await node.flush()
            await a.stop()
            await b.stop()
            await eventually(lambda: len(waits) >= 4, message=f"waits so far: {waits}")
            assert not node.connected
            bases = [0.05, 0.1, 0.2, 0.2]  # one wait per failed round, doubling to max_s
            for wait, base in zip(waits, bases, strict=False):
                assert base * 0.9 <= wait <= base * 1.1
            async with Station(configs[1]) as back:
                await eventually(
                    lambda: (
                        node.station_info is not None and node.station_info.node_id == back.node_id
                    ),
                    timeout=5,
                )
                async with Node(new_identity(), [back.endpoint]) as other:
                    await node.flush()
                    await other.publish(REALM, "failover.back", "back")
                    assert (await sub.next(3)).payload == "back"
    finally:
        await a.stop()
        await b.stop()


async def test_after_a_move_the_agents_of_the_new_station_see_it_present(tmp_path: Path) -> None:
    async with stations(tmp_path, 2) as (a, b):
        node = Node(new_identity(), [a.endpoint, b.endpoint], backoff=FAST)
        async with (
            node,
            Agent(node, settings(tmp_path / "alpha", "ask")) as alpha,
            agent_in(b, tmp_path / "beta") as beta,
        ):
            await alpha.hello()
            await beta.hello()
            alpha_id = node.identity.node_id

            async def beta_hears_alpha() -> bool:
                return any(e.node_id == alpha_id for e in await beta.presence.agents())

            assert not await beta_hears_alpha()  # A and B are not federated
            await a.stop()
            # its heartbeat is every 10 s: only the re-announcement can make this in time
            await eventually(beta_hears_alpha, timeout=5)

            async def listed_at_b() -> bool:
                rows = await beta.agents()
                return any(r["node_id"] == alpha_id.hex() and r["source"] == "both" for r in rows)

            await eventually(listed_at_b, timeout=5)  # registered in B's directory too
            rung = await beta.rings.ring(alpha_id, "you moved")  # its ring endpoint at B
            assert (rung.unreachable, rung.answer) == (0, 3)  # alpha's policy: ask (deferred)


async def test_a_station_refusing_handshakes_while_draining_is_passed_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="macula.node.node")
    async with stations(tmp_path, 2) as (a, b):
        a.core.stopping = True  # as between its GOODBYEs and its close: new clients refused
        async with Node(new_identity(), [a.endpoint, b.endpoint], backoff=FAST) as node:
            assert node.station_info is not None and node.station_info.node_id == b.node_id
        [refusal] = [r.getMessage() for r in caplog.records if str(a.port) in r.getMessage()]
        assert "temporary_relay_failure" in refusal


async def test_a_station_that_paused_our_control_stream_is_not_taken_for_dead(
    tmp_path: Path,
) -> None:
    """The liveness probe is a QUIC PING, acknowledged by the station's QUIC stack: a control
    stream the station stopped reading (backpressure) does not hold it up, so a paused client
    is not moved away (a `_relay.ping` CALL would wait behind the paused stream and time out)."""
    async with Station(station_config(tmp_path / "a")) as a:
        node = Node(new_identity(), [a.endpoint], probe_interval_s=0.1, probe_timeout_s=0.3)
        async with node:
            await node.flush()
            conn = a.core.node_conn[node.identity.node_id]
            control = a.core.peers[conn].control
            assert control is not None
            a._connections[conn].pause_reading(control)  # as a PauseReading action does
            await node.publish(REALM, "held", "behind the pause")
            before = node.stats.probes_acknowledged
            # several probe rounds while the station reads nothing of ours
            await eventually(lambda: node.stats.probes_acknowledged >= before + 4, timeout=5)
            assert node.stats.reconnects == 0 and node.connected
            a._connections[conn].resume_reading(control)
            assert await node.flush() == {}
            assert node.stats.reconnects == 0


async def test_a_station_behind_by_more_than_one_ping_keeps_its_nodes(tmp_path: Path) -> None:
    """A station whose receive queue is deep (hundreds of agents arriving at once on a busy
    machine) answers pings late; that is not a dead station, and its nodes stay (issue 27: when
    one ping unanswered in its timeout counted as dead, every node on the station reconnected at
    once, each reconnect a handshake for the station, which kept it behind: 1,000 arriving
    agents never all arrived). The station's socket is not read for a while: as when it is busy."""
    async with Station(station_config(tmp_path / "a")) as a, contextlib.AsyncExitStack() as stack:
        nodes = [
            Node(new_identity(), [a.endpoint], probe_interval_s=0.1, probe_timeout_s=0.2)
            for _ in range(5)
        ]  # one probe: 0.2 s, then 0.4 and 0.8 s more before the station counts as gone
        states: list[str] = []
        for node in nodes:
            await stack.enter_async_context(node)
            node.on_state(states.append)
            await node.flush()
        before = [node.stats.probes_acknowledged for node in nodes]
        reading = a._server._transport  # type: ignore[union-attr]
        reading.pause_reading()  # datagrams wait in the socket, unread

        def first_ping_missed(node: Node) -> bool:
            session = node._session
            return session is None or len(session.protocol._ping_waiters) >= 2

        try:  # each node's first ping has gone unanswered past its timeout
            await eventually(lambda: all(first_ping_missed(node) for node in nodes), timeout=5)
        finally:
            reading.resume_reading()  # the station catches up
        for node in nodes:
            assert await node.flush() == {}
        await eventually(
            lambda: all(n.stats.probes_acknowledged > b for n, b in zip(nodes, before, strict=True))
        )
        assert states == [] and [node.stats.reconnects for node in nodes] == [0] * len(nodes)
