"""Identity proofs, and the ring and ring-answer payloads that carry them.

A proof is Ed25519 over ``node_id (32) || timestamp (u64 big-endian Unix ms) || procedure
(UTF-8)``, written ``{"node_id": 64-hex, "timestamp": int, "procedure": str, "signature":
128-hex}``. The procedure binds it to one message: a ring to B is proven for
``agent.<B>.ring#ring:<ring_id>``, the answer back to caller A for
``agent.<A>.ring#answer:<ring_id>``, so a proof cannot be replayed for another ring, another
callee or the other direction.

Invariants:
- ``verify_proof`` never raises, whatever it is given; it returns None or one short reason:
  ``malformed`` (shape), ``wrong_node``, ``wrong_procedure``, ``bad_signature``, ``stale``, checked
  in that order, so ``stale`` is only ever said of a genuinely signed proof.
- ``validate_ring`` / ``validate_ring_answer`` never raise and list every problem; a proof
  problem reads ``"proof: <reason>"``. A payload they accept was signed by its ``from`` for this
  very ring, addressed to ``me``, within ``MAX_SKEW_MS`` of ``now_ms`` (either direction).
- ``build_*`` return only payloads the matching ``validate_*`` accepts, else raise ``RingError``.
- Replays inside the skew window are not caught here: the ring store refuses a ``ring_id`` twice.
No I/O, no clock (``now_ms`` is an argument), no hidden randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, NotRequired, TypedDict

from macula.agent.envelope import (
    MAX_PURPOSE_CHARS,
    MAX_SENT_AT,
    bool_problems,
    is_id,
    is_node_hex,
    is_room_topic,
)
from macula.errors import MaculaError
from macula.wire.identity import Identity, verify

MAX_SKEW_MS: Final = 60_000
MAX_REASON_CHARS: Final = 280
MAX_PROCEDURE_BYTES: Final = 1024
RING_KIND: Final = "ring"
RING_ANSWER_KIND: Final = "ring_answer"
ANSWERS: Final = frozenset({1, 2, 3})  # accepted, declined, deferred

_PROOF_KEYS: Final = frozenset({"node_id", "timestamp", "procedure", "signature"})
_U64: Final = 1 << 64


class Proof(TypedDict):
    node_id: str
    timestamp: int
    procedure: str
    signature: str


RingPayload = TypedDict(
    "RingPayload",
    {
        "kind": str,
        "ring_id": str,
        "from": str,
        "to": str,
        "purpose": str,
        "room_topic": str,
        "sent_at": int,
        "proof": Proof,
        "realm": NotRequired[str],  # 64 hex: the room's realm, absent for the all-zero realm
    },
)

RingAnswerPayload = TypedDict(
    "RingAnswerPayload",
    {
        "kind": str,
        "ring_id": str,
        "from": str,
        "to": str,
        "answer": int,
        "reason": NotRequired[str],
        "room_topic": str,
        "sent_at": int,
        "proof": Proof,
    },
)


class RingError(MaculaError, ValueError):
    """A ring or answer we were asked to build is invalid; ``problems`` lists every reason."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("invalid ring payload: " + "; ".join(self.problems))


# -- procedures and ids -------------------------------------------------------------------------


def ring_endpoint(node_id: bytes) -> str:
    """The procedure every present agent serves for rings: ``agent.<64 hex>.ring``."""
    return f"agent.{node_id.hex()}.ring"


def ring_procedure(callee: bytes, ring_id: str) -> str:
    """What a ring's proof is bound to: ``agent.<callee>.ring#ring:<ring_id>``."""
    return f"{ring_endpoint(callee)}#ring:{ring_id}"


def answer_procedure(caller: bytes, ring_id: str) -> str:
    """What an answer's proof is bound to: ``agent.<caller>.ring#answer:<ring_id>``."""
    return f"{ring_endpoint(caller)}#answer:{ring_id}"


def new_ring_id(random16: bytes) -> str:
    """A fresh ring id (32 lowercase hex) from 16 random bytes."""
    if type(random16) is not bytes or len(random16) != 16:
        raise ValueError("a ring id needs exactly 16 random bytes")
    return random16.hex()


# -- proofs -------------------------------------------------------------------------------------


def proof_message(node_id: bytes, timestamp: int, procedure: str) -> bytes:
    """The signed bytes: node_id || u64 big-endian timestamp || UTF-8 procedure."""
    return node_id + timestamp.to_bytes(8, "big") + procedure.encode("utf-8")


def make_proof(identity: Identity, procedure: str, now_ms: int) -> Proof:
    """A proof that ``identity`` holds its key, bound to ``procedure`` at ``now_ms``."""
    if type(now_ms) is not int or not 0 <= now_ms < _U64:
        raise ValueError("now_ms must be an int in 0..2^64-1")
    if type(procedure) is not str or not procedure:
        raise ValueError("a proof needs a non-empty procedure string")
    signature = identity.sign(proof_message(identity.node_id, now_ms, procedure))
    return {
        "node_id": identity.node_id.hex(),
        "timestamp": now_ms,
        "procedure": procedure,
        "signature": signature.hex(),
    }


