"""``macula-mcp demo`` (the README quickstart) passes: two real macula-mcp processes meet, then
ride out a restart of the station process on their own."""

from __future__ import annotations

import subprocess
import sys


def test_macula_mcp_demo_passes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("demo passed")
    assert not any(line.startswith("FAILED") for line in lines)
    assert any("mesh_ring" in line and "answer 1" in line for line in lines)
    started = [line for line in lines if line.startswith("station ")]
    assert len(started) == 2 and started[1].startswith("station restarted ")
    assert started[1].split()[-1] == started[0].split()[-1]  # same key, same port
    assert any("mesh://status" in line and "reconnects 1" in line for line in lines)
    assert any("after the restart" in line and "{'sum': 10}" in line for line in lines)
