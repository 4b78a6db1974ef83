"""``PendingCalls``: forwarded calls by id, counted per caller, selected by deadline or conn."""

from __future__ import annotations

from relay.core.pending import Pending, PendingCalls

PROVIDER = b"p" * 32


def pending(n: int, caller: int, provider: int, answer_by: int) -> Pending:
    return Pending(bytes([n]) * 16, caller, 0, provider, PROVIDER, answer_by)


def test_add_get_pop_keep_the_per_caller_count() -> None:
    table = PendingCalls()
    first, second = pending(1, 1, 9, 100), pending(2, 1, 9, 200)
    table.add(first)
    table.add(second)
    assert first.call_id in table and len(table) == 2
    assert table.get(second.call_id) is second
    assert table.in_flight_for(1) == 2 and table.in_flight_for(9) == 0
    assert table.pop(first.call_id) is first
    assert table.pop(first.call_id) is None  # popped once only
    assert table.in_flight_for(1) == 1 and first.call_id not in table


def test_due_selects_by_answer_by_in_insertion_order() -> None:
    table = PendingCalls()
    late, early, exact = pending(1, 1, 9, 300), pending(2, 1, 9, 100), pending(3, 2, 9, 200)
    for entry in (late, early, exact):
        table.add(entry)
    assert table.due(99) == []
    assert table.due(200) == [early, exact]
    assert len(table) == 3  # selecting does not remove


def test_involving_finds_calls_made_and_served_by_a_connection() -> None:
    table = PendingCalls()
    made, served, other = pending(1, 5, 9, 100), pending(2, 9, 5, 100), pending(3, 7, 9, 100)
    for entry in (made, served, other):
        table.add(entry)
    assert table.involving(5) == [made, served]
    assert table.involving(6) == []
