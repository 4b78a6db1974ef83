"""Names of the house services a station serves (shared memory, station and agent
directories, room history, path reservations). Clients resolve the realm they live in from the
DHT (procedure_advertisement records the station signs), then call them like any procedure."""

from __future__ import annotations

from typing import Final

from macula.wire.identity import realm_tag

HOUSE_REALM_NAME: Final = "macula.house"
HOUSE_REALM: Final = realm_tag(HOUSE_REALM_NAME)

MEMORY_ADD: Final = "macula.memory.add_knowledge_v1"
MEMORY_QUERY: Final = "macula.memory.query_v1"
LIST_STATIONS: Final = "macula.stations.list_stations_v1"
AGENTS_REGISTER: Final = "macula.agents.register_v1"
AGENTS_REMOVE: Final = "macula.agents.remove_v1"
AGENTS_LIST: Final = "macula.agents.list_v1"
HISTORY_FETCH: Final = "macula.history.fetch_v1"
RESERVE_PATHS: Final = "macula.reservations.reserve_v1"
RELEASE_PATHS: Final = "macula.reservations.release_v1"
LIST_RESERVATIONS: Final = "macula.reservations.list_v1"

MEMORY_PROCEDURES: Final = frozenset({MEMORY_ADD, MEMORY_QUERY})
STATION_DIRECTORY_PROCEDURES: Final = frozenset({LIST_STATIONS})
AGENT_DIRECTORY_PROCEDURES: Final = frozenset({AGENTS_REGISTER, AGENTS_REMOVE, AGENTS_LIST})
HISTORY_PROCEDURES: Final = frozenset({HISTORY_FETCH})
RESERVATION_PROCEDURES: Final = frozenset({RESERVE_PATHS, RELEASE_PATHS, LIST_RESERVATIONS})
# Reserved: only the station itself may advertise these (ADVERTISE or procedure_advertisement
# record, in any realm), and clients trust only records the station it is connected to signed.
HOUSE_PROCEDURES: Final = (
    MEMORY_PROCEDURES
    | STATION_DIRECTORY_PROCEDURES
    | AGENT_DIRECTORY_PROCEDURES
    | HISTORY_PROCEDURES
    | RESERVATION_PROCEDURES
)
