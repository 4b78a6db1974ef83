"""Room envelopes: topics, every validation rule, building, attestation, threading, poll hints."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from macula.agent.envelope import (
    KEY_KIND,
    KINDS,
    LIFECYCLE_KINDS,
    LOBBY_TOPIC,
    MAX_TEXT_BYTES,
    TALK_KINDS,
    EnvelopeError,
    build_envelope,
    is_attested,
    is_envelope_topic,
    is_room_topic,
    new_message_id,
    new_room_topic,
    poll_hint,
    thread,
    validate,
)

ME = bytes(range(32))
OTHER = bytes(range(1, 33))
ROOM = "agents.room." + "ab" * 16
ROOM2 = "agents.room." + "cd" * 16


def envelope(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "message_id": "m1",
        "room_topic": ROOM,
        "sent_at": 1_756_857_600_000,
        "from": ME.hex(),
        "kind": "question_asked",
        "text": "what is the plan?",
    }
    base.update(changes)
    return base


def without(key: str) -> dict[str, Any]:
    env = envelope()
    del env[key]
    return env


# -- topics and ids -----------------------------------------------------------------------------


def test_room_topics() -> None:
    topic = new_room_topic(bytes(range(16)))
    assert topic == "agents.room.000102030405060708090a0b0c0d0e0f"
    assert is_room_topic(topic) and is_envelope_topic(topic)
    assert is_envelope_topic(LOBBY_TOPIC) and not is_room_topic(LOBBY_TOPIC)
    for bad in [
        "agents.room." + "AB" * 16,
        "agents.room." + "ab" * 15,
        "agents.room." + "ab" * 17,
        "agents.room.",
        "agents.lobby.x",
        "agents.room." + "ab" * 16 + "\n",
        None,
        b"agents.lobby",
    ]:
        assert not is_room_topic(bad)
        assert not is_envelope_topic(bad)


@pytest.mark.parametrize("bad", [b"", bytes(15), bytes(17), "00" * 16])
def test_new_ids_need_16_random_bytes(bad: Any) -> None:
    with pytest.raises(ValueError):
        new_room_topic(bad)
    with pytest.raises(ValueError):
        new_message_id(bad)


def test_new_message_id_is_32_lowercase_hex() -> None:
    assert new_message_id(bytes([0xAB]) * 16) == "ab" * 16


# -- validation: one rule at a time --------------------------------------------------------------


def test_a_valid_envelope_has_no_problems() -> None:
    assert validate(envelope()) == []
    full = envelope(
        in_reply_to="m0",
        refs=["mcid1", "x" * 256],
        participants=[ME.hex(), OTHER.hex()],
        purpose="p" * 280,
        kind="answer_given",
    )
    assert validate(full) == []
    assert validate(envelope(room_topic=LOBBY_TOPIC, kind="help_requested")) == []


@pytest.mark.parametrize("kind", sorted(LIFECYCLE_KINDS - {KEY_KIND}))
def test_lifecycle_kinds_may_have_empty_text(kind: str) -> None:
    assert validate(envelope(kind=kind, text="")) == []


@pytest.mark.parametrize("kind", sorted(TALK_KINDS))
def test_talk_kinds_need_non_blank_text(kind: str) -> None:
    extra = {"in_reply_to": "m0"} if kind in {"answer_given", "result_reported"} else {}
    assert validate(envelope(kind=kind, **extra)) == []
    assert validate(envelope(kind=kind, text=" \n\t", **extra)) == [
        f"text: {kind} needs non-blank text"
    ]


RULES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", envelope(public=1), "public: unknown key"),
    ("non-string key", {**envelope(), 1: "x"}, "1: keys must be strings"),
    ("null optional", envelope(in_reply_to=None), "in_reply_to: null is not allowed"),
    ("null required", envelope(text=None), "text: null is not allowed"),
    ("bool top level", envelope(sent_at=True), "sent_at: booleans are not allowed"),
    ("bool text", envelope(text=False), "text: booleans are not allowed"),
    ("bool in refs", envelope(refs=["a", True]), "refs[1]: booleans are not allowed"),
    ("bool in participants", envelope(participants=[False]), "participants[0]: booleans"),
    ("message_id empty", envelope(message_id=""), "message_id: expected 1..64"),
    ("message_id too long", envelope(message_id="a" * 65), "message_id: expected 1..64"),
    ("message_id colon", envelope(message_id="a:b"), "message_id: expected 1..64"),
    ("message_id int", envelope(message_id=5), "message_id: expected 1..64"),
    ("in_reply_to bad", envelope(in_reply_to="a b"), "in_reply_to: expected 1..64"),
    ("room_topic bad", envelope(room_topic="agents.dm.x"), "room_topic: expected"),
    ("sent_at negative", envelope(sent_at=-1), "sent_at: expected an integer"),
    ("sent_at float", envelope(sent_at=1.5), "sent_at: expected an integer"),
    ("sent_at string", envelope(sent_at="1"), "sent_at: expected an integer"),
    ("sent_at huge", envelope(sent_at=1 << 53), "sent_at: expected an integer"),
    ("from uppercase", envelope(**{"from": ME.hex().upper()}), "from: expected a 64"),
    ("from short", envelope(**{"from": "ab"}), "from: expected a 64"),
    ("kind unknown", envelope(kind="said"), "kind: expected one of"),
    ("kind int", envelope(kind=1), "kind: expected one of"),
    ("text not str", envelope(text=["x"]), "text: expected a string"),
    ("text too long", envelope(text="é" * (MAX_TEXT_BYTES // 2 + 1)), "text: longer than"),
    ("refs not list", envelope(refs="a"), "refs: expected a list"),
    ("refs too many", envelope(refs=["a"] * 33), "refs: at most 32"),
    ("refs empty str", envelope(refs=[""]), "refs[0]: expected a string of 1..256"),
    ("refs long str", envelope(refs=["a" * 257]), "refs[0]: expected a string of 1..256"),
    ("refs non str", envelope(refs=[1]), "refs[0]: expected a string"),
    ("participants not list", envelope(participants=ME.hex()), "participants: expected"),
    ("participants bad", envelope(participants=["xy"]), "participants[0]: expected a 64"),
    ("participants dup", envelope(participants=[ME.hex()] * 2), "participants[1]: duplicate"),
    ("participants many", envelope(participants=[ME.hex()] * 257), "participants: at most"),
    ("purpose long", envelope(purpose="p" * 281), "purpose: longer than 280"),
    ("purpose not str", envelope(purpose=3), "purpose: expected a string"),
    ("answer needs reply", envelope(kind="answer_given"), "in_reply_to: required for answer"),
    ("result needs reply", envelope(kind="result_reported"), "in_reply_to: required for result"),
    ("self reply", envelope(in_reply_to="m1"), "in_reply_to: a message cannot reply to itself"),
]


@pytest.mark.parametrize(
    ("envelope_", "problem"), [r[1:] for r in RULES], ids=[r[0] for r in RULES]
)
def test_each_rule_reports_its_problem(envelope_: dict[str, Any], problem: str) -> None:
    problems = validate(envelope_)
    assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize("key", ["message_id", "room_topic", "sent_at", "from", "kind", "text"])
def test_every_required_key_is_required(key: str) -> None:
    assert validate(without(key)) == [f"{key}: missing"]


def test_text_limit_is_counted_in_utf8_bytes() -> None:
    assert validate(envelope(text="x" * MAX_TEXT_BYTES)) == []
    assert validate(envelope(text="é" * (MAX_TEXT_BYTES // 2))) == []
    assert validate(envelope(text="x" * (MAX_TEXT_BYTES + 1))) != []


@pytest.mark.parametrize("value", [None, [], "envelope", 3, b"{}", (("kind", "x"),)])
def test_non_objects_are_one_problem(value: object) -> None:
    assert validate(value) == [f"envelope: expected a JSON object, got {type(value).__name__}"]


def test_every_problem_is_listed_at_once() -> None:
    bad = {
        "message_id": "",
        "room_topic": "elsewhere",
        "sent_at": True,
        "from": "nobody",
        "kind": "answer_given",
        "text": " ",
        "refs": [True, ""],
        "colour": "blue",
    }
    assert validate(bad) == [
        "colour: unknown key",
        "message_id: expected 1..64 characters of A-Z a-z 0-9 _ -",
        "room_topic: expected 'agents.lobby' or 'agents.room.<32 lowercase hex>'",
        "sent_at: booleans are not allowed; use 0 or 1",
        "from: expected a 64 lowercase hex node id",
        "refs[0]: booleans are not allowed; use 0 or 1",
        "refs[1]: expected a string of 1..256 characters",
        "in_reply_to: required for answer_given",
        "text: answer_given needs non-blank text",
    ]


def test_empty_object_lists_every_missing_key() -> None:
    assert len(validate({})) == 6


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.one_of(st.sampled_from([*sorted(envelope()), "refs", "participants"]), st.text()),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    )
)
def test_arbitrary_dicts_never_raise(value: dict[str, Any]) -> None:
    problems = validate(value)
    assert all(type(p) is str for p in problems)


# -- building -----------------------------------------------------------------------------------


def test_build_envelope_returns_a_valid_envelope() -> None:
    env = build_envelope(
        message_id=new_message_id(bytes(16)),
        room_topic=ROOM,
        sender=ME,
        kind="room_opened",
        text="",
        sent_at=5,
        participants=[ME, OTHER],
        purpose="review",
    )
    assert env == {
        "message_id": "00" * 16,
        "room_topic": ROOM,
        "sent_at": 5,
        "from": ME.hex(),
        "kind": "room_opened",
        "text": "",
        "participants": [ME.hex(), OTHER.hex()],
        "purpose": "review",
    }
    reply = build_envelope(
        message_id="m2",
        room_topic=ROOM,
        sender=OTHER,
        kind="answer_given",
        text="yes",
        sent_at=6,
        in_reply_to="m1",
        refs=("mcid",),
    )
    assert reply["in_reply_to"] == "m1" and reply["refs"] == ["mcid"]
    assert validate(reply) == []


def test_build_envelope_raises_with_every_problem() -> None:
    with pytest.raises(EnvelopeError) as info:
        build_envelope(
            message_id="m1",
            room_topic="nowhere",
            sender=b"short",
            kind="answer_given",
            text="",
            sent_at=-5,
            participants=[b"x"],
        )
    assert info.value.problems == (
        "room_topic: expected 'agents.lobby' or 'agents.room.<32 lowercase hex>'",
        "sent_at: expected an integer Unix time in milliseconds",
        "from: expected a 64 lowercase hex node id",
        "participants[0]: expected a 64 lowercase hex node id",
        "in_reply_to: required for answer_given",
        "text: answer_given needs non-blank text",
    )
    assert "room_topic" in str(info.value)


def test_kinds_are_the_twelve_past_tense_verbs() -> None:
    assert len(KINDS) == 12 and LIFECYCLE_KINDS.isdisjoint(TALK_KINDS)


# -- attestation --------------------------------------------------------------------------------


def test_is_attested_only_when_the_publisher_is_the_sender() -> None:
    assert is_attested(envelope(), ME)
    assert not is_attested(envelope(), OTHER)
    assert not is_attested(envelope(**{"from": ME.hex().upper()}), ME)
    assert not is_attested(without("from"), ME)
    assert not is_attested("not a dict", ME)
    assert not is_attested(envelope(), ME[:31])
    assert not is_attested(envelope(), ME.hex())  # type: ignore[arg-type]


# -- threading ----------------------------------------------------------------------------------


def msg(mid: str, at: int, reply_to: str | None = None, room: str = ROOM) -> dict[str, Any]:
    extra = {"in_reply_to": reply_to} if reply_to is not None else {}
    return envelope(message_id=mid, sent_at=at, room_topic=room, **extra)


def shape(messages: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(t.message_id, t.thread_root, t.depth) for t in thread(messages)]


def test_chain_threads_in_depth_first_order() -> None:
    messages = [
        msg("a", 1),
        msg("b", 2, "a"),
        msg("x", 3),
        msg("c", 4, "b"),
        msg("d", 5, "a"),
        msg("y", 6, "x"),
    ]
    assert shape(messages) == [
        ("a", "a", 0),
        ("b", "a", 1),
        ("c", "a", 2),
        ("d", "a", 1),
        ("x", "x", 0),
        ("y", "x", 1),
    ]


def test_reply_before_its_parent_still_threads() -> None:
    assert shape([msg("c", 3, "b"), msg("b", 2, "a"), msg("a", 1)]) == [
        ("a", "a", 0),
        ("b", "a", 1),
        ("c", "a", 2),
    ]


def test_unknown_parent_makes_a_root_that_keeps_in_reply_to() -> None:
    threaded = thread([msg("b", 2, "gone"), msg("c", 3, "b")])
    assert [(t.message_id, t.thread_root, t.depth, t.in_reply_to) for t in threaded] == [
        ("b", "b", 0, "gone"),
        ("c", "b", 1, "b"),
    ]


def test_self_reply_is_a_root() -> None:
    threaded = thread([msg("a", 1, "a"), msg("b", 2, "a")])
    assert [(t.message_id, t.thread_root, t.depth, t.in_reply_to) for t in threaded] == [
        ("a", "a", 0, "a"),
        ("b", "a", 1, "a"),
    ]


def test_two_cycle_is_cut_at_its_earliest_message() -> None:
    assert shape([msg("a", 5, "b"), msg("b", 3, "a")]) == [("b", "b", 0), ("a", "b", 1)]
    assert shape([msg("b", 3, "a"), msg("a", 5, "b")]) == [("b", "b", 0), ("a", "b", 1)]


def test_longer_cycle_with_a_tail_is_cut_once() -> None:
    messages = [
        msg("a", 10, "c"),
        msg("b", 20, "a"),
        msg("c", 5, "b"),
        msg("tail", 30, "b"),
    ]
    assert shape(messages) == [("c", "c", 0), ("a", "c", 1), ("b", "c", 2), ("tail", "c", 3)]


def test_equal_sent_at_in_a_cycle_breaks_by_message_id() -> None:
    assert shape([msg("z", 1, "y"), msg("y", 1, "z")]) == [("y", "y", 0), ("z", "y", 1)]


def test_deep_chain_neither_recurses_nor_loops() -> None:
    n = 20_000
    messages = [msg(f"m{i}", i, f"m{i - 1}" if i else None) for i in reversed(range(n))]
    threaded = thread(messages)
    assert [t.depth for t in threaded] == list(range(n))
    assert {t.thread_root for t in threaded} == {"m0"}


def test_duplicates_keep_the_first_and_id_less_messages_are_skipped() -> None:
    first, second = msg("a", 1), {**msg("a", 9), "text": "again"}
    threaded = thread([first, {"text": "no id"}, second, {"message_id": 7}])
    assert len(threaded) == 1 and threaded[0].message is first


def test_non_int_sent_at_counts_as_zero() -> None:
    assert shape([msg("b", 1), {**msg("a", 0), "sent_at": "later"}]) == [
        ("a", "a", 0),
        ("b", "b", 0),
    ]


forest = st.integers(min_value=1, max_value=14).flatmap(
    lambda n: st.lists(
        st.tuples(
            st.integers(0, 5), st.one_of(st.none(), st.integers(0, n + 1).map(lambda i: f"m{i}"))
        ),
        min_size=n,
        max_size=n,
    )
)


@settings(max_examples=200)
@given(forest, st.randoms())
def test_threading_is_order_independent_and_consistent(
    spec: list[tuple[int, str | None]], rng: Any
) -> None:
    messages = [msg(f"m{i}", at, reply_to) for i, (at, reply_to) in enumerate(spec)]
    shuffled = copy.deepcopy(messages)
    rng.shuffle(shuffled)
    assert shape(messages) == shape(shuffled)

    threaded = thread(messages)
    assert sorted(t.message_id for t in threaded) == sorted(m["message_id"] for m in messages)
    position = {t.message_id: i for i, t in enumerate(threaded)}
    by_id = {t.message_id: t for t in threaded}
    for t in threaded:
        root = by_id[t.thread_root]
        assert root.depth == 0 and root.thread_root == root.message_id
        if t.depth > 0:
            parent = by_id[t.in_reply_to]  # type: ignore[index]
            assert parent.depth == t.depth - 1
            assert parent.thread_root == t.thread_root
            assert position[parent.message_id] < position[t.message_id]


# -- poll hint ----------------------------------------------------------------------------------


def said(who: bytes, at: int, kind: str = "question_asked", room: str = ROOM) -> dict[str, Any]:
    return envelope(
        message_id=f"{who.hex()[:4]}{at}",
        sent_at=at,
        room_topic=room,
        kind=kind,
        **{"from": who.hex()},
    )


HINT: Callable[[list[dict[str, Any]], str], str | None] = poll_hint


def test_hint_when_i_spoke_last() -> None:
    hint = HINT([said(OTHER, 1), said(ME, 2)], ME.hex())
    assert hint is not None and ROOM in hint and "mesh_wait_room" in hint


def test_no_hint_once_someone_answered() -> None:
    assert HINT([said(ME, 1), said(OTHER, 2)], ME.hex()) is None
    assert HINT([said(OTHER, 2), said(ME, 1)], ME.hex()) is None  # by sent_at, not input order


def test_lifecycle_messages_are_not_answers() -> None:
    messages = [said(ME, 1), said(OTHER, 2, kind="participant_joined")]
    assert HINT(messages, ME.hex()) is not None


def test_hint_names_only_the_rooms_where_i_spoke_last() -> None:
    messages = [said(ME, 1), said(OTHER, 2, room=ROOM2), said(ME, 1, room=LOBBY_TOPIC)]
    hint = HINT(messages, ME.hex().upper())
    assert hint is not None and ROOM in hint and LOBBY_TOPIC in hint and ROOM2 not in hint


def test_equal_sent_at_is_decided_by_input_position() -> None:
    assert HINT([said(OTHER, 5), said(ME, 5)], ME.hex()) is not None
    assert HINT([said(ME, 5), said(OTHER, 5)], ME.hex()) is None


def test_no_hint_without_talk() -> None:
    assert HINT([], ME.hex()) is None
    assert HINT([said(ME, 1, kind="room_opened"), {"kind": ["x"]}], ME.hex()) is None
