"""``StationSubscriptions``: the two indexes agree, and nothing is kept for an empty entry."""

from __future__ import annotations

from relay.core.subscriptions import StationSubscriptions

ALICE, BOB = b"a" * 32, b"b" * 32
NEWS, SPORT = (b"r" * 32, b"news"), (b"r" * 32, b"sport")


def test_add_is_seen_from_both_sides_and_is_idempotent() -> None:
    table = StationSubscriptions()
    table.add(ALICE, NEWS)
    table.add(ALICE, NEWS)
    table.add(BOB, NEWS)
    assert set(table.subscribers(NEWS)) == {ALICE, BOB}
    assert table.has(ALICE, NEWS) and not table.has(ALICE, SPORT)
    assert table.count_for(ALICE) == 1 and len(table) == 1


def test_remove_deletes_emptied_entries() -> None:
    table = StationSubscriptions()
    table.add(ALICE, NEWS)
    table.remove(ALICE, NEWS)
    table.remove(BOB, SPORT)  # never subscribed: a no-op
    assert not table.subscribers(NEWS)
    assert len(table) == 0 and set(table.nodes()) == set()


def test_purge_forgets_one_node_only() -> None:
    table = StationSubscriptions()
    for key in (NEWS, SPORT):
        table.add(ALICE, key)
    table.add(BOB, NEWS)
    table.purge(ALICE)
    assert set(table.nodes()) == {BOB}
    assert set(table.subscribers(NEWS)) == {BOB} and not table.subscribers(SPORT)
    assert table.count_for(ALICE) == 0
