"""Dialling: the guard refuses any origin but the allowlisted one before connecting, and every
failure of the SDK client is named by one code."""

from __future__ import annotations

import httpx
import pytest
from a2a.client import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.types import TaskNotCancelableError

from tools.a2a.allowlist import Agent
from tools.a2a.answers import Malformed
from tools.a2a.dial import Failure, NotAllowed, failure_of, http_client

pytestmark = pytest.mark.anyio


class Recorder(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.urls: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return httpx.Response(302, headers={"Location": "http://elsewhere:1/"})


async def test_only_the_allowlisted_origin_is_dialled_and_redirects_are_not_followed() -> None:
    inner = Recorder()
    async with http_client(Agent("http://127.0.0.1:9999/"), inner) as http:
        with pytest.raises(NotAllowed):
            await http.get("http://127.0.0.1:9998/")
        with pytest.raises(NotAllowed):
            await http.get("https://127.0.0.1:9999/")
        answer = await http.get("http://127.0.0.1:9999/x")
    assert answer.status_code == 302
    assert inner.urls == ["http://127.0.0.1:9999/x"]


def wrapped(cause: BaseException) -> A2AClientError:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise A2AClientError("wrapped") from exc
    except A2AClientError as outer:
        return outer


def status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://x/")
    return httpx.HTTPStatusError(
        "s", request=request, response=httpx.Response(code, request=request)
    )


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (wrapped(httpx.ConnectError("refused")), "a2a_unreachable", True),
        (A2AClientTimeoutError("slow"), "a2a_unreachable", True),
        (wrapped(status_error(401)), "a2a_auth_required", False),
        (AgentCardResolutionError("no", status_code=403), "a2a_auth_required", False),
        (wrapped(status_error(503)), "a2a_unreachable", True),
        (wrapped(status_error(404)), "a2a_refused", False),
        (TaskNotCancelableError("done already"), "a2a_refused", False),
        (A2AClientError("Invalid response type"), "a2a_malformed_answer", False),
        (AgentCardResolutionError("bad JSON"), "a2a_malformed_answer", False),
        (Malformed("no state"), "a2a_malformed_answer", False),
        (
            wrapped(NotAllowed("elsewhere", request=httpx.Request("GET", "http://e/"))),
            "a2a_not_allowlisted",
            False,
        ),
        (Failure("a2a_refused", "as is"), "a2a_refused", False),
        (RuntimeError("odd"), "a2a_malformed_answer", False),
    ],
)
def test_every_failure_has_one_code(exc: BaseException, code: str, retryable: bool) -> None:
    failure = failure_of(exc)
    assert (failure.code, failure.retryable) == (code, retryable)
    assert len(failure.detail) <= 310
