"""A dial to a loopback port nothing listens on (a station process down) over a real UDP
socket: the Initial meets ICMP "port unreachable" and the dial fails at once with
``ConnectionRefusedError``, having sent that one datagram: no CONNECTION_CLOSE after it and no
retransmission timer left behind (``FrameProtocol.abandon``), so a node redialling a
restarting station every 0.25-0.5 s sends it at most 4 datagrams a second (issue 37).
Datagrams are counted where they leave (the connected socket's transport)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import macula.quic.transport as transport
from macula.quic.backend import QuicConnection
from macula.quic.transport import FrameProtocol, client_configuration, dial
from support.processkit import free_udp_port

pytestmark = pytest.mark.anyio


class Counted(FrameProtocol):
    """A ``FrameProtocol`` that remembers itself and counts the datagrams it sends."""

    made: ClassVar[list[Counted]] = []

    def __init__(self, quic: QuicConnection, **kwargs: Any) -> None:
        super().__init__(quic, **kwargs)
        self.sent = 0
        Counted.made.append(self)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        inner = self._transport
        assert inner is not None

        def counting(data: Any, addr: Any = None) -> None:
            self.sent += 1
            inner.sendto(data, addr)

        self._transport = type("CountingTransport", (), {"sendto": staticmethod(counting)})()


async def test_a_refused_dial_sends_one_datagram_and_leaves_no_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "FrameProtocol", Counted)
    Counted.made.clear()
    port = free_udp_port()  # free again once closed: nothing listens there
    for _ in range(3):
        with pytest.raises(ConnectionRefusedError, match="nothing listens there"):
            async with dial("127.0.0.1", port, client_configuration(server_name="x"), timeout=10):
                pass  # pragma: no cover - nothing answers
    assert [protocol.sent for protocol in Counted.made] == [1, 1, 1]  # the Initial, no close
    for protocol in Counted.made:
        assert protocol.refused.done()
        assert protocol._timer is None  # no retransmission will follow
        protocol.transmit()  # and nothing queued goes out later either
        assert protocol.sent == 1