def verify_proof(
    proof: object,
    expected_node_id: bytes,
    expected_procedure: str,
    now_ms: int,
    max_skew_ms: int = MAX_SKEW_MS,
) -> str | None:
    """None if ``proof`` is valid for this node, procedure and time; else a short reason."""
    if not _well_formed(proof):
        return "malformed"
    assert isinstance(proof, dict)
    node_hex: str = proof["node_id"]
    timestamp: int = proof["timestamp"]
    procedure: str = proof["procedure"]
    if type(expected_node_id) is not bytes or node_hex != expected_node_id.hex():
        return "wrong_node"
    if type(expected_procedure) is not str or procedure != expected_procedure:
        return "wrong_procedure"
    node_id = bytes.fromhex(node_hex)
    message = proof_message(node_id, timestamp, procedure)
    if not verify(node_id, message, bytes.fromhex(proof["signature"])):
        return "bad_signature"
    if type(now_ms) is not int or abs(now_ms - timestamp) > max_skew_ms:
        return "stale"
    return None


def _well_formed(proof: object) -> bool:
    if not isinstance(proof, dict) or set(proof) != _PROOF_KEYS:
        return False
    timestamp = proof["timestamp"]
    procedure = proof["procedure"]
    signature = proof["signature"]
    if type(timestamp) is not int or not 0 <= timestamp < _U64:
        return False
    if type(signature) is not str or len(signature) != 128 or not _lower_hex(signature):
        return False
    if type(procedure) is not str or not procedure:
        return False
    try:
        encoded = procedure.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return len(encoded) <= MAX_PROCEDURE_BYTES and is_node_hex(proof["node_id"])


def _lower_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


# -- rings --------------------------------------------------------------------------------------


def build_ring(
    identity: Identity,
    to: bytes,
    purpose: str,
    room_topic: str,
    ring_id: str,
    now_ms: int,
    realm: bytes | None = None,
) -> RingPayload:
    """A proven ring from ``identity`` to ``to``, inviting it into ``room_topic`` (in
    ``realm``, when that is not the all-zero realm)."""
    payload: RingPayload = {
        "kind": RING_KIND,
        "ring_id": ring_id,
        "from": identity.node_id.hex(),
        "to": _hex(to),
        "purpose": purpose,
        "room_topic": room_topic,
        "sent_at": now_ms,
        "proof": _proof_or_placeholder(identity, to, ring_id, now_ms, ring_procedure),
    }
    if realm is not None and any(realm):
        payload["realm"] = realm.hex()
    problems = validate_ring(payload, to, now_ms)
    if problems:
        raise RingError(problems)
    return payload


def validate_ring(payload: object, me: bytes, now_ms: int) -> list[str]:
    """Every problem with a ring received by ``me`` at ``now_ms``; empty = valid. Never raises."""
    problems = _check_common(payload, RING_KIND, _RING_FIELDS, me)
    if isinstance(payload, dict):
        problems.extend(_check_proof(payload, me, now_ms, ring_procedure))
    return problems


def build_ring_answer(
    identity: Identity,
    to: bytes,
    ring_id: str,
    answer: int,
    room_topic: str,
    now_ms: int,
    reason: str | None = None,
) -> RingAnswerPayload:
    """A proven answer (1 accepted, 2 declined, 3 deferred) from the callee to caller ``to``."""
    payload: RingAnswerPayload = {
        "kind": RING_ANSWER_KIND,
        "ring_id": ring_id,
        "from": identity.node_id.hex(),
        "to": _hex(to),
        "answer": int(answer) if type(answer) is not bool else answer,
        "room_topic": room_topic,
        "sent_at": now_ms,
        "proof": _proof_or_placeholder(identity, to, ring_id, now_ms, answer_procedure),
    }
    if reason is not None:
        payload["reason"] = reason
    problems = validate_ring_answer(payload, to, now_ms)
    if problems:
        raise RingError(problems)
    return payload


def validate_ring_answer(payload: object, me: bytes, now_ms: int) -> list[str]:
    """Every problem with an answer received by caller ``me``; empty = valid. Never raises."""
    problems = _check_common(payload, RING_ANSWER_KIND, _ANSWER_FIELDS, me)
    if isinstance(payload, dict):
        problems.extend(_check_proof(payload, me, now_ms, answer_procedure))
    return problems


# -- shared checks ------------------------------------------------------------------------------

