"""The event store of one Streamable HTTP session: what lets a client resume a dropped stream
(``Last-Event-ID``), bounded in memory.

Invariants:
- one store per session: an event id from one session never replays another's events;
- at most ``limit`` events are kept (the oldest go first); a ``Last-Event-ID`` older than
  what is kept, or unknown, replays nothing (``None``) and the client reopens a fresh stream;
- event ids are this store's counter as text; replay sends, in order, the events of the same
  stream after the given one (priming events, whose message is ``None``, are not sent).
"""

from __future__ import annotations

from collections import deque
from typing import Final

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

DEFAULT_LIMIT: Final = 1000


class BoundedEventStore(EventStore):
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("an event store keeps at least one event")
        self.limit = limit
        self.counter = 0
        self.events: deque[tuple[int, StreamId, JSONRPCMessage | None]] = deque(maxlen=limit)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        self.counter += 1
        self.events.append((self.counter, stream_id, message))
        return str(self.counter)

    def stored(self, stream_id: StreamId) -> int:
        """How many messages (priming events aside) are kept for ``stream_id``."""
        return sum(1 for _, sid, msg in self.events if sid == stream_id and msg is not None)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        if not last_event_id.isdecimal():
            return None
        after = int(last_event_id)
        found = next(((n, sid) for n, sid, _ in self.events if n == after), None)
        if found is None:
            return None
        stream_id = found[1]
        for number, sid, message in list(self.events):
            if number > after and sid == stream_id and message is not None:
                await send_callback(EventMessage(message, str(number)))
        return stream_id
