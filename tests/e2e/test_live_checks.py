"""The two-process live checks pass end to end: real station process, two client processes.
The conversation and federation checks run by default; the others are live checks of what the
integration tests cover in one process over real QUIC, so they run with ``-m slow`` (the suite
stays under its 8 minutes)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from support.paths import SCRIPTS


@pytest.mark.parametrize(
    "script",
    [
        pytest.param("pubsub-two-process-check.py", marks=pytest.mark.slow),
        pytest.param("rpc-two-process-check.py", marks=pytest.mark.slow),
        pytest.param("content-two-process-check.py", marks=pytest.mark.slow),
        pytest.param("ring-two-process-check.py", marks=pytest.mark.slow),
        pytest.param("realm-two-process-check.py", marks=pytest.mark.slow),
        "conversation-two-process-check.py",
        "federation-two-process-check.py",
    ],
)
def test_live_check_passes(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script)],
        cwd=SCRIPTS,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    match = re.fullmatch(r"(\d+)/(\d+) checks passed", lines[-1])
    assert match and match.group(1) == match.group(2) and int(match.group(2)) >= 10, lines[-1]
    assert not any(line.startswith("[FAIL]") for line in lines)
