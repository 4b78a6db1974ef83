"""The station's room history (relay.house.history): what is kept, bounds, expired marks,
pagination, bad arguments. Real SQLite files under ``tmp_path``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest

from macula.services.house import HISTORY_FETCH
from macula.wire.codes import ErrorCode
from macula.wire.frames import publication_signable
from macula.wire.identity import verify
from relay.house import history as history_module
from relay.house.history import HistoryBounds, HistoryService, HistoryStore, keepable
from relay.ops.cli import build_parser, config_from_args
from support.housekit import ALICE, BOB, NOW, ROOM, assert_no_booleans, fetch, ok, publish, refused
from support.running import run
from support.storekit import hold
from support.storekit import trips as trips_of
from support.waiting import eventually

OTHER = "agents.room." + "cd" * 16


async def service(tmp_path: Path, **bounds: int) -> HistoryService:
    store = await HistoryStore.open(tmp_path / "history.sqlite3")
    return HistoryService(store, HistoryBounds(**bounds))


def test_signed_room_events_are_kept_and_verify_end_to_end(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        for seq in (10, 20, 30):
            history.note(publish(ALICE, seq), NOW)
        history.note(publish(ALICE, 20), NOW)  # a repeat is kept once
        page = ok(await fetch(history))
        assert_no_booleans(page)
        assert [e["seq"] for e in page["events"]] == [10, 20, 30]
        assert page["more"] == 0 and page["expired"] == [] and page["forgotten"] == 0
        assert page["next_after_id"] == page["events"][-1]["id"]
        for event in page["events"]:
            signable = publication_signable(
                event["topic"], event["realm"], event["publisher"], event["seq"], event["payload"]
            )
            assert verify(event["publisher"], signable, event["publisher_sig"])
        assert page["events"][0]["payload"]["n"] == [1, 2, {"x": b"\x00"}]
        await history.store.close()

    run(go())


def test_forged_unsigned_and_foreign_topics_are_not_kept(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        history.note(publish(ALICE, 1, sign=False), NOW)
        forged = dataclasses.replace(publish(ALICE, 2), payload={"text": "swapped"})
        history.note(forged, NOW)
        stolen = dataclasses.replace(publish(ALICE, 3), publisher=BOB.node_id)
        history.note(stolen, NOW)
        history.note(publish(ALICE, 4, topic="agent.hello"), NOW)
        history.note(publish(ALICE, 5, topic="agents.room.NOTHEX"), NOW)
        history.note(publish(ALICE, 2**63), NOW)
        assert ok(await fetch(history))["events"] == []
        assert history.stats["unsigned"] == 1
        assert history.stats["bad_publisher_sig"] == 2
        assert history.stats["seq_out_of_range"] == 1
        assert await history.store.count() == 0
        await history.store.close()

    run(go())


def test_pages_follow_after_id_and_limit(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        for seq in range(1, 8):
            history.note(publish(ALICE if seq % 2 else BOB, seq), NOW)
        history.note(publish(ALICE, 100, topic=OTHER), NOW)
        seen: list[int] = []
        after = 0
        while True:
            page = ok(await fetch(history, after_id=after, limit=3))
            seen += [e["seq"] for e in page["events"]]
            after = page["next_after_id"]
            if not page["more"]:
                break
        assert seen == list(range(1, 8))
        assert ok(await fetch(history, after_id=after))["events"] == []
        only_other = ok(await history.handle(HISTORY_FETCH, {"topic": OTHER}, BOB.node_id, NOW))
        assert [e["seq"] for e in only_other["events"]] == [100]
        await history.store.close()

    run(go())


def test_reply_bytes_bound_a_page_but_one_event_always_goes(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        history.max_reply_bytes = 10
        for seq in (1, 2):
            history.note(publish(ALICE, seq, text="x" * 100), NOW)
        page = ok(await fetch(history))
        assert [e["seq"] for e in page["events"]] == [1] and page["more"] == 1
        page = ok(await fetch(history, after_id=page["next_after_id"]))
        assert [e["seq"] for e in page["events"]] == [2] and page["more"] == 0
        await history.store.close()

    run(go())


def test_per_room_and_global_caps_leave_expired_marks(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path, max_per_room=3, max_events=5)
        for seq in range(1, 6):
            history.note(publish(ALICE, seq), NOW)
        await history.write_pending()
        assert await history.store.count(ROOM) == 3
        page = ok(await fetch(history))
        assert [e["seq"] for e in page["events"]] == [3, 4, 5]
        assert [(m["publisher"], m["seq"]) for m in page["expired"]] == [
            (ALICE.node_id, 1),
            (ALICE.node_id, 2),
        ]
        for seq in range(1, 4):
            history.note(publish(BOB, seq, topic=OTHER), NOW)
        await history.write_pending()
        assert await history.store.count() == 5  # the global cap: the earliest went
        assert [e["seq"] for e in ok(await fetch(history))["events"]] == [4, 5]
        await history.store.close()

    run(go())


def test_age_expires_events_and_forgotten_marks_are_counted(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path, max_age_ms=1000, max_expired=1)
        history.note(publish(ALICE, 1), NOW)
        history.note(publish(ALICE, 2), NOW)
        await history.write_pending(NOW)
        history.note(publish(ALICE, 3), NOW + 5000)
        await history.write_pending(NOW + 5000)
        page = ok(await fetch(history))
        assert [e["seq"] for e in page["events"]] == [3]
        assert [m["seq"] for m in page["expired"]] == [1, 2]
        await history.store.prune(history.bounds, NOW + 5000)  # marks beyond max_expired go
        page = ok(await fetch(history))
        assert [m["seq"] for m in page["expired"]] == [2]
        assert page["forgotten"] == 1 and page["forgotten_through_id"] > 0
        assert ok(await fetch(history, after_id=page["next_after_id"]))["forgotten"] == 0
        await history.store.close()

    run(go())


def test_since_ms_filters_by_station_receipt(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        history.note(publish(ALICE, 1), NOW - 10)
        history.note(publish(ALICE, 2), NOW)
        page = ok(await fetch(history, since_ms=NOW))
        assert [e["seq"] for e in page["events"]] == [2]
        await history.store.close()

    run(go())


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (None, "must be a map"),
        ({}, "missing 'topic'"),
        ({"topic": 7}, "'topic' must be"),
        ({"topic": "agent.hello"}, "'topic' must be 'agents.lobby'"),
        ({"topic": ROOM, "after_id": -1}, "'after_id' must be an int"),
        ({"topic": ROOM, "after_id": True}, "'after_id' must be an int"),
        ({"topic": ROOM, "limit": 0}, "'limit' must be an int 1..500"),
        ({"topic": ROOM, "limit": 501}, "'limit' must be an int 1..500"),
        ({"topic": ROOM, "since_ms": "now"}, "'since_ms' must be an int"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, payload: object, words: str) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        outcome = await history.handle(HISTORY_FETCH, payload, BOB.node_id, NOW)
        assert words in refused(outcome, "bad_request")
        await history.store.close()

    run(go())


def test_unknown_procedure_and_rate_limit(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path)
        unknown = await history.handle("macula.history.nope", {}, BOB.node_id, NOW)
        assert unknown.code == ErrorCode.UNKNOWN_NEXT_PEER
        outcomes = [await fetch(history) for _ in range(200)]
        limited = [o for o in outcomes if o.is_error]
        assert limited and limited[0].code == ErrorCode.UPSTREAM_CONGESTION
        assert limited[0].detail is not None and b"rate_limited" in limited[0].detail
        assert not (await fetch(history, caller=ALICE.node_id)).is_error  # per caller
        await history.store.close()

    run(go())


def test_pending_queue_is_bounded(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path, max_pending=2)
        for seq in range(1, 5):
            history.note(publish(ALICE, seq), NOW)
        assert history.stats["dropped_pending"] == 2
        assert await history.write_pending() == 2
        await history.store.close()

    run(go())


def test_kept_across_a_restart_and_ids_never_repeat(tmp_path: Path) -> None:
    async def go() -> None:
        history = await service(tmp_path, max_per_room=1)
        history.note(publish(ALICE, 1), NOW)
        history.note(publish(ALICE, 2), NOW)
        last = ok(await fetch(history))["next_after_id"]
        await history.store.close()
        history = await service(tmp_path, max_per_room=1)
        history.note(publish(ALICE, 3), NOW)
        page = ok(await fetch(history, after_id=last))
        assert [e["seq"] for e in page["events"]] == [3] and page["events"][0]["id"] > last
        await history.store.close()

    run(go())


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_per_room"):
        HistoryBounds(max_per_room=0)


def test_the_relay_flags_set_the_history_bounds(tmp_path: Path) -> None:
    base = ["--data-dir", str(tmp_path)]
    default = config_from_args(build_parser().parse_args(base)).house
    assert default.history == 1 and default.history_bounds == HistoryBounds()
    flags = [
        *("--history-max-per-room", "7", "--history-max-events", "70"),
        *("--history-max-age-s", "60", "--history-max-expired", "9", "--no-history"),
    ]
    house = config_from_args(build_parser().parse_args([*base, *flags])).house
    assert house.history == 0
    assert house.history_bounds == HistoryBounds(
        max_per_room=7, max_events=70, max_age_ms=60_000, max_expired=9
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--history-max-per-room", "0"])


def test_the_caps_hold_on_counts_kept_by_the_writes_across_restarts(tmp_path: Path) -> None:
    """The store counts its rows once, then follows every keep and prune (the caps walk only
    what they remove): after each write the real tables hold exactly what the caps allow, the
    oldest going first, also after a restart and after a keep that was rolled back."""

    async def real(store: HistoryStore) -> tuple[int, int]:
        return await store.count(), await store.expired_count()

    async def go() -> None:
        bounds = {"max_per_room": 4, "max_events": 7, "max_expired": 5}
        history = await service(tmp_path, **bounds)
        seqs = itertools.count(1)
        for round_ in range(6):
            for topic in (ROOM, OTHER, ROOM):
                for _ in range(round_ % 3 + 1):
                    history.note(publish(ALICE, next(seqs), topic=topic), NOW)
                await history.write_pending(NOW)
                assert history.store._rows == await real(history.store)
                assert await history.store.count() <= 7 and await history.store.count(ROOM) <= 4
            if round_ == 2:  # the counts are read anew by a reopened store
                await history.store.close()
                history = await service(tmp_path, **bounds)
        await history.store.prune(history.bounds, NOW)
        assert history.store._rows == await real(history.store) == (7, 5)
        newest = ok(await fetch(history))["events"]
        assert [e["seq"] for e in newest] == sorted(e["seq"] for e in newest)
        assert newest[-1]["seq"] == next(seqs) - 1  # the newest stayed, the oldest went

        counted = history.store._rows
        real_prune = history_module._prune

        def pruned_then_failed(*args: Any, **kwargs: Any) -> tuple[int, int]:
            real_prune(*args, **kwargs)  # every write done, inside the transaction
            raise OSError("disk gone")

        history_module._prune = pruned_then_failed  # type: ignore[assignment]
        try:
            with pytest.raises(OSError):
                await history.store.keep(
                    [keepable(publish(ALICE, next(seqs)), NOW)], history.bounds, NOW
                )
        finally:
            history_module._prune = real_prune  # type: ignore[assignment]
        assert history.store._rows == counted == await real(history.store)  # rolled back
        history.note(publish(ALICE, next(seqs)), NOW)
        await history.write_pending(NOW)
        assert history.store._rows == await real(history.store) == (7, counted[1] + 1)
        await history.store.close()

    run(go())


def test_a_keep_is_one_trip_and_a_cancelled_one_leaves_the_counts_true(tmp_path: Path) -> None:
    """A keep (insert, age, room cap, global cap, commit) runs on the store's thread in one
    trip. A keep whose caller is cancelled while that trip runs still commits (the trip cannot
    be stopped there): the counts are read again by the next keep, never left behind."""

    async def go() -> None:
        history = await service(tmp_path, max_events=3)
        store = history.store
        trips = trips_of(store)
        seqs = itertools.count(1)
        await store.keep([keepable(publish(ALICE, next(seqs)), NOW)], history.bounds, NOW)
        assert len(trips) == 1  # the first keep also counts the tables, in the same trip
        await store.keep([keepable(publish(ALICE, next(seqs)), NOW)], history.bounds, NOW)
        assert len(trips) == 2
        release, holding = await hold(store)  # its call is the 3rd trip
        batch = [keepable(publish(ALICE, next(seqs)), NOW) for _ in range(2)]
        keeping = asyncio.ensure_future(store.keep(batch, history.bounds, NOW))  # type: ignore[arg-type]
        await eventually(
            lambda: len(trips) == 4, interval=0
        )  # the keep's trip is queued behind the held call
        keeping.cancel()
        release.set()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
        await holding
        assert keeping.cancelled() and store._rows is None
        assert await store.count() == 3  # it committed: 4 kept, the oldest went (cap 3)
        await store.keep([keepable(publish(ALICE, next(seqs)), NOW)], history.bounds, NOW)
        assert store._rows == (await store.count(), await store.expired_count()) == (3, 2)
        await store.close()

    run(go())
