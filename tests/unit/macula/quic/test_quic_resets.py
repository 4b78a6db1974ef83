"""``macula.quic.resets``: stateless reset tokens derived from the station's key, the reset
packet (RFC 9000 §10.3), its detection, the rate limit; and ``StationChoice.restarted``, the
redial a reset earns."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from macula.client.backoff import Backoff
from macula.client.station_choice import StationChoice
from macula.quic.backend import (
    STATELESS_RESETS,
    QuicConfiguration,
    QuicConnection,
    derive_reset_tokens,
)
from macula.quic.resets import (
    FIXED_BIT,
    RESET_MIN_SIZE,
    SHORT_TRIGGER,
    TOKEN_SIZE,
    ResetLimiter,
    StatelessResets,
    is_reset,
    reset_packet,
    reset_secret,
    reset_token,
    unknown_cid,
)
from macula.wire.identity import Identity
from relay.station.tls import ensure_certificate

SEED_A = bytes(range(32))
SEED_B = bytes(range(1, 33))
CID = bytes.fromhex("0102030405060708")
OTHER_CID = bytes.fromhex("0102030405060709")


def counting_bytes() -> tuple[list[int], object]:
    """Random bytes that are a counter (predictable here, so a layout can be checked)."""
    state = [0]

    def random_bytes(n: int) -> bytes:
        out = bytes((state[0] + i) % 256 for i in range(n))
        state[0] += n
        return out

    return state, random_bytes


def test_a_token_is_the_same_for_the_same_key_and_connection_id() -> None:
    assert reset_token(reset_secret(SEED_A), CID) == reset_token(reset_secret(SEED_A), CID)
    token = StatelessResets(SEED_A, os.urandom).token(CID)
    assert token == StatelessResets(SEED_A, os.urandom).token(CID)  # the next process's
    assert len(token) == TOKEN_SIZE


def test_a_token_differs_across_keys_and_connection_ids() -> None:
    tokens = {
        reset_token(reset_secret(seed), cid)
        for seed in (SEED_A, SEED_B)
        for cid in (CID, OTHER_CID, b"", bytes(20))
    }
    assert len(tokens) == 8
    # the secret is not the seed, nor a plain hash of the connection id
    assert reset_secret(SEED_A) != SEED_A and len(reset_secret(SEED_A)) == 32


def test_a_secret_needs_a_32_byte_seed() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        reset_secret(b"short")


@pytest.mark.parametrize("trigger", [22, 30, SHORT_TRIGGER, SHORT_TRIGGER + 1])
def test_a_reset_to_a_short_packet_is_one_byte_shorter(trigger: int) -> None:
    token = reset_token(reset_secret(SEED_A), CID)
    packet = reset_packet(token, trigger, os.urandom)
    assert packet is not None and len(packet) == trigger - 1


@pytest.mark.parametrize("trigger", [SHORT_TRIGGER + 2, 100, 1200, 16000])
def test_a_reset_to_a_larger_packet_is_smaller_and_at_most_64_bytes(trigger: int) -> None:
    token = reset_token(reset_secret(SEED_A), CID)
    sizes = set()
    for _ in range(50):
        packet = reset_packet(token, trigger, os.urandom)
        assert packet is not None
        assert RESET_MIN_SIZE <= len(packet) < trigger and len(packet) <= 64
        sizes.add(len(packet))
    assert len(sizes) > 1 or trigger == SHORT_TRIGGER + 2  # sizes vary where they can


def test_the_reset_layout_is_a_short_header_then_unpredictable_bytes_then_the_token() -> None:
    token = reset_token(reset_secret(SEED_A), CID)
    for _ in range(100):
        packet = reset_packet(token, 200, os.urandom)
        assert packet is not None
        assert packet[0] & 0xC0 == 0x40  # 0b01xxxxxx: short header, fixed bit set
        assert packet.endswith(token)
    first = reset_packet(token, 200, os.urandom)
    second = reset_packet(token, 200, os.urandom)
    assert first is not None and second is not None
    assert first[:-TOKEN_SIZE] != second[:-TOKEN_SIZE]  # unpredictable, not a fixed prefix
    _, counting = counting_bytes()
    made = reset_packet(token, 30, counting)  # type: ignore[arg-type]
    assert made is not None and made[1 : 29 - TOKEN_SIZE] == bytes(range(1, 13))


@pytest.mark.parametrize("trigger", [0, 1, 20, RESET_MIN_SIZE])
def test_no_reset_answers_a_packet_too_small_for_a_smaller_one(trigger: int) -> None:
    assert reset_packet(bytes(TOKEN_SIZE), trigger, os.urandom) is None


def test_a_reset_token_must_be_16_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        reset_packet(b"short", 100, os.urandom)


def test_detection_matches_only_the_right_token() -> None:
    token = reset_token(reset_secret(SEED_A), CID)
    packet = reset_packet(token, 100, os.urandom)
    assert packet is not None and is_reset(packet, token)
    assert not is_reset(packet, reset_token(reset_secret(SEED_B), CID))  # another key
    assert not is_reset(packet, reset_token(reset_secret(SEED_A), OTHER_CID))  # another id
    assert not is_reset(packet, None) and not is_reset(packet, b"")  # no token given
    assert not is_reset(packet[:-1] + bytes([packet[-1] ^ 1]), token)  # one bit off
    assert not is_reset(token, token)  # 16 bytes: too short to be a reset
    assert is_reset(bytes(RESET_MIN_SIZE - TOKEN_SIZE) + token, token)


def test_only_a_short_header_packet_with_room_for_a_connection_id_is_a_candidate() -> None:
    short = bytes([0x41]) + CID + bytes(30)
    assert unknown_cid(short, 8) == CID
    assert unknown_cid(bytes([0xC0]) + bytes(60), 8) is None  # long header: Initial, ...
    assert unknown_cid(bytes([0x01]) + CID + bytes(30), 8) is None  # fixed bit zero
    assert unknown_cid(bytes([0x41]) + CID[:7], 8) is None  # no room for the id
    assert unknown_cid(b"", 8) is None
    assert FIXED_BIT == 0x40


def test_the_limiter_allows_a_burst_then_the_rate() -> None:
    limiter = ResetLimiter(rate=10, burst=3)
    now = 100.0
    assert [limiter.allow(now) for _ in range(5)] == [True, True, True, False, False]
    now += 0.05  # half a reset's worth
    assert not limiter.allow(now)
    now += 0.06
    assert limiter.allow(now) and not limiter.allow(now)
    now += 60  # a long quiet time refills only the burst
    assert [limiter.allow(now) for _ in range(4)] == [True, True, True, False]


def test_a_limiter_needs_a_positive_rate_and_burst() -> None:
    with pytest.raises(ValueError):
        ResetLimiter(rate=0)
    with pytest.raises(ValueError):
        ResetLimiter(burst=0)


def test_a_station_answers_with_the_token_of_the_unknown_id_within_its_rate() -> None:
    resets = StatelessResets(SEED_A, os.urandom, ResetLimiter(rate=1, burst=2))
    datagram = bytes([0x41]) + CID + bytes(60)
    answers = [resets.answer(datagram, CID, 5.0) for _ in range(4)]
    assert answers[2] is None and answers[3] is None
    for answer in answers[:2]:
        assert answer is not None and is_reset(answer, resets.token(CID))
        assert len(answer) < len(datagram)
    assert (resets.sent, resets.limited, resets.too_small) == (2, 2, 0)
    assert resets.answer(datagram[:RESET_MIN_SIZE], CID, 10.0) is None  # too small
    assert (resets.sent, resets.limited, resets.too_small) == (2, 2, 1)


def test_resets_answering_each_other_run_out_of_bytes() -> None:
    """§10.3.3: two ends answering each other's resets stop, each reset being smaller."""
    resets = StatelessResets(SEED_A, os.urandom, ResetLimiter(rate=1e9, burst=10**6))
    datagram: bytes | None = bytes([0x41]) + bytes(1199)
    answered = 0
    while datagram is not None:
        datagram = resets.answer(datagram, datagram[1:9], float(answered))
        answered += 1
    assert answered < 50 and resets.too_small == 1


