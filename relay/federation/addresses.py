"""Where a station of the mesh listens, as its own signed records say (FEDERATION.md).

Pure data: built from a verified station_endpoint record (0x12) by ``relay.federation.dht``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StationAddress:
    """A live station: its node id, a host it advertised, its QUIC port and DHT UDP port.

    ``dht_port`` is 0 when the station's record does not name one (it runs no DHT).
    """

    node_id: bytes
    host: str
    quic_port: int
    dht_port: int
