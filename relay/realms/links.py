"""Which links may carry a protected realm (issue 26): station endorsements, sans-I/O.

A protected realm's traffic crosses a link only to (and from) a station the realm's authority
endorsed for that realm: a 0x05 record of role ``station`` for the station's node id
(``macula.realm.records.check_station_endorsement``; ``macula-realm endorse-station``). A
station is given its own endorsements as files (``macula-relay --realm-endorsement FILE``,
the record's RPC form in CBOR, as ``macula-realm endorse-station --out`` writes it) and
presents them on every link: in the CONNECT ``endorsements`` of a link it dials, in the
``endorsements`` key of the HELLO it answers (``StationFrames.endorsements``). The peer checks
them itself (``RealmGate.present_station``); what a station says it protects grants nothing.

Invariants (the gate's ``allows`` is the one test, checked at each use, so a revocation acts
at once and ``sweep`` ends it at the latest one ``sweep_ms`` later):
- a link that comes up is told local interest and advertisements only in realms it may carry
  (``linked_realms``); a CALL in a protected realm is forwarded to a linked station only if
  that link may carry the realm (``provider_allowed``), else the caller gets "no route";
- when a link's endorsement ends, what it advertised in that realm is forgotten
  (``forget_link_adverts``);
- an EVENT of a protected realm arriving over a link must carry a ``publisher_sig``
  (``unsigned_in_protected_realm``): a station-attested event (no publisher signature) does not
  cross into a protected realm, whatever the general relay rules for unsigned events are.
- a link vouches for the members behind it: each station CALLs ``_realm.vouch``
  (``VOUCH_PROCEDURE``, payload ``{"endorsements": [...]}``, at most ``VOUCH_BATCH`` a CALL) on
  every link that may carry the realm, with its members' endorsements, when the link comes up
  and whenever a membership is accepted (before the member hears it is in, so the vouch is on
  the link before any frame the member sends). The receiving station checks each itself
  (``RealmGate.take_vouches``); a protected realm's EVENT from a link counts only if its
  publisher was vouched for on that link, a CALL only if its caller was
  (``unvouched``), a STREAM_OPEN likewise, and the RESULT of a protected realm's CALL this
  station forwarded to a link only if the node that answered (``responded_by``) is a member
  that link vouched for (``RealmCalls``; else it is dropped, counted, and the caller's deadline
  ends the call). So an endorsed station cannot pass off a key of its own as a member.
- a station's own endorsements are checked at start (``own_station_endorsements``): each must
  be a valid station endorsement, for this station's node id, of a realm it protects, signed
  by that realm's authority key; otherwise the station does not start (``ValueError``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from macula.realm.records import Endorsement
from macula.wire.frames import Call, Event, Result
from macula.wire.records import Record
from relay.core.actions import Action
from relay.core.peers import Peer
from relay.federation.gossip import AdvertGossip
from relay.realms.gate import (
    VOUCH_BATCH,
    EndorsementRefused,
    ProtectedRealm,
    RealmGate,
    check_endorsement,
)

VOUCH_PROCEDURE = "_realm.vouch"


class StationEndorsementError(ValueError):
    """This station's own station endorsement would be refused by its peers (it does not
    start)."""


VOUCH_DEADLINE_MS = 10_000


def linked_realms(gate: RealmGate, link: Peer, now_ms: int) -> Callable[[bytes], bool]:
    """Whether ``link`` may carry a realm (unprotected realms: always)."""
    return lambda realm: gate.allows(link.conn, True, realm, now_ms)


def provider_allowed(
    gossip: AdvertGossip, gate: RealmGate, caller: Peer, call: Call, now_ms: int
) -> bool:
    """May ``call`` go where it would be forwarded? False only for a protected realm's CALL
    whose provider is a linked station that may not carry the realm."""
    if not gate.protects(call.realm):
        return True
    provider = gossip.serving((call.realm, call.procedure), local_only=caller.is_station)
    if provider is None or not provider.is_station:
        return True
    return gate.allows(provider.conn, True, call.realm, now_ms)


def forget_link_adverts(gossip: AdvertGossip, conn: int, realm: bytes) -> int:
    """Forget what link ``conn`` advertised in ``realm``; how many."""
    keys = [key for key in gossip.remote.keys_of(conn) if key[0] == realm]
    return sum(gossip.remote.remove(key, conn) for key in keys)


def unvouched(gate: RealmGate, link: Peer, realm: bytes, member: bytes, now_ms: int) -> bool:
    """A frame link ``link`` relays in ``realm`` for ``member``: refused, as the link never
    vouched for that member there? (Unprotected realms: never.)"""
    return gate.protects(realm) and not gate.vouched_for(link.conn, realm, member, now_ms)


def vouch_actions(
    gate: RealmGate,
    links: Iterable[Peer],
    endorsements: Iterable[Endorsement],
    now_ms: int,
    call: Callable[[bytes, dict[str, Any]], list[Action]],
) -> list[Action]:
    """``_realm.vouch`` CALLs (made by ``call(station id, payload)``) telling each of
    ``links`` the ``endorsements`` of realms it may carry."""
    held = list(endorsements)
    out: list[Action] = []
    for link in links:
        carries = gate.endorsed_realms(link.conn, now_ms)
        mine = [e.record.to_rpc() for e in held if e.realm in carries]
        for start in range(0, len(mine), VOUCH_BATCH):
            out += call(link.node_id, {"endorsements": mine[start : start + VOUCH_BATCH]})
    return out


class RealmCalls:
    """The protected realms' CALLs forwarded to links and not answered yet: call_id ->
    (realm, link conn), at most ``limit`` (the oldest forgotten first; its answer then goes
    unchecked, as before this existed; ``forgotten`` counts how often)."""

    def __init__(self, limit: int = 16_384) -> None:
        self.limit = limit
        self.forgotten = 0
        self._calls: dict[bytes, tuple[bytes, int]] = {}

    def forwarded(
        self, gossip: AdvertGossip, gate: RealmGate, caller: Peer, call: Call, now_ms: int
    ) -> None:
        """``call`` was just forwarded: remember it if it went to a link in a protected realm."""
        if not gate.protects(call.realm):
            return
        provider = gossip.serving((call.realm, call.procedure), local_only=caller.is_station)
        if provider is None or not provider.is_station:
            return
        if len(self._calls) >= self.limit:
            del self._calls[next(iter(self._calls))]
            self.forgotten += 1
        self._calls[call.call_id] = (call.realm, provider.conn)

    def refused(self, gate: RealmGate, link: Peer, result: Result, now_ms: int) -> bool:
        """Is ``result``, from ``link``, the answer of a non-member to such a CALL?"""
        sent = self._calls.get(result.call_id)
        if sent is None or sent[1] != link.conn:
            return False
        del self._calls[result.call_id]
        return unvouched(gate, link, sent[0], result.responded_by, now_ms)

    def __len__(self) -> int:
        return len(self._calls)


def unsigned_in_protected_realm(gate: RealmGate, event: Event) -> bool:
    return gate.protects(event.realm) and event.publisher_sig is None


def own_station_endorsements(
    records: Iterable[Record],
    node_id: bytes,
    realms: Mapping[bytes, ProtectedRealm],
    now_ms: int,
) -> list[dict[str, Any]]:
    """The RPC forms this station presents on its links, each checked as a peer will check
    it; ``StationEndorsementError`` naming the first that a peer would refuse, and why."""
    presented: list[dict[str, Any]] = []
    for record in records:
        try:
            check_endorsement(
                record.to_rpc(),
                node_id=node_id,
                realms=realms,
                revocations={},
                now_ms=now_ms,
                station=True,
            )
        except EndorsementRefused as exc:
            why = f"--realm-endorsement refused: {exc.reason}: {exc.detail}"
            raise StationEndorsementError(why) from None
        presented.append(record.to_rpc())
    return presented
