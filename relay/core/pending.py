"""CALLs the station forwarded to an advertiser and still waits on (PROTOCOL.md §6.2).

Pure state, no I/O: the router decides what to answer when a call fails or expires.
Invariants: one entry per ``call_id``; the per-caller count always equals the number of
entries whose ``caller_conn`` is that connection; queries listing several entries return them
in the order they were added.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

ORIGIN = -1  # ``caller_conn`` of a CALL the station made itself (``RouterCore.call_station``)


@dataclass(slots=True)
class Pending:
    """A CALL forwarded to an advertiser, waiting for its reply (§6.2)."""

    call_id: bytes
    caller_conn: int
    caller_stream: int
    provider_conn: int
    provider_node: bytes
    answer_by_ms: int
    slot_only: bool = False  # answer_by is the 60 s forwarding slot, not the caller's deadline
    # forwarded over a station link: the reply is signed by whoever answered behind that
    # station (its client, or the station itself), not by ``provider_node``
    via_link: bool = False


class PendingCalls:
    def __init__(self) -> None:
        self._calls: dict[bytes, Pending] = {}
        self._per_caller: Counter[int] = Counter()

    def add(self, pending: Pending) -> None:
        assert pending.call_id not in self._calls, "call_id already pending"
        self._calls[pending.call_id] = pending
        self._per_caller[pending.caller_conn] += 1

    def get(self, call_id: bytes) -> Pending | None:
        return self._calls.get(call_id)

    def pop(self, call_id: bytes) -> Pending | None:
        pending = self._calls.pop(call_id, None)
        if pending is not None:
            self._per_caller[pending.caller_conn] -= 1
            if self._per_caller[pending.caller_conn] <= 0:
                del self._per_caller[pending.caller_conn]
        return pending

    def in_flight_for(self, caller_conn: int) -> int:
        """How many forwarded calls ``caller_conn`` is waiting on."""
        return self._per_caller[caller_conn]

    def due(self, now_ms: int) -> list[Pending]:
        """Entries whose ``answer_by_ms`` has come at ``now_ms``."""
        return [p for p in self._calls.values() if now_ms >= p.answer_by_ms]

    def involving(self, conn: int) -> list[Pending]:
        """Entries whose caller or provider is ``conn``."""
        return [p for p in self._calls.values() if conn in (p.caller_conn, p.provider_conn)]

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._calls

    def __len__(self) -> int:
        return len(self._calls)
