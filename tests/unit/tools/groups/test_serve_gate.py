"""``tools.groups.serve_gate``: the environment, allowlist and per-caller rate of a served
command."""

from __future__ import annotations

import pytest

from macula.agent.contact_policy import Mode, PolicyState
from tools.groups.serve_gate import CallerBuckets, ServeGate, command_env

ALICE = bytes([1]) * 32
BOB = bytes([2]) * 32


def test_the_environment_holds_only_the_passed_names_and_the_call() -> None:
    server = {"PATH": "/bin", "HOME": "/h", "OPENAI_API_KEY": "sk-x", "LANG": "C.UTF-8"}
    env = command_env(server, ALICE, "org.example.p", bytes(32))
    assert env == {
        "PATH": "/bin",
        "HOME": "/h",
        "LANG": "C.UTF-8",
        "MACULA_CALLER": ALICE.hex(),
        "MACULA_PROCEDURE": "org.example.p",
        "MACULA_REALM": "00" * 32,
    }


def test_each_caller_has_a_minutes_worth_then_waits() -> None:
    now = [0]
    gate = ServeGate("p", rate_per_minute=3, clock=lambda: now[0])
    assert [gate.check(ALICE) for _ in range(3)] == [None, None, None]
    refused = gate.check(ALICE)
    assert refused is not None and refused[0] == "rate_limited"
    assert "at most 3 calls a minute of p" in refused[1] and "retry in 20000 ms" in refused[1]
    assert gate.check(BOB) is None  # another caller is unaffected
    now[0] = 20_000  # one token back
    assert gate.check(ALICE) is None and gate.check(ALICE) is not None


def test_tracked_callers_are_bounded_forgetting_refilled_buckets_first() -> None:
    buckets = CallerBuckets(60, max_tracked=3)
    for n in range(3):
        assert buckets.take(bytes([n]) * 32, 0) == 0
    assert buckets.take(bytes([9]) * 32, 0) == 0  # none refilled: the oldest goes
    assert len(buckets) == 3
    assert buckets.take(bytes([10]) * 32, 60_000) == 0  # all refilled: all forgotten
    assert len(buckets) == 1
    with pytest.raises(ValueError, match="per_minute"):
        CallerBuckets(0)


def test_allowlist_mode_reads_the_policy_on_every_call() -> None:
    listed: list[str] = []
    gate = ServeGate("p", allow="allowlist", policy=lambda: PolicyState(Mode.ASK, tuple(listed)))
    refused = gate.check(ALICE)
    assert refused is not None and refused[0] == "refused" and ALICE.hex() in refused[1]
    listed.append(ALICE.hex())
    assert gate.check(ALICE) is None
    assert ServeGate("p").check(BOB) is None  # open: anyone
    with pytest.raises(ValueError, match="allow"):
        ServeGate("p", allow="friends")
