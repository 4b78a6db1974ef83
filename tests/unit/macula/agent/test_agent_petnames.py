"""Petnames: stable labels from node ids, the word lists, and resolution against a roster."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from macula.agent import petnames
from macula.agent.petnames import (
    FIRST_WORDS,
    NOUNS,
    SECOND_WORDS,
    PetnameError,
    parse_node_hex,
    petname,
    resolve,
)
from macula.wire.identity import Identity

ALICE = Identity(bytes([1]) * 32).node_id
BOB = Identity(bytes([2]) * 32).node_id
PETNAME = re.compile(r"[a-z]+_[a-z]+_[a-z]+_[0-9]{4}")


# -- stability and format -----------------------------------------------------------------------


def test_fixed_node_ids_have_fixed_petnames() -> None:
    # pinned: the word lists are part of the output; a change here renames every agent
    assert petname(bytes(32)) == "direct_bronze_kitten_3213"
    assert petname(bytes(range(32))) == "groovy_mauve_canyon_3867"
    assert petname(ALICE) == "polite_spiral_lantern_3941"
    assert petname(BOB) == "dreamy_spotted_ivy_6889"


@pytest.mark.parametrize("words", [FIRST_WORDS, SECOND_WORDS, NOUNS])
def test_each_word_list_has_256_distinct_lowercase_words(words: tuple[str, ...]) -> None:
    assert len(words) == 256
    assert len(set(words)) == 256
    assert all(re.fullmatch(r"[a-z]+", word) for word in words)


def test_word_lists_are_disjoint() -> None:
    assert not set(FIRST_WORDS) & set(SECOND_WORDS)
    assert not set(FIRST_WORDS) & set(NOUNS)
    assert not set(SECOND_WORDS) & set(NOUNS)


@given(st.binary(min_size=32, max_size=32))
def test_petname_format_and_stability(node_id: bytes) -> None:
    name = petname(node_id)
    assert PETNAME.fullmatch(name)
    assert petname(node_id) == name
    first, second, noun, _ = name.split("_")
    assert first in FIRST_WORDS and second in SECOND_WORDS and noun in NOUNS


def test_puzzle_valid_identities_do_not_share_their_first_word() -> None:
    # the puzzle zeroes the leading bits of SHA-256(node_id); petnames read its other end
    rng = random.Random(7)
    names = [petname(Identity.generate(rng.randbytes, difficulty=8).node_id) for _ in range(12)]
    assert len({name.split("_")[0] for name in names}) > 6


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), "00" * 32, None, bytearray(32)])
def test_petname_refuses_anything_but_32_bytes(bad: object) -> None:
    with pytest.raises(PetnameError):
        petname(bad)  # type: ignore[arg-type]


# -- resolution ---------------------------------------------------------------------------------


def test_hex_resolves_without_a_roster_in_any_case_and_with_blanks() -> None:
    assert resolve(ALICE.hex(), []) == ALICE
    assert resolve(ALICE.hex().upper(), []) == ALICE
    assert resolve(f"  {BOB.hex()}\n", [ALICE]) == BOB
    assert parse_node_hex(ALICE.hex()) == ALICE
    assert parse_node_hex("zz" * 32) is None


@pytest.mark.parametrize("text", ["abc", "0" * 63, "0" * 65, "0" * 128])
def test_wrong_length_hex_is_refused(text: str) -> None:
    with pytest.raises(PetnameError, match="hex characters, not 64"):
        resolve(text, [ALICE])


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_input_is_refused(text: str) -> None:
    with pytest.raises(PetnameError, match="empty"):
        resolve(text, [ALICE])


def test_non_string_input_is_refused() -> None:
    with pytest.raises(PetnameError):
        resolve(ALICE, [ALICE])  # type: ignore[arg-type]


def test_petname_resolves_against_the_roster() -> None:
    roster = [ALICE, BOB]
    assert resolve(petname(ALICE), roster) == ALICE
    assert resolve(petname(BOB), roster) == BOB
    assert resolve(petname(BOB).upper(), iter(roster)) == BOB
    assert resolve(f" {petname(BOB)} ", roster) == BOB


def test_roster_duplicates_count_once_and_bad_entries_are_ignored() -> None:
    roster: list[object] = [ALICE, ALICE, b"short", "not bytes", BOB]
    assert resolve(petname(ALICE), roster) == ALICE  # type: ignore[arg-type]


def test_a_petname_of_an_unseen_agent_does_not_resolve() -> None:
    with pytest.raises(PetnameError, match="no agent in your roster") as info:
        resolve(petname(ALICE), [BOB])
    assert info.value.candidates == ()


def test_zero_matches_name_candidates_with_a_similar_prefix() -> None:
    full = petname(ALICE)
    three_words = full.rsplit("_", 1)[0]
    with pytest.raises(PetnameError) as info:
        resolve(three_words, [ALICE, BOB])
    assert info.value.candidates == (full,)
    assert full in str(info.value)

    typo = full[:-1] + ("0" if full[-1] != "0" else "1")
    with pytest.raises(PetnameError) as info:
        resolve(typo, [ALICE, BOB])
    assert info.value.candidates == (full,)


def test_zero_matches_with_nothing_similar_names_no_candidates() -> None:
    with pytest.raises(PetnameError) as info:
        resolve("xylophone_quiet_thing_0000", [ALICE, BOB])
    assert info.value.candidates == ()
    assert "did you mean" not in str(info.value)


def test_several_matches_name_every_node_id(monkeypatch: pytest.MonkeyPatch) -> None:
    carol = Identity(bytes([3]) * 32).node_id
    names = {ALICE: "same_name_here_0001", BOB: "same_name_here_0001", carol: "other_one_x_0002"}
    monkeypatch.setattr(petnames, "petname", names.__getitem__)
    with pytest.raises(PetnameError, match="collision") as info:
        resolve("same_name_here_0001", [carol, BOB, ALICE])
    assert info.value.candidates == tuple(sorted([ALICE.hex(), BOB.hex()]))
    assert ALICE.hex() in str(info.value) and BOB.hex() in str(info.value)
    assert resolve("other_one_x_0002", [carol, BOB, ALICE]) == carol
