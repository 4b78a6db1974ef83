"""The station's path reservations (relay.house.reservations) over a real SQLite file, time
stepped by hand: conflicts, renewal, expiry, release, quotas, hostile arguments, restart
(issue 40)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from macula.services.house import LIST_RESERVATIONS, RELEASE_PATHS, RESERVE_PATHS
from macula.services.limits import MAX_RESERVATION_PATHS, MAX_RESERVATIONS_PER_HOLDER
from macula.wire.codes import ErrorCode
from relay.house.reservations import ReservationService, ReservationStore
from support.running import run

ALICE, BOB, CAROL = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
PROJECT = "github.com/org/repo"
T0 = 1_000_000


class Station:
    def __init__(self, service: ReservationService) -> None:
        self.service = service

    async def ok(self, procedure: str, payload: Any, caller: bytes, now: int = T0) -> Any:
        outcome = await self.service.handle(procedure, payload, caller, now)
        assert not outcome.is_error, outcome.detail
        return outcome.payload

    async def refused(self, procedure: str, payload: Any, caller: bytes, now: int = T0) -> str:
        outcome = await self.service.handle(procedure, payload, caller, now)
        assert outcome.is_error
        return (outcome.detail or b"").decode()


def reserve(paths: list[str], **more: Any) -> dict[str, Any]:
    return {"project": PROJECT, "paths": paths, "reason": "refactor", **more}


async def opened(path: Path, **kwargs: Any) -> tuple[ReservationStore, Station]:
    store = await ReservationStore.open(path)
    return store, Station(ReservationService(store, rate=1000.0, **kwargs))


def test_conflict_names_the_holder_the_paths_and_the_expiry(tmp_path: Path) -> None:
    async def go() -> None:
        store, s = await opened(tmp_path / "r.sqlite3")
        async with store:
            got = await s.ok(
                RESERVE_PATHS,
                reserve(["src/auth/"], holder_name="alice", ttl_seconds=600),
                ALICE,
            )
            assert got["granted"] == 1 and got["expires_ms"] == T0 + 600_000
            clash = await s.ok(RESERVE_PATHS, reserve(["src/auth/login.py", "docs/x"]), BOB)
            assert clash["granted"] == 0
            [conflict] = clash["conflicts"]
            assert conflict["holder"] == ALICE.hex() and conflict["holder_name"] == "alice"
            assert conflict["path"] == "src/auth/**" and conflict["reason"] == "refactor"
            assert conflict["expires_ms"] == T0 + 600_000
            assert conflict["requested"] == ["src/auth/login.py"]
            # all or nothing: docs/x was not reserved either
            listed = await s.ok(LIST_RESERVATIONS, {"project": PROJECT}, CAROL)
            assert [r["holder"] for r in listed["reservations"]] == [ALICE.hex()]
            # shared meets shared; exclusive meets nothing of another's
            assert (await s.ok(RESERVE_PATHS, reserve(["docs/**"], exclusive=0), BOB))["granted"]
            assert (await s.ok(RESERVE_PATHS, reserve(["docs/a"], exclusive=0), CAROL))["granted"]
            assert not (await s.ok(RESERVE_PATHS, reserve(["docs/a"]), ALICE))["granted"]
            # another project, another realm: no conflict
            other = reserve(["src/auth/x"]) | {"project": "other"}
            assert (await s.ok(RESERVE_PATHS, other, BOB))["granted"] == 1
            realm = reserve(["src/auth/x"]) | {"realm": "team"}
            assert (await s.ok(RESERVE_PATHS, realm, BOB))["granted"] == 1

    run(go())


def test_renewal_expiry_release_and_restart(tmp_path: Path) -> None:
    async def go() -> None:
        store, s = await opened(tmp_path / "r.sqlite3")
        async with store:
            await s.ok(RESERVE_PATHS, reserve(["a/**"], ttl_seconds=60), ALICE)
            renewed = await s.ok(
                RESERVE_PATHS, reserve(["a/**"], ttl_seconds=120), ALICE, T0 + 50_000
            )
            assert renewed["expires_ms"] == T0 + 50_000 + 120_000
            # past the first expiry, still held
            assert not (await s.ok(RESERVE_PATHS, reserve(["a/b"]), BOB, T0 + 100_000))["granted"]
        store, s = await opened(tmp_path / "r.sqlite3")  # a restart keeps it
        async with store:
            listed = await s.ok(LIST_RESERVATIONS, {"project": PROJECT}, BOB, T0 + 100_000)
            assert [r["path"] for r in listed["reservations"]] == ["a/**"]
            # expired: gone from listings, and no conflict
            after = T0 + 170_001
            listed = await s.ok(LIST_RESERVATIONS, {"project": PROJECT}, BOB, after)
            assert listed["reservations"] == []
            assert (await s.ok(RESERVE_PATHS, reserve(["a/b"]), BOB, after))["granted"] == 1
            # release: only one's own
            assert (await s.ok(RELEASE_PATHS, {"project": PROJECT}, ALICE, after))["released"] == 0
            done = await s.ok(RELEASE_PATHS, {"project": PROJECT, "paths": ["a/b"]}, BOB, after)
            assert done["released"] == 1

    run(go())


def test_listing_pages_and_touching(tmp_path: Path) -> None:
    async def go() -> None:
        store, s = await opened(tmp_path / "r.sqlite3")
        async with store:
            await s.ok(RESERVE_PATHS, reserve([f"f{i}" for i in range(10)]), ALICE)
            page = await s.ok(LIST_RESERVATIONS, {"project": PROJECT, "limit": 4}, BOB)
            assert len(page["reservations"]) == 4 and page["remaining"] == 6
            last = page["reservations"][-1]["id"]
            rest = await s.ok(
                LIST_RESERVATIONS, {"project": PROJECT, "limit": 100, "after_id": last}, BOB
            )
            assert len(rest["reservations"]) == 6 and rest["remaining"] == 0
            hit = await s.ok(LIST_RESERVATIONS, {"project": PROJECT, "touching": "f3"}, BOB)
            assert [r["path"] for r in hit["reservations"]] == ["f3"]

    run(go())


def test_quotas_and_hostile_arguments(tmp_path: Path) -> None:
    async def go() -> None:
        store, s = await opened(tmp_path / "r.sqlite3", max_total=200)
        async with store:
            for start in range(0, MAX_RESERVATIONS_PER_HOLDER, MAX_RESERVATION_PATHS):
                paths = [f"p{i}" for i in range(start, start + MAX_RESERVATION_PATHS)]
                assert (await s.ok(RESERVE_PATHS, reserve(paths), ALICE))["granted"] == 1
            detail = await s.refused(RESERVE_PATHS, reserve(["one/more"]), ALICE)
            assert detail.startswith("quota_exceeded")
            # renewing what one holds is never over the quota
            assert (await s.ok(RESERVE_PATHS, reserve(["p0"]), ALICE))["granted"] == 1
            for payload in (
                reserve(["../x"]),
                reserve(["/etc/passwd"]),
                reserve(["a/[b]"]),
                reserve([]),
                reserve(["x"] * (MAX_RESERVATION_PATHS + 1)),
                reserve([7]),
                reserve(["x" * 5000]),
                reserve(["x"], exclusive=2),
                reserve(["x"], ttl_seconds=0),
                reserve(["x"]) | {"project": ""},
                reserve(["x"]) | {"project": "p" * 300},
                "not a map",
            ):
                assert (await s.refused(RESERVE_PATHS, payload, BOB)).startswith("bad_request")
            refused = await s.service.handle("macula.unknown", {}, BOB, T0)
            assert refused.code == ErrorCode.UNKNOWN_NEXT_PEER

    run(go())


def test_each_caller_has_a_rate(tmp_path: Path) -> None:
    async def go() -> None:
        store = await ReservationStore.open(tmp_path / "r.sqlite3")
        async with store:
            s = Station(ReservationService(store, rate=1.0))
            for _ in range(4):
                await s.ok(RESERVE_PATHS, reserve(["x"]), ALICE)
            assert (await s.refused(RESERVE_PATHS, reserve(["x"]), ALICE)).startswith(
                "rate_limited"
            )
            assert (await s.ok(RESERVE_PATHS, reserve(["y"]), BOB))["granted"] == 1

    run(go())


def test_the_service_refuses_bad_settings(tmp_path: Path) -> None:
    async def go() -> None:
        store = await ReservationStore.open(tmp_path / "r.sqlite3")
        async with store:
            with pytest.raises(ValueError):
                ReservationService(store, max_total=0)

    run(go())
