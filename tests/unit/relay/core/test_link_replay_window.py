"""The replay window of a station link: per-signer floors, bounded memory (relay.core.admission)."""

from __future__ import annotations

import os

import pytest

from relay.core.admission import LinkReplayWindow
from relay.core.policy import ReplayWindow


def signers(n: int) -> list[bytes]:
    return [os.urandom(32) for _ in range(n)]


def interleaved(clients: list[bytes], per_client: int) -> list[tuple[bytes, bytes, int]]:
    """Round robin over clients whose clocks differ by a second each: every client's own
    frames ascend, the link's do not."""
    frames = []
    for n in range(per_client):
        for i, who in enumerate(clients):
            frames.append((who, os.urandom(16), 1_000_000 - i * 1_000 + n))
    return frames


def test_interleaved_clients_with_skewed_clocks_lose_nothing_on_a_small_window() -> None:
    frames = interleaved(signers(20), 30)
    window = LinkReplayWindow(capacity=25, max_floors=100)
    assert all(window.admit(who, fid, at) for who, fid, at in frames)
    # the per-connection window, given the same frames, refuses honest ones
    old = ReplayWindow(25)
    assert not all(old.admit(fid, at) for _, fid, at in frames)


def test_a_replay_is_refused_while_remembered_and_below_the_floor_once_forgotten() -> None:
    alice, bob = signers(2)
    window = LinkReplayWindow(capacity=3, max_floors=10)
    assert window.admit(alice, b"a" * 16, 10)
    assert not window.admit(alice, b"a" * 16, 10)  # remembered
    assert window.admit(bob, b"a" * 16, 10)  # the same id from someone else is not a replay
    for n in range(3):
        assert window.admit(bob, bytes([n]) * 16, 20 + n)
    assert not window.admit(alice, b"a" * 16, 10)  # forgotten, but at alice's floor
    assert window.admit(alice, b"c" * 16, 11)  # alice's newer frames still pass
    assert window.admit(alice, b"z" * 16, 5) is False  # older than what was forgotten


def test_memory_stays_bounded_under_a_flood_of_signers() -> None:
    window = LinkReplayWindow(capacity=100, max_floors=50)
    for who in signers(2_000):
        window.admit(who, os.urandom(16), 1_000)
    assert len(window.seen) == 100 and len(window.floors) == 50
    # floors had to be forgotten: the link-wide floor now holds, stricter, never looser
    assert window.floor_ms == 1_000
    assert not window.admit(os.urandom(32), os.urandom(16), 1_000)
    assert window.admit(os.urandom(32), os.urandom(16), 1_001)


def test_forget_before_drops_what_the_skew_check_refuses_anyway() -> None:
    alice = os.urandom(32)
    window = LinkReplayWindow(capacity=1, max_floors=1)
    window.admit(alice, b"a" * 16, 10)
    window.admit(alice, b"b" * 16, 20)  # forgets "a": alice's floor is 10
    window.admit(os.urandom(32), b"c" * 16, 30)  # forgets "b": alice's floor is 20
    window.admit(os.urandom(32), b"d" * 16, 40)  # forgets "c": two floors, alice's goes
    assert window.floor_ms == 20 and list(window.floors.values()) == [30]
    window.forget_before(25)
    assert window.floor_ms == -1 and list(window.floors.values()) == [30]
    window.forget_before(41)
    assert not window


def test_a_signer_that_is_not_a_node_id_is_a_bug() -> None:
    with pytest.raises(ValueError, match="32-byte"):
        LinkReplayWindow(1, 1).admit(b"short", b"x" * 16, 1)
