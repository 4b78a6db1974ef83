"""The rule a local station ends itself by (``relay.ops.lifetime``): its watched folder gone, or no
connection for its idle budget. Time is an argument; the watcher runs on a fake clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from relay.ops.cli import build_parser
from relay.ops.lifetime import LifetimeRule, exists, watch


def test_a_gone_folder_ends_the_station_whatever_its_connections(tmp_path: Path) -> None:
    rule = LifetimeRule(watched=tmp_path / "data")
    assert rule.verdict(10.0, watched_exists=True, connections=0) is None
    reason = rule.verdict(11.0, watched_exists=False, connections=3)
    assert reason is not None and str(tmp_path / "data") in reason and "gone" in reason


def test_idle_counts_from_the_last_check_that_saw_a_connection() -> None:
    rule = LifetimeRule(idle_exit_s=60.0, last_used=0.0)
    assert rule.verdict(59.0, True, 0) is None
    assert rule.verdict(59.5, True, 1) is None  # used: the budget starts again
    assert rule.verdict(119.0, True, 0) is None
    assert rule.verdict(119.5, True, 0) == "no connection for 60 s"


def test_without_either_check_the_rule_never_ends_the_station() -> None:
    rule = LifetimeRule()
    assert not rule.active
    assert rule.verdict(1e9, False, 0) is None


def test_only_a_missing_path_is_gone(tmp_path: Path) -> None:
    assert exists(tmp_path) and not exists(tmp_path / "missing")


def test_the_relay_flags_build_the_rule(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["--exit-when-gone", str(tmp_path), "--idle-exit-s", "90", "--lifetime-check-s", "0.5"]
    )
    assert (args.exit_when_gone, args.idle_exit_s, args.lifetime_check_s) == (tmp_path, 90, 0.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--idle-exit-s", "0"])


@pytest.mark.anyio
async def test_the_watcher_sets_stop_once_the_folder_is_removed(tmp_path: Path) -> None:
    watched = tmp_path / "data"
    watched.mkdir()
    stop = asyncio.Event()
    checks: list[int] = []

    def connections() -> int:
        checks.append(1)
        if len(checks) == 3:
            watched.rmdir()
        return 1

    reason = await asyncio.wait_for(
        watch(LifetimeRule(watched=watched), connections, stop, check_s=0.01), 5
    )
    assert stop.is_set() and reason is not None and "gone" in reason and len(checks) >= 3


@pytest.mark.anyio
async def test_the_watcher_returns_quietly_when_stopped_by_someone_else(tmp_path: Path) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(watch(LifetimeRule(watched=tmp_path), lambda: 0, stop, check_s=5))
    stop.set()
    assert await asyncio.wait_for(task, 5) is None and stop.is_set()
