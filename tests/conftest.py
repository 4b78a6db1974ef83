"""Root of the test suite: shared helpers live once in ``tests/support/`` (``from support.meshkit
import ...``); the ``anyio_backend`` fixture and the console tests' ``browser`` (headless
Chromium) are here.

One guard for the whole run: an aiosqlite connection a test left open keeps a non-daemon
worker thread alive, and the interpreter waits for it at exit, so pytest would print its summary
and then never exit (CI ran into its time limit that way). At the end of the session every such
connection still open is stopped and named on stderr, and the run fails: a leak is a defect to
fix, not to hang on.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest


def _open_sqlite_connections() -> list[object]:
    import aiosqlite.core

    gc.collect()  # what is garbage already stops its own thread (``Connection.__del__``)
    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, aiosqlite.core.Connection) and obj._thread.is_alive()
    ]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "aiosqlite.core" not in sys.modules:
        return
    leaked = _open_sqlite_connections()
    for connection in leaked:
        print(f"\nconftest: an aiosqlite connection was left open: {connection!r}", file=sys.stderr)
        connection.stop()  # type: ignore[attr-defined]
        connection._thread.join(timeout=5)  # type: ignore[attr-defined]
    workers = [t.name for t in threading.enumerate() if "_connection_worker_thread" in t.name]
    if leaked or workers:
        print(f"conftest: {len(leaked)} leaked connection(s) stopped; still running: {workers}",
              file=sys.stderr)  # fmt: skip
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_report_header() -> str:
    from macula.quic import backend as quic_backend
    from macula.quic import event_loop

    quic = quic_backend.describe()
    loop = event_loop.loop_name()
    return f"macula: QUIC {quic['quic']} {quic['version']}; processes start on {loop}"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """asyncio's loop for every ``@pytest.mark.anyio`` test; ``MACULA_LOOP=uvloop`` runs them on
    uvloop (``MACULA_QUIC=qh3`` on qh3). The baseline stays asyncio's loop and aioquic."""
    uvloop = os.environ.get("MACULA_LOOP", "").strip().lower() == "uvloop"
    return "asyncio", {"use_uvloop": uvloop}


@pytest.fixture(autouse=True)
def _fresh_verified_signatures() -> None:
    """Each test starts with no ``publisher_sig`` remembered as verified (macula.wire.verified):
    tests that count Ed25519 verifies, or feed a forged event, must not see an earlier test's
    verdict (identities and payloads are often the same from test to test)."""
    from macula.wire import verified

    verified.publications.forget()


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Debian's headless Chromium driven by playwright (the console's page tests)."""
    from support.consolekit import chromium

    async with chromium() as launched:
        yield launched