STEADY = Backoff(initial_s=1.0, factor=2.0, max_s=8.0, jitter=0.2, uniform=lambda a, b: (a + b) / 2)


def test_a_reset_after_a_settled_connection_redials_the_same_station_at_once() -> None:
    choice = StationChoice(3, STEADY, settle_s=10)
    choice.connected(100.0)
    step = choice.restarted(200.0)
    assert (step.index, step.wait_s, step.round_failed, step.rounds_failed) == (0, 0.0, 0, 0)
    choice.connected(200.5)
    step = choice.restarted(201.0)  # again before it settled: handled as any loss
    assert (step.index, step.wait_s) == (1, 0.0)


def test_a_reset_on_the_only_station_before_it_settled_waits_the_backoff() -> None:
    choice = StationChoice(1, STEADY, settle_s=10)
    choice.connected(100.0)
    step = choice.restarted(101.0)
    assert (step.index, step.wait_s, step.round_failed) == (0, 1.0, 1)


@pytest.mark.skipif(not STATELESS_RESETS, reason="the token hook is aioquic's")
def test_the_hook_derives_the_token_of_every_id_aioquic_makes(tmp_path: Path) -> None:
    """``derive_reset_tokens`` on a server connection: the first id's token (the transport
    parameter's) and those of the ids aioquic makes later (NEW_CONNECTION_ID) are derived."""
    resets = StatelessResets(SEED_A, os.urandom)
    configuration = QuicConfiguration(is_client=False)
    configuration.load_cert_chain(*ensure_certificate(tmp_path, Identity(SEED_A), ["localhost"]))
    quic = QuicConnection(configuration=configuration, original_destination_connection_id=CID)
    assert derive_reset_tokens(quic, resets.token)
    quic._remote_active_connection_id_limit = 4
    quic._replenish_connection_ids()
    ids = quic._host_cids
    assert len(ids) == 4 and len({c.cid for c in ids}) == 4
    assert all(c.stateless_reset_token == resets.token(c.cid) for c in ids)
