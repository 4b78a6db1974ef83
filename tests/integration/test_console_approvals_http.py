"""The console's approval routes over real HTTP (uvicorn, as the daemon serves them), for an
agent the daemon does not host (its queue read from its store file): the token guards the list
(which shows the content), a decision needs the console's own origin and a valid body, each item
is decided once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macula.clock import now_ms
from macula.store.approvals import ApprovalStore, Item
from support.consolekit import Home, console, http

pytestmark = pytest.mark.anyio

OWNER, SENDER = b"\x01" * 32, b"\x02" * 32
ITEM_ID = "0123456789abcdef"


async def hold(home: Path) -> None:
    path = home / "agents" / OWNER.hex()[:16] / "approvals.sqlite3"
    async with await ApprovalStore.open(path) as store:
        now = now_ms()
        item = Item(ITEM_ID, OWNER, "task", SENDER, None, "t1", 20, now, now + 60_000,
                    {"title": "deploy", "input": "the secret plan"})  # fmt: skip
        await store.add(item, max_pending=5)


async def test_the_queue_behind_the_console_guard(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    await hold(home.home)
    async with console(home) as served:
        listing = served.origin + "/api/approvals"
        assert (await http(listing))[0] == 401
        headers = (await http(served.url))[1]
        cookie = {k.lower(): v for k, v in headers.items()}["set-cookie"].split(";")[0]
        status, _, body = await http(listing, headers={"Cookie": cookie})
        assert status == 200
        [item] = json.loads(body)["approvals"]
        assert item["approval_id"] == ITEM_ID and item["content"]["input"] == "the secret plan"

        decide = served.origin + "/api/approvals/decide"
        body_ok = {"approval_id": ITEM_ID, "decision": "deny"}
        assert (await http(decide, "POST", {"Cookie": cookie}, body_ok))[0] == 403
        evil = {"Cookie": cookie, "Origin": "http://evil.example"}
        assert (await http(decide, "POST", evil, body_ok))[0] == 403
        own = {"Cookie": cookie, "Origin": served.origin}
        for bad in (
            {"approval_id": "../../etc", "decision": "deny"},
            {"approval_id": ITEM_ID, "decision": "yes"},
        ):
            status, _, answer = await http(decide, "POST", own, bad)
            assert status == 400 and json.loads(answer)["code"] == "invalid_argument", answer
        status, _, answer = await http(decide, "POST", own, {**body_ok, "approval_id": "f" * 16})
        assert status == 400 and json.loads(answer)["code"] == "not_found"
        status, _, answer = await http(decide, "POST", own, body_ok)
        assert status == 200 and json.loads(answer) == {
            "ok": 1, "approval_id": ITEM_ID, "state": "denied"
        }  # fmt: skip
        status, _, answer = await http(decide, "POST", own, body_ok)
        assert status == 400 and json.loads(answer)["code"] == "already_decided"
        assert json.loads((await http(listing, headers={"Cookie": cookie}))[2]) == {"approvals": []}
