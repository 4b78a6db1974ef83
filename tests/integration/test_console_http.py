"""The console's listener over real HTTP on loopback (uvicorn, as the daemon serves it): 401
without the token, the token traded for a cookie and out of the URL, cross-origin and
origin-less writes refused, a bad write answered with a structured error, strict headers on
every answer, and the token in no log line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from support.consolekit import Home, console, http
from tools.daemon.http.listener import COOKIE

pytestmark = pytest.mark.anyio


def cookie_of(headers: dict[str, str]) -> str:
    found = {k.lower(): v for k, v in headers.items()}["set-cookie"]
    assert "HttpOnly" in found and "SameSite=Strict" in found, found
    return found.split(";")[0]


async def test_the_token_opens_the_console_and_nothing_else_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    home = Home(tmp_path / "home")
    async with console(home) as served:
        status, headers, body = await http(served.origin + "/")
        assert status == 401 and b"macula-mcp console" in body
        lower = {k.lower(): v for k, v in headers.items()}
        assert "default-src 'self'" in lower["content-security-policy"]
        assert "unsafe-inline" not in lower["content-security-policy"]
        assert lower["x-frame-options"] == "DENY"
        assert (await http(served.origin + "/api/snapshot"))[0] == 401
        assert (await http(served.origin + "/events"))[0] == 401
        assert (await http(served.origin + "/?token=" + "x" * 43))[0] == 401

        status, headers, _ = await http(served.url)
        assert status == 303 and headers["location"] == "/"
        cookie = cookie_of(headers)
        assert served.token not in cookie
        status, headers, body = await http(
            served.origin + "/api/snapshot", headers={"Cookie": cookie}
        )
        assert status == 200
        view = json.loads(body)
        assert view["identities"] == [] and len(view["person"]["node_id"]) == 64
        assert {k.lower(): v for k, v in headers.items()}["x-frame-options"] == "DENY"
        assert (home.home / "http" / "port").stat().st_mode & 0o777 == 0o600
    assert served.token not in caplog.text  # uvicorn's and ours, at DEBUG
    assert not (home.home / "http" / "port").exists()  # gone with the listener


async def test_writes_need_the_consoles_own_origin(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    async with console(home) as served:
        cookie = cookie_of((await http(served.url))[1])
        say = served.origin + "/api/say"
        body = {"node_id": "00" * 32, "room_topic": "agents.room." + "ab" * 16, "text": "hi"}
        evil = {"Cookie": cookie, "Origin": "http://evil.example"}
        assert (await http(say, "POST", evil, body))[0] == 403
        assert (await http(say, "POST", {"Cookie": cookie}, body))[0] == 403
        rebinding = {"Cookie": cookie, "Host": "evil.example", "Origin": "http://evil.example"}
        assert (await http(say, "POST", rebinding, body))[0] in (403, 421)

        own = {"Cookie": cookie, "Origin": served.origin}
        status, _, answer = await http(say, "POST", own, body)
        refusal = json.loads(answer)
        assert status == 400 and refusal["ok"] == 0 and refusal["code"] == "unknown_identity"
        assert {"code", "detail", "retryable", "next_action"} <= refusal.keys()
        status, _, answer = await http(say, "POST", own | {"Content-Type": "text/plain"}, body)
        assert status == 400 and "application/json" in json.loads(answer)["detail"]
        realm = {"realm": "crew", "code": "ABCD-EFGH", "approve": "yes"}
        status, _, answer = await http(served.origin + "/api/realm", "POST", own, realm)
        assert status == 400 and json.loads(answer)["code"] == "invalid_argument"
        status, _, answer = await http(
            served.origin + "/api/realm", "POST", own, realm | {"approve": 1}
        )
        assert status == 400 and json.loads(answer)["code"] == "no_realm"
        assert f"{COOKIE}=" in cookie
