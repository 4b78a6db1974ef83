"""The README quickstart command works end to end (embedded station, two agents, a restart)."""

from __future__ import annotations

import subprocess
import sys


def test_macula_demo_passes_every_check() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "relay.demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert lines[0].startswith("station ") and "@127.0.0.1:" in lines[0]
    assert lines[-1] == "9/9 checks passed"
