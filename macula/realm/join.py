"""The join request both ends agree on: a public key with a proof that its sender holds it.

A request is ``{"op": "start" | "poll", "realm": NAME, "public_key": bytes(32), "proof": P}``,
where ``P`` is an identity proof (``macula.agent.proof``) over
``realm.<NAME>.join#<service key hex>#<op>``: bound to this realm, to this join service (its
node id) and to the operation. ``{"op": "about"}`` needs no proof: it answers the realm's signed
directory record and the service's key, which the client needs to sign for it.

Invariants:
- ``check_request`` accepts a request only if ``public_key`` is the CALL's verified caller, the
  proof is signed by that key for this realm, service and op, within ``JOIN_SKEW_MS`` of now,
  and has not been seen before (``ReplayCache``). Otherwise one ``JoinRefused`` whose reason is
  one of malformed, wrong_realm, wrong_node, bad_proof, stale, replayed, busy.
- ``ReplayCache`` holds at most ``max_entries`` proofs, each for twice the skew window (a proof
  older than that is refused as stale anyway); full of live entries it refuses (``busy``)
  rather than forget one that could still be replayed.
- Sans-I/O: the time is an argument.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from macula.agent.proof import make_proof, verify_proof
from macula.errors import MaculaError
from macula.realm.records import join_procedure, name_problem
from macula.wire.identity import Identity

JOIN_SKEW_MS: Final = 60_000
DEFAULT_REPLAY_ENTRIES: Final = 10_000
OPS: Final = ("start", "poll")

# the statuses a join service answers
PENDING: Final = "pending"
APPROVED: Final = "approved"
DENIED: Final = "denied"
EXPIRED: Final = "expired"
UNKNOWN: Final = "unknown"  # no session for this node (never started, or forgotten)
REFUSED: Final = "refused"  # the request itself was refused; ``reason`` says why


class JoinRefused(MaculaError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def proof_procedure(name: str, service_key: bytes, op: str) -> str:
    return f"{join_procedure(name)}#{service_key.hex()}#{op}"


def build_request(
    identity: Identity, name: str, service_key: bytes, op: str, now_ms: int
) -> dict[str, Any]:
    proof = make_proof(identity, proof_procedure(name, service_key, op), now_ms)
    return {"op": op, "realm": name, "public_key": identity.node_id, "proof": dict(proof)}


class ReplayCache:
    def __init__(self, max_entries: int = DEFAULT_REPLAY_ENTRIES, skew_ms: int = JOIN_SKEW_MS):
        self.max_entries = max_entries
        self.keep_ms = 2 * skew_ms
        self._seen: OrderedDict[tuple[str, int, str], int] = OrderedDict()

    def admit(self, key: tuple[str, int, str], now_ms: int) -> None:
        """Remember ``key``; ``JoinRefused`` if it was seen (replayed) or no room is left."""
        while self._seen and next(iter(self._seen.values())) + self.keep_ms <= now_ms:
            self._seen.popitem(last=False)
        if key in self._seen:
            raise JoinRefused("replayed", "this proof was already used; sign a fresh one")
        if len(self._seen) >= self.max_entries:
            raise JoinRefused("busy", "too many join requests right now; retry in a minute")
        self._seen[key] = now_ms

    def __len__(self) -> int:
        return len(self._seen)


def check_request(
    payload: object,
    *,
    name: str,
    service_key: bytes,
    caller: bytes,
    now_ms: int,
    replays: ReplayCache,
) -> tuple[str, bytes]:
    """``(op, node_id)`` of an acceptable request, else ``JoinRefused`` (module docstring)."""
    if not isinstance(payload, Mapping):
        raise JoinRefused("malformed", "a join request is a map")
    op, realm, key, proof = (payload.get(k) for k in ("op", "realm", "public_key", "proof"))
    if op not in OPS:
        raise JoinRefused("malformed", f"op must be one of {', '.join(OPS)}")
    assert isinstance(op, str)
    if type(realm) is not str or name_problem(realm):
        raise JoinRefused("malformed", "realm must be a realm name")
    if realm != name:
        raise JoinRefused("wrong_realm", f"this join service is realm {name!r}'s")
    if type(key) is not bytes or len(key) != 32:
        raise JoinRefused("malformed", "public_key must be 32 bytes")
    if key != caller:
        raise JoinRefused("wrong_node", "public_key is not the caller of this CALL")
    reason = verify_proof(proof, key, proof_procedure(name, service_key, op), now_ms, JOIN_SKEW_MS)
    if reason == "stale":
        raise JoinRefused("stale", "the proof is too old (or from the future); sign a fresh one")
    if reason is not None:
        raise JoinRefused("bad_proof", f"the proof of possession does not hold ({reason})")
    assert isinstance(proof, dict)
    replays.admit((proof["node_id"], proof["timestamp"], proof["signature"]), now_ms)
    return op, key
