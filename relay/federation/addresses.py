"""Where a station of the mesh listens, as its own signed records say (FEDERATION.md).

Pure data: built from a verified station_endpoint record (0x12) by ``endpoint_address``
(``relay.federation.dht.station``'s discovery, ``relay.federation.mesh_roster``'s lists).
"""

from __future__ import annotations

from dataclasses import dataclass

from macula.wire.records import Record, RecordType


@dataclass(frozen=True, slots=True)
class StationAddress:
    """A live station: its node id, a host it advertised, its QUIC port and DHT UDP port.

    ``dht_port`` is 0 when the station's record does not name one (it runs no DHT).
    """

    node_id: bytes
    host: str
    quic_port: int
    dht_port: int


def endpoint_address(record: Record) -> StationAddress | None:
    """The address a station_endpoint record names (its first advertised host), or None
    when it names none usable (the record's signature is the caller's to have checked)."""
    if record.type != RecordType.STATION_ENDPOINT:
        return None
    payload = record.payload
    hosts, quic, dht = (
        payload.get("host_advertised"),
        payload.get("quic_port"),
        payload.get("dht_port", 0),
    )
    if not isinstance(hosts, list) or not hosts or type(hosts[0]) is not bytes:
        return None
    if type(dht) is not int or not 0 <= dht <= 0xFFFF:
        return None
    if type(quic) is not int or not 0 < quic <= 0xFFFF:
        return None
    try:
        host = hosts[0].decode()
    except UnicodeDecodeError:
        return None
    return StationAddress(record.key, host, quic, dht) if host else None
