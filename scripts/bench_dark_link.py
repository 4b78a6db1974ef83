"""What ``mesh_say`` does over a link that goes dark (issue 37; the room outbox,
``macula/agent/room/outbox.py``).

One station in this process on loopback; bob on it directly; alice dialling it through a UDP
forwarder that drops every datagram both ways for ``--dark`` seconds (a WAN link gone dark:
no ICMP, no reset, nothing). During the dark alice says ``--says`` remarks, one after the
other, spread evenly. Printed: what each say returned and how long it took, alice's node
states, and when bob's transcript held every one (once each, in order), from the link's
return.

Run: ``uv run python scripts/bench_dark_link.py [--dark 8] [--says 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from macula.agent.agent import Agent, AgentSettings
from macula.client.backoff import Backoff
from macula.errors import MaculaError
from macula.node.node import Node
from macula.store.base import StorePaths
from macula.wire.identity import Identity
from relay.station.station import Station, StationConfig


class _Back(asyncio.DatagramProtocol):
    def __init__(self, link: DarkLink, client: tuple[str, int]) -> None:
        self.link, self.client = link, client

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not self.link.dark and self.link.transport is not None:
            self.link.transport.sendto(data, self.client)


class DarkLink(asyncio.DatagramProtocol):
    """A UDP forwarder on 127.0.0.1 to ``port`` that drops everything while ``dark``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.dark = False
        self.transport: asyncio.DatagramTransport | None = None
        self.ups: dict[tuple[str, int], asyncio.DatagramTransport] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.dark:
            return
        client = (str(addr[0]), int(addr[1]))
        up = self.ups.get(client)
        if up is not None:
            up.sendto(data)
        else:
            asyncio.get_running_loop().create_task(self._open(client, data))

    async def _open(self, client: tuple[str, int], first: bytes) -> None:
        up, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Back(self, client), remote_addr=("127.0.0.1", self.port)
        )
        self.ups[client] = up
        up.sendto(first)


def _settings(home: Path) -> AgentSettings:
    home.mkdir(parents=True)
    paths = StorePaths(home / "roster.sqlite3", home / "transcript.sqlite3", home / "rings.sqlite3")
    return AgentSettings(paths=paths, policy_file=home / "contact_policy.json", citizenship=False)


async def run(dark_s: float, says: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-dark-"))
    async with Station(StationConfig(data_dir=root / "station", port=0)) as station:
        link = DarkLink(station.port)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: link, local_addr=("127.0.0.1", 0)
        )
        via = f"{station.node_id.hex()}@127.0.0.1:{transport.get_extra_info('sockname')[1]}"
        backoff = Backoff(initial_s=0.2, max_s=1.0)
        async with (
            Node(Identity.generate(os.urandom), [via], backoff=backoff) as alice_node,
            Agent(alice_node, _settings(root / "alice")) as alice,
            Node(Identity.generate(os.urandom), [station.endpoint]) as bob_node,
            Agent(bob_node, _settings(root / "bob")) as bob,
        ):
            await alice.hello()
            await bob.hello()
            room = (await alice.rooms.open("dark link")).room_topic
            await bob.rooms.join(room)
            await alice.rooms.wait(room, 10, after_ms=0, kinds={"participant_joined"})
            await dark_then_back(alice, bob, room, link, dark_s, says)


async def dark_then_back(
    alice: Agent, bob: Agent, room: str, link: DarkLink, dark_s: float, says: int
) -> None:
    t0 = time.monotonic()
    alice.node.on_state(lambda state: print(f"  {time.monotonic() - t0:6.2f} s  alice {state}"))
    link.dark = True
    asyncio.get_running_loop().call_later(dark_s, lambda: setattr(link, "dark", False))
    print(f"dark for {dark_s:g} s; alice says {says} times")
    for n in range(says):
        # the says are spread over the dark: here time is the workload, not a wait
        await asyncio.sleep(max(0.0, n * dark_s / says - (time.monotonic() - t0)))
        start = time.monotonic() - t0
        try:
            said = await alice.rooms.say(room, "remark_made", f"dark {n}")
            outcome = f"delivered {said.delivered}, outbox.queued {said.queued}"
        except MaculaError as exc:
            outcome = f"FAILED {type(exc).__name__}: {exc}"
        print(f"  {start:6.2f} s  say {n}: {outcome} (took {time.monotonic() - t0 - start:.2f} s)")
    want = [f"dark {n}" for n in range(says)]
    me = alice.node.identity.node_id.hex()
    texts: list[str] = []
    while time.monotonic() - t0 < dark_s + 60:
        texts = [
            m.text or ""
            for m in await bob.rooms.transcript.messages(room)
            if m.from_hex == me and m.kind == "remark_made"
        ]
        if texts == want:
            break
        await asyncio.sleep(0.01)  # polling bob's transcript for the figure
    got = time.monotonic() - t0
    print(f"  bob's transcript: {texts} ({'all, once each, in order' if texts == want else 'NOT'})")
    print(f"  bob had them {got - dark_s:.2f} s after the link came back ({got:.2f} s)")
    print(f"  alice's outbox: {dict(alice.rooms.outbox.stats) if alice.rooms.outbox else {}}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dark", type=float, default=8.0, help="seconds the link is dark")
    parser.add_argument("--says", type=int, default=5, help="says during the dark")
    args = parser.parse_args()
    asyncio.run(run(args.dark, args.says))


if __name__ == "__main__":
    main()
