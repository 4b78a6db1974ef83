"""Identity proofs and ring payloads: valid, tampered, misbound, stale, malformed, never raising."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.agent.proof import (
    MAX_SKEW_MS,
    RingError,
    answer_procedure,
    build_ring,
    build_ring_answer,
    make_proof,
    new_ring_id,
    proof_message,
    ring_endpoint,
    ring_procedure,
    validate_ring,
    validate_ring_answer,
    verify_proof,
)
from macula.wire.identity import Identity

CALLER = Identity(bytes([1]) * 32)
CALLEE = Identity(bytes([2]) * 32)
STRANGER = Identity(bytes([3]) * 32)
NOW = 1_756_857_600_000
RING_ID = "0f" * 16
ROOM = "agents.room." + "ab" * 16
PROCEDURE = ring_procedure(CALLEE.node_id, RING_ID)
ROOM_PROBLEM = "room_topic: expected 'agents.room.<32 lowercase hex>'"
REASONS = {"malformed", "wrong_node", "wrong_procedure", "bad_signature", "stale"}


def proof(**changes: Any) -> dict[str, Any]:
    made: dict[str, Any] = dict(make_proof(CALLER, PROCEDURE, NOW))
    made.update(changes)
    return made


def check(candidate: object, now_ms: int = NOW) -> str | None:
    return verify_proof(candidate, CALLER.node_id, PROCEDURE, now_ms)


def flip(hex_text: str, bit: int) -> str:
    raw = bytearray(bytes.fromhex(hex_text))
    raw[bit // 8] ^= 1 << (bit % 8)
    return raw.hex()


# -- procedures ---------------------------------------------------------------------------------


def test_procedure_strings() -> None:
    callee_hex, caller_hex = CALLEE.node_id.hex(), CALLER.node_id.hex()
    assert ring_endpoint(CALLEE.node_id) == f"agent.{callee_hex}.ring"
    assert ring_procedure(CALLEE.node_id, RING_ID) == f"agent.{callee_hex}.ring#ring:{RING_ID}"
    assert answer_procedure(CALLER.node_id, RING_ID) == f"agent.{caller_hex}.ring#answer:{RING_ID}"
    assert new_ring_id(bytes([0x0F]) * 16) == RING_ID
    with pytest.raises(ValueError):
        new_ring_id(bytes(15))


# -- proofs -------------------------------------------------------------------------------------


def test_a_fresh_proof_verifies() -> None:
    made = make_proof(CALLER, PROCEDURE, NOW)
    assert set(made) == {"node_id", "timestamp", "procedure", "signature"}
    assert made["node_id"] == CALLER.node_id.hex() and made["timestamp"] == NOW
    assert len(made["signature"]) == 128
    assert check(made) is None


def test_the_signed_bytes_are_node_id_timestamp_procedure() -> None:
    message = proof_message(CALLER.node_id, NOW, "p#é")
    assert message == CALLER.node_id + NOW.to_bytes(8, "big") + "p#é".encode()
    made = make_proof(CALLER, "p#é", NOW)
    assert bytes.fromhex(made["signature"]) == CALLER.sign(message)


def test_every_signature_bit_flip_is_a_bad_signature() -> None:
    signature = proof()["signature"]
    for bit in range(512):
        assert check(proof(signature=flip(signature, bit))) == "bad_signature", bit


def test_node_id_bit_flips_fail() -> None:
    node_hex = CALLER.node_id.hex()
    for bit in range(0, 256, 7):
        flipped = flip(node_hex, bit)
        assert check(proof(node_id=flipped)) == "wrong_node"
        # even when the verifier expects the flipped id, the signature does not match it
        expected = bytes.fromhex(flipped)
        assert verify_proof(proof(node_id=flipped), expected, PROCEDURE, NOW) == "bad_signature"


def test_timestamp_and_procedure_tampering_fail() -> None:
    for bit in range(40):
        assert check(proof(timestamp=NOW ^ (1 << bit))) in {"bad_signature", "stale"}
        assert check(proof(timestamp=NOW ^ (1 << bit))) is not None
    other = ring_procedure(STRANGER.node_id, RING_ID)
    # the procedure field rewritten to the expected one: the signature no longer matches
    forged = dict(make_proof(CALLER, other, NOW), procedure=PROCEDURE)
    assert check(forged) == "bad_signature"


@pytest.mark.parametrize(
    "procedure",
    [
        ring_procedure(STRANGER.node_id, RING_ID),  # another callee
        ring_procedure(CALLEE.node_id, "1" * 32),  # another ring
        answer_procedure(CALLEE.node_id, RING_ID),  # the other direction
        ring_endpoint(CALLEE.node_id),  # unbound
    ],
)
def test_a_proof_for_another_procedure_is_wrong_procedure(procedure: str) -> None:
    assert check(make_proof(CALLER, procedure, NOW)) == "wrong_procedure"


def test_a_proof_by_someone_else_is_wrong_node() -> None:
    assert check(make_proof(STRANGER, PROCEDURE, NOW)) == "wrong_node"


@pytest.mark.parametrize(
    ("delta", "reason"),
    [
        (0, None),
        (MAX_SKEW_MS, None),
        (-MAX_SKEW_MS, None),
        (MAX_SKEW_MS + 1, "stale"),
        (-MAX_SKEW_MS - 1, "stale"),
        (3_600_000, "stale"),
    ],
)
def test_skew_is_sixty_seconds_either_way(delta: int, reason: str | None) -> None:
    assert check(proof(), NOW + delta) == reason


def test_custom_skew_and_a_non_int_clock() -> None:
    assert verify_proof(proof(), CALLER.node_id, PROCEDURE, NOW + 5_000, max_skew_ms=1_000) == (
        "stale"
    )
    assert verify_proof(proof(), CALLER.node_id, PROCEDURE, "now") == "stale"  # type: ignore[arg-type]


def test_bad_expectations_do_not_raise() -> None:
    assert verify_proof(proof(), b"short", PROCEDURE, NOW) == "wrong_node"
    assert verify_proof(proof(), CALLER.node_id.hex(), PROCEDURE, NOW) == "wrong_node"  # type: ignore[arg-type]
    assert verify_proof(proof(), CALLER.node_id, None, NOW) == "wrong_procedure"  # type: ignore[arg-type]


def _without(key: str) -> dict[str, Any]:
    made = proof()
    del made[key]
    return made


MALFORMED: list[object] = [
    None,
    [],
    "proof",
    42,
    b"\x00" * 64,
    {},
    _without("node_id"),
    _without("timestamp"),
    _without("procedure"),
    _without("signature"),
    proof(extra=1),
    proof(timestamp=True),
    proof(timestamp=-1),
    proof(timestamp=1 << 64),
    proof(timestamp=float(NOW)),
    proof(timestamp=str(NOW)),
    proof(node_id=CALLER.node_id.hex().upper()),
    proof(node_id=CALLER.node_id.hex()[:-2]),
    proof(node_id=CALLER.node_id),
    proof(node_id=None),
    proof(signature=proof()["signature"].upper()),
    proof(signature=proof()["signature"][:-2]),
    proof(signature="zz" * 64),
    proof(signature=bytes(64)),
    proof(signature=None),
    proof(procedure=""),
    proof(procedure=None),
    proof(procedure=["x"]),
    proof(procedure="\ud800"),
    proof(procedure="p" * 1025),
    {1: "x", **proof()},
]


@pytest.mark.parametrize("candidate", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_proofs_are_malformed(candidate: object) -> None:
    assert check(candidate) == "malformed"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=10,
)
PROOF_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "node_id": st.one_of(st.just(CALLER.node_id.hex()), JSONISH),
        "timestamp": st.one_of(st.integers(), JSONISH),
        "procedure": st.one_of(st.just(PROCEDURE), JSONISH),
        "signature": st.one_of(st.just(proof()["signature"]), JSONISH),
    },
)


@settings(max_examples=400)
@given(st.one_of(JSONISH, PROOF_LIKE, st.dictionaries(st.text(), JSONISH)), st.integers())
def test_arbitrary_input_returns_a_reason_and_never_raises(candidate: object, now: int) -> None:
    reason = verify_proof(candidate, CALLER.node_id, PROCEDURE, now)
    assert reason is None or reason in REASONS
    if reason is None:
        assert candidate == proof()


# -- rings --------------------------------------------------------------------------------------


def ring(**changes: Any) -> dict[str, Any]:
    made: dict[str, Any] = dict(
        build_ring(CALLER, CALLEE.node_id, "review the plan", ROOM, RING_ID, NOW)
    )
    made.update(changes)
    return made


def answer(**changes: Any) -> dict[str, Any]:
    made: dict[str, Any] = dict(
        build_ring_answer(CALLEE, CALLER.node_id, RING_ID, 2, ROOM, NOW, reason="busy")
    )
    made.update(changes)
    return made


def test_a_built_ring_is_valid_for_its_callee() -> None:
    built = ring()
    assert built["kind"] == "ring" and built["from"] == CALLER.node_id.hex()
    assert built["to"] == CALLEE.node_id.hex() and built["sent_at"] == NOW
    assert built["proof"]["procedure"] == PROCEDURE
    assert validate_ring(built, CALLEE.node_id, NOW + 30_000) == []


def test_a_ring_for_someone_else_is_refused() -> None:
    assert validate_ring(ring(), STRANGER.node_id, NOW) == [
        "to: addressed to another node",
        "proof: wrong_procedure",
    ]


def test_a_ring_whose_from_is_not_the_prover_is_refused() -> None:
    assert validate_ring(ring(**{"from": STRANGER.node_id.hex()}), CALLEE.node_id, NOW) == [
        "proof: wrong_node"
    ]


def test_a_ring_with_a_renamed_ring_id_is_refused() -> None:
    assert validate_ring(ring(ring_id="1" * 32), CALLEE.node_id, NOW) == ["proof: wrong_procedure"]


def test_a_stale_ring_is_refused() -> None:
    assert validate_ring(ring(), CALLEE.node_id, NOW + MAX_SKEW_MS + 1) == ["proof: stale"]


def test_a_ring_with_a_forged_signature_is_refused() -> None:
    forged = ring()
    forged["proof"] = dict(forged["proof"], signature=flip(forged["proof"]["signature"], 3))
    assert validate_ring(forged, CALLEE.node_id, NOW) == ["proof: bad_signature"]


RING_RULES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("kind", ring(kind="ring_answer"), ["kind: expected 'ring'"]),
    ("kind bool", ring(kind=True), ["kind: booleans are not allowed; use 0 or 1"]),
    ("ring_id", ring(ring_id="a:b"), ["ring_id: expected 1..64 characters of A-Z a-z 0-9 _ -"]),
    ("from", ring(**{"from": "x"}), ["from: expected a 64 lowercase hex node id"]),
    (
        "to",
        ring(to=CALLEE.node_id.hex().upper()),
        ["to: expected a 64 lowercase hex node id"],
    ),
    ("purpose long", ring(purpose="p" * 281), ["purpose: at most 280 characters of text"]),
    ("purpose type", ring(purpose=7), ["purpose: at most 280 characters of text"]),
    (
        "lobby",
        ring(room_topic="agents.lobby"),
        ["room_topic: expected 'agents.room.<32 lowercase hex>'"],
    ),
    ("sent_at", ring(sent_at=-1), ["sent_at: expected an integer Unix time in milliseconds"]),
    ("sent_at bool", ring(sent_at=False), ["sent_at: booleans are not allowed; use 0 or 1"]),
    ("unknown", ring(answer=1), ["answer: unknown key"]),
    ("null", ring(purpose=None), ["purpose: null is not allowed; omit the key instead"]),
    ("proof null", ring(proof=None), ["proof: null is not allowed; omit the key instead"]),
    ("proof malformed", ring(proof={"node_id": 1}), ["proof: malformed"]),
    (
        "proof bool",
        ring(proof=dict(ring()["proof"], timestamp=True)),
        ["proof.timestamp: booleans are not allowed; use 0 or 1", "proof: malformed"],
    ),
]


@pytest.mark.parametrize(
    ("payload", "problems"), [r[1:] for r in RING_RULES], ids=[r[0] for r in RING_RULES]
)
def test_each_ring_rule(payload: dict[str, Any], problems: list[str]) -> None:
    assert validate_ring(payload, CALLEE.node_id, NOW) == problems


@pytest.mark.parametrize(
    "key", ["kind", "ring_id", "from", "to", "purpose", "room_topic", "sent_at", "proof"]
)
def test_every_ring_key_is_required(key: str) -> None:
    payload = ring()
    del payload[key]
    problems = validate_ring(payload, CALLEE.node_id, NOW)
    assert problems[0] == f"{key}: missing"


def test_a_broken_ring_lists_every_problem_and_still_checks_the_proof_shape() -> None:
    payload = ring(**{"from": "nobody"}, ring_id="", purpose="p" * 300, proof=[])
    assert validate_ring(payload, CALLEE.node_id, NOW) == [
        "ring_id: expected 1..64 characters of A-Z a-z 0-9 _ -",
        "from: expected a 64 lowercase hex node id",
        "purpose: at most 280 characters of text",
        "proof: malformed",
    ]


@pytest.mark.parametrize("value", [None, [], "ring", 1])
def test_a_ring_that_is_not_an_object(value: object) -> None:
    assert validate_ring(value, CALLEE.node_id, NOW) == [
        f"payload: expected a JSON object, got {type(value).__name__}"
    ]


def test_build_ring_raises_with_every_problem() -> None:
    with pytest.raises(RingError) as info:
        build_ring(CALLER, CALLEE.node_id, "p" * 281, "agents.lobby", RING_ID, NOW)
    assert info.value.problems == (
        "purpose: at most 280 characters of text",
        "room_topic: expected 'agents.room.<32 lowercase hex>'",
    )
    with pytest.raises(RingError) as info:
        build_ring(CALLER, b"short", "hi", ROOM, "bad id", -1)
    assert "proof: malformed" in info.value.problems


# -- ring answers -------------------------------------------------------------------------------


def test_a_built_answer_is_valid_for_the_caller() -> None:
    built = answer()
    assert built["kind"] == "ring_answer" and built["answer"] == 2 and built["reason"] == "busy"
    assert built["proof"]["procedure"] == answer_procedure(CALLER.node_id, RING_ID)
    assert validate_ring_answer(built, CALLER.node_id, NOW) == []
    accepted = build_ring_answer(CALLEE, CALLER.node_id, RING_ID, 1, ROOM, NOW)
    assert "reason" not in accepted
    assert validate_ring_answer(accepted, CALLER.node_id, NOW) == []


def test_a_ring_proof_cannot_be_reused_as_an_answer_proof() -> None:
    # the callee's proof for calling someone else's ring endpoint is not an answer proof
    reused = answer(proof=make_proof(CALLEE, ring_procedure(CALLER.node_id, RING_ID), NOW))
    assert validate_ring_answer(reused, CALLER.node_id, NOW) == ["proof: wrong_procedure"]
    # nor is a ring payload an answer payload
    assert "kind: expected 'ring_answer'" in validate_ring_answer(ring(), CALLEE.node_id, NOW)


ANSWER_RULES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("answer 0", answer(answer=0), ["answer: expected 1, 2 or 3"]),
    ("answer 4", answer(answer=4), ["answer: expected 1, 2 or 3"]),
    ("answer str", answer(answer="1"), ["answer: expected 1, 2 or 3"]),
    ("answer list", answer(answer=[1]), ["answer: expected 1, 2 or 3"]),
    ("answer bool", answer(answer=True), ["answer: booleans are not allowed; use 0 or 1"]),
    ("reason long", answer(reason="r" * 281), ["reason: at most 280 characters of text"]),
    ("reason null", answer(reason=None), ["reason: null is not allowed; omit the key instead"]),
    ("purpose", answer(purpose="x"), ["purpose: unknown key"]),
    ("stranger", answer(**{"from": STRANGER.node_id.hex()}), ["proof: wrong_node"]),
]


@pytest.mark.parametrize(
    ("payload", "problems"), [r[1:] for r in ANSWER_RULES], ids=[r[0] for r in ANSWER_RULES]
)
def test_each_answer_rule(payload: dict[str, Any], problems: list[str]) -> None:
    assert validate_ring_answer(payload, CALLER.node_id, NOW) == problems


def test_an_answer_for_someone_else_or_too_late_is_refused() -> None:
    assert validate_ring_answer(answer(), STRANGER.node_id, NOW) == [
        "to: addressed to another node",
        "proof: wrong_procedure",
    ]
    assert validate_ring_answer(answer(), CALLER.node_id, NOW - MAX_SKEW_MS - 1) == ["proof: stale"]


def test_build_ring_answer_raises_on_a_bad_answer() -> None:
    with pytest.raises(RingError) as info:
        build_ring_answer(CALLEE, CALLER.node_id, RING_ID, 5, ROOM, NOW, reason="r" * 300)
    assert info.value.problems == (
        "answer: expected 1, 2 or 3",
        "reason: at most 280 characters of text",
    )


RING_LIKE = st.dictionaries(
    st.sampled_from(
        ["kind", "ring_id", "from", "to", "purpose", "answer", "reason", "room_topic", "sent_at"]
    )
    | st.text(max_size=5),
    JSONISH,
).map(lambda d: {**ring(), **d})


@settings(max_examples=150)
@given(st.one_of(JSONISH, RING_LIKE, RING_LIKE.map(lambda d: {**d, "proof": copy.deepcopy(d)})))
def test_ring_validators_never_raise(payload: object) -> None:
    for validator in (validate_ring, validate_ring_answer):
        problems = validator(payload, CALLEE.node_id, NOW)
        assert all(type(p) is str for p in problems)
