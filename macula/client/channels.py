"""Streaming-RPC channels (PROTOCOL.md §8) as the client core sees them, sans-I/O.

A ``ChannelState`` is one streaming session on a dedicated stream, from either side; ``deliver``
applies a verified STREAM_* frame from the peer to it and says what the adapter is told.
Invariants: a channel is ``closed`` once it ended both ways, was replied to or failed, and a
closed channel yields exactly one ``ChannelFinished`` per finishing frame; ``lose`` (the
connection ended) fails an open channel ``unavailable`` once and a closed one not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macula.client.events import ChannelData, ChannelFinished, Output
from macula.wire.frames import Frame, StreamData, StreamEnd, StreamError, StreamReply


@dataclass(slots=True)
class ChannelState:
    """One streaming-RPC session (§8) on a dedicated stream, from either side."""

    stream: int
    stream_id: bytes
    seq: int = 0
    reply: Any = None
    replied: bool = False
    error: tuple[str, str] | None = None
    peer_finished: bool = False
    finished: bool = False  # we sent STREAM_END(send)
    closed: bool = False


def deliver(channel: ChannelState, frame: Frame, out: list[Output]) -> None:
    """A verified frame from the peer on ``channel``'s stream: data, its end, a reply, a
    failure (anything else on the stream is ignored)."""
    if isinstance(frame, StreamData):
        out.append(ChannelData(channel.stream, frame.body))
    elif isinstance(frame, StreamEnd):
        channel.peer_finished = True
        channel.closed = channel.closed or frame.role == "both" or channel.finished
        out.append(ChannelFinished(channel.stream))
    elif isinstance(frame, StreamReply):
        channel.reply, channel.replied, channel.closed = frame.payload, True, True
        out.append(ChannelFinished(channel.stream))
    elif isinstance(frame, StreamError):
        channel.error = (
            frame.code.decode("utf-8", "replace"),
            frame.message.decode("utf-8", "replace"),
        )
        channel.closed = True
        out.append(ChannelFinished(channel.stream))


def lose(channel: ChannelState, reason: str) -> list[Output]:
    """The connection ended under ``channel``: an open one fails ``unavailable``."""
    if channel.closed:
        return []
    channel.error = ("unavailable", reason)
    channel.closed = True
    return [ChannelFinished(channel.stream)]
