"""``AdvertTable``: one advertiser per procedure, a per-connection index, expiring tombstones."""

from __future__ import annotations

from relay.core.adverts import Advertisement, AdvertTable

ALICE, BOB = b"a" * 32, b"b" * 32
ECHO, TIME = (b"r" * 32, "echo"), (b"r" * 32, "time")


def test_put_replaces_and_moves_the_connection_index() -> None:
    table = AdvertTable()
    table.put(ECHO, ALICE, 1)
    table.put(TIME, ALICE, 1)
    table.put(ECHO, BOB, 2)
    assert table.get(ECHO) == Advertisement(BOB, 2)
    assert table.keys_for(1) == [TIME] and table.count_for(2) == 1
    assert table.held_by(2, ECHO) and not table.held_by(1, ECHO)
    assert len(table) == 2


def test_remove_leaves_a_tombstone_until_its_time() -> None:
    table = AdvertTable()
    table.put(ECHO, ALICE, 1)
    assert table.remove(ECHO, tombstone_until_ms=1_000) == Advertisement(ALICE, 1)
    assert table.get(ECHO) is None and table.count_for(1) == 0
    assert table.released_by(ECHO, 999) == ALICE
    assert table.released_by(ECHO, 1_000) is None  # standing only before its time
    assert table.remove(ECHO, tombstone_until_ms=5_000) is None  # nothing left to remove
    assert dict(table.tombstones) == {ECHO: (ALICE, 1_000)}


def test_expire_deletes_only_tombstones_whose_time_has_come() -> None:
    table = AdvertTable()
    for key, until in ((ECHO, 1_000), (TIME, 2_000)):
        table.put(key, ALICE, 1)
        table.remove(key, until)
    table.expire(1_000)
    assert list(table.tombstones) == [TIME]
    table.expire(2_000)
    assert dict(table.tombstones) == {}
