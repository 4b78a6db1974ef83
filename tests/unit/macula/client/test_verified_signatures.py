"""``macula.wire.verified``: a ``publisher_sig`` this process verified is not verified again
here (one EVENT reaching several nodes of one process: a daemon's agents), and nothing that did
not verify is ever taken as verified."""

from __future__ import annotations

import os
from typing import Any

import nacl.bindings
import pytest

from macula.client.events import EventArrived
from macula.wire.identity import DOMAIN_EVENT_PUB, Identity
from macula.wire.verified import VerifiedSignatures
from support.pairkit import ALICE, BOB, CAROL, REALM, Link, established
from support.stationmesh import Clock

KEY = Identity(bytes([7]) * 32)


@pytest.fixture
def verifies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    count = [0]
    real = nacl.bindings.crypto_sign_open

    def counted(*args: Any) -> Any:
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(nacl.bindings, "crypto_sign_open", counted)
    return count


def signed(message: bytes) -> tuple[bytes, bytes]:
    message = DOMAIN_EVENT_PUB + message
    return message, KEY.sign(message)


def test_a_claim_that_verified_is_not_verified_again(verifies: list[int]) -> None:
    cache = VerifiedSignatures()
    message, signature = signed(b"hello")
    assert cache.verify(KEY.node_id, message, signature) is True
    assert cache.verify(KEY.node_id, message, signature) is True
    assert verifies == [1] and (cache.verifies, cache.hits) == (1, 1)


def test_a_bad_claim_is_checked_every_time_and_never_remembered(verifies: list[int]) -> None:
    cache = VerifiedSignatures()
    message, signature = signed(b"hello")
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    assert cache.verify(KEY.node_id, message, forged) is False
    assert cache.verify(KEY.node_id, message, forged) is False
    assert verifies == [2] and len(cache) == 0


def test_a_good_signature_on_another_message_or_key_is_verified_and_fails(
    verifies: list[int],
) -> None:
    cache = VerifiedSignatures()
    message, signature = signed(b"hello")
    assert cache.verify(KEY.node_id, message, signature) is True
    assert cache.verify(KEY.node_id, message + b"!", signature) is False
    assert cache.verify(ALICE.node_id, message, signature) is False
    assert cache.verify(KEY.node_id, message, signature[:63]) is False  # malformed: no lookup
    assert verifies == [3]


def test_it_keeps_at_most_its_capacity_the_oldest_forgotten_first(verifies: list[int]) -> None:
    cache = VerifiedSignatures(capacity=3)
    claims = [signed(os.urandom(8)) for _ in range(5)]
    for message, signature in claims:
        assert cache.verify(KEY.node_id, message, signature)
    assert len(cache) == 3 and verifies == [5]
    assert cache.verify(KEY.node_id, *claims[0])  # forgotten: verified again
    assert cache.verify(KEY.node_id, *claims[4])  # still there
    assert verifies == [6]
    with pytest.raises(ValueError):
        VerifiedSignatures(capacity=0)


def test_one_event_to_two_nodes_of_one_process_costs_one_verify(verifies: list[int]) -> None:
    """What the daemon's agents (or a benchmark's subscribers) share: each node still gets the
    event authenticated; the Ed25519 check ran once."""
    link = Link(Clock())
    alice = established(link, ALICE, tls_pinned=True)
    listeners = [established(link, who, tls_pinned=True) for who in (BOB, CAROL)]
    for end in listeners:
        link.client_did(end, end.core.subscribe(REALM, "news", link.clock.now))
        link.flush(end)
    before = verifies[0]
    link.client_did(alice, alice.core.publish(REALM, "news", "hi", 1, link.clock.now))
    for end in listeners:
        assert [(o.event.payload, o.authenticated) for o in end.take(EventArrived)] == [
            ("hi", True)
        ]
    assert verifies[0] - before == 1
