"""``macula-mcp approvals`` with no daemon and no agent running: it reads and decides the store
file directly (the agent applies the decision when it starts), and ``doctor`` names a malformed
``[approvals]`` table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from macula.clock import now_ms
from macula.store.approvals import ApprovalStore, Item
from tools.doctor_checks import settings_checks
from tools.owner.approvals import approvals_check, main

OWNER, SENDER = b"\x01" * 32, b"\x02" * 32


def held(home: Path) -> Path:
    path = home / "agents" / OWNER.hex()[:16] / "approvals.sqlite3"

    async def write() -> None:
        async with await ApprovalStore.open(path) as store:
            now = now_ms()
            item = Item("00112233445566aa", OWNER, "task", SENDER, None, "t1", 9, now, now + 60_000,
                        {"title": "hi", "input": "the content"})  # fmt: skip
            await store.add(item, max_pending=5)

    asyncio.run(write())
    return path


def test_list_shows_the_content_and_a_decision_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    path = held(tmp_path)
    assert main(["list", "--json"], env) == 0
    [line] = capsys.readouterr().out.splitlines()
    shown = json.loads(line)
    assert shown["approval_id"] == "00112233445566aa"
    assert shown["content"]["input"] == "the content"
    assert main(["deny", "00112233445566aa", "--reason", "no"], env) == 0
    assert "denied" in capsys.readouterr().out
    assert main(["approve", "00112233445566aa"], env) == 1  # decided once
    assert "already_decided" in capsys.readouterr().err
    assert main(["approve", "ffffffffffffffff"], env) == 1
    assert "not_found" in capsys.readouterr().err
    assert main(["list"], env) == 0
    assert "nothing waits" in capsys.readouterr().out

    async def read() -> Item | None:
        async with await ApprovalStore.open(path) as store:
            return await store.get("00112233445566aa")

    decided = asyncio.run(read())
    assert decided is not None and (decided.state, decided.reason) == ("denied", "no")
    assert decided.decided_by == "owner (cli)" and decided.applied == 0  # the agent applies it


def test_usage_errors_and_an_unknown_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    with pytest.raises(SystemExit) as usage:
        main(["approve"], env)
    assert usage.value.code == 2
    assert main(["list", "--agent", "nobody"], env) == 2
    assert "no such agent" in capsys.readouterr().err


def test_doctor_names_a_malformed_approvals_table(tmp_path: Path) -> None:
    env = {"MACULA_HOME": str(tmp_path)}
    assert approvals_check(env) is None  # no owner file: nothing to say
    (tmp_path / "owner.toml").write_text("[approvals]\nrings_when_asked = 'yes'\n")
    check = approvals_check(env)
    assert check is not None and check[:2] == ("owner approvals", False)
    assert str(tmp_path / "owner.toml") in check[2] and "rings_when_asked" in check[2]
    assert "fails closed" in check[2]
    assert check in settings_checks(env)
    (tmp_path / "owner.toml").write_text("[approvals]\nrings_when_asked = 1\n")
    fine = approvals_check(env)
    assert fine is not None and fine[1] is True and "rings_when_asked 1" in fine[2]
