"""Contact policy: reading the file (every failure means ask), overrides, decisions, trust."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from macula.agent.contact_policy import (
    Answer,
    Decision,
    Mode,
    PolicyFileError,
    PolicyState,
    decide,
    load_policy,
    parse_mode,
    trust,
    untrust,
)
from support.paths import file_mode

ALICE = bytes([0xAA]) * 32
BOB = bytes([0xBB]) * 32


def write(path: Path, content: Any) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    return tmp_path / "contact_policy.json"


# -- reading ------------------------------------------------------------------------------------


def test_missing_file_is_ask_without_error(policy_file: Path) -> None:
    state = load_policy(policy_file, None)
    assert state == PolicyState(mode=Mode.ASK)
    assert state.error is None and state.mode_source == "default"


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("open", Mode.OPEN),
        ("ask", Mode.ASK),
        ("allowlist", Mode.ALLOWLIST),
        ("closed", Mode.CLOSED),
        (1, Mode.OPEN),
        (2, Mode.ASK),
        (3, Mode.ALLOWLIST),
        (4, Mode.CLOSED),
    ],
)
def test_names_and_numbers(policy_file: Path, value: object, mode: Mode) -> None:
    state = load_policy(write(policy_file, {"contact_policy": value}), None)
    assert (state.mode, state.file_mode, state.error, state.mode_source) == (
        mode,
        mode,
        None,
        "file",
    )


def test_a_file_without_contact_policy_is_ask_without_error(policy_file: Path) -> None:
    state = load_policy(write(policy_file, {"offers": ["erlang"], "future": {"x": 1}}), None)
    assert (state.mode, state.error, state.file_mode, state.offers) == (
        Mode.ASK,
        None,
        None,
        ("erlang",),
    )


@pytest.mark.parametrize("value", [0, 5, -1, True, False, "Open", "OPEN", "", None, 1.0, [1]])
def test_bad_contact_policy_values_mean_ask_with_an_error(policy_file: Path, value: object) -> None:
    state = load_policy(write(policy_file, {"contact_policy": value, "allowlist": []}), None)
    assert state.mode is Mode.ASK and state.file_mode is None
    assert state.error is not None and "contact_policy" in state.error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"closed"', "not a JSON object"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_unparseable_files_mean_ask_with_an_error(
    policy_file: Path, content: str, message: str
) -> None:
    state = load_policy(write(policy_file, content), None)
    assert state.mode is Mode.ASK and message in (state.error or "")
    assert str(policy_file) in (state.error or "")


def test_non_utf8_and_unreadable_files_mean_ask_with_an_error(tmp_path: Path) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'{"contact_policy": "\xff"}')
    assert "UTF-8" in (load_policy(binary, None).error or "")
    directory = tmp_path / "a_directory"
    directory.mkdir()
    state = load_policy(directory, None)
    assert state.mode is Mode.ASK and "cannot be read" in (state.error or "")
    state = load_policy(tmp_path / "nul\0byte", None)
    assert state.mode is Mode.ASK and "cannot be read" in (state.error or "")


def test_bad_allowlist_entries_mean_ask_but_valid_entries_are_kept(policy_file: Path) -> None:
    content = {
        "contact_policy": "closed",
        "allowlist": [ALICE.hex().upper(), "nope", 7, ALICE.hex(), f" {BOB.hex()} ", True],
    }
    state = load_policy(write(policy_file, content), None)
    assert state.mode is Mode.ASK and state.file_mode is Mode.CLOSED
    assert state.allowlist == (ALICE.hex(), BOB.hex())
    assert state.error is not None
    assert "allowlist[1] 'nope'" in state.error and "allowlist[2] 7" in state.error
    assert "allowlist[5] True" in state.error
    assert decide(state, ALICE).answer is Answer.ACCEPTED  # ask + listed
    assert decide(state, bytes(32)).answer is Answer.DEFERRED


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"allowlist": ALICE.hex()}, "allowlist is not a list"),
        ({"allowlist": {"a": 1}}, "allowlist is not a list"),
        ({"offers": "erlang"}, "offers is not a list"),
        ({"offers": ["ok", 3]}, "offers[1] 3 is not a string"),
    ],
)
def test_bad_allowlist_or_offers_shapes(policy_file: Path, content: Any, message: str) -> None:
    state = load_policy(write(policy_file, {"contact_policy": "open", **content}), None)
    assert state.mode is Mode.ASK and message in (state.error or "")


def test_every_problem_is_reported_together(policy_file: Path) -> None:
    state = load_policy(write(policy_file, {"contact_policy": 9, "allowlist": ["x"]}), "nine")
    error = state.error or ""
    assert "contact_policy 9" in error and "allowlist[0]" in error
    assert "MACULA_MCP_CONTACT_POLICY='nine'" in error
    assert error.count("; ") == 2


def test_the_file_is_re_read_on_every_call(policy_file: Path) -> None:
    write(policy_file, {"contact_policy": "open"})
    assert load_policy(policy_file, None).mode is Mode.OPEN
    write(policy_file, {"contact_policy": "closed"})
    assert load_policy(policy_file, None).mode is Mode.CLOSED
    policy_file.unlink()
    assert load_policy(policy_file, None).mode is Mode.ASK


# -- the environment override -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "mode"),
    [("open", Mode.OPEN), ("CLOSED", Mode.CLOSED), (" 3 ", Mode.ALLOWLIST), ("2", Mode.ASK)],
)
def test_override_replaces_the_file_mode(policy_file: Path, override: str, mode: Mode) -> None:
    write(policy_file, {"contact_policy": "open", "allowlist": [ALICE.hex()]})
    state = load_policy(policy_file, override)
    assert (state.mode, state.mode_source, state.error) == (mode, "override", None)
    assert state.file_mode is Mode.OPEN and state.allowlist == (ALICE.hex(),)


def test_override_applies_without_a_file_and_over_a_malformed_one(policy_file: Path) -> None:
    assert load_policy(policy_file, "closed").mode is Mode.CLOSED
    state = load_policy(write(policy_file, "{oops"), "open")
    assert state.mode is Mode.OPEN and "not valid JSON" in (state.error or "")


@pytest.mark.parametrize("override", ["sometimes", "5", "0", "true"])
def test_invalid_override_fails_closed_with_an_error(policy_file: Path, override: str) -> None:
    write(policy_file, {"contact_policy": "open"})
    state = load_policy(policy_file, override)
    assert state.mode is Mode.CLOSED and state.mode_source == "invalid_override"
    assert state.error is not None and "MACULA_MCP_CONTACT_POLICY" in state.error


@pytest.mark.parametrize("override", [None, "", "  "])
def test_unset_or_empty_override_is_ignored(policy_file: Path, override: str | None) -> None:
    write(policy_file, {"contact_policy": "closed"})
    assert load_policy(policy_file, override).mode is Mode.CLOSED


def test_parse_mode_refuses_bools_and_strings_of_digits() -> None:
    assert parse_mode(True) is None and parse_mode("1") is None and parse_mode(1) is Mode.OPEN


# -- deciding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "listed", "answer"),
    [
        (Mode.OPEN, False, Answer.ACCEPTED),
        (Mode.OPEN, True, Answer.ACCEPTED),
        (Mode.CLOSED, False, Answer.DECLINED),
        (Mode.CLOSED, True, Answer.DECLINED),
        (Mode.ALLOWLIST, True, Answer.ACCEPTED),
        (Mode.ALLOWLIST, False, Answer.DECLINED),
        (Mode.ASK, True, Answer.ACCEPTED),
        (Mode.ASK, False, Answer.DEFERRED),
    ],
)
def test_decide(mode: Mode, listed: bool, answer: Answer) -> None:
    state = PolicyState(mode=mode, allowlist=(ALICE.hex(),) if listed else (BOB.hex(),))
    decision = decide(state, ALICE)
    assert decision.answer is answer
    assert (
        int(decision.answer) == {Answer.ACCEPTED: 1, Answer.DECLINED: 2, Answer.DEFERRED: 3}[answer]
    )
    if answer is Answer.DECLINED:
        assert decision.reason
    if answer is Answer.ACCEPTED:
        assert decision == Decision(Answer.ACCEPTED)


# -- trust and untrust --------------------------------------------------------------------------


def test_trust_creates_the_file_0600_in_a_new_0700_directory(tmp_path: Path) -> None:
    path = tmp_path / "config" / "macula" / "contact_policy.json"
    state = trust(path, ALICE)
    assert state.mode is Mode.ALLOWLIST and state.allowlist == (ALICE.hex(),)
    assert json.loads(path.read_text()) == {
        "contact_policy": "allowlist",
        "allowlist": [ALICE.hex()],
    }
    assert file_mode(path) == 0o600
    assert file_mode(path.parent) == 0o700
    assert sorted(os.listdir(path.parent)) == ["contact_policy.json"]  # no temporary file left


def test_trust_twice_keeps_one_entry_and_respects_other_spellings(policy_file: Path) -> None:
    write(policy_file, {"contact_policy": "allowlist", "allowlist": [ALICE.hex().upper()]})
    before = policy_file.read_text()
    assert trust(policy_file, ALICE).allowlist == (ALICE.hex(),)
    assert policy_file.read_text() == before  # nothing to change, nothing written
    trust(policy_file, BOB)
    trust(policy_file, BOB)
    assert json.loads(policy_file.read_text())["allowlist"] == [ALICE.hex().upper(), BOB.hex()]


@pytest.mark.parametrize("ask", ["ask", 2, None])
def test_trust_flips_unset_or_ask_to_allowlist(policy_file: Path, ask: object) -> None:
    write(policy_file, {} if ask is None else {"contact_policy": ask})
    state = trust(policy_file, ALICE)
    assert state.mode is Mode.ALLOWLIST
    assert json.loads(policy_file.read_text())["contact_policy"] == "allowlist"


@pytest.mark.parametrize("explicit", ["open", "closed", 1, 4, "allowlist"])
def test_trust_leaves_an_explicit_mode_alone(policy_file: Path, explicit: object) -> None:
    write(policy_file, {"contact_policy": explicit})
    trust(policy_file, ALICE)
    data = json.loads(policy_file.read_text())
    assert data == {"contact_policy": explicit, "allowlist": [ALICE.hex()]}


def test_trust_keeps_every_other_key_and_makes_an_existing_file_0600(policy_file: Path) -> None:
    write(policy_file, {"offers": ["erlang"], "note": {"x": [1, 2]}, "allowlist": []})
    os.chmod(policy_file, 0o644)
    trust(policy_file, ALICE)
    data = json.loads(policy_file.read_text())
    assert data["offers"] == ["erlang"] and data["note"] == {"x": [1, 2]}
    assert file_mode(policy_file) == 0o600


def test_trust_keeps_invalid_entries_and_their_error(policy_file: Path) -> None:
    write(policy_file, {"allowlist": ["typo"]})
    state = trust(policy_file, ALICE)
    assert json.loads(policy_file.read_text())["allowlist"] == ["typo", ALICE.hex()]
    assert state.allowlist == (ALICE.hex(),) and "typo" in (state.error or "")


def test_trust_with_an_override_reports_the_effective_mode(policy_file: Path) -> None:
    state = trust(policy_file, ALICE, env_override="closed")
    assert state.mode is Mode.CLOSED and state.file_mode is Mode.ALLOWLIST


@pytest.mark.parametrize("content", ["{oops", "[]", '{"allowlist": "x"}'])
def test_trust_and_untrust_never_rewrite_a_file_they_cannot_parse(
    policy_file: Path, content: str
) -> None:
    write(policy_file, content)
    with pytest.raises(PolicyFileError):
        trust(policy_file, ALICE)
    with pytest.raises(PolicyFileError):
        untrust(policy_file, ALICE)
    assert policy_file.read_text() == content


@pytest.mark.parametrize("bad", [b"", bytes(31), ALICE.hex()])
def test_trust_and_untrust_need_a_node_id(policy_file: Path, bad: Any) -> None:
    with pytest.raises(ValueError):
        trust(policy_file, bad)
    with pytest.raises(ValueError):
        untrust(policy_file, bad)
    assert not policy_file.exists()


@pytest.mark.parametrize("mode", ["allowlist", "ask", "open", "closed", 3])
def test_untrust_removes_every_spelling_and_never_touches_the_mode(
    policy_file: Path, mode: object
) -> None:
    content = {"contact_policy": mode, "allowlist": [ALICE.hex(), BOB.hex(), ALICE.hex().upper()]}
    write(policy_file, content)
    state = untrust(policy_file, ALICE)
    assert json.loads(policy_file.read_text()) == {
        "contact_policy": mode,
        "allowlist": [BOB.hex()],
    }
    assert state.allowlist == (BOB.hex(),)
    assert file_mode(policy_file) == 0o600


def test_untrust_without_a_file_or_entry_writes_nothing(policy_file: Path) -> None:
    assert untrust(policy_file, ALICE).mode is Mode.ASK
    assert not policy_file.exists()
    write(policy_file, {"contact_policy": "ask", "allowlist": [BOB.hex()]})
    before = policy_file.read_text()
    untrust(policy_file, ALICE)
    assert policy_file.read_text() == before


def test_trust_then_untrust_round_trip(policy_file: Path) -> None:
    trust(policy_file, ALICE)
    trust(policy_file, BOB)
    state = untrust(policy_file, ALICE)
    assert state.mode is Mode.ALLOWLIST and state.allowlist == (BOB.hex(),)
    assert decide(state, ALICE).answer is Answer.DECLINED
    assert decide(state, BOB).answer is Answer.ACCEPTED
