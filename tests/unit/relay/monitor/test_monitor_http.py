"""relay.monitor.http's request parsing (pure): strict, bounded."""

from __future__ import annotations

import pytest

from relay.monitor.http import (
    BadRequest,
    Response,
    check_headers,
    encode_response,
    parse_header_line,
    parse_request_line,
)


def test_a_request_line_with_a_query() -> None:
    assert parse_request_line(b"GET /connections?offset=2&limit=5 HTTP/1.1") == (
        "GET",
        "/connections",
        {"offset": "2", "limit": "5"},
    )
    assert parse_request_line(b"HEAD / HTTP/1.0")[:2] == ("HEAD", "/")


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (b"DELETE / HTTP/1.1", 405),
        (b"GET / HTTP/3", 505),
        (b"GET  / HTTP/1.1", 400),
        (b"GET http://x/ HTTP/1.1", 400),
        (b"GET /\x7f HTTP/1.1", 400),
        (b"GET /\xff HTTP/1.1", 400),
        (b"GET /" + b"a" * 3000 + b" HTTP/1.1", 414),
    ],
)
def test_bad_request_lines(line: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_request_line(line)
    assert caught.value.status == status


def test_headers_are_strict() -> None:
    assert parse_header_line(b"Host:  monitor ") == ("host", "monitor")
    for bad in (b" folded", b"NoColon", b"Bad Name: x", b": empty"):
        with pytest.raises(BadRequest):
            parse_header_line(bad)
    with pytest.raises(BadRequest):
        check_headers({"transfer-encoding": "chunked"})
    check_headers({"content-length": "0"})


def test_responses_close_and_head_has_no_body() -> None:
    raw = encode_response(Response(200, b"ok\n"), head=False)
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") and raw.endswith(b"\r\n\r\nok\n")
    assert b"Connection: close\r\n" in raw and b"Content-Length: 3\r\n" in raw
    assert encode_response(Response(200, b"ok\n"), head=True).endswith(b"\r\n\r\n")
