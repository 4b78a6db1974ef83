"""What ``RouterCore`` asks its I/O shell to do: the only output of the sans-I/O router.

Invariants: actions are immutable values naming a connection (the shell's number) and, where
it matters, a stream; ``Send.data`` is always one or more complete, length-prefixed frames.
``PauseReading`` is always followed, for the same connection, by a ``resume`` call of the core
at ``until_ms`` (the shell's timer); the core answers ``ResumeReading`` once it caught up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macula.wire.frames import Call


@dataclass(frozen=True, slots=True)
class Send:
    conn: int
    stream: int
    data: bytes  # one or more complete, length-prefixed frames


@dataclass(frozen=True, slots=True)
class EndStream:
    conn: int
    stream: int


@dataclass(frozen=True, slots=True)
class Close:
    conn: int
    reason: str
    after_ms: int = 0


@dataclass(frozen=True, slots=True)
class RunBuiltin:
    conn: int
    stream: int
    call: Call
    # ``_relay.ping`` only: this connection's refusal counters when the ping was read
    refused: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class PauseReading:
    """Stop handing this stream's frames to the core (QUIC flow control then pushes back on
    the sender); call ``RouterCore.resume(conn, now_ms)`` at ``until_ms``."""

    conn: int
    stream: int
    until_ms: int


@dataclass(frozen=True, slots=True)
class ResumeReading:
    conn: int
    stream: int


@dataclass(frozen=True, slots=True)
class StationReplied:
    """A CALL this station made (``RouterCore.call_station``) settled: ``ok`` with the RESULT
    payload, else ``payload`` is the ERROR detail text (or None) and ``code`` its §9 code (an
    unknown link, the link's loss and the deadline passing settle it so too)."""

    call_id: bytes
    ok: bool
    payload: Any
    code: int | None = None


@dataclass(frozen=True, slots=True)
class LinkUp:
    """A link with station ``node_id`` came up on ``conn`` (either side dialled it): ``host``
    is the dialled host or the peer's source address, ``dht_port`` its DHT port (0: unknown)."""

    conn: int
    node_id: bytes
    host: str
    dht_port: int


@dataclass(frozen=True, slots=True)
class LinkDown:
    """The link with station ``node_id`` on ``conn`` is gone (closed, lost or replaced)."""

    conn: int
    node_id: bytes


Action = (
    Send
    | EndStream
    | Close
    | RunBuiltin
    | PauseReading
    | ResumeReading
    | StationReplied
    | LinkUp
    | LinkDown
)
