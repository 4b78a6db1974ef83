"""The client's EVENT dedup (macula.client.intent.EventDedup) and station-attested events (issue
22):
an unsigned event a linked station vouches for never shadows the publisher's signed one, nor
another station's; the same event twice is still one."""

from __future__ import annotations

import os

from macula.client.intent import EventDedup
from macula.wire.frames import Event, new_frame_id

REALM = bytes([3]) * 32
PUBLISHER, X, Y = (os.urandom(32) for _ in range(3))
NOW = 1_767_225_600_000


def event(seq: int, *, sig: bytes | None = None, attested_by: bytes | None = None) -> Event:
    return Event(
        frame_id=new_frame_id(NOW, os.urandom(10)),
        sent_at_ms=NOW,
        topic="news",
        realm=REALM,
        publisher=PUBLISHER,
        seq=seq,
        payload=seq,
        publisher_sig=sig,
        attested_by=attested_by,
    )


def test_a_station_attested_event_never_shadows_the_signed_one_or_another_stations() -> None:
    dedup = EventDedup()
    assert dedup.first_time(event(1, attested_by=X))  # a hostile station front-runs seq 1
    assert dedup.first_time(event(1, attested_by=Y))
    assert dedup.first_time(event(1, sig=bytes(64)))  # the signed one still arrives
    assert not dedup.first_time(event(1, attested_by=X))
    assert not dedup.first_time(event(1, sig=bytes(64)))
    assert dedup.duplicates == 2


def test_an_unsigned_event_of_the_own_station_dedups_as_before() -> None:
    dedup = EventDedup()
    assert dedup.first_time(event(2))
    assert not dedup.first_time(event(2))
    assert dedup.duplicates == 1
