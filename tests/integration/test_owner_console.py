"""The console's Owner tab over real HTTP on loopback (uvicorn, as the daemon serves it): its
script is served, GET /api/owner shows the switches (and a malformed file's line and key), a
POST flips one through the owner's writer, and writes keep the console's guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.consolekit import Home, console, http

pytestmark = pytest.mark.anyio


async def test_the_owner_tab_shows_and_flips_switches(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    async with console(home) as served:
        status, headers, _ = await http(served.url)
        cookie = {k.lower(): v for k, v in headers.items()}["set-cookie"].split(";")[0]
        own = {"Cookie": cookie, "Origin": served.origin}
        status, _, script = await http(served.origin + "/static/owner.js", headers=own)
        assert status == 200 and b"/api/owner" in script
        status, _, page = await http(served.origin + "/", headers=own)
        assert b'id="owner"' in page and b"/static/owner.js" in page
        api = served.origin + "/api/owner"
        status, _, body = await http(api, headers=own)
        view = json.loads(body)
        assert status == 200 and view["exists"] == 0 and view["switches"]["preset"] == "full"

        flip = {"name": "mesh_serve", "value": 0, "agent": "ada"}
        assert (await http(api, "POST", {"Cookie": cookie}, flip))[0] == 403  # no Origin
        evil = {"Cookie": cookie, "Origin": "http://evil.example"}
        assert (await http(api, "POST", evil, flip))[0] == 403
        assert not (home.home / "owner.toml").exists()

        status, _, body = await http(api, "POST", own, flip)
        view = json.loads(body)
        assert status == 200 and view["ok"] == 1 and view["agents"] == ["ada"]
        assert view["switches"]["off"] == {"mesh_serve": "agents.ada.tools.mesh_serve"}
        status, _, body = await http(api, "POST", own, {"preset": "talk"})
        assert json.loads(body)["switches"]["preset"] == "talk"
        assert (home.home / "owner.toml").stat().st_mode & 0o777 == 0o600

        for bad in ({"name": "rpc", "value": True}, {"name": "nope", "value": 0},
                    {"preset": "all"}, {"name": "rpc", "value": 0, "agent": "a b"}):  # fmt: skip
            status, _, body = await http(api, "POST", own, bad)
            refusal = json.loads(body)
            assert status == 400 and refusal["code"] == "invalid_argument", bad
            assert {"detail", "retryable", "next_action"} <= refusal.keys()

        (home.home / "owner.toml").write_text("[tools]\nmesh_say = 5\n")
        status, _, body = await http(api, headers=own)
        problem = json.loads(body)["switches"]["problem"]
        assert problem["line"] == 2 and problem["key"] == "tools.mesh_say"
        status, _, body = await http(api, "POST", own, {"preset": "full"})
        assert status == 200  # a malformed (but TOML) file can be reset from the console
        assert json.loads(body)["switches"]["malformed"] == 0
