"""What the client core answers with (``macula.client.core``): bytes to send and small facts.

The session (``macula.node.session``) turns each into a QUIC write, a future's outcome, a queue item
or a call on its owner; the pair tests read them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macula.errors import MaculaError
from macula.wire.frames import Call, Event, StreamOpen


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send ``data`` (one complete, length-prefixed frame) on ``stream``."""

    stream: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Established:
    """The station accepted us (HELLO ``true``); the intent has been replayed before this."""

    station_key: bytes


@dataclass(frozen=True, slots=True)
class HandshakeFailed:
    error: MaculaError


@dataclass(frozen=True, slots=True)
class Ended:
    """The connection is over: GOODBYE, framing error, loss, or our own close."""

    reason: str
    terminal: bool  # this identity connected elsewhere: reconnecting would fight it
    closed: bool = False  # we closed it (not broken)


@dataclass(frozen=True, slots=True)
class EventArrived:
    event: Event
    authenticated: bool  # publisher_sig present and valid (§4.4)


@dataclass(frozen=True, slots=True)
class CallArrived:
    stream: int
    call: Call


@dataclass(frozen=True, slots=True)
class CallSettled:
    call_id: bytes
    payload: Any = None
    error: MaculaError | None = None


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    """A caller opened a streaming-RPC session to us on ``stream`` (§8)."""

    stream: int
    opening: StreamOpen


@dataclass(frozen=True, slots=True)
class ChannelData:
    stream: int
    body: Any


@dataclass(frozen=True, slots=True)
class ChannelFinished:
    """No more data will arrive on this channel (END, REPLY, ERROR or loss): see its state."""

    stream: int


Output = (
    Transmit
    | Established
    | HandshakeFailed
    | Ended
    | EventArrived
    | CallArrived
    | CallSettled
    | ChannelOpened
    | ChannelData
    | ChannelFinished
)
