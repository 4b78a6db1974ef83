"""The agent's local stores (DESIGN.md §2 ``store/``): roster, transcript and rings in SQLite.

Invariants:
- Each store is one SQLite file (WAL, 0600, in a 0700 directory when we create it), opened with
  ``await XStore.open(path)`` and closed with ``await x.close()`` or ``async with``.
- Two processes may share a file without losing or corrupting rows (see ``base``).
- Results are small frozen dataclasses; flags are the ints 0/1; time is always an argument.
- Nothing here imports ``relay`` or ``tools``.
"""

from macula.store.base import (
    HOME_ENV,
    RINGS_DB_ENV,
    ROSTER_DB_ENV,
    TRANSCRIPT_DB_ENV,
    Bounds,
    StoreError,
    StorePaths,
    paths_from_env,
)
from macula.store.rings import (
    ANSWER_ACCEPTED,
    ANSWER_DECLINED,
    ANSWER_DEFERRED,
    MAX_PENDING_PER_CALLER,
    RING_TTL_MS,
    AddOutcome,
    Ring,
    RingDirection,
    RingState,
    RingStore,
)
from macula.store.roster import MAX_AGE_MS, HelloFields, RosterEntry, RosterStore
from macula.store.transcript import (
    PublicRoom,
    RoomActivity,
    RoomMembership,
    RoomRole,
    TranscriptMessage,
    TranscriptStore,
)

__all__ = [
    "ANSWER_ACCEPTED",
    "ANSWER_DECLINED",
    "ANSWER_DEFERRED",
    "HOME_ENV",
    "MAX_AGE_MS",
    "MAX_PENDING_PER_CALLER",
    "RINGS_DB_ENV",
    "RING_TTL_MS",
    "ROSTER_DB_ENV",
    "TRANSCRIPT_DB_ENV",
    "AddOutcome",
    "Bounds",
    "HelloFields",
    "PublicRoom",
    "Ring",
    "RingDirection",
    "RingState",
    "RingStore",
    "RoomActivity",
    "RoomMembership",
    "RoomRole",
    "RosterEntry",
    "RosterStore",
    "StoreError",
    "StorePaths",
    "TranscriptMessage",
    "TranscriptStore",
    "paths_from_env",
]
