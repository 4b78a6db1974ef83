"""What ``RouterCore`` asks its I/O shell to do: the only output of the sans-I/O router.

Invariants: actions are immutable values naming a connection (the shell's number) and, where
it matters, a stream; ``Send.data`` is always one or more complete, length-prefixed frames.
"""

from __future__ import annotations

from dataclasses import dataclass

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


Action = Send | EndStream | Close | RunBuiltin
