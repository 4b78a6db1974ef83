"""A person's mark on a room message (``macula.agent.person``): it verifies only for the very
message it was made for, from the agent that endorsed the person, on an attested envelope."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from macula.agent.person import REF_PREFIX, endorse, from_person, person_ref
from macula.wire.identity import Identity

AGENT = Identity(b"\x01" * 32)
PERSON = Identity(b"\x02" * 32)
OTHER = Identity(b"\x03" * 32)
TOPIC = "agents.room." + "ab" * 16


def message(text: str = "stop the deploy", **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "attested": 1,
        "sender_hex": AGENT.node_id.hex(),
        "message_id": "m1",
        "room_topic": TOPIC,
        "kind": "remark_made",
        "text": text,
    }
    return base | changes


def mark(signer: Identity = PERSON, endorser: Identity = AGENT, **fields: Any) -> str:
    m = message() | fields
    return person_ref(
        signer,
        endorse(endorser, signer.node_id),
        message_id=m["message_id"],
        room_topic=m["room_topic"],
        sender_hex=m["sender_hex"],
        kind=m["kind"],
        text=m["text"],
    )


def test_the_mark_of_a_person_verifies_and_fits_in_a_ref() -> None:
    ref = mark()
    assert ref.startswith(REF_PREFIX) and len(ref) <= 256
    assert from_person(**message(), refs=[ref]) == 1
    assert from_person(**message(), refs=["another ref", ref]) == 1


def test_a_mark_copied_onto_another_message_does_not_verify() -> None:
    ref = mark()
    assert from_person(**message(text="deploy now"), refs=[ref]) == 0
    assert from_person(**message(message_id="m2"), refs=[ref]) == 0
    assert from_person(**message(kind="question_asked"), refs=[ref]) == 0
    assert from_person(**message(room_topic="agents.room." + "cd" * 16), refs=[ref]) == 0
    assert from_person(**message(sender_hex=OTHER.node_id.hex()), refs=[ref]) == 0


def test_an_unattested_message_or_an_unendorsed_key_is_not_a_person() -> None:
    assert from_person(**message(attested=0), refs=[mark()]) == 0
    # endorsed by some other agent than the sender: not the sender's person
    assert from_person(**message(), refs=[mark(endorser=OTHER)]) == 0
    # the agent's own key in the person's place (what an agent could make): no endorsement
    assert from_person(**message(), refs=[mark(signer=OTHER, endorser=OTHER)]) == 0
    assert from_person(**message(), refs=[mark(), mark()]) == 0  # two marks: ambiguous
    assert from_person(**message(), refs=None) == 0


@given(st.text(max_size=300))
def test_anything_else_after_the_prefix_is_not_a_mark(tail: str) -> None:
    assert from_person(**message(), refs=[REF_PREFIX + tail]) == 0
