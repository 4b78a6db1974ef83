"""Join codes, the wrong-guess limit, and the join request's proof of possession."""

from __future__ import annotations

import itertools
import os

import pytest

from macula.realm.codes import ALPHABET, CODE_LENGTH, GuessLimiter, display, new_code, normalize
from macula.realm.join import JoinRefused, ReplayCache, build_request, check_request
from macula.wire.identity import Identity

NOW = 1_800_000_000_000
SERVICE = Identity(bytes([9]) * 32)
ALICE = Identity(bytes([5]) * 32)
MALLORY = Identity(bytes([6]) * 32)
NAME = "org.example.team"


def test_codes_are_from_the_unambiguous_alphabet_and_vary() -> None:
    codes = {new_code(os.urandom) for _ in range(200)}
    assert len(codes) == 200
    for code in codes:
        assert len(code) == CODE_LENGTH and set(code) <= set(ALPHABET)
    assert not set("01ILOU") & set(ALPHABET)


def test_code_generation_has_no_modulo_bias_path() -> None:
    # bytes >= 240 are rejected (240 = 8 * 30): a source giving only those at first is skipped
    source = itertools.chain([bytes([255] * CODE_LENGTH)], itertools.repeat(bytes(range(8))))
    code = new_code(lambda n: next(source))
    assert code == "".join(ALPHABET[i] for i in range(8))


def test_normalize_and_display() -> None:
    code = new_code(os.urandom)
    shown = display(code)
    assert shown[4] == "-" and normalize(shown) == code
    assert normalize(shown.lower()) == code and normalize(f" {code[:4]} {code[4:]} ") == code
    for bad in ("", "ABC", "ABCD-EFG0", "ABCD-EFGHJ", "x" * 100):
        assert normalize(bad) is None


def test_guess_limiter_blocks_after_max_wrong_in_window() -> None:
    limiter = GuessLimiter(max_wrong=3, window_ms=1000)
    assert limiter.blocked_for_ms([NOW, NOW + 1], NOW + 2) == 0
    assert limiter.blocked_for_ms([NOW, NOW + 1, NOW + 2], NOW + 3) == 997
    assert limiter.blocked_for_ms([NOW, NOW + 1, NOW + 2], NOW + 1000) == 0  # first slid out
    with pytest.raises(ValueError):
        GuessLimiter(0, 1)


def check(
    payload: object,
    caller: bytes = ALICE.node_id,
    now: int = NOW,
    replays: ReplayCache | None = None,
    name: str = NAME,
) -> tuple[str, bytes]:
    return check_request(
        payload,
        name=name,
        service_key=SERVICE.node_id,
        caller=caller,
        now_ms=now,
        replays=ReplayCache() if replays is None else replays,
    )


def refused(payload: object, **kw: object) -> str:
    with pytest.raises(JoinRefused) as excinfo:
        check(payload, **kw)  # type: ignore[arg-type]
    return excinfo.value.reason


def test_a_fresh_request_is_accepted_once_and_a_replay_refused() -> None:
    request = build_request(ALICE, NAME, SERVICE.node_id, "start", NOW)
    replays = ReplayCache()
    assert check(request, replays=replays) == ("start", ALICE.node_id)
    assert refused(request, replays=replays) == "replayed"


def test_bad_requests_are_refused_each_with_its_reason() -> None:
    good = build_request(ALICE, NAME, SERVICE.node_id, "start", NOW)
    assert refused(None) == "malformed"
    assert refused({**good, "op": "steal"}) == "malformed"
    assert refused({**good, "public_key": b"x"}) == "malformed"
    assert refused(good, caller=MALLORY.node_id) == "wrong_node"  # someone else's CALL
    assert refused(good, now=NOW + 61_000) == "stale"
    assert refused(good, name="org.example.other") == "wrong_realm"
    # bound to the op: a start proof does not poll
    assert refused({**good, "op": "poll"}) == "bad_proof"
    # bound to the service: a proof made for another join service
    other = build_request(ALICE, NAME, MALLORY.node_id, "start", NOW)
    assert refused(other) == "bad_proof"
    # mallory's key with alice's proof
    assert refused({**good, "public_key": MALLORY.node_id}, caller=MALLORY.node_id) == "bad_proof"
    proof = dict(good["proof"])
    proof["signature"] = "00" * 64
    assert refused({**good, "proof": proof}) == "bad_proof"


def test_replay_cache_is_bounded_and_forgets_old_entries() -> None:
    cache = ReplayCache(max_entries=2, skew_ms=1000)
    cache.admit(("a", 1, "s"), NOW)
    cache.admit(("b", 1, "s"), NOW)
    with pytest.raises(JoinRefused) as excinfo:
        cache.admit(("c", 1, "s"), NOW + 1)
    assert excinfo.value.reason == "busy"
    cache.admit(("c", 1, "s"), NOW + 2000)  # the old ones expired
    assert len(cache) == 1
