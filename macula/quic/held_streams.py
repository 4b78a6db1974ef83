"""The bytes of streams whose reading is paused: held in arrival order, counted, bounded.

``FrameProtocol.pause_reading`` stops handing a stream's frames to its sink; what the peer sends
meanwhile waits here until ``resume_reading`` releases it a chunk per loop turn. Invariants:
- bytes come out in the order they went in, and a stream's end (FIN) comes out with its last
  bytes, never before;
- ``size`` is what a stream holds now (paused or still releasing), kept as a running count;
- the QUIC library bounds what a paused stream can hold: on aioquic, ``macula.quic.credit``
  grants no credit while it is paused, so at most one window arrives; qh3's native core has no
  hook for that and grants credit as bytes arrive, so the holder itself enforces the same bound:
  ``hold`` says when a stream holds more than ``window`` bytes and the caller fails the stream
  (the station closes that connection, saying why). An honest sender is blocked by credit on
  aioquic and never gets there; one that sends a window beyond what was read is cut off on qh3
  instead of growing the station's memory.
"""

from __future__ import annotations

from collections import deque


class HeldStreams:
    __slots__ = ("_ended", "_held", "_sizes", "paused")

    def __init__(self) -> None:
        self.paused: set[int] = set()
        self._held: dict[int, deque[bytes]] = {}
        self._sizes: dict[int, int] = {}
        self._ended: set[int] = set()  # streams whose end arrived while held

    def holds(self, stream_id: int) -> bool:
        """True while ``stream_id`` is paused or still has held bytes to release."""
        return stream_id in self.paused or stream_id in self._held

    def hold(self, stream_id: int, data: bytes, end_stream: bool) -> int:
        """Keep ``data`` (and the stream's end, if it came); the bytes the stream holds now."""
        self._held.setdefault(stream_id, deque()).append(data)
        size = self._sizes[stream_id] = self._sizes.get(stream_id, 0) + len(data)
        if end_stream:
            self._ended.add(stream_id)
        return size

    def size(self, stream_id: int) -> int:
        return self._sizes.get(stream_id, 0)

    def take(self, stream_id: int, chunk: int) -> tuple[bytes, bool] | None:
        """At least one held piece, up to about ``chunk`` bytes, and whether the stream's end
        comes with it; None when nothing is held."""
        held = self._held.get(stream_id)
        if held is None:
            return None
        pieces: list[bytes] = []
        size = 0
        while held and size < chunk:
            pieces.append(held.popleft())
            size += len(pieces[-1])
        self._sizes[stream_id] -= size
        end = False
        if not held:
            end = stream_id in self._ended
            self._drop(stream_id)
        return b"".join(pieces), end

    def has_bytes(self, stream_id: int) -> bool:
        return stream_id in self._held

    def forget(self, stream_id: int) -> None:
        """Drop what ``stream_id`` holds and unpause it (reset, failed, or lost)."""
        self._drop(stream_id)
        self.paused.discard(stream_id)

    def _drop(self, stream_id: int) -> None:
        self._held.pop(stream_id, None)
        self._sizes.pop(stream_id, None)
        self._ended.discard(stream_id)
