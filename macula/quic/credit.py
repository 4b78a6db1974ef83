"""QUIC receive credit that follows what the application consumed (flow control that pushes back).

aioquic grants a stream more credit (MAX_STREAM_DATA) as soon as bytes *arrive*, doubling its
window each time half of it is used: a receiver that stops reading a stream never slows the
sender, and the window grows with the stream's history. ``ReceiveCredit`` replaces that rule on
one ``QuicConnection``: a stream's limit is ``consumed + window`` (bytes handed to the
application plus a fixed window), raised in steps of at least half a window. Invariants:
- a stream whose reading is paused gets no new credit, so its sender is blocked after at most
  ``window`` bytes beyond what was consumed; that is also the bound on what the receiver holds;
- a limit is never lowered (QUIC forbids it), and a lost MAX_STREAM_DATA is re-sent (aioquic's
  delivery handler resets ``max_stream_data_local_sent``);
- streams the application never consumed from keep aioquic's own rule.
This reaches into aioquic's packet builder (``_write_stream_limits``, a private method, checked
against aioquic 1.7): when it is missing the connection keeps aioquic's behaviour, and
``installed`` says so.
"""

from __future__ import annotations

from typing import Any

from macula.quic.backend import (
    MAX_STREAM_DATA_FRAME_CAPACITY,
    QuicConnection,
    QuicFrameType,
    QuicStream,
)


class ReceiveCredit:
    def __init__(self, quic: QuicConnection, window: int) -> None:
        self.window = window
        self.consumed: dict[int, int] = {}  # stream id -> bytes handed to the application
        self._quic = quic
        self._aioquic_rule = getattr(quic, "_write_stream_limits", None)
        self._on_delivery = getattr(quic, "_on_max_stream_data_delivery", None)
        self.installed = self._aioquic_rule is not None and self._on_delivery is not None
        if self.installed:
            vars(quic)["_write_stream_limits"] = self._write_stream_limits

    def consume(self, stream_id: int, size: int) -> None:
        self.consumed[stream_id] = self.consumed.get(stream_id, 0) + size

    def forget(self, stream_id: int) -> None:
        self.consumed.pop(stream_id, None)

    def _write_stream_limits(self, builder: Any, space: Any, stream: QuicStream) -> None:
        consumed = None if stream.stream_id is None else self.consumed.get(stream.stream_id)
        if consumed is None or not stream.max_stream_data_local:
            assert self._aioquic_rule is not None
            self._aioquic_rule(builder=builder, space=space, stream=stream)
            return
        wanted = consumed + self.window
        if wanted - stream.max_stream_data_local >= self.window // 2:
            stream.max_stream_data_local = wanted
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream.stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local
