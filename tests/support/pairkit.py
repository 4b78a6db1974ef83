"""A station's router core and client cores paired over an in-memory link, no sockets: bytes
move only when a test pumps the link, time only when it steps the clock (``Clock``)."""

from __future__ import annotations

import random
from typing import Any

from macula.client.core import ClientCore, CoreState
from macula.client.events import CallSettled, Established, Output, Transmit
from macula.client.intent import EventDedup, Intent
from macula.wire.framing import FrameDecoder
from macula.wire.identity import Identity, realm_tag
from relay.builtins.outcome import Outcome
from relay.core.actions import Close, EndStream, RunBuiltin, Send
from relay.core.policy import StationPolicy
from relay.core.router import RouterCore

from .identities import hardened
from .stationmesh import Client as End
from .stationmesh import Clock

REALM = realm_tag("test.client-pair")
ZERO_REALM = bytes(32)
STATION = Identity(bytes(range(100, 132)))
OTHER_STATION = Identity(bytes(range(140, 172)))


ALICE, BOB, CAROL = hardened(11), hardened(12), hardened(13)


class Link:
    """RouterCore and any number of ClientCores; the built-in ``_relay.ping`` runs in-line."""

    def __init__(self, clock: Clock, station: Identity = STATION, **policy: Any) -> None:
        self.clock = clock
        self.station = station
        self.router = RouterCore(
            station,
            StationPolicy(**policy),
            open_stream=self._open_stream,
            random_bytes=random.Random(7).randbytes,
        )
        self.ends: dict[int, End] = {}
        self._server_streams: dict[int, int] = {}
        self._to_router: dict[tuple[int, int], FrameDecoder] = {}
        self._to_client: dict[tuple[int, int], FrameDecoder] = {}
        self._conns = iter(range(1, 1000))
        self.builtins_run: list[str] = []

    def _open_stream(self, conn: int) -> int:
        stream = self._server_streams.get(conn, 1)
        self._server_streams[conn] = stream + 4
        return stream

    def dial(
        self,
        identity: Identity,
        *,
        intent: Intent | None = None,
        dedup: EventDedup | None = None,
        pinned: bytes | None = None,
        tls_pinned: bool = False,
        unpinned: bool = False,
    ) -> End:
        """A new connection from ``identity``: CONNECT sent and the link pumped
        (``tls_pinned``: as a session whose TLS proved the pinned key; ``unpinned``: no key
        pinned at all, so the CONNECT binds nothing)."""
        conn = next(self._conns)
        core = ClientCore(
            identity,
            random.Random(conn).randbytes,
            intent=intent or Intent(),
            dedup=dedup or EventDedup(),
            pinned=None if unpinned else self.station.node_id if pinned is None else pinned,
            tls_pinned=tls_pinned,
        )
        end = self.ends[conn] = End(core, conn)
        self.router.connection_made(conn, self.clock.now)
        self.client_did(end, core.connect(self.clock.now))
        return end

    # moving bytes --------------------------------------------------------------------------

    def client_did(self, end: End, outputs: list[Output]) -> None:
        """Take a client core's outputs: bytes go to the router, the rest is recorded."""
        for output in outputs:
            if isinstance(output, Transmit):
                decoder = self._to_router.setdefault((end.conn, output.stream), FrameDecoder())
                frames = decoder.feed(output.data)
                if end.conn in self.router.peers:
                    actions = self.router.frames_received(
                        end.conn, output.stream, frames, self.clock.now
                    )
                    self.router_did(actions)
            else:
                end.outputs.append(output)

    def router_did(self, actions: list[Any]) -> None:
        for action in actions:
            end = self.ends.get(action.conn)
            if end is None:
                continue
            if isinstance(action, Send):
                decoder = self._to_client.setdefault((action.conn, action.stream), FrameDecoder())
                frames = decoder.feed(action.data)
                out = end.core.frames_received(action.stream, frames, self.clock.now)
                self.client_did(end, out)
            elif isinstance(action, EndStream):
                self.client_did(end, end.core.stream_ended(action.stream))
            elif isinstance(action, Close):
                self.lose(end, action.reason)
            elif isinstance(action, RunBuiltin):
                self.builtins_run.append(action.call.procedure)
                assert action.call.procedure == "_relay.ping", action.call.procedure
                outcome = Outcome.result({"ts": self.clock.now * 1000})
                done = self.router.builtin_done(
                    action.conn, action.stream, action.call, outcome, self.clock.now
                )
                self.router_did(done)

    def lose(self, end: End, reason: str) -> None:
        """The connection is gone, for both sides."""
        self.router_did(self.router.connection_lost(end.conn, self.clock.now))
        self.client_did(end, end.core.connection_lost(reason))
        self.ends.pop(end.conn, None)

    def tick(self) -> None:
        self.router_did(self.router.tick(self.clock.now))
        for end in list(self.ends.values()):
            self.client_did(end, end.core.tick(self.clock.now))

    def flush(self, end: End) -> Any:
        """``Node.flush``: a ``_relay.ping`` CALL; its RESULT comes after everything before."""
        call_id, out = end.core.call(
            ZERO_REALM, "_relay.ping", None, self.clock.now + 10_000, self.clock.now
        )
        self.client_did(end, out)
        settled = [s for s in end.take(CallSettled) if s.call_id == call_id]
        assert len(settled) == 1 and settled[0].error is None
        return settled[0].payload


def established(link: Link, identity: Identity, **kw: Any) -> End:
    end = link.dial(identity, **kw)
    assert end.take(Established) == [Established(link.station.node_id)]
    assert end.core.state is CoreState.ESTABLISHED
    return end
