"""Who may connect at all (issue 13): ``--admission open|allowlist|members``.

``ConnectRule`` is pure: a verified CONNECT and the number of realms its ``endorsements``
made it a member of in, a refusal (a §9 code and a reason) or None out. ``parse_allowlist``
reads the text of the ``--allowlist`` file (node ids, 64 hex each, one a line; ``#`` comments
and blank lines ignored); ``relay.station.realm_files.Allowlist`` reads the file itself and re-reads
it when its mtime or size changes (``reload``, called on the tick).

Invariants: ``open`` admits everyone; ``allowlist`` admits the node ids in the file;
``members`` admits a client whose CONNECT carries at least one valid, unrevoked endorsement
of a realm this station protects (the CONNECT ``endorsements`` array, PROTOCOL.md §3.3).
A station peer (capability bit 0) is admitted by its own rule in every mode but ``open``: its
node id is a configured ``--peer`` or in the allowlist file. Refusals: 0x10 ``unauthorized``
(not on the allowlist, not a known station), 0x05 ``target_realm_refused`` (no membership).
A file that cannot be read or has a bad line keeps the list as it was (logged, counted);
at start it is an error (``AllowlistError``; both in ``relay.station.realm_files``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from macula.wire.codes import ErrorCode
from macula.wire.frames import CAP_STATION, Connect


class AdmissionMode(StrEnum):
    OPEN = "open"
    ALLOWLIST = "allowlist"
    MEMBERS = "members"


class AllowlistError(ValueError):
    pass


def parse_allowlist(text: str) -> frozenset[bytes]:
    """The node ids of an allowlist file's text; ``AllowlistError`` naming the bad line."""
    ids: set[bytes] = set()
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            node_id = bytes.fromhex(entry)
        except ValueError:
            node_id = b""
        if len(node_id) != 32:
            raise AllowlistError(f"line {number}: expected a node id (64 hex digits)")
        ids.add(node_id)
    return frozenset(ids)


class NodeIdList(Protocol):
    """What ``ConnectRule`` reads of an allowlist (``relay.station.realm_files.Allowlist``)."""

    @property
    def ids(self) -> frozenset[bytes]: ...


@dataclass(slots=True)
class ConnectRule:
    mode: AdmissionMode = AdmissionMode.OPEN
    allowlist: NodeIdList | None = None  # relay.station.realm_files.Allowlist: it reads the file
    stations: frozenset[bytes] = field(default_factory=frozenset)  # configured --peer ids

    def refusal(self, connect: Connect, memberships: int) -> tuple[int, str] | None:
        """Why this CONNECT (already verified) is refused, or None."""
        if self.mode is AdmissionMode.OPEN:
            return None
        allowed = self.allowlist.ids if self.allowlist is not None else frozenset()
        node_id = connect.node_id
        if connect.capabilities & CAP_STATION:  # a station peer: its own rule
            if node_id in self.stations or node_id in allowed:
                return None
            return ErrorCode.UNAUTHORIZED, "station not among this station's peers"
        if self.mode is AdmissionMode.ALLOWLIST:
            if node_id in allowed:
                return None
            return ErrorCode.UNAUTHORIZED, "node id not on this station's allowlist"
        if memberships > 0:
            return None
        return ErrorCode.TARGET_REALM_REFUSED, "no valid endorsement of a realm protected here"