_Procedure = Callable[[bytes, str], str]
_Fields = tuple[frozenset[str], frozenset[str]]
_RING_FIELDS: Final[_Fields] = (
    frozenset({"kind", "ring_id", "from", "to", "purpose", "room_topic", "sent_at", "proof"}),
    frozenset({"realm"}),
)
_ANSWER_FIELDS: Final[_Fields] = (
    frozenset({"kind", "ring_id", "from", "to", "answer", "room_topic", "sent_at", "proof"}),
    frozenset({"reason"}),
)
_FIELD_ORDER: Final = (
    "kind",
    "ring_id",
    "from",
    "to",
    "answer",
    "reason",
    "purpose",
    "room_topic",
    "realm",
    "sent_at",
    "proof",
)


def _check_common(
    payload: object,
    kind: str,
    fields: _Fields,
    me: bytes,
) -> list[str]:
    if not isinstance(payload, dict):
        return [f"payload: expected a JSON object, got {type(payload).__name__}"]
    required, optional = fields
    problems: list[str] = []
    for key in payload:
        if type(key) is not str:
            problems.append(f"{key!r}: keys must be strings")
        elif key not in required and key not in optional:
            problems.append(f"{key}: unknown key")
    present = [key for key in _FIELD_ORDER if key in payload and key in required | optional]
    problems.extend(f"{key}: missing" for key in _FIELD_ORDER if key in required - payload.keys())
    for key in present:
        if payload[key] is None:
            problems.append(f"{key}: null is not allowed; omit the key instead")
        else:
            problems.extend(bool_problems(payload[key], key))
    problems.extend(_field_problems(payload, kind, me))
    return problems


def _field_problems(payload: dict[object, object], kind: str, me: bytes) -> list[str]:
    """Per-field rules, in ``_FIELD_ORDER``; absent, null and boolean values are reported
    elsewhere and skipped here."""
    me_hex = _hex(me)
    checks: dict[str, list[tuple[Callable[[object], bool], str]]] = {
        "kind": [(lambda v: v == kind, f"expected {kind!r}")],
        "ring_id": [(is_id, "expected 1..64 characters of A-Z a-z 0-9 _ -")],
        "from": [(is_node_hex, "expected a 64 lowercase hex node id")],
        "to": [
            (is_node_hex, "expected a 64 lowercase hex node id"),
            (lambda v: not is_node_hex(v) or v == me_hex, "addressed to another node"),
        ],
        "room_topic": [(is_room_topic, "expected 'agents.room.<32 lowercase hex>'")],
        "sent_at": [(_is_ms, "expected an integer Unix time in milliseconds")],
    }
    if kind == RING_KIND:
        checks["purpose"] = [(_text_within(MAX_PURPOSE_CHARS), _at_most(MAX_PURPOSE_CHARS))]
        checks["realm"] = [(is_node_hex, "expected a 64 lowercase hex realm tag")]
    else:
        checks["answer"] = [(lambda v: type(v) is int and v in ANSWERS, "expected 1, 2 or 3")]
        checks["reason"] = [(_text_within(MAX_REASON_CHARS), _at_most(MAX_REASON_CHARS))]
    problems: list[str] = []
    for key in _FIELD_ORDER:
        value = payload.get(key)
        if key not in checks or value is None or type(value) is bool:
            continue
        problems.extend(f"{key}: {why}" for ok, why in checks[key] if not ok(value))
    return problems


def _check_proof(
    payload: dict[object, object], me: bytes, now_ms: int, procedure: _Procedure
) -> list[str]:
    """The proof must be well formed; once ``from`` and ``ring_id`` are, it must verify."""
    if "proof" not in payload or payload["proof"] is None:
        return []  # already reported as missing / null
    proof = payload["proof"]
    sender, ring_id = payload.get("from"), payload.get("ring_id")
    if not (is_node_hex(sender) and is_id(ring_id) and type(me) is bytes):
        return [] if _well_formed(proof) else ["proof: malformed"]
    assert isinstance(sender, str) and isinstance(ring_id, str)
    reason = verify_proof(proof, bytes.fromhex(sender), procedure(me, ring_id), now_ms)
    return [] if reason is None else [f"proof: {reason}"]


def _proof_or_placeholder(
    identity: Identity, to: bytes, ring_id: str, now_ms: int, procedure: _Procedure
) -> Proof:
    """The proof for a payload being built; inputs too broken to sign get an empty proof,
    so that validation lists what is wrong instead of this raising half-way."""
    if type(to) is not bytes or not is_id(ring_id) or not _is_ms(now_ms):
        return {"node_id": "", "timestamp": 0, "procedure": "", "signature": ""}
    return make_proof(identity, procedure(to, ring_id), now_ms)


def _hex(node_id: object) -> str:
    return node_id.hex() if isinstance(node_id, bytes) else ""


def _is_ms(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SENT_AT


def _text_within(limit: int) -> Callable[[object], bool]:
    return lambda value: type(value) is str and len(value) <= limit


def _at_most(limit: int) -> str:
    return f"at most {limit} characters of text"
