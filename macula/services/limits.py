"""What the station's house services accept, written once: the station (``relay/house``)
refuses past these, and the MCP layer (``tools``) declares the same bounds on its tools.

Invariant: plain constants, no imports; a station may be configured to accept less for
``MAX_MEMORY_CONTENT_BYTES`` (``relay.house.memory.MemoryService``), never more for the rest.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_TOP_K",
    "MAX_DOCUMENT_ID_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_MEMORY_CONTENT_BYTES",
    "MAX_PLACE_CHARS",
    "MAX_QUERY_BYTES",
    "MAX_TOPICS",
    "MAX_TOPIC_CHARS",
    "MAX_TOP_K",
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
