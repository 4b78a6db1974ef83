"""What the station's house services accept, written once: the station (``relay/house``)
refuses past these, and the MCP layer (``tools``) declares the same bounds on its tools.

Invariant: plain constants, no imports; a station may be configured to accept less for
``MAX_MEMORY_CONTENT_BYTES`` (``relay.house.memory.MemoryService``), never more for the rest.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_AGENTS_LIST",
    "DEFAULT_HISTORY_PAGE",
    "DEFAULT_RESERVATIONS_PAGE",
    "DEFAULT_RESERVATION_TTL_S",
    "DEFAULT_TOP_K",
    "MAX_AGENTS_LIST",
    "MAX_AGENT_TEXT_CHARS",
    "MAX_DOCUMENT_ID_CHARS",
    "MAX_HISTORY_PAGE",
    "MAX_LABEL_CHARS",
    "MAX_MEMORY_CONTENT_BYTES",
    "MAX_PLACE_CHARS",
    "MAX_PROJECT_CHARS",
    "MAX_QUERY_BYTES",
    "MAX_RESERVATIONS_PAGE",
    "MAX_RESERVATIONS_PER_HOLDER",
    "MAX_RESERVATIONS_PER_PROJECT",
    "MAX_RESERVATION_GLOBSTARS",
    "MAX_RESERVATION_PATHS",
    "MAX_RESERVATION_PATH_CHARS",
    "MAX_RESERVATION_REASON_CHARS",
    "MAX_RESERVATION_TTL_S",
    "MAX_RESERVATION_WILDCARDS",
    "MAX_TOPICS",
    "MAX_TOPIC_CHARS",
    "MAX_TOP_K",
    "MIN_RESERVATION_TTL_S",
]

# shared memory (macula.memory.add_knowledge_v1 / query_v1)
MAX_MEMORY_CONTENT_BYTES: Final = 256 * 1024  # one deposit's content, UTF-8 bytes
MAX_LABEL_CHARS: Final = 200  # a deposit's source_label
MAX_DOCUMENT_ID_CHARS: Final = 256
MAX_TOPICS: Final = 32  # topics of one deposit
MAX_TOPIC_CHARS: Final = 64  # one topic
MAX_QUERY_BYTES: Final = 4096  # a query's text, UTF-8 bytes
DEFAULT_TOP_K: Final = 10  # hits a query returns unless it asks for another number
MAX_TOP_K: Final = 100

# the station directory (macula.stations.list_stations_v1): continent, country, city
MAX_PLACE_CHARS: Final = 100

# the agent directory (macula.agents.register_v1 / list_v1): an entry's free-text fields
# (operator_name, session_name, model, connected_via, each offer) are what an agent says of
# itself in agent.hello too (macula.agent.presence)
MAX_AGENT_TEXT_CHARS: Final = 280
DEFAULT_AGENTS_LIST: Final = 200  # entries a listing returns unless it asks for another number
MAX_AGENTS_LIST: Final = 500

# room history (macula.history.fetch_v1): events in one page
DEFAULT_HISTORY_PAGE: Final = 100
MAX_HISTORY_PAGE: Final = 500

# path reservations (macula.reservations.reserve_v1 / release_v1 / list_v1), per project
MAX_PROJECT_CHARS: Final = 256  # a project id (normalised origin URL or a name)
MAX_RESERVATION_PATH_CHARS: Final = 512  # one path or glob, relative to the project's root
MAX_RESERVATION_PATHS: Final = 32  # paths or globs in one reserve or release call
MAX_RESERVATION_WILDCARDS: Final = 8  # '*' and '?' in one glob ('**' counts once)
MAX_RESERVATION_GLOBSTARS: Final = 2  # '**' segments in one glob
MAX_RESERVATION_REASON_CHARS: Final = 280
MAX_RESERVATIONS_PER_HOLDER: Final = 128  # live reservations of one agent in one project
MAX_RESERVATIONS_PER_PROJECT: Final = 1024  # live reservations of everyone in one project
MIN_RESERVATION_TTL_S: Final = 1
DEFAULT_RESERVATION_TTL_S: Final = 3600
MAX_RESERVATION_TTL_S: Final = 7 * 24 * 3600
DEFAULT_RESERVATIONS_PAGE: Final = 100
MAX_RESERVATIONS_PAGE: Final = 500
