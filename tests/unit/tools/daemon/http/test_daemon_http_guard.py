"""The console's guard (``tools.daemon.http.listener.guard``, pure): loopback Host only, same
Origin,
a token in the URL traded for a cookie (and taken out of the URL), 401 otherwise; and the
``MACULA_MCP_HTTP_PORT`` setting."""

from __future__ import annotations

from typing import Any

import pytest

from tools.daemon.http.listener import COOKIE, Verdict, cookie_value, guard
from tools.daemon.http.listener import _refuse as refuse_console
from tools.daemon.http.mcp import _refuse as refuse_mcp
from tools.settings import DaemonSettingError, DaemonSettings

TOKEN = "A" * 43
PORT = 8765
HOST = f"127.0.0.1:{PORT}"


def decide(method: str = "GET", path: str = "/", query: str = "", **headers: str):  # type: ignore[no-untyped-def]
    return guard(
        method=method,
        path=path,
        query=query,
        headers={"host": HOST} | {k.replace("_", "-"): v for k, v in headers.items()},
        port=PORT,
        token=TOKEN,
    )


def with_cookie(value: str) -> str:
    return f"other=1; {COOKIE}={value}"


def test_the_token_in_the_url_becomes_a_cookie_and_leaves_the_url() -> None:
    verdict = decide(query=f"token={TOKEN}&room=x")
    assert verdict.status == 303
    assert verdict.location == "/?room=x"
    assert verdict.cookie == cookie_value(TOKEN) and TOKEN not in verdict.cookie
    assert decide(query=f"token={TOKEN}").location == "/"
    assert decide(cookie=with_cookie(cookie_value(TOKEN))).status == 0


def test_without_the_token_or_its_cookie_it_is_401() -> None:
    assert decide().status == 401
    assert decide(query="token=" + "B" * 43).status == 401
    assert decide(query="token=").status == 401
    assert decide(cookie=with_cookie("nope")).status == 401
    assert decide(cookie=with_cookie(TOKEN)).status == 401  # the token itself is no cookie
    assert decide(method="POST", query=f"token={TOKEN}", origin=f"http://{HOST}").status == 401


def test_another_host_or_origin_is_refused_before_the_token_counts() -> None:
    good = with_cookie(cookie_value(TOKEN))
    assert decide(host="evil.example:8765", cookie=good).status == 421  # DNS rebinding
    assert decide(host="127.0.0.1:9999", cookie=good).status == 421
    assert decide(origin="http://evil.example", cookie=good).status == 403
    assert decide(origin="null", cookie=good).status == 403
    assert decide(host=f"localhost:{PORT}", cookie=good).status == 0


def test_a_write_needs_the_consoles_own_origin() -> None:
    good = with_cookie(cookie_value(TOKEN))
    assert decide("POST", "/api/say", cookie=good).status == 403  # no Origin at all
    assert decide("POST", "/api/say", cookie=good, origin="http://evil.example").status == 403
    assert decide("POST", "/api/say", cookie=good, origin=f"http://{HOST}").status == 0


def test_the_http_port_setting() -> None:
    assert DaemonSettings.from_env({"MACULA_HOME": "/tmp/h"}).http_port == 0
    assert (
        DaemonSettings.from_env({"MACULA_HOME": "/tmp/h", "MACULA_MCP_HTTP_PORT": "8080"}).http_port
        == 8080
    )
    for bad in ("-1", "65536", "eighty", "80.5"):
        with pytest.raises(DaemonSettingError, match="MACULA_MCP_HTTP_PORT"):
            DaemonSettings.from_env({"MACULA_HOME": "/tmp/h", "MACULA_MCP_HTTP_PORT": bad})


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["console", "mcp"])
async def test_a_refusal_is_sent_whole_with_its_length(which: str) -> None:
    # Sent chunked before the request's body was read, a refusal was cut by a reset about 1
    # time in 200 (urllib, uvicorn's h11): with its Content-Length it arrives whole.
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    if which == "console":
        await refuse_console(send, Verdict(421, "only http://127.0.0.1 on its own port"))
    else:
        await refuse_mcp(send, 401, "a bearer token is required")
    start, body = sent
    headers = dict(start["headers"])
    assert int(headers[b"content-length"]) == len(body["body"]) > 0
    assert not body.get("more_body")


def test_the_http_max_sessions_setting() -> None:
    name = "MACULA_MCP_HTTP_MAX_SESSIONS"
    assert DaemonSettings.from_env({"MACULA_HOME": "/tmp/h"}).http_max_sessions == 64
    assert DaemonSettings.from_env({"MACULA_HOME": "/tmp/h", name: "3"}).http_max_sessions == 3
    for bad in ("0", "-1", "1025", "many", "2.5", "1e3"):
        with pytest.raises(DaemonSettingError, match=f"{name} must be a whole number 1-1024"):
            DaemonSettings.from_env({"MACULA_HOME": "/tmp/h", name: bad})
