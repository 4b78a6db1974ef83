"""How many connections the station holds, in all and per source address (issue 11): pure.

Invariants: ``by_address`` counts exactly the admitted connections not yet released, per
address ("" — unknown — is never counted nor capped); a refusal is counted (``refused``, summed
up in the log at most once per interval) and changes nothing else.
"""

from __future__ import annotations

from collections import Counter

from relay.core.logbook import Refusals


class ConnectionCaps:
    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.by_address: Counter[str] = Counter()
        self.refused = Refusals(None, "connection")

    def refusal(self, open_now: int, address: str) -> tuple[str, str] | None:
        """(counter, reason) if one more connection from ``address`` is over a cap."""
        if open_now >= self.max_connections:
            why = ("connections_over_cap", "station is full")
        elif address and self.by_address[address] >= self.max_per_address:
            why = ("connections_over_address_cap", "too many connections from this address")
        else:
            if address:
                self.by_address[address] += 1
            return None
        self.refused.count(*why)
        return why

    def release(self, address: str) -> None:
        if address and address in self.by_address:
            self.by_address[address] -= 1
            if self.by_address[address] <= 0:
                del self.by_address[address]
