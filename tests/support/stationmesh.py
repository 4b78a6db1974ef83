"""Several station routers (``RouterCore``) linked in memory, with client cores on each.

Real frame bytes, no sockets, a stepped clock: bytes move only when a test acts, time only
when it steps the clock. A link between stations X and Y is two connections, ``cx`` at X
(where Y's CONNECT arrives) and ``cy`` at Y (where X's CONNECT arrives), each CONNECT with the
station capability bit and signed by its station; the HELLOs they answer are discarded, and
after that X's ``Send(cx, s, ...)`` is fed to ``Y.frames_received(cy, s, ...)`` and back. The
side that receives the CONNECT opens odd streams on the link, the other even ones (as QUIC's
server- and client-initiated streams), so both may open dedicated streams on one link.

Built-ins run in-line: ``_relay.ping`` answers at once; any other goes to the station's
``builtin`` callable (a test sets it), else the test fails. ``StationReplied`` actions are
collected in ``MeshStation.replied``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from macula.client.core import ClientCore, CoreState
from macula.client.events import CallSettled, Established, Output, Transmit
from macula.client.intent import EventDedup, Intent
from macula.wire.frames import CAP_STATION, Connect, new_frame_id
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity
from relay.builtins.outcome import Outcome
from relay.core.actions import (
    Action,
    Close,
    EndStream,
    PauseReading,
    ResumeReading,
    RunBuiltin,
    Send,
    StationReplied,
)
from relay.core.interest import PublishHook
from relay.core.policy import StationPolicy
from relay.core.router import RouterCore

NOW = 1_767_225_600_000
_Carried = Send | EndStream | Close | PauseReading | ResumeReading  # what names a connection
ZERO_REALM = bytes(32)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def step(self, ms: int) -> None:
        self.now += ms


@dataclass
class Client:
    """A client core on one station: its connection there and the outputs it produced."""

    core: ClientCore
    conn: int
    outputs: list[Output] = field(default_factory=list)
    next_stream: int = 4

    def new_stream(self) -> int:
        stream, self.next_stream = self.next_stream, self.next_stream + 4
        return stream

    def of(self, kind: type[Any]) -> list[Any]:
        return [o for o in self.outputs if isinstance(o, kind)]

    def take(self, kind: type[Any]) -> list[Any]:
        """The outputs of ``kind`` so far, forgetting them."""
        taken = self.of(kind)
        self.outputs = [o for o in self.outputs if not isinstance(o, kind)]
        return taken


@dataclass
class LinkEnd:
    """One side of a station link: the far station and its connection number there."""

    other: MeshStation
    other_conn: int


class MeshStation:
    def __init__(
        self,
        mesh: Mesh,
        identity: Identity,
        policy: StationPolicy,
        seed: int,
        published: PublishHook | None = None,
    ) -> None:
        self.mesh = mesh
        self.identity = identity
        self.router = RouterCore(
            identity,
            policy,
            open_stream=self._open_stream,
            random_bytes=random.Random(seed).randbytes,
            published=published,
        )
        self.clients: dict[int, Client] = {}
        self.links: dict[int, LinkEnd] = {}
        self.replied: list[StationReplied] = []
        self.builtins_run: list[RunBuiltin] = []
        self.builtin: Callable[[RunBuiltin], Outcome] | None = None
        self._next_stream: dict[int, int] = {}  # conn -> next stream the router opens on it
        self._conns = iter(range(1, 10_000))

    @property
    def node_id(self) -> bytes:
        return self.identity.node_id

    def new_conn(self, first_stream: int = 1) -> int:
        conn = next(self._conns)
        self._next_stream[conn] = first_stream
        return conn

    def _open_stream(self, conn: int) -> int:
        stream = self._next_stream[conn]
        self._next_stream[conn] = stream + 4
        return stream

    def link_to(self, other: MeshStation) -> int:
        """Our connection number for the link to ``other`` (KeyError if none)."""
        return next(c for c, end in self.links.items() if end.other is other)


class Mesh:
    def __init__(self, clock: Clock | None = None, **policy: Any) -> None:
        self.clock = clock or Clock()
        self.policy = StationPolicy(**policy)
        self.stations: list[MeshStation] = []
        self._decoders: dict[tuple[int, int, int], FrameDecoder] = {}  # (id(station), conn, s)
        self._frame_salt = iter(range(1, 1 << 30))

    # --- building the mesh ----------------------------------------------------------------

    def station(self, identity: Identity, published: PublishHook | None = None) -> MeshStation:
        seed = len(self.stations) + 7
        station = MeshStation(self, identity, self.policy, seed=seed, published=published)
        self.stations.append(station)
        return station

    def client(self, station: MeshStation, identity: Identity, *, pinned: bool = True) -> Client:
        """A client of ``station``, its handshake done; ``pinned`` (as our clients are when
        they know the station's key) binds its connection there (issue 27)."""
        conn = station.new_conn()
        core = ClientCore(
            identity,
            random.Random(conn * 1000 + len(self.stations)).randbytes,
            intent=Intent(),
            dedup=EventDedup(),
            pinned=station.node_id if pinned else None,
        )
        client = station.clients[conn] = Client(core, conn)
        station.router.connection_made(conn, self.clock.now)
        self.client_did(station, client, core.connect(self.clock.now))
        assert client.take(Established) == [Established(station.node_id)]
        assert core.state is CoreState.ESTABLISHED
        return client

    def link(self, x: MeshStation, y: MeshStation) -> tuple[int, int]:
        """Link ``x`` and ``y`` (``y`` dialled ``x``): (cx, cy), both handshaken."""
        cx, cy = x.new_conn(first_stream=1), y.new_conn(first_stream=4)
        x.links[cx] = LinkEnd(y, cy)
        y.links[cy] = LinkEnd(x, cx)
        now = self.clock.now
        x.router.connection_made(cx, now)
        y.router.connection_made(cy, now)
        # both CONNECTs are in before either side's first frames (its adverts) travel
        held_x = x.router.frames_received(cx, 0, [self.connect_map(y.identity)], now)
        held_y = y.router.frames_received(cy, 0, [self.connect_map(x.identity)], now)
        assert x.router.peers[cx].is_station and y.router.peers[cy].is_station
        self.do(x, held_x)
        self.do(y, held_y)
        return cx, cy

    def connect_map(self, identity: Identity, capabilities: int = CAP_STATION) -> dict[str, Any]:
        frame = Connect(
            frame_id=new_frame_id(self.clock.now, next(self._frame_salt).to_bytes(10, "big")),
            sent_at_ms=self.clock.now,
            capabilities=capabilities,
            node_id=identity.node_id,
            station_id=identity.node_id,
            puzzle_evidence=identity.puzzle_evidence,
        )
        return frame.signed_by(identity).to_map()

    def unlink(self, x: MeshStation, y: MeshStation) -> None:
        """The link between ``x`` and ``y`` is lost, on both sides."""
        cx = x.link_to(y)
        cy = x.links[cx].other_conn
        del x.links[cx], y.links[cy]
        self.do(x, x.router.connection_lost(cx, self.clock.now))
        self.do(y, y.router.connection_lost(cy, self.clock.now))

    # --- moving bytes -----------------------------------------------------------------------

    def _decode(self, station: MeshStation, conn: int, stream: int, data: bytes) -> list[Any]:
        key = (id(station), conn, stream)
        return self._decoders.setdefault(key, FrameDecoder()).feed(data)

    def client_did(self, station: MeshStation, client: Client, outputs: list[Output]) -> None:
        """A client core's outputs: bytes go to its station's router, the rest is kept."""
        for output in outputs:
            if isinstance(output, Transmit):
                frames = self._decode(station, client.conn, output.stream, output.data)
                if client.conn in station.router.peers:
                    actions = station.router.frames_received(
                        client.conn, output.stream, frames, self.clock.now
                    )
                    self.do(station, actions)
            else:
                client.outputs.append(output)

    def do(self, station: MeshStation, actions: list[Action]) -> None:
        """Carry out a router's actions: to its clients, over its links, built-ins in-line."""
        for action in actions:
            if isinstance(action, StationReplied):
                station.replied.append(action)
            elif isinstance(action, RunBuiltin):
                self._builtin(station, action)
            elif action.conn in station.links:
                self._over_link(station, action)
            elif action.conn in station.clients:
                self._to_client(station, station.clients[action.conn], action)

    def _over_link(self, station: MeshStation, action: _Carried) -> None:
        end = station.links[action.conn]
        other, now = end.other, self.clock.now
        if isinstance(action, Send):
            frames = self._decode(other, end.other_conn, action.stream, action.data)
            frames = [f for f in frames if f.get("frame_type") != "hello"]
            if frames:
                self.do(
                    other, other.router.frames_received(end.other_conn, action.stream, frames, now)
                )
        elif isinstance(action, EndStream):
            self.do(other, other.router.stream_ended(end.other_conn, action.stream, now))
        elif isinstance(action, Close):
            self.unlink(station, other)

    def _to_client(self, station: MeshStation, client: Client, action: _Carried) -> None:
        now = self.clock.now
        if isinstance(action, Send):
            frames = self._decode(station, -client.conn, action.stream, action.data)
            self.client_did(
                station, client, client.core.frames_received(action.stream, frames, now)
            )
        elif isinstance(action, EndStream):
            self.client_did(station, client, client.core.stream_ended(action.stream))
        elif isinstance(action, Close):
            self.lose(station, client, action.reason)

    def _builtin(self, station: MeshStation, action: RunBuiltin) -> None:
        station.builtins_run.append(action)
        if action.call.procedure == "_relay.ping":
            outcome = Outcome.result({"ts": self.clock.now * 1000})
        else:
            assert station.builtin is not None, f"no built-in for {action.call.procedure}"
            outcome = station.builtin(action)
        done = station.router.builtin_done(
            action.conn, action.stream, action.call, outcome, self.clock.now
        )
        self.do(station, done)

    def lose(self, station: MeshStation, client: Client, reason: str) -> None:
        """A client's connection is gone, for both sides."""
        station.clients.pop(client.conn, None)
        self.do(station, station.router.connection_lost(client.conn, self.clock.now))
        self.client_did(station, client, client.core.connection_lost(reason))

    # --- time and waiting -------------------------------------------------------------------

    def tick(self) -> None:
        for station in self.stations:
            self.do(station, station.router.tick(self.clock.now))
            for client in list(station.clients.values()):
                self.client_did(station, client, client.core.tick(self.clock.now))

    def flush(self, station: MeshStation, client: Client) -> None:
        """``Node.flush``: a ``_relay.ping``; its RESULT comes after everything sent before."""
        call_id, out = client.core.call(
            ZERO_REALM, "_relay.ping", None, self.clock.now + 10_000, self.clock.now
        )
        self.client_did(station, client, out)
        settled = [s for s in client.take(CallSettled) if s.call_id == call_id]
        assert len(settled) == 1 and settled[0].error is None
